"""What ``gpufleet submit`` and ``gpufleet run`` share: their job flags (the names of
sbatch's options, read by the same ``slurmvalues.apply`` as a script's directives), a script
read from disk, and the API's submission built from both.

The command line wins over ``#SBATCH`` directives, as in Slurm. Some options need the
server to be honoured exactly, and are resolved here before the submit:

- ``-A/--account``: the team of that name, when it is one of yours (admins: any team);
- ``--reservation``: an id, or the name of a reservation you may see;

The server resolves the rest, as slurmctld does: the default pool of a job without
``-p`` (``admin create-pool --default``), the first of a pool list that can run it,
``--exclusive`` (every GPU, CPU and memory of its nodes) and ``--mem=0``. A job that
counts no GPUs gets none (Slurm's "no GPUs unless asked").

``--export`` (Slurm's default ``ALL``) sends the submitter's environment, less what must
not or cannot travel: see :func:`export_env`.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from gpufleet.cli import gpufleet_directives, sbatch, slurmflags, slurmvalues
from gpufleet.cli.options import flag

if TYPE_CHECKING:
    from gpufleet.client import GpufleetClient

F = TypeVar("F", bound=Callable[..., Any])


# -- the flags ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobFlag:
    directive: str | None
    """The sbatch option it is (None: gpufleet's own)."""
    annotation: Any
    option: Any


def _opt(directive: str | None, *names: str, help: str, annotation: Any = str | None) -> JobFlag:
    return JobFlag(directive, annotation, typer.Option(None, *names, help=help, show_default=False))


JOB_FLAGS: dict[str, JobFlag] = {
    "gpus": _opt("gpus", "--gpus", "-G", help="GPUs in all, or TYPE:N (default none, as in Slurm)."),
    "gpus_per_task": _opt("gpus-per-task", "--gpus-per-task", help="GPUs for each task (x --ntasks)."),
    "gpus_per_node": _opt("gpus-per-node", "--gpus-per-node", help="GPUs on each node, or TYPE:N."),
    "gres": _opt("gres", "--gres", help="gpu[:TYPE]:N: GPUs on each node, as Slurm's --gres."),
    "nodes": _opt("nodes", "--nodes", "-N", help="Nodes (N, or MIN-MAX: the fewest)."),
    "gpu_type": _opt(None, "--gpu-type", help="A GPU model (H100 matches H100-80GB)."),
    "mig": _opt(None, "--mig", help="MIG slices instead of GPUs: PROFILE[:N] on one node, e.g. 1g.10gb:2."),
    "gpu_memory": _opt(
        None,
        "--gpu-memory",
        help="Memory each GPU needs (10G): the smallest MIG slice, GPU share or GPU that has it.",
    ),
    "gpu_fraction": _opt(
        None,
        "--gpu-fraction",
        help="Part of one shared GPU (0.25): that share of its compute and memory, enforced by MPS.",
    ),
    "cuda": _opt(
        None,
        "--cuda",
        help="The CUDA version it needs (12.4): only nodes whose driver supports it.",
    ),
    "constraint": _opt(
        "constraint",
        "--constraint",
        "-C",
        help="Node features: ib, 'a100&ib', 'a|b', '[r1|r2]' (GPU models too).",
    ),
    "exclude": _opt("exclude", "--exclude", "-x", help="Nodes it never runs on: gpu01,gpu[03-05]."),
    "qos": _opt("qos", "--qos", "-q", help="Its QOS (gpufleet admin qos list; default: the default QOS)."),
    "licenses": _opt("licenses", "--licenses", "-L", help="NAME[:N],...: licenses it holds while it runs."),
    "ntasks": _opt("ntasks", "--ntasks", "-n", help="Tasks in all (CPUs: tasks x --cpus-per-task)."),
    "ntasks_per_node": _opt(
        "ntasks-per-node", "--ntasks-per-node", "--tasks-per-node", help="Tasks on each node."
    ),
    "cpus_per_task": _opt("cpus-per-task", "--cpus-per-task", "-c", help="CPUs for each task."),
    "mem": _opt("mem", "--mem", help="Memory per node: 16G, 512M, 16000 (MB)."),
    "mem_per_cpu": _opt("mem-per-cpu", "--mem-per-cpu", help="Memory per CPU."),
    "mem_per_gpu": _opt("mem-per-gpu", "--mem-per-gpu", help="Memory per GPU."),
    "time_limit": _opt("time", "--time", "-t", help="2h, 90m, D-HH:MM:SS, UNLIMITED; bare = minutes."),
    "name": _opt("job-name", "--name", "--job-name", "-J", help="The job's name (default: the script's)."),
    "pool": _opt(
        "partition",
        "--pool",
        "--partition",
        "-p",
        help="The pool, or a,b: the first that can run it (default: the operator's default pool).",
    ),
    "team": _opt(None, "--team", help="Charge this team (default: your default team)."),
    "account": _opt("account", "--account", "-A", help="Slurm's account: one of your teams."),
    "array": _opt("array", "--array", "-a", help="A job array: 0-15, 0,6,16-32, 0-15:4, 0-99%10."),
    "dependency": _opt(
        "dependency", "--dependency", "-d", help="afterok:ID[:ID...], afterany:..., singleton."
    ),
    "kill_on_invalid_dep": _opt(
        "kill-on-invalid-dep",
        "--kill-on-invalid-dep",
        help="yes: cancel it once its dependency can never hold.",
    ),
    "output": _opt("output", "--output", "-o", help="stdout file; %j %A %a %x %u %N are filled in."),
    "error": _opt("error", "--error", "-e", help="stderr file (default: with stdout)."),
    "input": _opt("input", "--input", "-i", help="stdin file."),
    "chdir": _opt("chdir", "--chdir", "-D", help="Working directory (default: where you submit)."),
    "begin": _opt("begin", "--begin", "-b", help="Not before: now+1hour, 16:00, tomorrow, 2026-12-05T16:00."),
    "deadline": _opt("deadline", "--deadline", help="Cancelled once it can no longer end by then."),
    "signal": _opt(
        "signal",
        "--signal",
        help="[B:]SIG[@SECONDS]: sent that long before the time limit, and before a preemption "
        "(which waits SECONDS, up to the server's --max-preempt-grace).",
    ),
    "checkpoint_every": _opt(
        None,
        "--checkpoint-every",
        help="How often it saves its state (30m): a preemption prefers jobs that just checkpointed. "
        "In a script: #GPUFLEET --checkpoint-every 30m.",
    ),
    "export": _opt("export", "--export", help="ALL (default), NONE, or [ALL,]VAR[=value],..."),
    "nice": _opt("nice", "--nice", help="Lower the priority by N (negative: operators)."),
    "priority": _opt("priority", "--priority", help="Priority -1000..1000 (above 0: operators)."),
    "reservation": _opt(
        "reservation", "--reservation", help="Run only inside this reservation (id or name)."
    ),
    "max_price": _opt("max-price", "--max-price", help="Wait until a GPU-hour costs at most this."),
    "image": _opt(None, "--image", help="Run in this container image."),
    "mail_type": _opt("mail-type", "--mail-type", help="Accepted; gpufleet sends no mail."),
    "mail_user": _opt("mail-user", "--mail-user", help="Accepted; gpufleet sends no mail."),
    "comment": _opt("comment", "--comment", help="Accepted and not kept."),
    "wait_all_nodes": _opt(
        "wait-all-nodes", "--wait-all-nodes", help="Accepted: a job's nodes always start together here."
    ),
    "hint": _opt("hint", "--hint", help="Accepted: CPUs are counted, not bound to cores or threads, here."),
    "requeue": JobFlag(
        "requeue",
        bool | None,
        flag(
            "--requeue/--no-requeue",
            default=None,
            help="Run again after a node or GPU failure (default: yes).",
            show_default=False,
        ),
    ),
    "exclusive": JobFlag(
        "exclusive", bool, flag("--exclusive", help="Whole nodes: every GPU, CPU and memory of each.")
    ),
    "hold": JobFlag(
        "hold", bool, flag("--hold", "-H", help="Submit it held: it waits until `gpufleet release`.")
    ),
    "overcommit": JobFlag(
        "overcommit",
        bool,
        flag("--overcommit", "-O", help="Accepted: a job runs as many processes as it starts here."),
    ),
    "get_user_env": JobFlag(
        "get-user-env",
        bool,
        flag("--get-user-env", help="Accepted: a job runs in its owner's login identity (HOME, USER)."),
    ),
    "max_attempts": JobFlag(
        None, int, typer.Option(5, "--max-attempts", min=1, help="Attempts in all, the first included.")
    ),
    "requeue_backoff": JobFlag(
        None,
        str,
        typer.Option(
            "10s", "--requeue-backoff", help="Delay before the 2nd requeue, doubling (the 1st is immediate)."
        ),
    ),
    "ignore_unsupported": JobFlag(
        None,
        bool,
        flag(
            "--ignore-unsupported",
            help="Submit anyway without the #SBATCH directives gpufleet cannot honour.",
        ),
    ),
}
"""``gpufleet submit``'s and ``gpufleet run``'s flags, in the order their help lists them."""


def with_job_flags(command: F) -> F:
    """Give ``command`` every :data:`JOB_FLAGS` flag, after its arguments and before its
    own options. Typer reads a command's options from its signature: ``submit`` and
    ``run`` take ``**flags`` and share one list instead of two copies of forty options."""
    sig = inspect.signature(command, eval_str=True)
    params = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
    shared = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=f.option, annotation=f.annotation)
        for name, f in JOB_FLAGS.items()
    ]
    arguments = [p for p in params if isinstance(p.default, typer.models.ArgumentInfo)]
    own = [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
        for p in params
        if not isinstance(p.default, typer.models.ArgumentInfo)
    ]
    command.__signature__ = sig.replace(parameters=[*arguments, *shared, *own])  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in (*params, *shared)} | {"return": None}
    return command


