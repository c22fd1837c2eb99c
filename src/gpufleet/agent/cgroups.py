"""A cgroup per job attempt: memory and pids limits, and the set of every process the
job started, detached or not (as Slurm's ``proctrack/cgroup`` + ``task/cgroup`` do).

Three kinds of host, found by ``Cgroups`` at start (``mode``):

- **v2** (``<mount>/cgroup.controllers`` exists): ``<root>/<node>-job-<id>-<attempt>``, the memory
  and pids controllers enabled on ``<root>`` where needed, ``memory.max`` / ``pids.max``;
  ending it is ``cgroup.kill`` (or SIGKILL to each member on kernels before 5.14).
- **v1** (hybrid and legacy hosts: controllers mounted at ``<mount>/memory``,
  ``<mount>/pids``, ``<mount>/freezer``): one directory per controller,
  ``<mount>/<controller>/<root name>/<node>-job-<id>-<attempt>``, with ``memory.limit_in_bytes``
  and ``memory.memsw.limit_in_bytes`` (the same value: no escape into swap; where the
  kernel accounts swap) and ``pids.max``; ending it freezes the freezer group (nothing
  in it can fork meanwhile), SIGKILLs every member and thaws it.
- **none** (no hierarchy, or none writable: a container without a delegated subtree):
  ``create`` returns None and ``disabled_reason`` says once, at start, what cannot be
  enforced; the agent prints it and reports it with every sync (the page shows it).
  The runner then finds a job's processes by the mark in their environment
  (``marked``).

The job's wrapper writes its own pid to ``cgroup.procs`` of each directory before it
starts the job (``--cgroup DIR[:DIR...]``), so every process of the job is in them from
its first instruction; a job's account cannot leave them (the files are root's).
``root`` and ``mount`` are parameters so tests use a plain directory laid out like
cgroupfs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("gpufleet.agent")

CGROUP2_MOUNT = Path("/sys/fs/cgroup")
DEFAULT_ROOT = CGROUP2_MOUNT / "gpufleet"
V1_CONTROLLERS = ("memory", "pids", "freezer")
NO_LIMITS = "jobs run without memory/pids limits; leftover processes found by their environment only"


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    memory_max_bytes: int | None = None
    pids_max: int | None = 4096


def split(cgroup: str | None) -> tuple[Path, ...]:
    """``LocalJob.cgroup`` (directories joined with ``os.pathsep``) as paths."""
    return tuple(Path(p) for p in (cgroup or "").split(os.pathsep) if p)


def members(cgroup: str | None) -> set[int]:
    """Every live process in the job's cgroup directories (none once they are gone;
    cgroupfs lists live ones only, a test's plain file may name dead ones)."""
    pids: set[int] = set()
    for d in split(cgroup):
        with contextlib.suppress(OSError, ValueError):
            pids |= {int(p) for p in (d / "cgroup.procs").read_text().split()}
    return {p for p in pids if os.path.exists(f"/proc/{p}")}


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
    except OSError:
        return False
    return True


