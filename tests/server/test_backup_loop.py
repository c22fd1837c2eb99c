"""The backup loop (``loops/backup.py``): its names, its retention (the newest N of its
own files, nothing else), its failures (counted, retried, never the end of the loop),
when it first runs; in process with a fake clock on SQLite and PostgreSQL, then on a
running ``gpufleet server --backup-dir`` with ``/metrics``."""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpufleet.clock import FakeClock
from gpufleet.server.loops.backup import (
    STALE_TEMP_S,
    BackupPolicy,
    BackupStatus,
    BackupStep,
    backup_loop,
    first_after,
    ours,
    taken_at,
    to_delete,
)
from gpufleet.server.store import backup as store
from gpufleet.server.store import db as dbmod
from server.conftest import ADMIN_TOKEN, gpufleet, scratch_postgres, start_server, stop_server

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
HOUR = 3600.0


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("gpufleet-20270115T080000Z.db", T0),
        ("gpufleet-20270115T080000Z.dump", T0),
        ("gpufleet-20270115T080000Z.db.bak", None),
        ("gpufleet-20270115T0800Z.db", None),
        ("mine-20270115T080000Z.db", None),
        (".gpufleet-backup-abc.tmp", None),
        ("gpufleet-notes.txt", None),
    ],
    ids=["sqlite", "pg_dump", "suffix", "short-time", "prefix", "temporary", "notes"],
)
def test_only_its_own_names_are_its_own(name: str, want: float | None) -> None:
    assert taken_at(name) == want


@pytest.mark.parametrize(
    ("count", "keep", "deleted"),
    [(0, 3, 0), (3, 3, 0), (5, 3, 2), (5, 1, 4)],
    ids=["none", "exactly-keep", "two-over", "keep-one"],
)
def test_retention_deletes_the_oldest_beyond_keep(count: int, keep: int, deleted: int) -> None:
    backups = [(T0 + i, Path(f"f{i}")) for i in range(count)]
    assert to_delete(backups, keep) == [Path(f"f{i}") for i in range(deleted)]


@pytest.mark.parametrize(
    ("newest", "now", "want"),
    [(None, T0, 0.0), (T0 - 2 * HOUR, T0, 4 * HOUR), (T0 - 7 * HOUR, T0, 0.0), (T0 + HOUR, T0, 6 * HOUR)],
    ids=["no-backup", "two-hours-old", "overdue", "from-the-future"],
)
def test_first_backup_comes_a_period_after_the_newest(newest: float | None, now: float, want: float) -> None:
    assert first_after(newest, now=now, every_s=6 * HOUR) == want


@contextlib.contextmanager
def database(kind: str, tmp_path: Path) -> Iterator[str]:
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'g.db'}"
        dbmod.upgrade(url)
        yield url
        return
    with scratch_postgres("backuploop") as url:
        dbmod.upgrade(url)
        yield url


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_steps_name_prune_and_leave_foreign_files(kind: str, tmp_path: Path) -> None:
    folder = tmp_path / "backups"
    folder.mkdir()
    outside = tmp_path / "precious.db"
    outside.write_text("someone else's")
    foreign = {
        "gpufleet-notes.txt": "notes",
        "gpufleet-20000101T000000Z.db.bak": "a copy made by hand",
        "other-20000101T000000Z.db": "another tool's",
    }
    for name, body in foreign.items():
        (folder / name).write_text(body)
    (folder / "gpufleet-20000101T000000Z.db").symlink_to(outside)  # its pattern, not a file
    (folder / "gpufleet-20000102T000000Z.dump").mkdir()  # its pattern, a folder
    with database(kind, tmp_path) as url:
        clock, status = FakeClock(T0), BackupStatus()
        step = BackupStep(
            url=url, clock=clock, policy=BackupPolicy(directory=folder, every_s=HOUR, keep=2), status=status
        )
        for _ in range(4):
            step()
            clock.advance(HOUR)
        ext = "db" if kind == "sqlite" else "dump"
        kept = [p.name for _, p in ours(folder)]
        assert kept == [f"gpufleet-20270115T100000Z.{ext}", f"gpufleet-20270115T110000Z.{ext}"]
        for name in kept:
            path = folder / name
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            assert store.revision_of(path) == dbmod.head_revision()
    for name, body in foreign.items():
        assert (folder / name).read_text() == body
    assert (folder / "gpufleet-20000101T000000Z.db").is_symlink() and outside.read_text() == "someone else's"
    assert (folder / "gpufleet-20000102T000000Z.dump").is_dir()
    assert (status.successes, status.failures, status.deleted, status.files) == (4, 0, 2, 2)
    assert status.last_success_at == T0 + 3 * HOUR and status.last_size > 0


def test_a_failed_backup_is_counted_retried_and_the_loop_goes_on(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'g.db'}"
    folder = tmp_path / "backups"
    clock, status = FakeClock(T0), BackupStatus()
    loop = backup_loop(
        url=url, clock=clock, policy=BackupPolicy(directory=folder, every_s=HOUR, keep=3), status=status
    )
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    retried: list[bool] = []
    step = loop.step
    assert isinstance(step, BackupStep)
    step.retry = lambda: retried.append(True)
    assert loop.run_once() is False  # no database yet: counted, never raised
    assert (loop.failures, status.failures, retried) == (1, 1, [True])
    assert status.last_success_at is None and list(folder.iterdir()) == []
    dbmod.upgrade(url)
    clock.advance(60)
    assert loop.run_once() is True
    assert (loop.passes, status.successes, status.failures) == (1, 1, 1)
    assert status.last_success_at == T0 + 60 and len(ours(folder)) == 1