# -- options from the script and the flags --------------------------------------------------------


def from_flags(
    opts: slurmflags.SbatchOptions, flags: Mapping[str, Any], *, now: float
) -> slurmflags.SbatchOptions:
    """``opts`` (a script's) with the command line's flags applied over them, as Slurm
    does: a flag replaces the directive of the same option, and the problem it had. Each
    flag gpufleet will not take is a Problem (with the same words as the directive's)."""
    given: list[tuple[str, Any]] = []
    for name, f in JOB_FLAGS.items():
        value = flags.get(name)
        if f.directive is None or value is None:
            continue
        if name == "requeue":  # --requeue/--no-requeue
            given.append(("requeue" if value else "no-requeue", None))
        elif value is True:  # --exclusive, --hold
            given.append((f.directive, None))
        elif value is not False:
            given.append((f.directive, value))
    replaced = {d for d, _ in given}
    if replaced & {"requeue", "no-requeue"}:
        replaced |= {"requeue", "no-requeue"}
    for directive in replaced:
        opts = slurmflags.forget(opts, directive)
    problems = [p for p in opts.problems if p.option not in replaced]
    origins = [(o, w) for o, w in opts.origins if o not in replaced]
    for directive, value in given:
        said = f"--{directive}" + ("" if value is None else f"={value}")
        try:
            opts = slurmvalues.apply(opts, directive, value, now=now)
        except slurmflags.Refused as exc:
            problems.append(sbatch.Problem(where="", text=sbatch.refusal(said, str(exc)), refused=True))
        except ValueError as exc:
            problems.append(sbatch.Problem(where="", text=str(exc), refused=False))
        else:
            origins.append((directive, said))
    if flags.get("gpu_type"):
        opts = replace(opts, gpu_type=flags["gpu_type"])
    if flags.get("mig"):
        try:
            profile, count = slurmvalues.mig_slices(flags["mig"])
        except ValueError as exc:
            problems.append(sbatch.Problem(where="", text=str(exc), refused=False))
        else:
            opts = replace(opts, gpu_type=profile, gpus=count, gpus_per_node=None, nodes=1)
    if flags.get("gpu_fraction"):
        try:
            fraction = float(flags["gpu_fraction"])
            if not 0 < fraction < 1:
                raise ValueError
        except ValueError:
            text = f"--gpu-fraction {flags['gpu_fraction']}: a part of one GPU, above 0 and below 1 (0.25)"
            problems.append(sbatch.Problem(where="", text=text, refused=False))
    return replace(opts, problems=tuple(problems), origins=tuple(origins))


