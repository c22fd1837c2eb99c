"""The submit path's fleet cache: a stale fleet may accept a job, never refuse one."""

from __future__ import annotations

from pathlib import Path

from gpufleet.server.services.inventory import FleetCache
from gpufleet.server.store import db as dbmod
from gpufleet.server.store.models import GpuRow, NodeRow


def _add_node(db: dbmod.Database, name: str) -> None:
    with db.write() as s:
        s.add(NodeRow(name=name, pool="default", created_at=0))
        s.flush()
        s.add_all(GpuRow(node=name, index=i, model="H100", memory_mb=1) for i in range(8))


def test_stale_fleet_is_kept_briefly_and_never_passed_off_as_fresh(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'inv.db'}"
    dbmod.upgrade(url)
    db = dbmod.Database.connect(url)
    cache = FleetCache()
    _add_node(db, "a")
    with db.read() as s:
        one = cache.registered(s, "default")
        assert cache.is_fresh("default", one) and len(one.nodes) == 1
    _add_node(db, "b")
    cache.invalidate()
    with db.read() as s:
        assert cache.registered(s, "default", stale_ok=True) is one  # accepting on it is safe
        assert not cache.is_fresh("default", one)  # a refusal is confirmed on a reload
        two = cache.registered(s, "default")
        assert len(two.nodes) == 2 and cache.is_fresh("default", two)
        cache.stale_s = 0.0  # too old to be kept: even stale_ok reloads
        cache.invalidate()
        assert cache.registered(s, "default", stale_ok=True) is not two
    db.dispose()
