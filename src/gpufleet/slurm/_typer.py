"""A ``gpufleet`` command run under a Slurm name (``sbatch`` is ``gpufleet submit``,
``sacct`` is ``gpufleet history``): one definition of their options, not two. These two
pay for Typer (~35 ms), as ``gpufleet submit`` does; the commands a job runs at every
task start (``scontrol``, ``squeue``) do not."""

from __future__ import annotations


def run_command(name: str, prog: str, argv: list[str]) -> int:
    """``gpufleet NAME ARGV``'s exit code, its usage and help naming ``prog``."""
    from gpufleet.cli import load

    command = load(name)
    try:
        command.main(args=argv, prog_name=prog, standalone_mode=True)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        import sys

        sys.stderr.write(f"{exc.code}\n")
        return 1
    return 0


__all__ = ["run_command"]
