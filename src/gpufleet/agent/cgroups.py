"""A cgroup v2 directory per job attempt, with memory and pids limits (as Slurm's
``proctrack/cgroup`` + ``task/cgroup`` do).

``Cgroups.create`` makes ``<root>/job-<id>-<attempt>``, enables the memory and pids
controllers on ``<root>`` where needed, writes ``memory.max`` / ``pids.max`` and returns the
directory; the job's wrapper writes its own pid to ``cgroup.procs`` before it starts the
job, so every process of the job is in it from the first instruction. Where the machine
has no cgroup v2 hierarchy (v1 or hybrid hosts, containers without a delegated subtree)
or the root is not writable, ``create`` returns None and says why once: the job runs
without a cgroup rather than not at all. ``root`` is a parameter so tests use a plain
temporary directory laid out like cgroupfs.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("gpufleet.agent")

CGROUP2_MOUNT = Path("/sys/fs/cgroup")
DEFAULT_ROOT = CGROUP2_MOUNT / "gpufleet"


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    memory_max_bytes: int | None = None
    pids_max: int | None = 4096


class Cgroups:
    def __init__(self, root: Path = DEFAULT_ROOT, *, mount: Path | None = None) -> None:
        self.root = root
        self.mount = mount if mount is not None else root.parent
        self.disabled_reason: str | None = None
        if not (self.mount / "cgroup.controllers").exists():
            self.disabled_reason = (
                f"no cgroup v2 hierarchy at {self.mount}: jobs run without memory/pids limits"
            )

    def _ensure_root(self) -> None:
        self.root.mkdir(mode=0o755, exist_ok=True)
        wanted = {"memory", "pids"}
        for parent in (self.mount, self.root):
            ctl = parent / "cgroup.subtree_control"
            have = set(ctl.read_text().split()) if ctl.exists() else set()
            missing = sorted(wanted - have)
            if not missing:
                continue
            try:
                ctl.write_text(" ".join(f"+{c}" for c in missing) + "\n")
            except OSError:  # one controller the kernel lacks fails the whole write
                for c in missing:
                    with contextlib.suppress(OSError):
                        ctl.write_text(f"+{c}\n")

    def create(self, job_id: int, attempt: int, limits: Limits) -> Path | None:
        if self.disabled_reason is not None:
            return None
        path = self.root / f"job-{job_id}-{attempt}"
        try:
            self._ensure_root()
            path.mkdir(mode=0o755, exist_ok=True)
            if limits.memory_max_bytes is not None:
                (path / "memory.max").write_text(f"{limits.memory_max_bytes}\n")
            if limits.pids_max is not None:
                (path / "pids.max").write_text(f"{limits.pids_max}\n")
        except OSError as exc:
            self.disabled_reason = (
                f"cannot use cgroups under {self.root} ({exc.strerror}): jobs run without limits"
            )
            log.warning("%s", self.disabled_reason)
            return None
        return path

    def remove(self, path: Path | None) -> None:
        """Remove an attempt's directory once its processes are gone (rmdir on cgroupfs;
        a test's plain directory has files in it, removed first)."""
        if path is None or self.root not in path.parents:
            return
        if not (path / "cgroup.events").exists():  # not cgroupfs: a test's directory
            for f in path.glob("*"):
                with contextlib.suppress(OSError):
                    f.unlink()
        with contextlib.suppress(OSError):
            os.rmdir(path)
