"""``sbatch``: ``gpufleet submit`` under Slurm's name. Its options are sbatch's already
(read by ``cli/slurmflags``, the same for ``#SBATCH`` directives and flags), it prints
``Submitted batch job N`` for a script (``--parsable``: ``N``), and the job's own
credential submits as the job's owner, so a script resubmits itself as Slurm's do::

    sbatch --dependency=afterany:$SLURM_JOB_ID train.sh

Usage errors exit 2 (click's), refusals 2, failures 1, each with gpufleet's line.
Not taken: a script on standard input (name the file) and ``--wrap`` (write the
command after ``--``: ``sbatch -- CMD``, which prints the id alone).
"""

from __future__ import annotations

from gpufleet.slurm._typer import run_command


def main(argv: list[str]) -> int:
    return run_command("submit", "sbatch", argv)


__all__ = ["main"]
