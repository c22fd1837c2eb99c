"""Real POSIX accounts for tests that run real job processes.

Jobs never run as root: a root agent runs each job as its owner's account. The suite
runs as root in CI, so tests that start real jobs map every gpufleet user to an
unprivileged account made for the tests (``JOB_ACCOUNT``, and ``OTHER_ACCOUNT`` for the
tests that need two people); run as another user, the agent runs jobs as itself and
these helpers change nothing. ``python3`` here is a system interpreter the job accounts
can execute (the suite's own may live under /root, which they cannot enter).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from gpufleet.agent import RunAs, UserMap

JOB_ACCOUNT = "gpufleet-job"
OTHER_ACCOUNT = "gpufleet-other"
PYTHON = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or "python3"
ROOT = os.geteuid() == 0


def ensure_account(name: str) -> None:
    """Create a system account without a home or a login shell (once)."""
    if not ROOT:
        return
    if subprocess.run(["getent", "passwd", name], capture_output=True, check=False).returncode == 0:
        return
    flags = ["--system", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin"]
    made = subprocess.run(["useradd", *flags, "--user-group", name], check=False, capture_output=True)
    if (
        made.returncode != 0
        and subprocess.run(["getent", "passwd", name], capture_output=True).returncode != 0
    ):
        raise RuntimeError(f"useradd {name}: {made.stderr.decode(errors='replace').strip()}")
    # (another test worker may have made it at the same moment: useradd locks, one fails)


def run_as(fallback: str = JOB_ACCOUNT, **entries: str) -> RunAs:
    """Every gpufleet user runs as ``fallback`` unless named in ``entries``."""
    return RunAs(users=UserMap(entries=entries, fallback=fallback))


def user_map_file(directory: Path, fallback: str = JOB_ACCOUNT, **entries: str) -> Path:
    path = directory / "users.toml"
    lines = [f'"{k}" = "{v}"' for k, v in {**entries, "*": fallback}.items()]
    path.write_text("[users]\n" + "\n".join(lines) + "\n")
    return path


def passable(path: Path) -> None:
    """Let other accounts pass through ``path`` and its parents up to /tmp (pytest makes
    its base temp dir 0700): a job reaches its own directories by absolute path."""
    if not ROOT:
        return
    for p in (path, *path.parents):
        if p == Path("/tmp") or p == p.parent:
            break
        if p.exists():
            p.chmod(p.stat().st_mode | 0o111)
