"""How a batch script travels with its job: the command ``bash -c TEXT SCRIPT_NAME
ARGS...`` (``SCRIPT_SHELL``), the text itself, as Slurm stores the batch script.
``gpufleet submit job.sh`` packs it (``cli/sbatch.py``), ``jobs show`` and ``scontrol
show job`` read it back. Here, outside ``gpufleet.cli``, so that the in-job commands
read it without the CLI's Typer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SCRIPT_SHELL = ("bash", "-c")


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchScript:
    """The script a job's command carries."""

    name: str
    text: str
    args: tuple[str, ...]

    @classmethod
    def of(cls, command: Sequence[str]) -> BatchScript | None:
        """The script in ``command``, or None for any other command."""
        if len(command) < 4 or tuple(command[:2]) != SCRIPT_SHELL:
            return None
        return cls(name=command[3], text=command[2], args=tuple(command[4:]))


__all__ = ["SCRIPT_SHELL", "BatchScript"]
