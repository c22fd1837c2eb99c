"""``#SBATCH`` directives of a Slurm batch script, read strictly so existing scripts run
with their meaning or not at all.

Directives are the ``#SBATCH`` lines before the first command (as Slurm reads them).
Both ``--opt=value`` and ``--opt value`` (and ``-N 2`` / ``-N2``) are accepted. Each
option is read by ``slurmvalues.apply`` (honoured, harmless or refused): a refused one is
a :class:`Problem` with ``refused`` set (``gpufleet submit --ignore-unsupported`` turns
each into a warning); a bad value is a Problem that nothing passes. Problems name the
script's line: ``job.sh line 7: #SBATCH --switches=1: gpufleet cannot honour this (...)``.

A script job's command is ``bash -c TEXT SCRIPT_NAME ARGS...`` (``SCRIPT_SHELL``): the
text travels with the job, as Slurm stores the batch script; ``BatchScript.of`` reads a
command back as the script it carries (both in ``gpufleet.slurm.batchscript``, which the
in-job commands read without the CLI).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gpufleet.slurm.batchscript import SCRIPT_SHELL as SCRIPT_SHELL
from gpufleet.slurm.batchscript import BatchScript as BatchScript

if TYPE_CHECKING:  # read when a script is: `jobs show` and `queue` need BatchScript alone
    from gpufleet.cli.slurmflags import Arg, SbatchOptions


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    """A directive or flag gpufleet will not take as it stands."""

    where: str
    """``job.sh line 7`` for a directive, empty for a command-line flag."""
    text: str
    refused: bool
    """True: gpufleet cannot honour the option (``--ignore-unsupported`` passes it with a
    warning); False: a bad value (nothing passes it)."""

    option: str = ""
    """The option's long name (a flag of the same name on the command line replaces the
    directive, and its problem with it)."""

    def __str__(self) -> str:
        return f"{self.where}: {self.text}" if self.where else self.text


# -- reading a script --------------------------------------------------------------------------


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


@dataclass(frozen=True, slots=True)
class Given:
    """One option as a directive gave it."""

    name: str  # the long name ("" for a stray word)
    value: str | None
    written: str  # as written: ``-N 2``, ``--time=1:00:00``


def _arg(name: str) -> Arg:
    from gpufleet.cli.slurmflags import OPTIONS

    option = OPTIONS.get(name)
    return option.arg if option is not None else "optional"


def options_of(tokens: list[str]) -> list[Given]:
    """The options in a directive's words, read as sbatch's getopt reads them: a value
    after ``=`` or glued to a short option, else the next word for an option that takes
    one (an unknown option takes the next word unless it starts with ``-``)."""
    from gpufleet.cli.slurmflags import OPTIONS, SHORT

    out: list[Given] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if tok.startswith("--"):
            name, eq, value = tok[2:].partition("=")
            if eq:
                out.append(Given(name, value, tok))
                continue
            arg = _arg(name)
            takes_next = arg == "required" or (name not in OPTIONS and i < len(tokens))
            if takes_next and i < len(tokens) and not (name not in OPTIONS and tokens[i].startswith("-")):
                out.append(Given(name, tokens[i], f"{tok} {tokens[i]}"))
                i += 1
            else:
                out.append(Given(name, None, tok))
        elif tok.startswith("-") and len(tok) >= 2:
            name = SHORT.get(tok[1], f"-{tok[1]}")
            if len(tok) > 2:
                out.append(Given(name, tok[2:].removeprefix("="), tok))
            elif _arg(name) != "none" and i < len(tokens) and not tokens[i].startswith("-"):
                out.append(Given(name, tokens[i], f"{tok} {tokens[i]}"))
                i += 1
            else:
                out.append(Given(name, None, tok))
        else:
            out.append(Given("", None, tok))
    return out


def parse_script(text: str, *, source: str = "script", now: float) -> SbatchOptions:
    """A script's directives applied in order (a later one wins); each one gpufleet will
    not take is a Problem (``source line N: ...``)."""
    from gpufleet.cli.slurmflags import Refused, SbatchOptions
    from gpufleet.cli.slurmvalues import apply

    opts = SbatchOptions()
    problems: list[Problem] = []
    origins: list[tuple[str, str]] = []
    for no, rest in directive_lines(text):
        where = f"{source} line {no}"
        for given in options_of(_tokens(rest)):
            said = f"#SBATCH {given.written}"
            if not given.name:
                problems.append(Problem(where=where, text=f"{said}: not an option", refused=False))
                continue
            try:
                opts = apply(opts, given.name, given.value, now=now)
            except Refused as exc:
                problems.append(
                    Problem(where=where, text=refusal(said, str(exc)), refused=True, option=given.name)
                )
            except ValueError as exc:
                problems.append(Problem(where=where, text=str(exc), refused=False, option=given.name))
            else:
                origins.append((given.name, f"{where}: {said}"))
    return replace(opts, problems=tuple(problems), origins=tuple(origins))


def refusal(said: str, why: str) -> str:
    """``SAID: gpufleet cannot honour this (WHY); WHAT TO DO``."""
    reason, _, todo = why.partition("; ")
    return f"{said}: gpufleet cannot honour this ({reason})" + (f"; {todo}" if todo else "")
