"""The backup loop (``gpufleet server --backup-dir DIR --backup-every 6h --backup-keep 14``).

Built in ``loops/build.py`` with the term's loops, so only the leader backs up (one
server on SQLite; under HA the lease holder). Each step:

1. writes ``DIR/gpufleet-YYYYMMDDTHHMMSSZ.db`` (SQLite) or ``.dump`` (``pg_dump``), the
   name the step's UTC time (``store/backup.py``: consistent while the server runs,
   never a half-written file under that name, mode 0600);
2. keeps the newest ``keep`` files whose names match that pattern and deletes the older
   ones. A file it did not make (another name, a symlink, a folder) is never touched;
   one it cannot delete is logged and counted, and the rest go on.

A failed backup is counted (``BackupStatus.failures``, ``gpufleet_backup_failures_total``
in ``/metrics``) and logged by the runner; the step wakes its own loop, so the runner
tries again once it has rested ``retry_after_s`` (a tenth of the period, at most 10
minutes), then keeps its period: the loop never stops.

A start does not reset the period: the first backup comes one period after the newest
file in DIR (at once when there is none, or it is older), so a server restarted more
often than its period still backs up.

``BackupStatus`` outlives the terms (``app.py`` makes it, ``metrics/backup.py`` reads it):
the time of the last success (seeded from the newest file in DIR), its size, the
counts of successes, failures and files deleted.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from gpufleet.clock import Clock
from gpufleet.server.errors import BackupError
from gpufleet.server.runner import Loop
from gpufleet.server.store import backup as store

log = logging.getLogger("gpufleet.backup")
NAME = re.compile(r"^gpufleet-(\d{8}T\d{6}Z)\.(db|dump)$")
"""What the loop names its files, and the only files it deletes."""
STAMP = "%Y%m%dT%H%M%SZ"
MAX_RETRY_S = 600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class BackupPolicy:
    """Where, how often, how many (``--backup-dir``, ``--backup-every``, ``--backup-keep``)."""

    directory: Path
    every_s: float
    keep: int


class BackupStatus:
    """What ``/metrics`` shows of the backups; written by the loop, read at scrape time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.last_success_at: float | None = None
        self.last_size = 0
        self.successes = 0
        self.failures = 0
        self.deleted = 0
        self.files = 0

    def seed(self, at: float | None, files: int) -> None:
        """What DIR holds at start: the newest backup's time (unless one is recorded)."""
        with self._lock:
            if self.last_success_at is None:
                self.last_success_at = at
            self.files = files

    def succeeded(self, *, at: float, size: int) -> None:
        with self._lock:
            self.successes += 1
            self.last_success_at = at
            self.last_size = size

    def failed(self) -> None:
        with self._lock:
            self.failures += 1

    def pruned(self, *, deleted: int, files: int) -> None:
        with self._lock:
            self.deleted += deleted
            self.files = files


def backup_name(now: float, url: str) -> str:
    """``gpufleet-<UTC time>.db`` (SQLite) or ``.dump`` (pg_dump's custom format)."""
    ext = "db" if store.kind_of(url) == "sqlite" else "dump"
    return f"gpufleet-{datetime.fromtimestamp(now, UTC).strftime(STAMP)}.{ext}"


def taken_at(name: str) -> float | None:
    """The UTC time in one of the loop's names; None for any other name."""
    m = NAME.match(name)
    if m is None:
        return None
    return datetime.strptime(m.group(1), STAMP).replace(tzinfo=UTC).timestamp()


def ours(directory: Path) -> list[tuple[float, Path]]:
    """The loop's backups in ``directory``, oldest first: regular files (not symlinks)
    whose names match ``NAME``."""
    found: list[tuple[float, Path]] = []
    with os.scandir(directory) as entries:
        for entry in entries:
            at = taken_at(entry.name)
            if at is None or not entry.is_file(follow_symlinks=False):
                continue
            found.append((at, Path(entry.path)))
    return sorted(found)


STALE_TEMP_S = 3600.0
"""A backup's temporary file (``store/backup.py``: ``.gpufleet-backup-*.tmp``) untouched
this long is a dead writer's (``kill -9`` mid-copy): ``prune`` deletes it. A copy in
progress writes all along, so its file is never this old."""


