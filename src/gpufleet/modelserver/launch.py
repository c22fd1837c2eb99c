"""How to start this installation's ``gpufleet model-server`` as a service replica.

Replicas run as their owner's account; started as root (the demo, CI), the agent runs
them as an unprivileged account, which must be able to run the interpreter. A venv made
from a Python under a private home (pyenv in ``/root``) is not runnable by it: the venv
is, but its interpreter is not. Then the same-version system Python (``/usr/bin/python3.X``,
ABI-compatible) runs it with this venv's packages and gpufleet's source on
``PYTHONPATH`` (both must be reachable: a venv inside the repo under ``/work`` or
``/opt`` is; one under ``/root`` is not, and ``runnable`` says so).
"""

from __future__ import annotations

import os
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True, slots=True, kw_only=True)
class Launch:
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    runnable: bool = True
    """False: no interpreter the job account can run was found (``why`` says what)."""
    why: str = ""


def others_can_reach(path: Path) -> bool:
    """Whether an account that is neither owner nor group may open ``path``: every
    parent directory searchable by others, the file itself readable or executable."""
    try:
        target = path.resolve()
        if not target.stat().st_mode & (stat.S_IROTH | stat.S_IXOTH):
            return False
        return all(p.stat().st_mode & stat.S_IXOTH for p in target.parents)
    except OSError:
        return False


def model_server(*, as_other_account: bool, args: tuple[str, ...] = ()) -> Launch:
    """The command (and extra environment) for a replica of the built-in model server."""
    return gpufleet_command(("model-server", *args), as_other_account=as_other_account)


def names_gpufleet(program: str) -> bool:
    """Whether a command's program is a ``gpufleet`` entry point (``gpufleet``,
    ``.venv/bin/gpufleet``, ``/opt/x/bin/gpufleet``): what ``gpufleet_command`` replaces."""
    return Path(program).name == "gpufleet"


def gpufleet_command(args: tuple[str, ...], *, as_other_account: bool) -> Launch:
    """``gpufleet ARGS`` as this installation runs it for a job's account: its own
    interpreter when that account can run it, else the same-version system Python with
    this installation's packages on ``PYTHONPATH`` (see the module's docstring)."""
    tail = ["-m", "gpufleet", *args]
    exe = Path(sys.executable)
    if not as_other_account or others_can_reach(exe):
        return Launch(command=[str(exe), *tail])
    import gpufleet

    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    paths = [p for p in sys.path if p.endswith("site-packages")]
    paths.append(str(Path(gpufleet.__file__).resolve().parents[1]))
    for cand in (Path("/usr/bin") / version, Path("/usr/local/bin") / version):
        if cand.exists() and others_can_reach(cand):
            reachable = all(others_can_reach(Path(p)) for p in paths if Path(p).exists())
            return Launch(
                command=[str(cand), *tail],
                env={"PYTHONPATH": os.pathsep.join(paths)},
                runnable=reachable,
                why="" if reachable else f"the job account cannot read this venv's packages ({paths[0]})",
            )
    return Launch(
        command=[str(exe), *tail],
        runnable=False,
        why=f"the job account cannot run {exe.resolve()} and there is no {version} it can run",
    )
