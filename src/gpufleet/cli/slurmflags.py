"""Every option of ``sbatch(1)`` and what gpufleet makes of it, in one table
(:data:`OPTIONS`), each of one kind:

- **honoured**: mapped to the API with its exact meaning (``--gres=gpu:N`` is per node,
  ``--gpus`` the total, as in Slurm; ``--time=90`` is minutes, ``UNLIMITED`` no limit);
- **harmless**: accepted, nothing to do (``--mail-type``, ``--comment``, accounting knobs);
- **refused**: gpufleet cannot give it its meaning; :class:`Refused` says why and what
  to do.

An option on none of the lists is refused too. :func:`apply` reads one option, whether
a script's directive (``sbatch.parse_script``) or ``gpufleet submit``'s flag of the same
name (``batch.from_flags``), so a bad value reads the same in both
(``--time=soon: cannot read duration ...``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from gpufleet.arrayspec import parse_array
from gpufleet.cli.localtime import parse_slurm_time
from gpufleet.migindex import PROFILE_NAME
from gpufleet.slurmopts import parse_mem, parse_signal
from gpufleet.timefmt import parse_duration

if TYPE_CHECKING:
    from gpufleet.cli.sbatch import Problem

UNLIMITED = math.inf
"""``time_limit_s`` of ``--time=UNLIMITED`` (or ``infinite``, or ``0``): no limit."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SbatchOptions:
    """What a script (and the command line) asks for; None = not given."""

    gpus: int | None = None
    gpus_per_node: int | None = None
    nodes: int | None = None
    gpu_type: str | None = None
    gpu_type_by: str | None = None
    """The option that set ``gpu_type`` (``gres``, ``gpus``, ``constraint``...): a flag
    that replaces it on the command line takes its GPU model with it, as Slurm replaces
    the whole option."""
    gpus_per_task: int | None = None
    exclude: tuple[str, ...] | None = None
    constraint: str | None = None  # canonical (gpufleet.constraint)
    qos: str | None = None
    licenses: tuple[tuple[str, int], ...] | None = None
    time_limit_s: float | None = None  # UNLIMITED: no limit
    name: str | None = None
    pool: str | None = None
    output: str | None = None
    error: str | None = None
    input: str | None = None
    chdir: str | None = None
    array: str | None = None  # canonical (arrayspec)
    dependency: str | None = None
    kill_on_invalid_dep: bool | None = None
    begin: float | None = None  # epoch seconds
    deadline: float | None = None
    signal: str | None = None  # canonical (slurmopts.parse_signal)
    requeue: bool | None = None
    hold: bool | None = None
    export: str | None = None
    nice: int | None = None
    reservation: str | None = None
    exclusive: bool | None = None
    account: str | None = None
    priority: int | None = None
    max_price: float | None = None
    ntasks: int | None = None
    ntasks_per_node: int | None = None
    cpus_per_task: int | None = None
    mem: int | None = None  # MiB per node
    mem_per_cpu: int | None = None
    mem_per_gpu: int | None = None
    problems: tuple[Problem, ...] = field(default=())
    origins: tuple[tuple[str, str], ...] = field(default=())
    """(option, where it was given: ``job.sh line 4: #SBATCH --dependency=afterok:9``)
    for every option taken from a script: the server's word on a value names the line."""


# -- the options -------------------------------------------------------------------------------

Kind = Literal["honoured", "harmless", "refused"]
Arg = Literal["required", "none", "optional"]


@dataclass(frozen=True, slots=True)
class Option:
    """How gpufleet takes one option of ``sbatch(1)``."""

    kind: Kind
    arg: Arg = "required"
    why: str = ""
    """A refused option: why gpufleet cannot honour it, then ``; `` and what to do."""


def _refused(why: str, arg: Arg = "required") -> Option:
    return Option("refused", arg, why)


