"""Reading one ``sbatch(1)`` option into :class:`~gpufleet.cli.slurmflags.SbatchOptions`
(:func:`apply`): its kind from the table (``slurmflags.OPTIONS``), then its value, checked
as Slurm reads it. The same function reads a script's directive (``sbatch.parse_script``)
and ``gpufleet submit``'s flag of the same name (``batch.from_flags``), so a bad value
reads the same in both (``--time=soon: cannot read duration ...``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gpufleet.arrayspec import parse_array
from gpufleet.cli.localtime import parse_slurm_time
from gpufleet.cli.slurmflags import OPTIONS, UNLIMITED, Refused, SbatchOptions
from gpufleet.migindex import PROFILE_NAME
from gpufleet.slurmopts import parse_mem, parse_signal
from gpufleet.timefmt import parse_duration

_UNKNOWN = "an option gpufleet does not know; remove it"


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
