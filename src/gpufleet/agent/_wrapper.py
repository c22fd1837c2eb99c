"""The job wrapper: ``python -I -S _wrapper.py EXIT_FILE [OPTIONS] -- COMMAND...``.

Options: ``--cgroup DIR`` (join that cgroup v2 directory first, so every process of the
job is in it), ``--uid N --gid N [--groups A,B]`` (the job's account: the wrapper, started
by a root agent, stays root to write EXIT_FILE where the job cannot forge it, and starts
COMMAND with exactly these ids; an unprivileged agent passes none).

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


def _options(argv: list[str]) -> tuple[str, dict[str, str], list[str]] | None:
    if "--" not in argv or argv.index("--") < 1 or argv.index("--") == len(argv) - 1:
        return None
    cut = argv.index("--")
    head, command = argv[:cut], argv[cut + 1 :]
    exit_file, rest = head[0], head[1:]
    if len(rest) % 2:
        return None
    opts = dict(zip(rest[::2], rest[1::2], strict=True))
    if not set(opts) <= {"--cgroup", "--uid", "--gid", "--groups"}:
        return None
    return exit_file, opts, command


def main(argv: list[str]) -> int:
    parsed = _options(argv)
    if parsed is None:
        print(
            "usage: _wrapper.py EXIT_FILE [--cgroup DIR] [--uid N --gid N --groups A,B] -- COMMAND...",
            file=sys.stderr,
        )
        return 2
    exit_file, opts, command = parsed
    if "--cgroup" in opts:
        try:
            with open(os.path.join(opts["--cgroup"], "cgroup.procs"), "w") as f:
                f.write(f"{os.getpid()}\n")
        except OSError as exc:
            why = f"gpufleet: cannot join cgroup {opts['--cgroup']}: {exc.strerror}"
            print(why, file=sys.stderr, flush=True)
    ids: dict[str, object] = {}
    if "--uid" in opts:
        groups = [int(g) for g in opts.get("--groups", "").split(",") if g]
        ids = {"user": int(opts["--uid"]), "group": int(opts["--gid"]), "extra_groups": groups}
    child: list[subprocess.Popen[bytes]] = []

    def note(_signum: int, _frame: object) -> None:
        """A handler, not SIG_IGN: an ignored signal would be inherited by the child."""

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, note)
    try:
        child.append(subprocess.Popen(command, **ids))  # type: ignore[call-overload]
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
