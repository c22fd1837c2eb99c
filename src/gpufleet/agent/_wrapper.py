"""The job wrapper: ``python -I -S _wrapper.py EXIT_FILE [OPTIONS] -- COMMAND...``.

Options: ``--cgroup DIR[:DIR...]`` (join these cgroup directories first, one for v2,
one per controller for v1, so every process of the job is in them), ``--uid N --gid N
[--groups A,B]`` (the job's account: the wrapper, started by a root agent, stays root to
write EXIT_FILE where the job cannot forge it, and starts COMMAND with exactly these ids;
an unprivileged agent passes none), ``--workdir DIR`` or
``--submit-dir DIR`` (the job's working directory: sbatch's ``--chdir``, else where it
was submitted), ``--output FILE`` / ``--error FILE`` / ``--input FILE`` (sbatch's, their
patterns already expanded by the agent; a relative name is relative to the working
directory), ``--pid-file FILE`` (where the pid of COMMAND, "the batch shell", is written,
0600, for the agent's ``--signal=B:...``), ``--env-file FILE`` (the job's environment,
``KEY=VALUE`` entries separated by NUL bytes, 0600 in the agent's attempt dir).

The wrapper itself runs as root with an environment the agent built from scratch (a
fixed PATH and ``LANG=C``): the job's environment (``LD_PRELOAD``, ``LD_LIBRARY_PATH``,
``GCONV_PATH``, ``PYTHON*``, ... whatever its owner put there) never reaches a process
running as root, whose dynamic loader would honour it. The wrapper reads the file as
data only, removes it, and hands its entries to ``execve`` in the forked child, after
that child dropped to the job's ids; the command is looked up in the job's PATH. Without
``--env-file`` (an unprivileged agent's tests) the child gets the wrapper's environment.

Runs COMMAND as its child, waits for it, and writes its exit code (128+N when killed by
signal N, 127 when it cannot be started) to EXIT_FILE atomically, so an agent that was
restarted meanwhile still learns how the job ended. It leads the job's process group:
the agent signals the whole group, so the child gets SIGTERM directly (once) and the
wrapper, which only notes the signal, survives it to record the code. It notes every
signal a job may be sent that way (``--signal`` without ``B:``: USR1, HUP, ...), all
but KILL, STOP and the fault signals (SEGV, BUS, FPE, ILL, TRAP, SYS, ABRT). SIGKILL ends
both (the agent then knows the code itself).

The job's account, never root, enters the working directory and opens the user's files:
a root wrapper takes the account's ids as its *effective* ones for that (groups, egid,
euid; the kernel then checks the account's permissions, links included, with root's
capabilities gone), and back (the real and saved uid stay 0, so the job cannot signal
or trace it meanwhile); the child inherits the directory and the descriptors and drops
to the account's ids for good before it ``exec``s. A working directory that cannot be
entered leaves the job in the private one the agent started the wrapper in (``run/``),
an output, error or input file that cannot be opened means the job is not started (127:
it fails, as Slurm fails a batch job whose ``--output`` it cannot open, instead of
running with nothing written where its owner looks); each says why in a ``gpufleet:``
line of the job's log.

Output: the wrapper's own stdout and stderr are the attempt's ``output.log`` (what
``gpufleet logs`` shows). Without ``--output``/``--error`` the child writes there
directly. With them, the child's stdout and stderr go into pipes the wrapper reads and
copies both to ``output.log`` and to the user's file (stderr to ``--error`` instead when
that is given and differs), until the child exits; then what is left in the pipes, and
only then EXIT_FILE, so the log is complete once the code is there. Output a process the
shell left behind writes after that is not copied (Slurm ends such processes with the
job). Files are opened for appending (created 0666 less the umask): a requeued job keeps
what its earlier attempts wrote (Slurm truncates unless ``--open-mode=append``).

It starts in a few milliseconds: ``os`` and the builtin ``_signal`` only (``subprocess`` and
``signal`` cost 5.5 ms of imports on every job start; ``select``, 0.2 ms, only for a job
with an output file; ``ctypes``, 3 ms, only without ``--cgroup``: the wrapper then makes
itself the job's subreaper, and once COMMAND exits it SIGKILLs and reaps whatever the job
left behind, detached or not, before it writes EXIT_FILE); the child is a plain ``fork``,
which drops to the job's ids, sets SIGPIPE and SIGXFSZ back to their defaults (Python
ignores them, and an ignored signal stays ignored across ``exec``: ``yes | head`` would
end in EPIPE errors) and ``exec``s COMMAND with the job's environment (127 and a line
when that fails).
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # builtin; ``signal`` imports enum
import os
import sys

OPTIONS = frozenset(
    {
        "--cgroup",
        "--uid",
        "--gid",
        "--groups",
        "--workdir",
        "--submit-dir",
        "--output",
        "--error",
        "--input",
        "--pid-file",
        "--env-file",
    }
)
_UNNOTED = ("SIGKILL", "SIGSTOP", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGTRAP", "SIGSYS", "SIGABRT")
"""Signals the wrapper leaves alone: uncatchable, or faults (a handler that returns
from a real one would run the faulting instruction again, forever)."""
_IGNORED = ("SIGCHLD", "SIGCONT", "SIGURG", "SIGWINCH")
"""Ignored by default already: noting them would only interrupt the wrapper's waits."""