def stale_temps(directory: Path, *, now: float) -> list[Path]:
    """Regular files named like a backup's temporary file, unmodified ``STALE_TEMP_S``."""
    found: list[Path] = []
    with os.scandir(directory) as entries:
        for entry in entries:
            name = entry.name
            if not (name.startswith(".gpufleet-backup-") and name.endswith(".tmp")):
                continue
            if (
                entry.is_file(follow_symlinks=False)
                and now - entry.stat(follow_symlinks=False).st_mtime >= STALE_TEMP_S
            ):
                found.append(Path(entry.path))
    return sorted(found)


def to_delete(backups: list[tuple[float, Path]], keep: int) -> list[Path]:
    """Of the loop's backups (oldest first), those beyond the newest ``keep``."""
    return [path for _, path in backups[: max(0, len(backups) - keep)]]


def first_after(newest: float | None, *, now: float, every_s: float) -> float:
    """Seconds from start to the first backup: one period after the newest (at once when
    there is none or it is a period old; never more than a period, whatever its clock)."""
    if newest is None:
        return 0.0
    return min(every_s, max(0.0, every_s - (now - newest)))


class BackupStep:
    """One backup and one pruning (the module docstring's steps 1 and 2)."""

    def __init__(self, *, url: str, clock: Clock, policy: BackupPolicy, status: BackupStatus) -> None:
        self.url = url
        self.clock = clock
        self.policy = policy
        self.status = status
        self.retry: Callable[[], None] | None = None
        """Called when a backup fails (the loop's ``wake``: try again after the rest)."""

    def __call__(self) -> None:
        now = self.clock.now()
        dest = self.policy.directory / backup_name(now, self.url)
        try:
            made = store.backup(self.url, dest, timeout_s=max(self.policy.every_s, MAX_RETRY_S))
        except Exception:
            self.status.failed()
            if self.retry is not None:
                self.retry()
            raise  # the runner logs it, rests retry_after_s, then takes the wake-up
        self.status.succeeded(at=now, size=made.size)
        log.info("backup %s written (%d bytes)", dest, made.size)
        self.prune()

    def prune(self) -> None:
        """Delete the loop's backups beyond the newest ``keep`` and dead writers'
        temporary files (``stale_temps``); one that cannot be deleted is logged and
        left, the rest go on."""
        backups = ours(self.policy.directory)
        gone = 0
        for path in to_delete(backups, self.policy.keep):
            gone += _unlink(path)
        for path in stale_temps(self.policy.directory, now=time.time()):  # file times: the wall clock
            _unlink(path)
        self.status.pruned(deleted=gone, files=len(backups) - gone)


def _unlink(path: Path) -> int:
    """1 when ``path`` (still a regular file) was deleted, else 0 (logged)."""
    try:
        if not stat.S_ISREG(path.lstat().st_mode):  # changed since the listing
            return 0
        path.unlink()
        return 1
    except OSError as exc:
        log.warning("backup %s not deleted: %s", path, exc.strerror or exc)
        return 0


def backup_loop(*, url: str, clock: Clock, policy: BackupPolicy, status: BackupStatus) -> Loop:
    """The loop, not started; ``status`` seeded with what ``policy.directory`` holds. It
    never raises (a leader's term must start whatever the directory's state): a folder
    it cannot make or read is logged, and its first backup, at once, fails and counts."""
    try:
        policy.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        existing = ours(policy.directory)
    except OSError as exc:
        log.warning("backup folder %s: %s", policy.directory, exc.strerror or exc)
        existing = []
    newest = existing[-1][0] if existing else None
    status.seed(newest, len(existing))
    step = BackupStep(url=url, clock=clock, policy=policy, status=status)
    loop = Loop(
        name="backup",
        step=step,
        interval_s=policy.every_s,
        first_after_s=first_after(newest, now=clock.now(), every_s=policy.every_s),
        retry_after_s=min(MAX_RETRY_S, policy.every_s / 10),
        expected=(BackupError,),
    )
    step.retry = loop.wake
    return loop


__all__ = [
    "NAME",
    "BackupPolicy",
    "BackupStatus",
    "BackupStep",
    "backup_loop",
    "backup_name",
    "first_after",
    "ours",
    "taken_at",
    "to_delete",
]
