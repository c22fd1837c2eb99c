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
both (the agent then knows the code itself).

It starts in a few milliseconds: ``os`` and the builtin ``_signal`` only (``subprocess`` and
``signal`` cost 5.5 ms of imports on every job start); the child is a plain ``fork``, which
drops to the job's ids and ``exec``s COMMAND (127 and a line when that fails).
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # builtin; ``signal`` imports enum
import os
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


def _exec(command: list[str], opts: dict[str, str], path: list[str]) -> None:
    """In the forked child: become the job's account, then run COMMAND, looked up in
    ``path`` (the PATH, read before the fork: ``os.execvp`` imports modules, which the
    job's account may not be able to read). Never returns."""
    err: OSError | None = None
    try:
        if "--uid" in opts:
            os.setgroups([int(g) for g in opts.get("--groups", "").split(",") if g])
            os.setgid(int(opts["--gid"]))
            os.setuid(int(opts["--uid"]))
        for exe in [command[0]] if "/" in command[0] else [os.path.join(d or ".", command[0]) for d in path]:
            try:
                os.execv(exe, command)
            except (FileNotFoundError, NotADirectoryError, PermissionError) as exc:
                err = err if isinstance(err, PermissionError) else exc  # EACCES wins, as in execvp
        raise err or FileNotFoundError(2, "No such file or directory")
    except OSError as exc:
        os.write(2, f"gpufleet: cannot start {command[0]!r}: {exc}\n".encode())
    finally:
        os._exit(127)


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

    def note(_signum: int, _frame: object) -> None:
        """A handler, not SIG_IGN: an ignored signal would be inherited by the child
        (a handled one is reset to its default by exec)."""

    for sig in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
        _signal.signal(sig, note)
    sys.stdout.flush()
    sys.stderr.flush()
    path = os.environ.get("PATH", os.defpath).split(os.pathsep)
    pid = os.fork()
    if pid == 0:
        _exec(command, opts, path)
    _, status = os.waitpid(pid, 0)  # retried on EINTR (PEP 475): the noted signals do not end it
    code = 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    _write(exit_file, code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