def _write(path: str, value: int) -> None:
    """``value`` into ``path`` atomically, 0600 (the agent's, in the agent's directory)."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, f"{value}\n".encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _say(text: str) -> None:
    """A line for the job's log (the wrapper's stderr is ``output.log``)."""
    try:  # noqa: SIM105  (contextlib costs imports on every job start)
        os.write(2, f"gpufleet: {text}\n".encode(errors="replace"))
    except OSError:
        pass


def _options(argv: list[str]) -> tuple[str, dict[str, str], list[str]] | None:
    if "--" not in argv or argv.index("--") < 1 or argv.index("--") == len(argv) - 1:
        return None
    cut = argv.index("--")
    head, command = argv[:cut], argv[cut + 1 :]
    exit_file, rest = head[0], head[1:]
    if len(rest) % 2:
        return None
    opts = dict(zip(rest[::2], rest[1::2], strict=True))
    if not set(opts) <= OPTIONS or len(opts) != len(rest) // 2:
        return None
    return exit_file, opts, command


def _groups(opts: dict[str, str]) -> list[int]:
    return [int(g) for g in opts.get("--groups", "").split(",") if g]


def _become(opts: dict[str, str]) -> tuple[int, int, list[int]] | None:
    """A root wrapper takes the job account's ids as its effective ones (what it opens or
    enters next is checked by the kernel as the account's); returns what ``_restore``
    needs. The real and saved uid stay root's."""
    if "--uid" not in opts:
        return None
    saved = (os.geteuid(), os.getegid(), os.getgroups())
    try:
        os.setgroups(_groups(opts))
        os.setegid(int(opts["--gid"]))
        os.seteuid(int(opts["--uid"]))
    except OSError:
        _restore(saved)
        raise
    return saved


def _restore(saved: tuple[int, int, list[int]] | None) -> None:
    if saved is not None:
        os.seteuid(saved[0])  # first: root's capabilities back, to set the rest
        os.setegid(saved[1])
        os.setgroups(saved[2])


