"""``#GPUFLEET`` directives: gpufleet's own options in a batch script, beside ``#SBATCH``.

Slurm has no option for what only gpufleet does, so a script says it on its own lines,
read the way ``#SBATCH`` lines are (``sbatch.py``): the directive block before the first
command, ``--opt=value`` or ``--opt value``, a trailing `` #`` comment ignored, a later
line winning over an earlier one, and the command line winning over both. The options:

- ``--checkpoint-every DURATION`` (``30m``, ``2h``, ``1800`` seconds): how often the job
  saves its state, so that a preemption prefers a job that just checkpointed
  (``gpufleet submit --checkpoint-every``).

An unknown option, a stray word or a bad value is an error naming the script's line, as
an unknown ``#SBATCH`` option is (nothing is submitted; ``--ignore-unsupported`` does not
pass it: a misspelt option must not silently change what the job asks).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from gpufleet.cli.sbatch import Problem
from gpufleet.timefmt import parse_duration

PREFIX = "#GPUFLEET"
OPTIONS = ("checkpoint-every",)
"""gpufleet's own directives (each takes a value)."""
MAX_CHECKPOINT_S = 30 * 86400.0


@dataclass(frozen=True, slots=True, kw_only=True)
class GpufleetOptions:
    """What a script's ``#GPUFLEET`` lines ask for; None = not given."""

    checkpoint_every: str | None = None
    problems: tuple[Problem, ...] = ()
    origins: tuple[tuple[str, str], ...] = ()
    """(option, ``job.sh line 3: #GPUFLEET --checkpoint-every 30m``), as ``SbatchOptions``'."""


def checkpoint_every(value: str) -> str:
    """``--checkpoint-every``'s value as given, checked (ValueError says why)."""
    try:
        secs = parse_duration(value)
    except ValueError as exc:
        raise ValueError(f"--checkpoint-every={value}: {exc}") from None
    if not 1 <= secs <= MAX_CHECKPOINT_S:
        raise ValueError(f"--checkpoint-every={value}: between 1 second and 30 days")
    return value


def directive_lines(text: str) -> list[tuple[int, str]]:
    """(line number, text after ``#GPUFLEET``) in the directive block: up to the first
    line that is neither blank nor a comment (``#SBATCH`` lines are comments here)."""
    out: list[tuple[int, str]] = []
    for no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            if line.startswith(PREFIX) and (len(line) == len(PREFIX) or line[len(PREFIX)].isspace()):
                out.append((no, line[len(PREFIX) :].strip()))
            continue
        break
    return out


def _words(rest: str) -> list[str]:
    rest = rest.split(" #", 1)[0]
    try:
        return shlex.split(rest)
    except ValueError:
        return rest.split()


def parse(text: str, *, source: str = "script") -> GpufleetOptions:
    """A script's ``#GPUFLEET`` directives, in order (a later one wins)."""
    value: str | None = None
    problems: list[Problem] = []
    origins: list[tuple[str, str]] = []
    for no, rest in directive_lines(text):
        where = f"{source} line {no}"
        words = _words(rest)
        i = 0
        while i < len(words):
            word = words[i]
            i += 1
            name, eq, given = word.removeprefix("--").partition("=")
            said = f"{PREFIX} {word}"
            if not word.startswith("--") or name not in OPTIONS:
                known = ", ".join(f"--{o}" for o in OPTIONS)
                what = "an unknown option" if word.startswith("-") else "not an option"
                problems.append(
                    Problem(where=where, text=f"{said}: {what} (gpufleet's are {known})", refused=False)
                )
                continue
            if not eq:
                if i >= len(words):
                    problems.append(
                        Problem(where=where, text=f"{said}: needs a value", refused=False, option=name)
                    )
                    continue
                given = words[i]
                said = f"{said} {given}"
                i += 1
            try:
                value = checkpoint_every(given)
            except ValueError as exc:
                problems.append(Problem(where=where, text=str(exc), refused=False, option=name))
            else:
                origins.append((name, f"{where}: {said}"))
    return GpufleetOptions(checkpoint_every=value, problems=tuple(problems), origins=tuple(origins))