def test_a_start_picks_up_where_the_folder_is(tmp_path: Path) -> None:
    folder = tmp_path / "backups"
    folder.mkdir()
    (folder / "gpufleet-20270115T060000Z.db").write_text("x")  # two hours before T0
    status = BackupStatus()
    policy = BackupPolicy(directory=folder, every_s=6 * HOUR, keep=3)
    loop = backup_loop(url="sqlite:///unused.db", clock=FakeClock(T0), policy=policy, status=status)
    assert loop.first_after_s == 4 * HOUR and status.last_success_at == T0 - 2 * HOUR and status.files == 1
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    policy = BackupPolicy(directory=blocked, every_s=HOUR, keep=3)
    loop = backup_loop(url="sqlite:///unused.db", clock=FakeClock(T0), policy=policy, status=BackupStatus())
    assert loop.first_after_s == 0.0  # no raise: it backs up at once, fails, counts


def _metrics(url: str) -> dict[str, float]:
    body = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10).text
    out = {}
    for line in body.splitlines():
        if line.startswith("gpufleet_backup"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_a_server_backs_up_keeps_n_and_reports_it(tmp_path: Path) -> None:
    folder = tmp_path / "backups"
    folder.mkdir()
    (folder / "gpufleet-readme.txt").write_text("mine")
    url = f"sqlite:///{tmp_path / 'g.db'}"
    srv = start_server(url, extra=("--backup-dir", str(folder), "--backup-every", "1s", "--backup-keep", "2"))
    try:
        deadline = time.monotonic() + 60
        while _metrics(srv.url).get("gpufleet_backups_total", 0) < 4:
            assert time.monotonic() < deadline, srv.stderr()
            time.sleep(0.2)
        seen = _metrics(srv.url)
    finally:
        stop_server(srv)
    assert seen["gpufleet_backup_failures_total"] == 0 and seen["gpufleet_backup_deleted_total"] >= 2
    assert seen["gpufleet_backup_files"] == 2 and seen["gpufleet_backup_last_size_bytes"] > 0
    assert abs(seen["gpufleet_backup_last_success_timestamp_seconds"] - time.time()) < 120
    assert len(ours(folder)) == 2 and (folder / "gpufleet-readme.txt").read_text() == "mine"
    assert sorted(os.listdir(folder)) == sorted([*(p.name for _, p in ours(folder)), "gpufleet-readme.txt"])
    newest = ours(folder)[-1][1]
    target = f"sqlite:///{tmp_path / 'restored.db'}"
    assert gpufleet("db", "restore", str(newest), "--database-url", target).returncode == 0


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--backup-every", "0s"), "--backup-every must be 1s or longer"),
        (("--backup-every", "soon"), "--backup-every"),
        (("--backup-keep", "0"), "--backup-keep"),
        (("--backup-dir", "{file}"), "--backup-dir"),
    ],
    ids=["zero-period", "bad-period", "keep-none", "dir-is-a-file"],
)
def test_bad_backup_options_are_refused_before_start(
    tmp_path: Path, args: tuple[str, str], says: str
) -> None:
    (tmp_path / "f").write_text("x")
    argv = [a.replace("{file}", str(tmp_path / "f")) for a in args]
    res = gpufleet("server", "--database-url", f"sqlite:///{tmp_path / 'g.db'}", *argv, timeout=60)
    assert res.returncode == 2 and says in res.stderr
    assert not (tmp_path / "g.db").exists()  # refused before the database was touched


def test_a_dead_writers_temporary_file_goes_and_a_live_one_stays(tmp_path: Path) -> None:
    """``kill -9`` mid-backup leaves ``.gpufleet-backup-*.tmp``: pruning deletes it once it
    has not changed for ``STALE_TEMP_S``; a fresh one (a copy in progress) and a symlink of
    that name stay."""
    folder = tmp_path / "backups"
    folder.mkdir()
    dead, live = folder / ".gpufleet-backup-dead.tmp", folder / ".gpufleet-backup-live.tmp"
    dead.write_text("half a copy")
    live.write_text("a copy being written")
    old = time.time() - STALE_TEMP_S - 60
    os.utime(dead, (old, old))
    outside = tmp_path / "precious"
    outside.write_text("keep")
    link = folder / ".gpufleet-backup-link.tmp"
    link.symlink_to(outside)
    os.utime(link, (old, old), follow_symlinks=False)
    policy = BackupPolicy(directory=folder, every_s=HOUR, keep=2)
    BackupStep(url="sqlite:///unused", clock=FakeClock(T0), policy=policy, status=BackupStatus()).prune()
    assert not dead.exists() and live.read_text() == "a copy being written"
    assert link.is_symlink() and outside.read_text() == "keep"