def _kill_each(pids: set[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def signal_all(cgroup: str | None, sig: int) -> set[int]:
    """``sig`` to every member of the job's cgroup; returns those signalled."""
    pids = members(cgroup)
    _kill_each(pids, sig)
    return pids


def kill_all(cgroup: str | None) -> set[int]:
    """End every process of the job: ``cgroup.kill`` (v2), else freeze, SIGKILL each
    member, thaw (v1: a frozen process cannot fork a new one meanwhile; the kill is
    delivered at the thaw). Returns the members found (empty: nothing was left)."""
    dirs = split(cgroup)
    pids = members(cgroup)
    if not pids:
        return pids
    if any(_write(d / "cgroup.kill", "1\n") for d in dirs if (d / "cgroup.kill").exists()):
        return pids
    freezer = next((d for d in dirs if (d / "freezer.state").exists()), None)
    frozen = freezer is not None and _write(freezer / "freezer.state", "FROZEN\n")
    try:
        _kill_each(members(cgroup), signal.SIGKILL)
    finally:
        if frozen and freezer is not None:
            _write(freezer / "freezer.state", "THAWED\n")
    return pids


class Cgroups:
    def __init__(self, root: Path = DEFAULT_ROOT, *, mount: Path | None = None) -> None:
        self.root = root
        self.mount = mount if mount is not None else root.parent
        self.disabled_reason: str | None = None
        self.mode = "none"
        if (self.mount / "cgroup.controllers").exists():
            self.mode = "v2"
        elif any((self.mount / c / "cgroup.procs").exists() for c in V1_CONTROLLERS):
            self.mode = "v1"
        else:
            self.disabled_reason = f"no cgroup hierarchy (v1 or v2) at {self.mount}: {NO_LIMITS}"

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

    def _v2(self, name: str, limits: Limits) -> list[Path]:
        self._ensure_root()
        path = self.root / name
        path.mkdir(mode=0o755, exist_ok=True)
        if limits.memory_max_bytes is not None:
            (path / "memory.max").write_text(f"{limits.memory_max_bytes}\n")
        if limits.pids_max is not None:
            (path / "pids.max").write_text(f"{limits.pids_max}\n")
        return [path]

    def _v1(self, name: str, limits: Limits) -> list[Path]:
        """One directory per mounted controller. A missing controller is skipped (its
        limit is then not enforced: said once); a write that fails is an error."""
        dirs: list[Path] = []
        for ctrl in V1_CONTROLLERS:
            top = self.mount / ctrl
            if not (top / "cgroup.procs").exists():
                self._lacking(ctrl)
                continue
            path = top / self.root.name / name
            path.mkdir(mode=0o755, parents=True, exist_ok=True)
            dirs.append(path)
            if ctrl == "memory" and limits.memory_max_bytes is not None:
                (path / "memory.limit_in_bytes").write_text(f"{limits.memory_max_bytes}\n")
                swap = path / "memory.memsw.limit_in_bytes"
                if swap.exists():
                    swap.write_text(f"{limits.memory_max_bytes}\n")
            if ctrl == "pids" and limits.pids_max is not None:
                (path / "pids.max").write_text(f"{limits.pids_max}\n")
        return dirs

    def _lacking(self, ctrl: str) -> None:
        if self.disabled_reason is None:
            self.disabled_reason = f"no cgroup v1 {ctrl} controller at {self.mount / ctrl}: not enforced"
            log.warning("%s", self.disabled_reason)

    def create(self, job_id: int, attempt: int, limits: Limits, *, node: str = "") -> str | None:
        """The attempt's cgroup directories (joined with ``os.pathsep``: ``LocalJob.cgroup``
        and the wrapper's ``--cgroup``), None where the node has none usable. ``node``
        prefixes the name: several agents on one machine (tests, a demo) never share one."""
        if self.mode == "none":
            return None
        tag = "".join(c if c.isalnum() or c in "._-" else "_" for c in node[:100])
        name = f"{tag}-job-{job_id}-{attempt}" if tag else f"job-{job_id}-{attempt}"
        try:
            dirs = self._v2(name, limits) if self.mode == "v2" else self._v1(name, limits)
        except OSError as exc:
            self.mode = "none"
            self.disabled_reason = f"cannot use cgroups under {self.root} ({exc.strerror}): {NO_LIMITS}"
            log.warning("%s", self.disabled_reason)
            return None
        return os.pathsep.join(map(str, dirs)) or None

    def remove(self, cgroup: str | None) -> None:
        """Remove an attempt's directories once its processes are gone (rmdir on cgroupfs;
        a test's plain directory has files in it, removed first)."""
        for path in split(cgroup):
            if self.root.name not in path.parts or path.parent.name != self.root.name:
                continue
            if not (path / "cgroup.events").exists() and not (path / "tasks").exists():
                for f in path.glob("*"):  # not cgroupfs: a test's directory
                    with contextlib.suppress(OSError):
                        f.unlink()
            with contextlib.suppress(OSError):
                os.rmdir(path)


def marked(hostfile: str) -> set[int]:
    """Without a cgroup: the processes (not root's) whose environment carries the
    attempt's mark, its ``GPUFLEET_HOSTFILE`` (a path in this agent's work dir, one per
    attempt). Root reads ``/proc/PID/environ`` as data; a process that exec'd with
    another environment escapes this (a cgroup is the enforced form)."""
    import psutil

    found: set[int] = set()
    for p in psutil.process_iter(["uids"]):
        uids = p.info.get("uids")
        if uids is None or uids.real == 0 or p.pid == os.getpid():
            continue
        try:
            if p.environ().get("GPUFLEET_HOSTFILE") == hostfile:
                found.add(p.pid)
        except psutil.Error:
            continue
    return found