def _open_out(path: str, flag: str) -> int | None:
    """The user's output file, opened for appending (as the job's account), or None
    and a line saying why (the job is then not started). Not blocking on a FIFO without
    a reader; no controlling tty."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOCTTY | os.O_NONBLOCK, 0o666)
        os.set_blocking(fd, True)
        return fd
    except OSError as exc:
        _say(f"cannot open {flag} {path}: {exc.strerror or exc}: not started")
        return None


def _setup(opts: dict[str, str]) -> tuple[dict[int, tuple[int, str]], int | None] | None:
    """As the job's account: enter its working directory, open its files. Returns
    {stream: (user fd, name)} for the copies of stdout (1) and stderr (2) and the
    descriptor for stdin, or None when ``--input`` cannot be opened."""
    target = opts.get("--workdir") or opts.get("--submit-dir")
    if target:
        try:
            os.chdir(target)
        except OSError as exc:
            what = "working directory (--chdir)" if "--workdir" in opts else "submit directory"
            try:
                here = os.getcwd()
            except OSError:
                here = "the job's private directory"
            _say(f"cannot enter the {what} {target}: {exc.strerror or exc}; running in {here}")
    copies: dict[int, tuple[int, str]] = {}
    out, err = opts.get("--output"), opts.get("--error")
    if out:
        fd = _open_out(out, "--output")
        if fd is None:
            return None
        copies[1] = copies[2] = (fd, out)
    if err and err != out:
        fd = _open_out(err, "--error")
        if fd is None:
            return None
        copies[2] = (fd, err)
    stdin: int | None = None
    if "--input" in opts:
        try:
            stdin = os.open(opts["--input"], os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)
            os.set_blocking(stdin, True)
        except OSError as exc:
            _say(f"cannot open --input {opts['--input']}: {exc.strerror or exc}: not started")
            return None
    return copies, stdin


def _put(fd: int, data: bytes) -> bool:
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError:
        return False
    return True


def _pump(fd: int, route: list[object]) -> bool:
    """Copy one chunk from the pipe ``fd`` to output.log and to the route's user file
    (``[user fd, name]``; fd -1 once writing there failed). False at EOF or when the
    pipe is empty (non-blocking)."""
    try:
        data = os.read(fd, 65536)
    except OSError:  # BlockingIOError: drained; anything else: as good as EOF
        return False
    if not data:
        return False
    _put(1, data)
    user = route[0]
    if isinstance(user, int) and user >= 0 and not _put(user, data):
        _say(f"stopped writing {route[1]}: cannot write there")
        route[0] = -1
    return True


def _copy(pid: int, routes: dict[int, list[object]], wake: int) -> int:
    """The tee: the job's output from the pipes (read end -> route) until the child
    exits (its SIGCHLD wakes the wait through ``wake``), then what is left in them.
    Returns the child's wait status."""
    import select  # a C module, no Python imports: only jobs with an output file pay its 0.2 ms

    poller = select.poll()
    for fd in (*routes, wake):
        poller.register(fd, select.POLLIN)
    live = set(routes)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if not live:  # the job closed its stdout and stderr: wait for it
            _, status = os.waitpid(pid, 0)
            break
        for fd, _ in poller.poll():  # retried on EINTR (PEP 475); a signal also writes to ``wake``
            if fd == wake:  # the signal numbers: read and dropped
                try:
                    while os.read(wake, 512):
                        pass
                except OSError:  # BlockingIOError: all read
                    pass
            elif not _pump(fd, routes[fd]):
                poller.unregister(fd)
                live.discard(fd)
    for fd in live:  # what the shell wrote before it exited (a pipe holds at most 1 MiB), no more
        os.set_blocking(fd, False)
        for _ in range(16):  # 16 reads of 64 KiB: a process left writing cannot keep the job alive
            if not _pump(fd, routes[fd]):
                break
    return status


def _job_env(opts: dict[str, str]) -> dict[bytes, bytes] | None:
    """The job's environment from ``--env-file`` (read as bytes, never applied here: see
    the module's docstring), the file removed; None without the option. A file that
    cannot be read gives an empty environment and a line, not the wrapper's own."""
    name = opts.get("--env-file")
    if name is None:
        return None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            raw = b""
            while chunk := os.read(fd, 1 << 20):
                raw += chunk
        finally:
            os.close(fd)
        os.unlink(name)
    except OSError as exc:
        _say(f"cannot read the job's environment: {exc.strerror or exc}")
        return {}
    env: dict[bytes, bytes] = {}
    for entry in raw.split(b"\0"):
        key, eq, value = entry.partition(b"=")
        if key and eq:
            env[key] = value
    return env


