"""The Slurm commands on every job's PATH (issue 31): ``<work_dir>/bin/srun``, ``scontrol``,
``squeue``, ``sbatch``, ``scancel``, ``sacct``, ``sinfo``, each a two-line shell script
``exec <python> -m gpufleet.slurm NAME "$@"`` that runs this node's gpufleet the way a
job's account can (``modelserver.launch.gpufleet_command``, as ``selfcmd`` does for a
replica's ``gpufleet``: the agent's own interpreter where others may run it, else the
same-version system Python with this installation's packages on ``PYTHONPATH``).

Written by the agent at its start, owned by it (root on a real node), 0755 in a 0755
directory inside the 0711 work dir: every account may run them, no job may change them.
A job finds them first on its PATH (``jobs.server_env``), whatever PATH it brought, and
they talk to the server with the job's own credential (``GPUFLEET_TOKEN``, set there
too). Rewritten at every start (an upgraded gpufleet, a moved venv), atomically.
"""

from __future__ import annotations

import contextlib
import os
import shlex
from pathlib import Path

from gpufleet.modelserver.launch import gpufleet_command

COMMANDS = ("srun", "scontrol", "squeue", "sbatch", "scancel", "sacct", "sinfo")


def launcher_text(name: str, *, as_other_account: bool) -> str:
    """The script for ``name``: this gpufleet's interpreter, ``-m gpufleet.slurm NAME``."""
    launch = gpufleet_command((), as_other_account=as_other_account)
    python = launch.command[0]
    path = launch.env.get("PYTHONPATH")
    if path:
        run = f"PYTHONPATH={shlex.quote(path)} exec {shlex.quote(python)} -s -m gpufleet.slurm {name}"
    else:
        run = f"exec {shlex.quote(python)} -I -m gpufleet.slurm {name}"  # -I: nothing of the job's PYTHON*
    return f'#!/bin/sh\n{run} "$@"\n'


def write_launchers(work_dir: Path, *, as_other_account: bool | None = None) -> Path:
    """``<work_dir>/bin`` with one launcher per Slurm command; returns the directory."""
    other = os.geteuid() == 0 if as_other_account is None else as_other_account
    bin_dir = work_dir.absolute() / "bin"
    bin_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    bin_dir.chmod(0o755)
    for name in COMMANDS:
        target = bin_dir / name
        tmp = bin_dir / f".{name}.tmp"
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755)
        with open(fd, "w") as f:
            f.write(launcher_text(name, as_other_account=other))
        tmp.chmod(0o755)
        os.replace(tmp, target)
    return bin_dir
