"""The MIG planner in a real server (``gpufleet server --auto-mig``), its node's agent
played through the sync: slice jobs wait and no whole-GPU job does -> an idle MIG GPU is
asked a layout of the waiting profile, through the operator's path (cordon rule ``mig``,
a ``mig-asked`` event by ``auto-mig`` with the reason, the change in the node's sync
reply), and once the node applies it the jobs run there; then whole-GPU jobs wait -> an
idle MIG GPU goes back to whole. Held and blocked jobs are no demand. The planner's rules
one by one: ``tests/test_migplan.py``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from gpufleet import mig
from gpufleet.api.maintenance import MigLayoutIn
from gpufleet.cli import app
from gpufleet.server.config import ServerConfig
from gpufleet.server.loops import automig
from gpufleet.server.problems import Kind
from gpufleet.server.services import miglayouts
from gpufleet.server.store.db import Database
from gpufleet.server.store.models import GpuRow
from server.conftest import Server, make_pool, make_team, ok, start_server, stop_server, unique, wait_for
from server.playnode import attempt_of, eventually, join_token, placed, submit, sync

MODEL = "NVIDIA H100 80GB HBM3"
ONE_G = ["1g.10gb"] * 7


@pytest.fixture(scope="module")
def auto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    db = tmp_path_factory.mktemp("automig") / "gpufleet.db"
    # the scheduling pass in a thread: the same pass, and a server up in half the time
    flags = ("--auto-mig", "--auto-mig-interval", "0.1", "--scheduler-thread")
    srv = start_server(f"sqlite:///{db}", extra=flags)
    yield srv
    stop_server(srv)


def gpus(node: str, layouts: dict[int, list[str] | None]) -> list[dict[str, Any]]:
    """What the node's agent reports: GPU -> its MIG layout (None: MIG mode off), the
    instances placed as the agent places them."""
    out = []
    for i, layout in sorted(layouts.items()):
        g: dict[str, Any] = {"index": i, "model": MODEL, "uuid": f"GPU-{node}-{i}", "mig_enabled": False}
        if layout is not None:
            placed_ = mig.place_layout(mig.H100_80GB, layout)
            g |= {
                "mig_enabled": True,
                "mig_instances": [
                    {
                        "uuid": f"MIG-{node}-{i}-{p.start}",
                        "profile": p.profile,
                        "gpu_instance_id": k + 1,
                        "compute_instance_id": 0,
                        "start": p.start,
                        "size": p.size,
                        "memory_mb": p.size * 10_240,
                    }
                    for k, p in enumerate(placed_)
                ],
            }
        out.append(g)
    return out


def asked(srv: Server, node: str) -> list[tuple[int | None, str, str]]:
    with srv.client() as c:
        events = ok(c.get("/fleet/events", params={"node": node}))
    return sorted((e["gpu_index"], e["actor"], e["reason"]) for e in events if e["kind"] == "mig-asked")


def gpu_row(srv: Server, node: str, index: int) -> tuple[bool, str | None, list[str] | None]:
    with Session(srv.engine) as s:
        row = s.execute(
            select(GpuRow.cordoned, GpuRow.cordon_rule, GpuRow.mig_pending).where(
                GpuRow.node == node, GpuRow.index == index
            )
        ).one()
    return bool(row[0]), row[1], row[2]


def ran(job: dict[str, Any]) -> dict[str, Any]:
    return {"job_id": job["id"], "state": "exited", "exit_code": 0, "attempt": attempt_of(job)}


def test_waiting_slices_relayout_an_idle_gpu_and_waiting_whole_jobs_make_one_whole(auto: Server) -> None:
    pool, team = make_pool(auto), make_team(auto)
    node = unique("am")
    with auto.client() as c:
        ok(c.put(f"/nodes/{node}", json={"pool": pool, "gpus": gpus(node, {0: None, 1: None})}))
    token = join_token(auto, node)
    sync(auto, node, {"gpus": gpus(node, {0: ONE_G, 1: ["7g.80gb"]}), "jobs": []}, token=token)
    slices = {"gpu_type": "MIG 1g.10gb", "pool": pool, "team": team}
    busy, _ = placed(auto, submit(auto, gpus=7, **slices)["id"])  # every 1g.10gb slice of GPU 0
    submit(auto, gpus=3, begin="now+1hour", **slices)  # blocked: no demand
    submit(auto, gpus=3, hold=True, **slices)  # held: no demand
    two = submit(auto, gpus=2, **slices)

    got = eventually(lambda: asked(auto, node))
    assert [(g, who) for g, who, _ in got] == [(1, "auto-mig")], got
    assert "(auto-mig: 2 1g.10gb slices waiting)" in got[0][2]
    assert gpu_row(auto, node, 1) == (True, "mig", ONE_G)
    reply = sync(auto, node, {"gpus": gpus(node, {0: ONE_G, 1: ["7g.80gb"]}), "jobs": []}, token=token)
    assert reply["mig"] == [{"gpu": 1, "layout": ONE_G}]
    applied = {
        "gpus": gpus(node, {0: ONE_G, 1: ONE_G}),
        "jobs": [],
        "mig_results": [{"gpu": 1, "layout": ONE_G}],
    }
    sync(auto, node, applied, token=token)
    assert gpu_row(auto, node, 1) == (False, None, None)
    job, _ = placed(auto, two["id"])
    assert [mig.device_gpu(i) for i in job["allocation"][0]["gpus"]] == [1, 1]

    sync(auto, node, {"jobs": [ran(busy), ran(job)]}, token=token)
    for j in (busy, job):
        wait_for(auto, j["id"], "COMPLETED")
    one = submit(auto, gpus=1, pool=pool, team=team)  # no whole GPU: both are in MIG mode
    got = eventually(lambda: len(asked(auto, node)) == 2 and asked(auto, node))
    assert got and got[0][:2] == (0, "auto-mig") and "(auto-mig: 1 whole GPU waiting)" in got[0][2], got
    assert gpu_row(auto, node, 0) == (True, "mig", [])
    reply = sync(auto, node, {"jobs": []}, token=token)
    assert reply["mig"] == [{"gpu": 0, "layout": []}]
    back = {"gpus": gpus(node, {0: None, 1: ONE_G}), "jobs": [], "mig_results": [{"gpu": 0, "layout": []}]}
    sync(auto, node, back, token=token)
    assert placed(auto, one["id"])[0]["allocation"] == [{"node": node, "gpus": [0]}]


@pytest.mark.parametrize("interval", ["0", "soon"])
def test_a_bad_interval_is_refused_before_the_server_starts(tmp_path: Path, interval: str) -> None:
    argv = ["server", "--database-url", f"sqlite:///{tmp_path / 'x.db'}", "--auto-mig-interval", interval]
    done = CliRunner().invoke(app, argv)
    assert done.exit_code == 2, done.output
    assert "gpufleet: error:" in done.output and not (tmp_path / "x.db").exists()
    assert ServerConfig(database_url="sqlite://").auto_mig is False  # off unless asked


def test_idle_only_refuses_a_gpu_a_job_took_or_one_asked_since(auto: Server) -> None:
    """What the loop's ``idle_only`` guards against: between its read and its write, a job
    took the GPU (the operator's path would drain it) or an operator asked a layout (the
    loop would replace it). Both are a conflict that writes nothing."""
    pool, team = make_pool(auto), make_team(auto)
    node = unique("am")
    with auto.client() as c:
        ok(c.put(f"/nodes/{node}", json={"pool": pool, "gpus": gpus(node, {0: None, 1: None})}))
    token = join_token(auto, node)
    sync(auto, node, {"gpus": gpus(node, {0: ["7g.80gb"], 1: ["7g.80gb"]}), "jobs": []}, token=token)
    placed(auto, submit(auto, gpus=1, gpu_type="MIG 7g.80gb", pool=pool, team=team)["id"])
    with auto.client() as c:
        taken = next(g["index"] for g in ok(c.get(f"/nodes/{node}"))["gpus"] if g["job_id"] is not None)
        ok(c.put(f"/nodes/{node}/gpus/{1 - taken}/mig", json={"layout": ["3g.40gb", "3g.40gb"]}))
    db = Database.connect(auto.db_url)
    try:
        for index in (0, 1):
            failed = miglayouts.set_layout(
                db=db,
                actor=automig.ACTOR,
                name=node,
                index=index,
                spec=MigLayoutIn(layout=ONE_G),
                now=time.time(),
                reason="auto-mig: test",
                idle_only=True,
            )
            assert failed is not None and failed.kind == Kind.CONFLICT, failed
    finally:
        db.dispose()
    assert gpu_row(auto, node, taken) == (False, None, None)
    assert gpu_row(auto, node, 1 - taken) == (True, "mig", ["3g.40gb", "3g.40gb"])
    assert [who for _, who, _ in asked(auto, node)] == ["admin"]
