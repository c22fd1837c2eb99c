"""``srun`` inside an allocation: a job step (issue 31; ``server/services/steps.py`` has
the server's side, ``agent/steps.py`` the nodes').

``srun [OPTIONS] COMMAND [ARGS...]`` in a job (``SLURM_JOB_ID`` set) or with ``--jobid``
posts a step of the job (``POST /v1/jobs/{id}/steps``) with the job's own credential,
follows it (``GET .../steps/{n}?after=N``: its state and its tasks' output), prints that
output on its own stdout (so into the job's output), each line prefixed ``N: `` with
``-l``, and exits with the step's code: 0, or the highest exit code of its tasks.
SIGINT/SIGTERM cancel the step (its tasks are stopped on every node) before srun exits.

Options as Slurm's: ``-n/--ntasks``, ``-N/--nodes`` (``MIN[-MAX]``: MIN), ``--ntasks-per-node``
(``--tasks-per-node``), ``--gpus-per-task``, ``-c/--cpus-per-task``, ``-l/--label``,
``-K/--kill-on-bad-exit``, ``--export`` (``ALL`` by default: srun's environment goes to
the tasks, under what each node sets; ``NONE``; ``ALL,K=V``; ``K1,K2=V``: only these),
``--jobid``, ``--overlap`` (steps always share the job's resources here), ``-o/-e``
(a file instead of srun's stdout/stderr; ``%j`` job, ``%s`` step, ``%t`` task id),
``-J/--job-name``, ``-D/--chdir``. Accepted and without effect (the allocation already
decided them): ``--mpi``, ``--cpu-bind``, ``--gpu-bind``, ``--distribution``, ``--exact``,
``--mem``, ``--gres``, ``--gpus``, ``-u``, ``-t``, ``-p``, ``-A``, ``--exclusive``, ``-v``,
``-W``, ``--unbuffered``, ``--wait``, ``--ntasks-per-gpu``, ``--accel-bind``, ``-Q``.

Outside an allocation srun says so and exits 1: gpufleet's way to run a command on the
cluster is ``gpufleet run``/``gpufleet submit``.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import time
from typing import IO, Any

from gpufleet.slurm._common import SlurmError, connect, run

PROG = "srun"
IGNORED = (
    "--mpi",
    "--cpu-bind",
    "--cpu_bind",
    "--gpu-bind",
    "--distribution",
    "-m",
    "--mem",
    "--mem-per-cpu",
    "--mem-per-gpu",
    "--gres",
    "--gpus",
    "-G",
    "--time",
    "-t",
    "--partition",
    "-p",
    "--account",
    "-A",
    "--wait",
    "-W",
    "--ntasks-per-gpu",
    "--accel-bind",
    "--gpus-per-node",
    "--qos",
    "-q",
    "--constraint",
    "-C",
    "--nodelist",
    "-w",
    "--exclude",
    "-x",
)
IGNORED_FLAGS = ("--exact", "-u", "--unbuffered", "--exclusive", "-v", "--verbose", "-Q", "--quiet")
EXPORT_SKIP = frozenset({"GPUFLEET_TOKEN", "GPUFLEET_ADMIN_TOKEN", "GPUFLEET_AGENT_TOKEN", "_"})
"""Never sent with a step: the credentials (each node sets the job's own) and the shell's ``$_``."""
MAX_VALUE = 65_536
POLL_MIN_S = 0.05
POLL_MAX_S = 0.5


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, add_help=True, allow_abbrev=False)
    p.add_argument("-n", "--ntasks", type=int)
    p.add_argument("-N", "--nodes")
    p.add_argument("--ntasks-per-node", "--tasks-per-node", dest="ntasks_per_node", type=int)
    p.add_argument("--gpus-per-task")
    p.add_argument("-c", "--cpus-per-task", type=int)
    p.add_argument("-l", "--label", action="store_true")
    p.add_argument("-K", "--kill-on-bad-exit", action="store_true")
    p.add_argument("--export")
    p.add_argument("--jobid")
    p.add_argument("--overlap", action="store_true")
    p.add_argument("-o", "--output")
    p.add_argument("-e", "--error")
    p.add_argument("-J", "--job-name")
    p.add_argument("-D", "--chdir")
    for opt in IGNORED:
        p.add_argument(opt, dest=f"ignored_{opt.strip('-').replace('-', '_')}", help=argparse.SUPPRESS)
    for flag in IGNORED_FLAGS:
        p.add_argument(flag, action="store_true", dest=f"flag_{flag.strip('-')}", help=argparse.SUPPRESS)
    p.add_argument("command", nargs=argparse.REMAINDER)
    return p


def _count(raw: str | None, what: str) -> int | None:
    """``N`` or ``MIN-MAX`` (Slurm's ``-N``): the minimum."""
    if raw is None:
        return None
    m = re.fullmatch(r"(\d+)(?:-\d+)?", raw.strip())
    if m is None or int(m[1]) < 1:
        raise SlurmError(f"invalid {what}: {raw!r}")
    return int(m[1])


def _gpus(raw: str | None) -> int | None:
    """``--gpus-per-task=[TYPE:]N``."""
    if raw is None:
        return None
    m = re.fullmatch(r"(?:[^:]+:)?(\d+)", raw.strip())
    if m is None:
        raise SlurmError(f"invalid --gpus-per-task: {raw!r}")
    return int(m[1])


def export_env(spec: str | None, environ: dict[str, str]) -> dict[str, str]:
    """The tasks' environment from srun's (``--export``; see the module docstring)."""
    mine = {
        k: v
        for k, v in environ.items()
        if k not in EXPORT_SKIP and k and "=" not in k and len(k) <= 256 and len(v) <= MAX_VALUE
    }
    if spec is None or spec.strip().upper() == "ALL":
        return _bounded(mine)
    parts = [p for p in spec.split(",") if p]
    if parts and parts[0].upper() == "NONE" and len(parts) == 1:
        return {}
    out: dict[str, str] = {}
    if any(p.upper() == "ALL" for p in parts):
        out.update(mine)
    else:  # only the named ones, and Slurm's own
        out.update({k: v for k, v in mine.items() if k.startswith("SLURM_")})
    for p in parts:
        if p.upper() in ("ALL", "NONE"):
            continue
        key, eq, value = p.partition("=")
        if eq:
            out[key] = value
        elif key in mine:
            out[key] = mine[key]
    return _bounded(out)


def _bounded(env: dict[str, str]) -> dict[str, str]:
    """At most the API's 1024 variables (the rest are dropped, Slurm's own kept first)."""
    if len(env) <= 1024:
        return env
    keys = sorted(env, key=lambda k: (not k.startswith("SLURM_"), k))[:1024]
    return {k: env[k] for k in keys}


class Printer:
    """The tasks' output as it arrives, line by line with ``-l`` (``N: `` before each
    line, the width of the highest task id), into srun's stdout or ``-o`` files."""

    def __init__(
        self, *, label: bool, ntasks: int, files: dict[int, IO[str]] | None, default: IO[str]
    ) -> None:
        self.label = label
        self.width = len(str(max(0, ntasks - 1)))
        self.partial: dict[int, str] = {}
        self.files = files or {}
        self.default = default

    def _out(self, procid: int) -> IO[str]:
        return self.files.get(procid, self.files.get(-1, self.default))

    def add(self, procid: int, data: str) -> None:
        if not self.label:
            self._out(procid).write(data)
            self._out(procid).flush()
            return
        text = self.partial.pop(procid, "") + data
        lines = text.split("\n")
        self.partial[procid] = lines.pop()
        out = self._out(procid)
        for line in lines:
            out.write(f"{procid:>{self.width}}: {line}\n")
        out.flush()

    def close(self) -> None:
        for procid, rest in sorted(self.partial.items()):
            if rest:
                self._out(procid).write(f"{procid:>{self.width}}: {rest}\n")
        self.partial.clear()
        for f in {id(f): f for f in self.files.values()}.values():
            f.close()
        self.default.flush()


def _files(pattern: str | None, *, job: int, step: int, ntasks: int) -> dict[int, IO[str]] | None:
    """``-o``: one file, or one per task with ``%t`` (``%j`` job, ``%s`` step)."""
    if not pattern:
        return None
    base = pattern.replace("%j", str(job)).replace("%s", str(step)).replace("%%", "%")
    if "%t" not in base:
        return {-1: open(base, "a")}
    return {t: open(base.replace("%t", str(t)), "a") for t in range(ntasks)}


def main(argv: list[str]) -> int:
    return run(PROG, lambda: _srun(argv))


def kill_flag(argv: list[str], p: argparse.ArgumentParser) -> tuple[list[str], bool | None]:
    """``-K``/``--kill-on-bad-exit`` take a value only attached (``-K0``,
    ``--kill-on-bad-exit=1``), as in Slurm: ``srun -K python x.py`` runs python. srun's
    options without those forms, and what they said (None: nothing)."""
    out: list[str] = []
    said: bool | None = None
    takes_value = {o for o, a in p._option_string_actions.items() if a.nargs is None}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-") or arg == "--":
            return out + argv[i:], said  # the command
        m = re.fullmatch(r"(?:-K|--kill-on-bad-exit=)([01])", arg)
        if m:
            said = m[1] == "1"
        else:
            out.append(arg)
            if arg in takes_value and i + 1 < len(argv):
                out.append(argv[i + 1])  # its value
                i += 1
        i += 1
    return out, said


def _srun(argv: list[str]) -> int:
    p = parser()
    argv, kill = kill_flag(argv, p)
    args = p.parse_args(argv)
    if kill is not None:
        args.kill_on_bad_exit = kill
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise SlurmError("no command to run")
    raw_job = args.jobid or os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID")
    if not raw_job:
        raise SlurmError("no job allocation: run srun inside a job (sbatch, gpufleet submit) or use --jobid")
    job = _count(raw_job.split(".")[0].split("_")[0], "--jobid")
    body: dict[str, Any] = {
        "command": command,
        "env": export_env(args.export, dict(os.environ)),
        "workdir": os.path.abspath(args.chdir) if args.chdir else os.getcwd(),
        "kill_on_bad_exit": bool(args.kill_on_bad_exit),
        "overlap": bool(args.overlap),
    }
    nodes = _count(args.nodes, "--nodes")
    gpus = _gpus(args.gpus_per_task)
    for key, value in (
        ("ntasks", args.ntasks),
        ("nodes", nodes),
        ("ntasks_per_node", args.ntasks_per_node),
        ("gpus_per_task", gpus),
        ("cpus_per_task", args.cpus_per_task),
        ("name", args.job_name),
    ):
        if value is not None:
            body[key] = value
    if args.ntasks is None and nodes is None and args.ntasks_per_node is None:
        inherited = os.environ.get("SLURM_NTASKS")  # Slurm: the job's task count
        if inherited and inherited.isdigit() and int(inherited) > 0 and args.jobid is None:
            body["ntasks"] = int(inherited)
    with connect() as client:
        step = client.request("POST", f"/jobs/{job}/steps", json=body)
        return _follow(client, step, args)


def _follow(client: Any, step: dict[str, Any], args: argparse.Namespace) -> int:
    job, number = int(step["job_id"]), int(step["step"])
    stop: list[int] = []

    def interrupted(signum: int, _frame: object) -> None:
        stop.append(signum)

    old = {sig: signal.signal(sig, interrupted) for sig in (signal.SIGINT, signal.SIGTERM)}
    printer = Printer(
        label=bool(args.label),
        ntasks=int(step["ntasks"]),
        files=_files(args.output, job=job, step=number, ntasks=int(step["ntasks"])),
        default=sys.stdout,
    )
    after, pause, cancelled, state = 0, POLL_MIN_S, False, step
    try:
        while True:
            if stop and not cancelled:
                cancelled = True
                sys.stderr.write(f"srun: interrupted: cancelling step {job}.{number}\n")
                client.request("POST", f"/jobs/{job}/steps/{number}/cancel")
            state = client.request("GET", f"/jobs/{job}/steps/{number}", params={"after": after})
            for chunk in state["output"]:
                printer.add(int(chunk["procid"]), str(chunk["data"]))
                after = int(chunk["id"])
            if state["output"]:
                pause = POLL_MIN_S
                continue  # more may be waiting (an answer holds at most 1 MiB)
            if state["state"] != "RUNNING":
                break
            time.sleep(pause)
            pause = min(POLL_MAX_S, pause * 1.5)
    finally:
        printer.close()
        for sig, handler in old.items():
            signal.signal(sig, handler)
    return _verdict(state, cancelled)


def _verdict(state: dict[str, Any], cancelled: bool) -> int:
    """Slurm's lines for tasks that failed, and srun's exit code."""
    for t in state.get("tasks", []):
        code = t.get("exit_code")
        if code not in (None, 0):
            what = f"Killed by signal {code - 128}" if code > 128 else f"Exited with exit code {code}"
            sys.stderr.write(f"srun: error: {t['node']}: task {t['procid']}: {what}\n")
    if state["state"] == "COMPLETED":
        return 0
    if state["state"] == "CANCELLED":
        sys.stderr.write(f"srun: error: step {state['id']} cancelled\n")
        code = state.get("exit_code")
        return int(code) if code else (130 if cancelled else 1)
    code = state.get("exit_code")
    return int(code) if code else 1
