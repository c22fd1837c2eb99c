"""``sbatch``: ``gpufleet submit`` under Slurm's name. Its options are sbatch's already
(read by ``cli/slurmvalues``, the same for ``#SBATCH`` directives and flags), it prints
``Submitted batch job N`` for a script (``--parsable``: ``N``), and the job's own
credential submits as the job's owner, so a script resubmits itself as Slurm's do::

    sbatch --dependency=afterany:$SLURM_JOB_ID train.sh

As Slurm's, with no script named it reads one from standard input (the job is named
``sbatch``), and ``--wrap CMD`` makes the script ``#!/bin/sh`` + ``CMD`` (named
``wrap``): either is written to a private temporary file only for the submit (the
script's text travels with the job).

Usage errors exit 2 (click's), refusals 2, failures 1, each with gpufleet's line.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from gpufleet.slurm._typer import run_command


def _script_given(argv: list[str], takes_value: set[str]) -> bool:
    """Whether ``argv`` names a script (or ``-- CMD``): a word that is no option nor an
    option's value, as click reads them (options stop at the first such word)."""
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--" or not word.startswith("-") or word == "-":
            return True
        if "=" not in word and word in takes_value:
            i += 1  # its value
        elif not word.startswith("--") and len(word) == 2 and word in takes_value:
            i += 1
        i += 1
    return False


def _options_with_values() -> set[str]:
    from gpufleet.cli import load

    names: set[str] = set()
    for param in load("submit").params:
        if getattr(param, "is_flag", False) or param.param_type_name != "option":
            continue
        names |= set(param.opts)
    return names


def main(argv: list[str]) -> int:
    wrap: str | None = None
    rest: list[str] = []
    i = 0
    while i < len(argv):  # --wrap is sbatch's, not submit's: taken out here
        word = argv[i]
        if word == "--":
            rest += argv[i:]
            break
        if word.startswith("--wrap="):
            wrap = word.partition("=")[2]
        elif word == "--wrap" and i + 1 < len(argv):
            wrap, i = argv[i + 1], i + 1
        else:
            rest.append(word)
        i += 1
    if wrap is None and (_script_given(rest, _options_with_values()) or "--help" in rest):
        return run_command("submit", "sbatch", rest)
    if wrap is None and sys.stdin.isatty():
        sys.stderr.write("sbatch: error: no script named, and none on standard input (or use --wrap)\n")
        return 1
    text = f"#!/bin/sh\n{wrap}\n" if wrap is not None else sys.stdin.read()
    if not text.strip():
        sys.stderr.write("sbatch: error: Batch script is empty!\n")
        return 1
    if not text.startswith("#!"):
        sys.stderr.write(
            "sbatch: error: This does not look like a batch script.  The first line must start with #! "
            "followed by the path to an interpreter.\n"
        )
        return 1
    where = Path(tempfile.mkdtemp(prefix="gpufleet-sbatch-"))
    try:
        script = where / ("wrap" if wrap is not None else "sbatch")
        fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return run_command("submit", "sbatch", [*rest, str(script)])
    finally:
        shutil.rmtree(where, ignore_errors=True)


__all__ = ["main"]