_H, _OK = Option("honoured"), Option("harmless")
_NO_PLACEMENT = "gpufleet places jobs itself; use -p POOL, -C FEATURE or --exclude NODES to steer it"
_NO_CORES = "gpufleet counts CPUs per task and per node, not sockets, cores or threads; use -c N"
OPTIONS: dict[str, Option] = {
    # honoured: each becomes an API field with the same meaning
    "job-name": _H,
    "partition": _H,
    "nodes": _H,
    "ntasks": _H,
    "ntasks-per-node": _H,
    "tasks-per-node": _H,  # sbatch's own alias of --ntasks-per-node
    "gpus-per-task": _H,
    "exclude": _H,
    "qos": _H,
    "licenses": _H,
    "cpus-per-task": _H,
    "mem": _H,
    "mem-per-cpu": _H,
    "mem-per-gpu": _H,
    "gpus": _H,
    "gpus-per-node": _H,
    "gres": _H,
    "constraint": _H,
    "time": _H,
    "output": _H,
    "error": _H,
    "input": _H,
    "chdir": _H,
    "array": _H,
    "dependency": _H,
    "kill-on-invalid-dep": _H,
    "begin": _H,
    "deadline": _H,
    "signal": _H,
    "requeue": Option("honoured", "none"),
    "no-requeue": Option("honoured", "none"),
    "hold": Option("honoured", "none"),
    "export": _H,
    "nice": Option("honoured", "optional"),
    "reservation": _H,
    "exclusive": Option("honoured", "optional"),
    "account": _H,
    "priority": _H,
    "max-price": _H,
    # harmless: nothing to do here
    "mail-type": _OK,
    "mail-user": _OK,
    "comment": _OK,
    "parsable": Option("harmless", "none"),
    "quiet": Option("harmless", "none"),
    "verbose": Option("harmless", "none"),
    "ignore-pbs": Option("harmless", "none"),
    "wckey": _OK,
    "acctg-freq": _OK,
    "profile": _OK,
    "wait-all-nodes": _OK,  # 0 or 1: a job's nodes all start together here, so it waits anyway
    "hint": _OK,  # nomultithread and the like: CPUs are counted, not bound, here
    "overcommit": Option("harmless", "none"),  # a job's tasks run as many as it starts
    "get-user-env": Option("harmless", "optional"),  # the job gets the owner's login identity
    "open-mode": _H,  # append is what the agent does; truncate is refused (``_open_mode``)
    # refused: gpufleet cannot give them their meaning
    "nodelist": _refused(f"no job is pinned to named nodes; {_NO_PLACEMENT}"),
    "nodefile": _refused(f"no job is pinned to named nodes; {_NO_PLACEMENT}"),
    "switches": _refused("placement keeps a multi-node job in one leaf when it can; remove it"),
    "clusters": _refused("one gpufleet server is one cluster; remove it"),
    "cluster-constraint": _refused("one gpufleet server is one cluster; remove it"),
    "wait": _refused("sbatch returns once the job is in; use `gpufleet run` to wait for it", "none"),
    "wrap": _refused("a script holds its command; give one after --: gpufleet submit -- COMMAND"),
    "test-only": _refused("gpufleet has no dry run; remove it", "none"),
    "sockets-per-node": _refused(_NO_CORES),
    "cores-per-socket": _refused(_NO_CORES),
    "threads-per-core": _refused(_NO_CORES),
    "extra-node-info": _refused(_NO_CORES),
    "ntasks-per-core": _refused(_NO_CORES),
    "ntasks-per-socket": _refused(_NO_CORES),
    "ntasks-per-gpu": _refused("tasks are per node here; use --ntasks-per-node"),
    "core-spec": _refused(_NO_CORES),
    "thread-spec": _refused(_NO_CORES),
    "mincpus": _refused("CPUs are counted per task here; use -c/--cpus-per-task"),
    "cpus-per-gpu": _refused("CPUs are counted per task here; use -c/--cpus-per-task"),
    "gpus-per-socket": _refused("GPUs are counted per job or per node here; use --gpus or --gpus-per-node"),
    "gpu-bind": _refused("a job sees exactly its GPUs (CUDA_VISIBLE_DEVICES); remove it"),
    "cpu-bind": _refused("no CPU binding here; remove it"),
    "mem-bind": _refused("no memory binding here; remove it"),
    "distribution": _refused("no task distribution here; remove it"),
    "cpu-freq": _refused("no CPU frequency control here; remove it"),
    "gpu-freq": _refused("no GPU frequency control here; remove it"),
    "oversubscribe": _refused("GPUs are never shared between jobs; remove it", "none"),
    "no-kill": _refused(
        "a failed node requeues the job or fails it; choose with --requeue/--no-requeue", "optional"
    ),
    "tmp": _refused("no local-disk requests here; remove it"),
    "time-min": _refused("a job's limit is its --time; remove it"),
    "use-min-nodes": _refused("a job gets the fewest of -N MIN-MAX already; remove it", "none"),
    "contiguous": _refused(f"{_NO_PLACEMENT}", "none"),
    "spread-job": _refused(f"{_NO_PLACEMENT}", "none"),
    "prefer": _refused("constraints are never soft here; use -C, or remove it"),
    "export-file": _refused("no environment files here; use --export=VAR=value,..."),
    "propagate": _refused("limits are not carried to the nodes; remove it", "optional"),
    "uid": _refused("a job runs as its owner's account; remove it"),
    "gid": _refused("a job runs as its owner's account; remove it"),
    "mcs-label": _refused("gpufleet has no MCS labels; remove it"),
    "network": _refused("no network requests here; remove it"),
    "reboot": _refused("nodes are not rebooted for a job; remove it", "none"),
    "delay-boot": _refused("nodes are not rebooted for a job; remove it"),
    "power": _refused("no power requests here; remove it"),
    "container": _refused("no OCI bundles here; use gpufleet submit --image IMAGE"),
    "container-id": _refused("no OCI bundles here; use gpufleet submit --image IMAGE"),
    "bb": _refused("gpufleet has no burst buffers; remove it"),
    "bbf": _refused("gpufleet has no burst buffers; remove it"),
    "batch": _refused(f"{_NO_PLACEMENT}"),
    "x11": _refused("no X11 forwarding here; remove it", "optional"),
    "resv-ports": _refused("no reserved ports here (MASTER_PORT is set); remove it", "optional"),
}
SHORT: dict[str, str] = {
    "a": "array",
    "A": "account",
    "b": "begin",
    "B": "extra-node-info",
    "c": "cpus-per-task",
    "C": "constraint",
    "d": "dependency",
    "D": "chdir",
    "e": "error",
    "F": "nodefile",
    "G": "gpus",
    "H": "hold",
    "i": "input",
    "J": "job-name",
    "k": "no-kill",
    "L": "licenses",
    "m": "distribution",
    "M": "clusters",
    "n": "ntasks",
    "N": "nodes",
    "o": "output",
    "O": "overcommit",
    "p": "partition",
    "q": "qos",
    "Q": "quiet",
    "s": "oversubscribe",
    "S": "core-spec",
    "t": "time",
    "v": "verbose",
    "W": "wait",
    "w": "nodelist",
    "x": "exclude",
}
_UNKNOWN = "an option gpufleet does not know; remove it"