SCRIPT_SUFFIXES = (".sh", ".bash", ".sbatch", ".slurm", ".batch", ".job")


@dataclass(frozen=True, slots=True, kw_only=True)
class Script:
    path: Path
    text: str


class NoScript(Exception):
    """A script that was named but cannot be read; the message says which and why."""


def script_of(args: list[str]) -> Script | None:
    """The batch script ``args`` name (``submit job.sh [ARGS]``), or None for a command.
    A file that starts with ``#!`` or holds ``#SBATCH`` is a script; a name that looks
    like one (``*.sh``, ``./run``) but cannot be read is refused here (:class:`NoScript`),
    not queued to fail on a node with 127. Any other word is a command for the node."""
    if not args:
        return None
    path = Path(args[0])
    looks = path.suffix in SCRIPT_SUFFIXES or (not path.is_absolute() and "/" in args[0])
    if not path.exists():
        if looks:
            raise NoScript(f"no script {args[0]} (no such file here)")
        return None
    if not path.is_file():
        if looks:
            raise NoScript(f"{args[0]} is not a file")
        return None
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        if looks:
            raise NoScript(f"cannot read script {args[0]}: {exc}") from None
        return None
    if not (text.startswith("#!") or "#SBATCH" in text or path.suffix in SCRIPT_SUFFIXES):
        return None
    return Script(path=path, text=text)


