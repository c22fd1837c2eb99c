"""``gpufleet slurm install DIR``: Slurm's commands (``srun``, ``scontrol``, ``squeue``,
``sbatch``, ``scancel``, ``sacct``, ``sinfo``) as launchers of ``python -m
gpufleet.slurm`` in DIR, for a user who wants to type Slurm's commands on a login node
(jobs get them on their PATH from the agent anyway).

Opt-in and careful: it writes nothing if any of the seven names in DIR is a file that
is not a gpufleet launcher (a real Slurm binary, a site's wrapper, anything of the
user's: ``launchers.is_launcher``), nor a link; a launcher already there is rewritten
only with ``--force`` (for another interpreter) unless it is the same already. A real
Slurm found on PATH is named in a warning: DIR before it on PATH would shadow it.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import typer

from gpufleet.cli._common import FAILED, fail, warn
from gpufleet.cli.options import flag
from gpufleet.slurm import COMMANDS
from gpufleet.slurm.launchers import is_launcher, launcher_text

slurm_app = typer.Typer(help="Slurm's own commands (squeue, sbatch, scontrol...) speaking to gpufleet.")


@slurm_app.callback(no_args_is_help=True)
def _group() -> None:
    """Slurm's own commands (squeue, sbatch, scontrol...) speaking to gpufleet."""


@slurm_app.command("install")
def install(
    directory: Path = typer.Argument(..., help="Where to write them (made if missing); put it on PATH."),
    force: bool = flag("--force", help="Rewrite gpufleet launchers already there (never anything else)."),
) -> None:
    """Write srun, scontrol, squeue, sbatch, scancel, sacct and sinfo into DIRECTORY as
    launchers of this gpufleet; prints what to add to PATH.

    Never writes over a file that is not one of gpufleet's launchers (a real Slurm, a
    site's wrapper): then it writes nothing and says which."""
    target = directory.expanduser().absolute()
    if target.exists() and not target.is_dir():
        raise fail(f"{target} is not a directory")
    foreign = [
        target / n
        for n in COMMANDS
        if (target / n).is_symlink() or ((target / n).exists() and not is_launcher(target / n))
    ]
    if foreign:
        raise fail(
            "not a gpufleet launcher, left alone (nothing written): "
            + ", ".join(str(p) for p in foreign)
            + "; choose another directory",
            FAILED,
        )
    target.mkdir(parents=True, exist_ok=True)
    python = sys.executable
    written, kept, stale = [], [], []
    for name in COMMANDS:
        path, text = target / name, launcher_text(name, python)
        if path.exists():
            if path.read_text(errors="replace") == text:
                kept.append(name)
                continue
            if not force:
                stale.append(name)
                continue
        tmp = target / f".{name}.gpufleet-tmp"
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
        written.append(name)
    if written:
        typer.echo(f"wrote {' '.join(written)} in {target}")
    if kept:
        typer.echo(f"up to date: {' '.join(kept)}")
    if stale:
        warn(f"launchers of another interpreter left as they are: {' '.join(stale)} (--force rewrites them)")
    for name in COMMANDS:
        found = shutil.which(name)
        if found and Path(found).parent != target and not is_launcher(Path(found)):
            warn(f"a real {name} is on PATH ({found}): with {target} first on PATH, gpufleet's is used")
    on_path = str(target) in os.environ.get("PATH", "").split(os.pathsep)
    typer.echo("already on PATH" if on_path else f'add to PATH:  export PATH="{target}:$PATH"')
    if stale:
        raise typer.Exit(FAILED)


__all__ = ["install", "slurm_app"]