class Refused(Exception):
    """An option (or one of its values) gpufleet cannot honour: why; what to do."""


# -- values ------------------------------------------------------------------------------------


def _whole(value: str, flag: str, *, least: int = 1, most: int = 1_000_000) -> int:
    if not re.fullmatch(r"-?\d+", value.strip()) or not least <= int(value) <= most:
        raise ValueError(f"{flag}={value}: expected a whole number from {least} to {most}")
    return int(value)


def _gpu_count(value: str, flag: str) -> tuple[str | None, int]:
    """``N`` or ``TYPE:N`` (``--gpus``, ``--gpus-per-node``)."""
    kind, _, count = value.rpartition(":")
    if not re.fullmatch(r"-?\d+", count):
        raise ValueError(f"{flag}={value}: expected N or TYPE:N GPUs, e.g. 4 or a100:4")
    if int(count) < 0:
        raise ValueError(f"{flag}={value}: a GPU count is 0 or more (0, the default: none)")
    return kind or None, int(count)


def _kind(kind: str | None) -> str | None:
    """A GPU type as the API takes it: a MIG profile (``gpu:1g.10gb:1``) asks for slices."""
    return f"MIG {kind.lower()}" if kind is not None and _profile(kind) else kind


def _profile(text: str) -> bool:
    """Whether a GPU type is a MIG profile's name (any case: Slurm's gres types are)."""
    return PROFILE_NAME.fullmatch(text.lower()) is not None


def mig_slices(value: str) -> tuple[str, int]:
    """``--mig PROFILE[:N]``: (the API's GPU type for those slices, N)."""
    profile, _, count = value.strip().partition(":")
    if not _profile(profile):
        raise ValueError(f"--mig {value}: expected PROFILE[:N], a MIG profile such as 1g.10gb or 3g.40gb:2")
    if count and (not count.isdigit() or int(count) < 1):
        raise ValueError(f"--mig {value}: the count after ':' is a number of slices >= 1")
    return f"MIG {profile.lower()}", int(count or 1)


