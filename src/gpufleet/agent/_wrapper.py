"""The job wrapper: ``python -I -S _wrapper.py EXIT_FILE -- COMMAND...``.

Runs COMMAND as its child, waits for it, and writes its exit code (128+N when killed by
signal N, 127 when it cannot be started) to EXIT_FILE atomically, so an agent that was
restarted meanwhile still learns how the job ended. It leads the job's process group:
the agent signals the whole group, so the child gets SIGTERM directly (once) and the
wrapper, which only notes the signal, survives it to record the code. SIGKILL ends
both (the agent then knows the code itself). Standard library only, so it starts fast.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def _write(path: str, code: int) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{code}\n")
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: _wrapper.py EXIT_FILE -- COMMAND...", file=sys.stderr)
        return 2
    exit_file, command = argv[0], argv[2:]
    child: list[subprocess.Popen[bytes]] = []

    def note(_signum: int, _frame: object) -> None:
        """A handler, not SIG_IGN: an ignored signal would be inherited by the child."""

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, note)
    try:
        child.append(subprocess.Popen(command))
    except OSError as exc:
        print(f"gpufleet: cannot start {command[0]!r}: {exc}", file=sys.stderr, flush=True)
        _write(exit_file, 127)
        return 127
    while True:
        try:
            rc = child[0].wait()
            break
        except InterruptedError:
            continue
    code = 128 - rc if rc < 0 else rc
    _write(exit_file, code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
