"""``sacct``: ``gpufleet history`` under Slurm's name. Its options are sacct's (``-j``,
``-o/--format`` with sacct's field names and ``%WIDTH``, ``-P/--parsable2``, ``-p``,
``-n``, ``-X``, ``-S``/``-E``, ``-s``, ``-u``, ``-a``, ``-r``, ``-A``, ``--name``) and so
are its defaults (your jobs since midnight; with ``-j``, any time), its columns and
states (``cli/sacct.py``).
"""

from __future__ import annotations

from gpufleet.slurm._typer import run_command


def main(argv: list[str]) -> int:
    return run_command("history", "sacct", argv)


__all__ = ["main"]