# -- the submission -------------------------------------------------------------------------------

_IDENTITY = frozenset({"HOME", "USER", "LOGNAME", "SHELL", "MAIL"})
_SESSION = frozenset(
    {
        "SSH_AUTH_SOCK",
        "SSH_AGENT_PID",
        "SSH_CONNECTION",
        "SSH_CLIENT",
        "SSH_TTY",
        "DISPLAY",
        "XAUTHORITY",
        "DBUS_SESSION_BUS_ADDRESS",
        "XDG_RUNTIME_DIR",
        "XDG_SESSION_ID",
        "KRB5CCNAME",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
    }
)
_SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL")
MAX_ENV_VALUE = 65_536
"""The API's limit on one variable's value; a longer one stays behind (with a warning)."""


def exported(name: str) -> bool:
    """Whether ``--export=ALL`` sends variable ``name``: not gpufleet's own (``GPUFLEET_*``:
    the token, the server), nor what looks like a secret (a name containing TOKEN,
    SECRET, PASSWORD, PASSWD, KEY or CREDENTIAL), nor this login session's (SSH agent,
    X display, D-Bus, Kerberos cache, PWD), nor Slurm's (``SLURM_*``, which the node sets
    for the job), nor the identity the node's account gives the job (HOME, USER,
    LOGNAME, SHELL, MAIL)."""
    upper = name.upper()
    if upper.startswith(("GPUFLEET_", "SLURM_")) or name in _SESSION or name in _IDENTITY:
        return False
    return not any(word in upper for word in _SECRET_WORDS)


