"""The launchers of the Slurm commands: ``DIR/squeue`` is a three-line shell script
``exec PYTHON -s -m gpufleet.slurm squeue "$@"``. ``gpufleet slurm install DIR`` writes
them for a user (their interpreter); the agent writes its own for every job
(``agent/slurmbin.py``, the node's interpreter).

:func:`is_launcher` tells one of these (either writer's) from anything else: a real
Slurm binary (ELF), a site's wrapper script, a user's file. Those are never written
over.
"""

from __future__ import annotations

import os
import shlex
import stat
from pathlib import Path

MARK = "# gpufleet: written by `gpufleet slurm install`; delete it to remove it"
MAX_BYTES = 4096
"""A launcher is small: a bigger file is not one (and is not read whole)."""


def launcher_text(name: str, python: str) -> str:
    return f'#!/bin/sh\n{MARK}\nexec {shlex.quote(python)} -s -m gpufleet.slurm {name} "$@"\n'


def is_launcher(path: Path) -> bool:
    """Whether ``path`` is a regular file (not a link) that is a gpufleet launcher."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return False
        head = f.read(MAX_BYTES + 1)
    if len(head) > MAX_BYTES or not head.startswith(b"#!/bin/sh\n"):
        return False
    text = head.decode("utf-8", "replace")
    return f" -m gpufleet.slurm {path.name} " in text


__all__ = ["MARK", "is_launcher", "launcher_text"]
