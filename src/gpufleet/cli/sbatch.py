"""``#SBATCH`` directives of a Slurm batch script, read so existing scripts run unchanged.

Directives are the ``#SBATCH`` lines before the first command (as Slurm reads them).
Both ``--opt=value`` and ``--opt value`` (and ``-N 2`` / ``-N2``) are accepted. A
directive gpufleet does not understand becomes a warning, never silently dropped.
``--gres=gpu:N`` is per node, as in Slurm.

A script job's command is ``bash -c TEXT SCRIPT_NAME ARGS...`` (``SCRIPT_SHELL``): the
text travels with the job, as Slurm stores the batch script; ``BatchScript.of`` reads a
command back as the script it carries.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from gpufleet.timefmt import parse_duration

_LONG_WITH_VALUE = {
    "gres",
    "gpus",
    "gpus-per-node",
    "nodes",
    "time",
    "job-name",
    "partition",
    "output",
    "error",
}
_FLAGS = {"requeue", "no-requeue"}
_SHORT = {"N": "nodes", "t": "time", "J": "job-name", "p": "partition", "o": "output", "e": "error"}
SCRIPT_SHELL = ("bash", "-c")


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchScript:
    """The script a job's command carries (see the module docstring)."""

    name: str
    text: str
    args: tuple[str, ...]

    @classmethod
    def of(cls, command: Sequence[str]) -> BatchScript | None:
        """The script in ``command``, or None for any other command."""
        if len(command) < 4 or tuple(command[:2]) != SCRIPT_SHELL:
            return None
        return cls(name=command[3], text=command[2], args=tuple(command[4:]))


@dataclass(frozen=True, slots=True, kw_only=True)
class SbatchOptions:
    """What a script asks for; None = not given."""

    gpus: int | None = None
    gpus_per_node: int | None = None
    nodes: int | None = None
    gpu_type: str | None = None
    time_limit_s: float | None = None
    name: str | None = None
    pool: str | None = None
    output: str | None = None
    error: str | None = None
    requeue: bool | None = None
    warnings: tuple[str, ...] = field(default=())


def directive_lines(text: str) -> list[tuple[int, str]]:
    """(line number, text after ``#SBATCH``) up to the first command line."""
    out: list[tuple[int, str]] = []
    for no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if no == 1 and line.startswith("#!"):
            continue
        if not line or (line.startswith("#") and not line.startswith("#SBATCH")):
            continue
        if not line.startswith("#SBATCH"):
            break
        out.append((no, line[len("#SBATCH") :].strip()))
    return out


def _tokens(rest: str) -> list[str]:
    rest = rest.split(" #", 1)[0]  # trailing comment
    try:
        return shlex.split(rest)
    except ValueError:
        return rest.split()


def _pairs(tokens: list[str]) -> list[tuple[str, str | None] | str]:
    """(option, value) pairs; a bare string is an unparseable token."""
    out: list[tuple[str, str | None] | str] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if tok.startswith("--"):
            name, eq, value = tok[2:].partition("=")
            if eq:
                out.append((name, value))
            elif name in _FLAGS:
                out.append((name, None))
            elif i < len(tokens) and (name in _LONG_WITH_VALUE or not tokens[i].startswith("-")):
                out.append((name, tokens[i]))
                i += 1
            else:
                out.append((name, None))
        elif tok.startswith("-") and len(tok) >= 2:
            long = _SHORT.get(tok[1], "-" + tok[1])
            if len(tok) > 2:
                out.append((long, tok[2:].lstrip("=")))
            elif i < len(tokens) and not tokens[i].startswith("-"):
                out.append((long, tokens[i]))
                i += 1
            else:
                out.append((long, None))
        else:
            out.append(tok)
    return out


def _typed_count(value: str) -> tuple[str | None, int]:
    """``N`` or ``TYPE:N`` -> (type, N)."""
    parts = value.split(":")
    if len(parts) == 1:
        return None, int(parts[0])
    return ":".join(parts[:-1]), int(parts[-1])


def _gres(value: str) -> tuple[str | None, int] | None:
    for item in value.split(","):
        kind, _, rest = item.partition(":")
        if kind == "gpu":
            return _typed_count(rest) if rest else (None, 1)
    return None


def _apply(opts: SbatchOptions, name: str, value: str | None) -> SbatchOptions | str:
    """The options with one directive applied, or a warning about it."""
    if name in _FLAGS:
        return replace(opts, requeue=name == "requeue")
    if value is None:
        return f"--{name} needs a value"
    try:
        match name:
            case "gres":
                got = _gres(value)
                if got is None:
                    return f"--gres={value}: only gpu resources are supported"
                return replace(opts, gpu_type=got[0] or opts.gpu_type, gpus_per_node=got[1])
            case "gpus":
                kind, n = _typed_count(value)
                return replace(opts, gpu_type=kind or opts.gpu_type, gpus=n)
            case "gpus-per-node":
                kind, n = _typed_count(value)
                return replace(opts, gpu_type=kind or opts.gpu_type, gpus_per_node=n)
            case "nodes":
                m = re.fullmatch(r"(\d+)(?:-(\d+))?", value)
                if m is None:
                    return f"--nodes={value}: expected N or MIN-MAX"
                return replace(opts, nodes=int(m.group(1)))
            case "time":
                return replace(opts, time_limit_s=parse_duration(value, bare_unit_s=60))
            case "job-name":
                return replace(opts, name=value)
            case "partition":
                return replace(opts, pool=value)
            case "output":
                return replace(opts, output=value)
            case "error":
                return replace(opts, error=value)
    except ValueError as exc:
        return f"--{name}={value}: {exc}"
    return f"unsupported directive --{name}" if not name.startswith("-") else f"unsupported directive {name}"


def parse_script(text: str) -> SbatchOptions:
    opts = SbatchOptions()
    warnings: list[str] = []
    for no, rest in directive_lines(text):
        for pair in _pairs(_tokens(rest)):
            if isinstance(pair, str):
                warnings.append(f"line {no}: ignored {pair!r}")
                continue
            got = _apply(opts, *pair)
            if isinstance(got, str):
                warnings.append(f"line {no}: ignored: {got}")
            else:
                opts = got
    return replace(opts, warnings=tuple(warnings))


def total_gpus(opts: SbatchOptions, *, default: int = 1) -> int:
    """Slurm's arithmetic: ``--gpus`` is the total; ``--gres``/``--gpus-per-node`` count
    per node. With no GPU request at all the job gets ``default`` GPUs."""
    if opts.gpus is not None:
        return opts.gpus
    if opts.gpus_per_node is not None:
        return opts.gpus_per_node * (opts.nodes or 1)
    return default