def _gres(value: str) -> tuple[str | None, int]:
    """``gpu``, ``gpu:N``, ``gpu:TYPE`` or ``gpu:TYPE:N`` (per node); other kinds are refused."""
    got: tuple[str | None, int] | None = None
    for item in value.split(","):
        kind, colon, rest = item.partition(":")
        if kind != "gpu":
            raise Refused(f"{kind} is not a generic resource here, only gpu; remove it")
        if colon and "" in rest.split(":"):  # gpu: or gpu::2 - Slurm: invalid gres specification
            raise ValueError(f"--gres={value}: a ':' with nothing after it; expected gpu[:TYPE]:N (gpu:4)")
        parts = rest.split(":") if rest else []
        count = parts.pop() if parts and parts[-1].isdigit() else "1"
        if len(parts) > 1 or (
            parts
            and not (re.fullmatch(r"[A-Za-z][\w.-]*", parts[0]) or PROFILE_NAME.fullmatch(parts[0].lower()))
        ):
            raise ValueError(f"--gres={value}: expected gpu[:TYPE]:N, e.g. gpu:4 or gpu:a100:2")
        got = (parts[0] if parts else None, int(count))
    assert got is not None
    return got


def _time(value: str, flag: str) -> float:
    if value.strip().lower() in ("unlimited", "infinite", "0"):
        return UNLIMITED
    try:
        secs = parse_duration(value, bare_unit_s=60)
    except ValueError as exc:
        raise ValueError(f"{flag}={value}: {exc}") from None
    if secs <= 0:
        raise ValueError(f"{flag}={value}: give a positive time, or UNLIMITED")
    return secs


_PATTERN = re.compile(r"%(%|\d*(.?))")
_PATTERN_LETTERS = "jJAabxuNnst"


def _pattern(value: str, flag: str) -> str:
    """File names with sbatch's patterns, which the agent fills as Slurm does
    (``agent/jobs.slurm_path``): ``%j %J %A %a %b %x %u %N %n %s %t %%``, a width
    (``%4a``), a backslash for none."""
    if not value.strip():
        raise ValueError(f"{flag}: give a file name")
    if "\\" in value:
        return value
    for m in _PATTERN.finditer(value):
        if m.group(1) != "%" and m.group(2) not in _PATTERN_LETTERS:
            raise Refused(
                f"%{m.group(2) or ''} is not a file name pattern here (%j %J %A %a %b %x %u %N %n %s %t); "
                "use those, or %% for a %"
            )
    return value


def _export(value: str, flag: str) -> str:
    for item in value.split(","):
        name = item.partition("=")[0]
        if name not in ("ALL", "NONE", "NIL") and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError(
                f"{flag}={value}: expected ALL, NONE or VAR[=value],... ({name!r} is not a name)"
            )
    return value


ALL_MEMORY = 0
"""``mem`` of ``--mem=0``: all of each node's memory (the server resolves it)."""


def _mem(value: str, flag: str) -> int:
    """MiB (``slurmopts.parse_mem``); ``--mem=0`` is Slurm's "all of each node's memory"
    (:data:`ALL_MEMORY`); for ``--mem-per-cpu``/``--mem-per-gpu`` 0 means nothing."""
    if re.fullmatch(r"0+(?:\.0*)?\s*[kmgt]?i?b?", value.strip().lower()):
        if flag == "--mem":
            return ALL_MEMORY
        raise ValueError(f"{flag}={value}: give a size of at least 1M")
    return parse_mem(value, flag=flag)


def _yes_no(value: str, flag: str) -> bool:
    if value.lower() not in ("yes", "no"):
        raise ValueError(f"{flag}={value}: expected yes or no")
    return value.lower() == "yes"


def _price(value: str, flag: str) -> float:
    try:
        price = float(value)
    except ValueError:
        price = -1.0
    if not (math.isfinite(price) and price >= 0):
        raise ValueError(f"{flag}={value}: expected a price per GPU-hour >= 0, e.g. 1.5")
    return price


def _constraint(value: str, flag: str) -> str:
    """Node features (``gpufleet.constraint``: ``a``, ``a&b``, ``a|b``, ``[a|b]``; a GPU
    model is a feature); counts (``a*2``) are refused, not a bad value."""
    from gpufleet.constraint import Unsupported, parse

    try:
        return str(parse(value))
    except Unsupported:
        raise Refused("feature counts (a*2) are not supported; ask for the feature on every node") from None


def _licenses(value: str, flag: str) -> tuple[tuple[str, int], ...]:
    """``-L NAME[:N],...`` (Slurm also takes ``NAME@SERVER``, remote licenses: refused)."""
    got: dict[str, int] = {}
    for item in value.split(","):
        name, _, count = item.strip().partition(":")
        if "@" in name:
            raise Refused("remote licenses (NAME@SERVER) are not kept here; name an operator's license")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", name) or (count and not count.isdigit()):
            raise ValueError(f"{flag}={value}: expected NAME[:COUNT],..., e.g. matlab:2,ansys")
        got[name] = got.get(name, 0) + int(count or 1)
    return tuple(sorted(got.items()))


