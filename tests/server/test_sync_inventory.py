"""One node's impossible inventory never stops the fleet.

A sync whose GPUs contradict what the server knows (a model change under a running job,
a held GPU gone while the others changed model, duplicate indices or UUIDs, an index no
GPU can have, several models on one node) cordons that node with the reason and a fleet
event, leaves its stored GPUs as they were, and still applies the rest of the sync. A
node whose stored rows are invalid anyway (written by hand) is left out of the
scheduling pass instead of failing it, and counted in ``/metrics``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import update

from gpufleet.server.store.models import GpuRow
from server.conftest import Server, make_pool, make_team, ok, wait_for
from server.playnode import eventually, log_text, metric, placed, register, submit, sync

Report = Callable[[str, int, int], list[dict[str, Any]]]
"""(node, index the job holds, the node's other index) -> the GPUs the node reports."""


def _gpu(node: str, index: int, model: str = "H100", uuid: str | None = None) -> dict[str, Any]:
    return {"index": index, "model": model, "uuid": uuid if uuid is not None else f"GPU-{node}-{index}"}


CONTRADICTIONS: list[tuple[str, Report, str]] = [
    (
        "model-change-under-a-job",
        lambda n, held, other: [_gpu(n, held, "A100"), _gpu(n, other, "A100")],
        "changed model",
    ),
    ("held-gpu-missing-others-changed", lambda n, held, other: [_gpu(n, other, "A100")], "missing"),
    (
        "duplicate-index",
        lambda n, held, other: [_gpu(n, held), _gpu(n, other), _gpu(n, other, uuid="GPU-x")],
        "reported twice",
    ),
    (
        "duplicate-uuid",
        lambda n, held, other: [_gpu(n, held, uuid="GPU-same"), _gpu(n, other, uuid="GPU-same")],
        "reported twice",
    ),
    ("impossible-index", lambda n, held, other: [_gpu(n, held), _gpu(n, other), _gpu(n, 4096)], "impossible"),
    ("several-models", lambda n, held, other: [_gpu(n, held), _gpu(n, other, "A100")], "several models"),
]


@pytest.fixture(scope="module")
def team(server: Server) -> str:
    return make_team(server)


def _events(server: Server, node: str) -> list[dict[str, Any]]:
    with server.client() as c:
        return ok(c.get("/fleet/events", params={"node": node}))  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("report", "why"), [(r, w) for _, r, w in CONTRADICTIONS], ids=[i for i, _, _ in CONTRADICTIONS]
)
def test_contradicting_inventory_cordons_the_node_and_the_rest_of_the_sync_applies(
    server: Server, team: str, report: Report, why: str
) -> None:
    pool, elsewhere = make_pool(server), make_pool(server)
    node, token = register(server, pool=pool, gpus=2)
    job, attempt = placed(server, submit(server, gpus=1, pool=pool, team=team)["id"])
    held = job["allocation"][0]["gpus"][0]
    with server.client() as c:
        before = ok(c.get(f"/nodes/{node}"))["gpus"]
    body = {
        "gpus": report(node, held, 1 - held),
        "jobs": [{"job_id": job["id"], "state": "running", "attempt": attempt}],
        "logs": [{"job_id": job["id"], "attempt": attempt, "offset": 0, "end": 6, "data": "hello\n"}],
    }
    for _ in range(2):  # the same report again: one cordon, one event
        reply = sync(server, node, body, token=token)
        assert [d["job_id"] for d in reply["jobs"]] == [job["id"]]
        assert reply["log_acks"] == [{"job_id": job["id"], "attempt": attempt, "end": 6}]
    assert wait_for(server, job["id"], "RUNNING")
    assert log_text(server, job["id"]) == "hello\n"
    with server.client() as c:
        shown = ok(c.get(f"/nodes/{node}"))
    assert shown["state"] == "Ready" and shown["cordoned"] is True
    assert why in shown["cordon_reason"]
    assert shown["gpus"] == before  # the stored inventory is untouched
    cordons = [e for e in _events(server, node) if e["kind"] == "cordoned"]
    assert len(cordons) == 1 and why in cordons[0]["reason"] and cordons[0]["severity"] == "critical"
    # The fleet goes on: a job elsewhere is placed.
    register(server, pool=elsewhere, gpus=1)
    wait_for(server, submit(server, gpus=1, pool=elsewhere, team=team)["id"], "SCHEDULED")
    with server.client() as c:
        ok(c.post(f"/jobs/{job['id']}/cancel"))


