"""Measured GPU power on its way to the scheduling pass, in process: which syncs'
readings are handed to the writer (``store/gpupower.py``: the dead band, the minute's
refresh, implausible figures dropped), and the node rows' write and read
(``services/racks.py``: a newer row is never replaced, old or malformed readings are not
counted). The running server's side is ``test_rack_power.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select, update

from gpufleet.api.nodes import GpuTelemetry
from gpufleet.server.services import racks
from gpufleet.server.store import db as dbmod
from gpufleet.server.store.gpupower import NodePower, PowerReadings, moved
from gpufleet.server.store.models import NodeRow, Pool, RackPowerRow
from gpufleet.server.store.writer import InlineWriter


def _gpus(*watts: float | None) -> list[GpuTelemetry]:
    return [GpuTelemetry(index=i, power_w=w) for i, w in enumerate(watts)]


@pytest.mark.parametrize(
    ("old", "new", "want"),
    [
        ({0: 100.0}, {0: 110.0}, False),
        ({0: 100.0}, {0: 110.1}, True),
        ({0: 400.0}, {0: 420.0}, False),  # 5 % of 400 W is 20 W
        ({0: 400.0}, {0: 379.0}, True),
        ({0: 100.0, 1: 50.0}, {0: 100.0}, True),  # a GPU lost its reading
        ({}, {0: 0.0}, True),
        (dict.fromkeys(range(8), 600.0), {i: 600.0 * (1.05 if i % 2 else 0.95) for i in range(8)}, False),
        (dict.fromkeys(range(8), 600.0), dict.fromkeys(range(8), 624.0), False),  # the total: +4 %
        (dict.fromkeys(range(8), 600.0), dict.fromkeys(range(8), 636.0), True),  # +6 %
        ({0: 700.0, 1: 70.0}, {0: 70.0, 1: 700.0}, True),  # the same total: a job moved GPUs
    ],
    ids=["10W-in", "10W-out", "5pct-in", "5pct-out", "gpu-gone", "gpu-new", "noise", "4pct", "6pct", "moved"],
)
def test_the_dead_band(old: dict[int, float], new: dict[int, float], want: bool) -> None:
    assert moved(old, new) is want


def test_what_a_sync_hands_to_the_writer() -> None:
    power = PowerReadings()
    assert not power.note("n", at=0.0, gpus=_gpus(None, None))  # nothing measured
    assert power.note("n", at=1.0, gpus=_gpus(100.0, 700.0))
    assert not power.note("n", at=2.0, gpus=_gpus(105.0, 690.0))  # against what waits
    assert power.pending() == {"n": NodePower(at=1.0, watts={0: 100.0, 1: 700.0})}
    assert power.note("n", at=61.0, gpus=_gpus(105.0, 690.0))  # a minute on: refreshed
    odd = [
        GpuTelemetry.model_construct(index=i, power_w=w) for i, w in ((0, float("nan")), (1, float("inf")))
    ]
    plain = [GpuTelemetry(index=i, power_w=w) for i, w in ((2, -1.0), (3, 6000.0), (4, 80.0))]
    assert power.note("m", at=1.0, gpus=[*odd, *plain])
    assert power.pending()["m"] == NodePower(at=1.0, watts={4: 80.0})


@pytest.fixture
def database(tmp_path: Path) -> Iterator[dbmod.Database]:
    url = f"sqlite:///{tmp_path / 'power.db'}"
    dbmod.upgrade(url)
    db = dbmod.Database.connect(url)
    with db.write() as s:
        s.add(Pool(name="p"))
        s.flush()
        s.add_all(NodeRow(name=n, pool="p", rack="r1", created_at=0) for n in ("a", "b", "c"))
        s.add(RackPowerRow(rack="r1", budget_w=40_000, headroom=0.3, updated_at=0, updated_by="admin"))
    yield db
    db.dispose()


def test_rows_are_written_in_one_flush_and_read_back_while_recent(database: dbmod.Database) -> None:
    power = PowerReadings()
    writer = InlineWriter(database)
    power.note("a", at=100.0, gpus=_gpus(150.0, 60.0))
    power.note("b", at=100.0, gpus=_gpus(300.0))
    power.flush(writer, racks.write_gpu_power)
    assert power.pending() == {}
    assert not power.note("a", at=101.0, gpus=_gpus(150.0, 60.0))  # written: nothing moved
    with database.read() as s:
        model = racks.power_model(s, 150.0)
        assert model is not None and model.measured == (("a", 0, 150.0), ("a", 1, 60.0), ("b", 0, 300.0))
        assert racks.power_model(s, 100.0 + racks.READING_MAX_AGE_S + 1).measured == ()  # type: ignore[union-attr]
    with database.write() as s:  # another server wrote a newer reading; a row's junk is skipped
        s.execute(
            update(NodeRow).where(NodeRow.name == "b").values(gpu_power={"0": 250.0}, gpu_power_at=200.0)
        )
        s.execute(
            update(NodeRow)
            .where(NodeRow.name == "c")
            .values(gpu_power={"x": 1.0, "1": "hot", "2": -3.0, "3": 90.0}, gpu_power_at=200.0)
        )
    with database.write() as s:
        racks.write_gpu_power(s, [{"b": NodePower(at=150.0, watts={0: 999.0})}])
    with database.read() as s:
        assert s.execute(
            select(NodeRow.gpu_power, NodeRow.gpu_power_at).where(NodeRow.name == "b")
        ).one() == (
            {"0": 250.0},
            200.0,
        )
        model = racks.power_model(s, 230.0)  # a's is 130 s old
        assert model is not None and model.measured == (("b", 0, 250.0), ("c", 3, 90.0))