def _pools(value: str, flag: str) -> str:
    """One pool, or a comma list (Slurm's ``-p a,b``: the first that can run the job)."""
    names = value.split(",")
    if not value or not all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", n) for n in names):
        raise ValueError(f"{flag}={value}: expected a pool name, or several separated by commas")
    if len(names) > 16:
        raise ValueError(f"{flag}={value}: at most 16 pools")
    return value


def _nodes_list(value: str, flag: str) -> tuple[str, ...]:
    """``--exclude``: node names, comma-separated, with Slurm's ranges (``gpu[01-04,07]``)."""
    from gpufleet.slurm.hostlist import expand

    try:
        names = expand(value)
    except ValueError as exc:
        raise ValueError(f"{flag}={value}: {exc}") from None
    bad = [n for n in names if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", n)]
    if not names or bad:
        raise ValueError(f"{flag}={value}: expected node names, e.g. gpu01,gpu02 or gpu[01-04]")
    if len(names) > 1024:
        raise ValueError(f"{flag}={value}: at most 1024 nodes")
    return tuple(names)


def _text(value: str, flag: str) -> str:
    if not value.strip():
        raise ValueError(f"{flag}: give a value")
    return value


def _exclusive(value: str | None) -> bool:
    if value not in (None, ""):
        raise Refused(f"only plain --exclusive (whole nodes) is taken, not --exclusive={value}")
    return True


def _open_mode(value: str, flag: str) -> None:
    if value not in ("append", "truncate"):
        raise ValueError(f"{flag}={value}: expected append or truncate")
    if value == "truncate":
        raise Refused(
            "the agent appends to --output and --error files, so a requeued job keeps what its "
            "earlier attempts wrote; remove it, or name a new file per job with %j"
        )


Parse = Callable[[str, str], Any]
_FIELDS: dict[str, tuple[str, Parse]] = {
    "job-name": ("name", _text),
    "partition": ("pool", _pools),
    "ntasks": ("ntasks", _whole),
    "ntasks-per-node": ("ntasks_per_node", lambda v, f: _whole(v, f, most=4096)),
    "tasks-per-node": ("ntasks_per_node", lambda v, f: _whole(v, f, most=4096)),
    "gpus-per-task": ("gpus_per_task", lambda v, f: _whole(v, f, least=0, most=1024)),
    "exclude": ("exclude", _nodes_list),
    "constraint": ("constraint", _constraint),
    "qos": ("qos", _text),
    "licenses": ("licenses", lambda v, f: _licenses(v, f)),
    "cpus-per-task": ("cpus_per_task", lambda v, f: _whole(v, f, most=4096)),
    "mem": ("mem", _mem),
    "mem-per-cpu": ("mem_per_cpu", _mem),
    "mem-per-gpu": ("mem_per_gpu", _mem),
    "time": ("time_limit_s", _time),
    "output": ("output", _pattern),
    "error": ("error", _pattern),
    "input": ("input", _pattern),
    "chdir": ("chdir", _text),
    "array": ("array", lambda v, f: str(parse_array(v))),
    "dependency": ("dependency", _text),
    "kill-on-invalid-dep": ("kill_on_invalid_dep", _yes_no),
    "signal": ("signal", lambda v, f: parse_signal(v)),
    "export": ("export", _export),
    "reservation": ("reservation", _text),
    "account": ("account", _text),
    "priority": ("priority", lambda v, f: _whole(v, f, least=-1000, most=1000)),
    "max-price": ("max_price", _price),
}
"""Options that set one field from one value."""


def apply(opts: SbatchOptions, name: str, value: str | None, *, now: float) -> SbatchOptions:
    """``opts`` with option ``--name[=value]`` applied. Raises :class:`Refused` (gpufleet
    cannot honour it) or ValueError (a bad value; the message names ``--name=value``)."""
    option = OPTIONS.get(name)
    if option is None:
        raise Refused(_UNKNOWN)
    if option.kind == "refused":
        raise Refused(option.why)
    flag = f"--{name}"
    if option.arg == "required" and value is None:
        raise ValueError(f"{flag} needs a value")
    if option.arg == "none" and value is not None:
        raise ValueError(f"{flag} takes no value (got {flag}={value})")
    if option.kind == "harmless":
        return opts
    if name in _FIELDS:
        key, parse = _FIELDS[name]
        assert value is not None
        return replace(opts, **{key: parse(value, flag)})
    return _apply_special(opts, name, value, now=now)


def _apply_special(opts: SbatchOptions, name: str, value: str | None, *, now: float) -> SbatchOptions:
    """The honoured options that set more than one field, or none from a value."""
    flag = f"--{name}"
    match name:
        case "gres":
            assert value is not None
            kind, n = _gres(value)
            return replace(_typed(opts, _kind(kind), name), gpus_per_node=n)
        case "gpus" | "gpus-per-node":
            assert value is not None
            kind, n = _gpu_count(value, flag)
            opts = _typed(opts, _kind(kind), name)
            return replace(opts, gpus=n) if name == "gpus" else replace(opts, gpus_per_node=n)
        case "nodes":
            assert value is not None
            m = re.fullmatch(r"(\d+)(?:-(\d+))?", value)
            if m is None or int(m.group(1)) < 1 or (m.group(2) and int(m.group(2)) < int(m.group(1))):
                raise ValueError(f"{flag}={value}: expected N or MIN-MAX nodes (N >= 1)")
            return replace(opts, nodes=int(m.group(1)))  # MIN-MAX: the fewest, as Slurm may give
        case "begin" | "deadline":
            assert value is not None
            at = parse_slurm_time(value, now=now, flag=flag, future=True)
            return replace(opts, begin=at) if name == "begin" else replace(opts, deadline=at)
        case "requeue" | "no-requeue":
            return replace(opts, requeue=name == "requeue")
        case "hold":
            return replace(opts, hold=True)
        case "nice":
            nice = 100 if value in (None, "") else _whole(value, flag, least=-1000, most=1000)
            return replace(opts, nice=nice)
        case "exclusive":
            return replace(opts, exclusive=_exclusive(value))
        case "open-mode":
            assert value is not None
            _open_mode(value, flag)
            return opts
    raise AssertionError(f"honoured option {name} has no handler")


def _typed(opts: SbatchOptions, gpu_type: str | None, by: str) -> SbatchOptions:
    """``opts`` with the GPU model option ``by`` gave (none given: the one it had)."""
    if gpu_type is None:
        return opts
    return replace(opts, gpu_type=gpu_type, gpu_type_by=by)


def forget(opts: SbatchOptions, option: str) -> SbatchOptions:
    """``opts`` without what ``option`` set (a command-line flag replaces a directive
    whole, as in Slurm: ``--gres gpu:1`` drops a script's ``--gres=gpu:v100:1``'s model)."""
    if opts.gpu_type_by == option:
        opts = replace(opts, gpu_type=None, gpu_type_by=None)
    return opts


def total_gpus(opts: SbatchOptions, *, default: int = 0) -> int:
    """Slurm's arithmetic: ``--gpus`` is the total; ``--gres``/``--gpus-per-node`` count
    per node; ``--gpus-per-task`` per task (tasks: ``-n``, else tasks per node x nodes,
    else 1). With no GPU request at all the job gets ``default`` GPUs: none, as in Slurm."""
    if opts.gpus is not None:
        return opts.gpus
    if opts.gpus_per_node is not None:
        return opts.gpus_per_node * (opts.nodes or 1)
    if opts.gpus_per_task is not None:
        return opts.gpus_per_task * tasks(opts)
    return default


def tasks(opts: SbatchOptions) -> int:
    """Tasks in all: ``-n``, else ``--ntasks-per-node`` x nodes, else 1."""
    if opts.ntasks is not None:
        return opts.ntasks
    return (opts.ntasks_per_node or 1) * (opts.nodes or 1)


def gpus_per_node(opts: SbatchOptions) -> int | None:
    """GPUs per node as counted: ``--gres``/``--gpus-per-node``, or ``--gpus-per-task``
    x ``--ntasks-per-node`` (Slurm's per-node count of that pair); None: the scheduler
    splits the total."""
    if opts.gpus_per_node is not None:
        return opts.gpus_per_node
    if opts.gpus is None and opts.gpus_per_task is not None and opts.ntasks_per_node is not None:
        return opts.gpus_per_task * opts.ntasks_per_node
    return None


def asks_gpus(opts: SbatchOptions) -> bool:
    """Whether any option counted GPUs (without one, a job gets none, as in Slurm)."""
    return opts.gpus is not None or opts.gpus_per_node is not None or opts.gpus_per_task is not None