def _set_model(server: Server, node: str, index: int, model: str) -> None:
    with server.engine.begin() as conn:
        conn.execute(update(GpuRow).where(GpuRow.node == node, GpuRow.index == index).values(model=model))


def test_a_node_with_invalid_rows_is_skipped_not_fatal(server: Server, team: str) -> None:
    pool, elsewhere = make_pool(server), make_pool(server)
    bad, _ = register(server, pool=pool, gpus=2)
    register(server, pool=elsewhere, gpus=1)
    _set_model(server, bad, 1, "A100")  # mixed models, written straight into the database
    try:
        # Submitting into the bad node's pool is not a 500: the node is not counted.
        waiting = submit(server, gpus=1, pool=pool, team=team)
        other = submit(server, gpus=1, pool=elsewhere, team=team)
        wait_for(server, other["id"], "SCHEDULED")
        skipped = eventually(lambda: metric(server, "gpufleet_scheduler_skipped_nodes") >= 1)
        if not skipped:  # late in a long run this was seen once in three: one more pass, and say what
            nudge = submit(server, gpus=1, pool=elsewhere, team=team)
            skipped = eventually(lambda: metric(server, "gpufleet_scheduler_skipped_nodes") >= 1, timeout=20)
            with server.client() as c:
                ok(c.post(f"/jobs/{nudge['id']}/cancel"))
        if not skipped:
            counts = [metric(server, f"gpufleet_scheduling_{n}_total") for n in ("passes", "failures")]
            with server.client() as c:
                servers = c.get("/fleet/servers").text  # on PostgreSQL: who leads
            lines = list(dict.fromkeys(server.stderr().splitlines()))  # each distinct line once
            said = [ln for ln in lines if any(w in ln for w in ("leader", "scheduling", "child", "Error"))]
            raise AssertionError(
                f"no pass counted it; passes, failures: {counts}; servers: {servers}\n"
                + "\n".join([*said[-40:], "-- last lines:", *lines[-30:]])
            )
        with server.client() as c:
            assert ok(c.get(f"/jobs/{waiting['id']}"))["state"] == "PENDING"
    finally:
        _set_model(server, bad, 1, "H100")
    # Repaired: it is back in the pass.
    assert wait_for(server, waiting["id"], "SCHEDULED")["allocation"][0]["node"] == bad
    for jid in (waiting["id"], other["id"]):
        with server.client() as c:
            ok(c.post(f"/jobs/{jid}/cancel"))


def test_operator_registration_that_would_mix_models_under_a_job_is_refused(
    server: Server, team: str
) -> None:
    """``PUT /v1/nodes/{name}`` leaving a held GPU of the old model next to new ones."""
    pool = make_pool(server)
    node, _ = register(server, pool=pool, gpus=2)
    job, _ = placed(server, submit(server, gpus=1, pool=pool, team=team)["id"])
    held = job["allocation"][0]["gpus"][0]
    before = server.counts()
    with server.client() as c:
        resp = c.put(f"/nodes/{node}", json={"pool": pool, "gpus": [_gpu(node, 1 - held, "A100")]})
        assert resp.status_code == 409, resp.text
        assert resp.headers["content-type"] == "application/problem+json"
        assert f"GPU {held}" in resp.json()["detail"]
        assert [g["model"] for g in ok(c.get(f"/nodes/{node}"))["gpus"]] == ["H100", "H100"]
        ok(c.post(f"/jobs/{job['id']}/cancel"))
    assert server.counts()["gpus"] == before["gpus"]
