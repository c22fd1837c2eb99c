"""A service replica whose command names ``gpufleet`` runs this node's gpufleet.

The README's service example deploys ``[".venv/bin/gpufleet", "model-server", ...]``: a
path relative to where the user typed it, which the replica (started in its own working
directory, as another account) does not find (exit 127), and, where the venv was made
from a Python in a private home (pyenv under ``/root``), could not run if it did. Every
node runs gpufleet (its agent), so a replica's ``gpufleet`` (bare, or any path ending in
``/gpufleet``) is this node's, started the way the replica's account can run it
(``modelserver.launch.gpufleet_command``). Where it cannot (no interpreter or packages
that account may read), the replica is not started: it ends at once with exit 126 and a
line that says why and what to do, which ``service show`` then reports (its rollout is
stalled with that reason) instead of an unexplained crash loop.

Only replicas: a batch job's command is the user's to the letter.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from gpufleet.agent.jobs import JobSpec
from gpufleet.modelserver.launch import Launch, gpufleet_command, names_gpufleet

REFUSED_CODE = 126


Launcher = Callable[..., Launch]


def resolve(spec: JobSpec, *, as_other_account: bool, launcher: Launcher = gpufleet_command) -> JobSpec:
    """``spec`` with a ``gpufleet`` command made runnable (see the module docstring);
    ``launcher`` is the seam that finds how (``gpufleet_command``)."""
    if not spec.command or not names_gpufleet(spec.command[0]):
        return spec
    launch = launcher(tuple(spec.command[1:]), as_other_account=as_other_account)
    if not launch.runnable:
        why = (
            f"gpufleet: cannot run this node's gpufleet as the replica's account: {launch.why}; "
            "install gpufleet where every account can read it (e.g. a venv under /opt made from "
            "a system Python), or deploy an image"
        )
        command = ("/bin/sh", "-c", 'echo "$1" >&2; exit 126', "gpufleet", why)
        return dataclasses.replace(spec, command=command)
    env = dict(spec.env)
    extra = launch.env.get("PYTHONPATH")
    if extra:
        own = env.get("PYTHONPATH")
        env["PYTHONPATH"] = extra if not own else extra + os.pathsep + own
    return dataclasses.replace(spec, command=tuple(launch.command), env=env)