def _subreaper() -> bool:
    """Without a cgroup: become the job's subreaper (``PR_SET_CHILD_SUBREAPER``), so what
    the job detaches (``setsid``, a double fork) is reparented to the wrapper, not to
    init, and ``_end_orphans`` ends it with the job. ``ctypes`` costs 3 ms of imports:
    paid only here, where no cgroup does the job."""
    try:
        import ctypes

        return bool(ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _end_orphans() -> None:
    """SIGKILL every process left under the wrapper (its children, the job's orphans
    reparented to it) and reap them, until none is left (bounded: what they fork
    meanwhile is reparented here too, and ended the next round)."""
    me = os.getpid()
    for _ in range(1000):
        try:
            with open(f"/proc/{me}/task/{me}/children") as f:
                kids = [int(k) for k in f.read().split()]
        except (OSError, ValueError):
            kids = []
        if not kids:
            break
        for kid in kids:
            try:  # noqa: SIM105  (no contextlib: see the module's docstring)
                os.kill(kid, _signal.SIGKILL)
            except OSError:
                pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    while True:  # the zombies left
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                break
        except ChildProcessError:
            break


def _exec(
    command: list[str], opts: dict[str, str], env: dict[bytes, bytes] | None, stdio: dict[int, int]
) -> None:
    """In the forked child: its stdin/stdout/stderr (``stdio``: target -> descriptor),
    become the job's account, then run COMMAND with the job's environment ``env`` (None:
    the wrapper's), looked up in that environment's PATH (``os.execvp`` imports modules,
    which the job's account may not be able to read). Never returns."""
    err: OSError | None = None
    try:
        for target, fd in stdio.items():
            os.dup2(fd, target)
        if "--uid" in opts:
            os.setgroups(_groups(opts))
            os.setgid(int(opts["--gid"]))
            os.setuid(int(opts["--uid"]))
        for sig in (_signal.SIGPIPE, _signal.SIGXFSZ):  # as subprocess's restore_signals
            _signal.signal(sig, _signal.SIG_DFL)
        if env is None:
            path = os.environ.get("PATH", os.defpath).split(os.pathsep)
        else:
            path = os.fsdecode(env.get(b"PATH", os.defpath.encode())).split(os.pathsep)
        environ = os.environ if env is None else env
        for exe in [command[0]] if "/" in command[0] else [os.path.join(d or ".", command[0]) for d in path]:
            try:
                os.execve(exe, command, environ)
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
            "usage: _wrapper.py EXIT_FILE [--cgroup DIR[:DIR...]] [--uid N --gid N --groups A,B] "
            "[--workdir DIR | --submit-dir DIR] [--output F] [--error F] [--input F] "
            "[--pid-file F] [--env-file F] -- COMMAND...",
            file=sys.stderr,
        )
        return 2
    exit_file, opts, command = parsed
    exit_file = os.path.abspath(exit_file)  # before any chdir
    pid_file = os.path.abspath(opts["--pid-file"]) if "--pid-file" in opts else None
    for group in opts.get("--cgroup", "").split(os.pathsep):
        if not group:
            continue
        try:
            with open(os.path.join(group, "cgroup.procs"), "w") as f:
                f.write(f"{os.getpid()}\n")
        except OSError as exc:
            print(f"gpufleet: cannot join cgroup {group}: {exc.strerror}", file=sys.stderr, flush=True)

    def note(_signum: int, _frame: object) -> None:
        """A handler, not SIG_IGN: an ignored signal would be inherited by the child
        (a handled one is reset to its default by exec)."""

    spared = {getattr(_signal, n, 0) for n in (*_UNNOTED, *_IGNORED)}
    for sig in range(1, _signal.NSIG):
        if sig not in spared:
            try:  # noqa: SIM105  (no contextlib: see the module's docstring)
                _signal.signal(sig, note)
            except (OSError, ValueError):  # reserved by the C library (32, 33)
                pass
    sys.stdout.flush()
    sys.stderr.flush()
    reaper = "--cgroup" not in opts and _subreaper()
    env = _job_env(opts)
    try:
        saved = _become(opts)
    except OSError as exc:  # then the child cannot switch either: it says so and exits 127
        _say(f"cannot take the job account's ids: {exc.strerror or exc}")
        prepared: tuple[dict[int, tuple[int, str]], int | None] | None = ({}, None)
    else:
        try:
            prepared = _setup(opts)
        finally:
            _restore(saved)
    if prepared is None:
        _write(exit_file, 127)
        return 127
    copies, stdin = prepared
    stdio = {} if stdin is None else {0: stdin}
    routes: dict[int, list[object]] = {}  # pipe read end -> [user fd, name]
    ends: dict[int, int] = {}  # user fd -> pipe write end
    for stream, (user, name) in copies.items():
        if user not in ends:
            r, ends[user] = os.pipe()
            routes[r] = [user, name]
        stdio[stream] = ends[user]
    wake = -1
    if routes:  # a wake-up for the tee's wait: the child's exit (SIGCHLD) writes to it
        wake, poke = os.pipe()
        os.set_blocking(wake, False)
        os.set_blocking(poke, False)
        _signal.set_wakeup_fd(poke, warn_on_full_buffer=False)
        _signal.signal(_signal.SIGCHLD, note)
    pid = os.fork()
    if pid == 0:
        _exec(command, opts, env, stdio)
    for fd in (*ends.values(), *([] if stdin is None else [stdin])):
        os.close(fd)
    if pid_file is not None:
        try:
            _write(pid_file, pid)
        except OSError as exc:
            _say(f"cannot record the batch shell's pid: {exc.strerror or exc}")
    # waits are retried on EINTR (PEP 475): the noted signals do not end them
    status = _copy(pid, routes, wake) if routes else os.waitpid(pid, 0)[1]
    if reaper:
        _end_orphans()
    code = 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    _write(exit_file, code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