def export_env(spec: str | None, environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """(the job's ``env``, warnings) for ``--export=spec``: ``ALL`` (the default) sends
    :func:`exported` variables; ``NONE``/``NIL`` nothing; ``VAR`` (its value here, if set)
    and ``VAR=value`` are sent as named, secrets too (you named them), only ``ALL`` among
    them adds the rest. ``GPUFLEET_*`` never leaves."""
    items = (spec or "ALL").split(",")
    env: dict[str, str] = {}
    if "ALL" in items:
        env = {k: v for k, v in environ.items() if exported(k)}
    for item in items:
        name, eq, value = item.partition("=")
        if name in ("ALL", "NONE", "NIL") or name.upper().startswith("GPUFLEET_"):
            continue
        if eq:
            env[name] = value
        elif name in environ:
            env[name] = environ[name]
    warnings = [
        f"--export: {name} not sent (longer than {MAX_ENV_VALUE} characters)"
        for name, value in env.items()
        if len(value) > MAX_ENV_VALUE
    ]
    return {k: v for k, v in env.items() if len(v) <= MAX_ENV_VALUE}, warnings


class Unhonoured(Exception):
    """An option gpufleet could not honour once it asked the server (see the module
    docstring); ``refused`` as ``sbatch.Problem``."""

    def __init__(self, message: str, *, refused: bool = True) -> None:
        super().__init__(message)
        self.refused = refused


def where_given(opts: slurmflags.SbatchOptions, directive: str, value: object) -> str:
    """How to name an option in a problem: its script line if it came from one (and the
    command line did not override it), else ``--directive=value``."""
    said = f"--{directive}" + ("" if value in (None, True) else f"={value}")
    for name, where in opts.origins:
        if name == directive:
            return where
    return said


def job_spec(
    c: GpufleetClient,
    opts: slurmflags.SbatchOptions,
    command: list[str],
    flags: Mapping[str, Any],
    *,
    environ: Mapping[str, str],
    cwd: str,
) -> tuple[dict[str, Any], list[str]]:
    """(the ``POST /v1/jobs`` body, warnings). Asks the server only for what an option
    needs (see the module docstring). Raises :class:`Unhonoured`."""
    env, warnings = export_env(opts.export, environ)
    spec: dict[str, Any] = {
        "command": command,
        "name": opts.name or "",
        "pool": opts.pool or "",
        "env": env,
        "submit_dir": cwd,
        "requeue": True if opts.requeue is None else opts.requeue,
        "hold": bool(opts.hold),
        "max_attempts": flags.get("max_attempts", 5),
        "requeue_backoff": flags.get("requeue_backoff", "10s"),
    }
    ignore = bool(flags.get("ignore_unsupported"))
    spec["gpus"] = slurmflags.total_gpus(opts)
    spec |= {"gpus_per_node": slurmflags.gpus_per_node(opts) or 0, "nodes": opts.nodes or 0}
    if opts.exclusive:
        spec["exclusive"] = True
    if opts.exclude:
        spec["exclude"] = list(opts.exclude)
    if opts.licenses:
        spec["licenses"] = dict(opts.licenses)
    if opts.time_limit_s is not None and opts.time_limit_s != slurmflags.UNLIMITED:
        spec["time_limit"] = opts.time_limit_s
    if opts.chdir is not None:
        spec["workdir"] = os.path.join(cwd, opts.chdir)
    priority = (opts.priority or 0) - (opts.nice or 0)
    if not -1000 <= priority <= 1000:
        raise Unhonoured(f"--priority less --nice is {priority}: keep it within -1000..1000", refused=False)
    if priority:
        spec["priority"] = priority
    spec |= {k: getattr(opts, k) for k in _SAME if getattr(opts, k) is not None}
    for key in ("image", "team", "gpu_memory", "cuda"):  # cuda: checked by the server (a 422 says why)
        if flags.get(key):
            spec[key] = flags[key]
    if flags.get("gpu_fraction"):
        spec["gpu_fraction"] = float(flags["gpu_fraction"])
    every = flags.get("checkpoint_every") or opts.checkpoint_every
    if every:
        try:
            spec["checkpoint_every"] = gpufleet_directives.checkpoint_every(every)
        except ValueError as exc:
            raise Unhonoured(str(exc), refused=False) from None
    if opts.account is not None and "team" not in spec:
        with _unless(ignore, warnings):
            spec["team"] = _team_of_account(c, opts)
    if opts.reservation is not None:
        spec["reservation"] = _reservation_id(c, opts)
    return spec, warnings


_SAME = (
    "gpu_type",
    "output",
    "error",
    "input",
    "array",
    "dependency",
    "kill_on_invalid_dep",
    "begin",
    "deadline",
    "signal",
    "cpus_per_task",
    "ntasks",
    "ntasks_per_node",
    "mem",
    "mem_per_cpu",
    "mem_per_gpu",
    "max_price",
    "constraint",
    "qos",
)
"""Options that are the API's field of the same name, as they are."""


@contextlib.contextmanager
def _unless(ignore: bool, warnings: list[str]) -> Iterator[None]:
    """An option refused inside the block is a warning with ``--ignore-unsupported``
    (the job goes in without it), else the :class:`Unhonoured` it was."""
    try:
        yield
    except Unhonoured as exc:
        if not (ignore and exc.refused):
            raise
        warnings.append(f"{exc} (ignored: --ignore-unsupported)")


def _team_of_account(c: GpufleetClient, opts: slurmflags.SbatchOptions) -> str:
    me = c.whoami()
    account = opts.account
    assert account is not None
    if account in me.teams or me.role == "admin":
        return account
    where = where_given(opts, "account", account)
    teams = ", ".join(me.teams) or "none"
    raise Unhonoured(
        sbatch.refusal(where, f"{account} is not one of your teams ({teams}); use -A TEAM or --team TEAM")
    )


def _reservation_id(c: GpufleetClient, opts: slurmflags.SbatchOptions) -> int:
    wanted = opts.reservation
    assert wanted is not None
    if wanted.isdigit():
        return int(wanted)
    for r in c.reservations():
        if r.name == wanted:
            return r.id
    raise Unhonoured(
        f"{where_given(opts, 'reservation', wanted)}: no reservation {wanted} (gpufleet reservation list)",
        refused=False,
    )


__all__ = [
    "JOB_FLAGS",
    "NoScript",
    "Script",
    "Unhonoured",
    "export_env",
    "exported",
    "from_flags",
    "job_spec",
    "script_of",
    "where_given",
    "with_job_flags",
]
