"""``python -m gpufleet.slurm NAME ARGS...``: runs ``gpufleet.slurm.NAME.main(ARGS)``.

A command that asks the server and prints (all but ``srun``, which runs a job step for
as long as it takes) runs as ``gpufleet queue`` does (``gpufleet.cli.main``): without the
garbage collector, and ended with ``os._exit`` once its output is flushed, skipping the
interpreter's teardown. httpx's own command line (click, rich: ~30 ms) is never
imported.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys

from gpufleet.slurm import COMMANDS

USAGE = f"usage: python -m gpufleet.slurm {{{','.join(COMMANDS)}}} [ARGS...]\n"


def main(argv: list[str]) -> int:
    """The command's exit code; 2 (with the usage) for a name that is none of them."""
    if not argv or argv[0] not in COMMANDS:
        sys.stderr.write(USAGE)
        return 2
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
    module = importlib.import_module(f"gpufleet.slurm.{argv[0]}")
    code: int = module.main(argv[1:])
    return code


def _quick_exit(code: int) -> None:
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:  # a closed pipe (`squeue | head -1`)
        code = code or 120
    os._exit(code)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["srun"]:
        sys.exit(main(args))
    gc.disable()
    try:
        result = main(args)
    except SystemExit as exc:  # argparse's usage errors, sys.exit("why")
        if exc.code is not None and not isinstance(exc.code, int):
            sys.stderr.write(f"{exc.code}\n")
        result = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt:
        result = 130
    _quick_exit(result)
