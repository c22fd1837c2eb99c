"""A rollout to a generation that never gets ready, on real agents with real replica
processes: every old replica keeps serving (never fewer ready replicas than asked), the
rollout is marked stalled with the new replicas' exit code and last line, the waiting
replica says it is in crash back-off and why, and ``service show`` tells all of it; then
``rollback`` rolls the old replicas back in, again never below the count asked.

SQLite only: the decisions are pure (``tests/test_replicas.py``) and the API tests cover
both databases; this one is about processes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.modelserver.launch import model_server
from jobaccounts import ROOT, passable
from server.conftest import Server, make_team, ok, start_server, stop_server, unique
from services.simnodes import sim_node

NAME = "roll-mlp"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # a node timeout of 10 s: on a busy 2-core machine an agent may miss FAST's 1 s, and a
    # node not live at a pass is rightly left out of its spread
    s = start_server(
        f"sqlite:///{tmp_path_factory.mktemp('roll') / 'g.db'}",
        extra=("--node-timeout", "10", "--requeue-after", "20", "--service-drain", "1"),
    )
    yield s
    stop_server(s)


def _show(c: httpx.Client) -> dict[str, Any]:
    return ok(c.get(f"/services/{NAME}"))  # type: ignore[no-any-return]


def _ready(out: dict[str, Any], gen: int) -> int:
    return sum(1 for r in out["replicas"] if r["ready"] and not r["draining"] and r["generation"] == gen)


def test_a_rollout_that_never_gets_ready_stalls_and_keeps_every_old_replica(
    srv: Server, tmp_path: Path
) -> None:
    passable(tmp_path)
    team = make_team(srv)
    pool = unique("rpool")
    with srv.client() as c:
        ok(c.post("/pools", json={"name": pool}), 201)
    nodes = [sim_node(srv, tmp_path, pool=pool, gpus=2, grace_s=2.0) for _ in range(3)]
    launch = model_server(as_other_account=ROOT, args=("--model", "mlp"))
    assert launch.runnable, launch.why
    try:
        with srv.client() as c:
            spec = {
                "name": NAME,
                "team": team,
                "pool": pool,
                "command": launch.command,
                "env": launch.env,
                "replicas": 3,
                "protocol": "kserve-v2",
                "readiness_timeout": 60,
            }
            ok(c.put(f"/services/{NAME}", json=spec))
            deadline = time.monotonic() + 90
            while _ready(out := _show(c), 1) < 3:
                assert time.monotonic() < deadline, out
                time.sleep(0.2)
            assert out["rollout"]["state"] == "complete", out["rollout"]
            placed = sorted(r["nodes"][0] for r in out["replicas"])
            assert placed == sorted(n.name for n in nodes), (placed, out["replicas"])  # spread

            broken = ["sh", "-c", "echo 'boom: no weights here' >&2; exit 3"]
            out = ok(c.patch(f"/services/{NAME}", json={"command": broken}))
            assert out["generation"] == 2
            stalled: dict[str, Any] | None = None
            deadline = time.monotonic() + 90
            while stalled is None:
                out = _show(c)
                assert _ready(out, 1) == 3, out  # never fewer ready replicas than asked
                assert out["replicas_ready"] >= 3, out
                if out["rollout"]["state"] == "stalled":
                    stalled = out
                assert time.monotonic() < deadline, out
                time.sleep(0.1)
            reason = stalled["rollout"]["reason"]
            assert stalled["rollout"]["generation"] == 2
            assert "exited 3 times" in reason and "exit code 3" in reason, reason
            deadline = time.monotonic() + 20  # the last line, once its log has been shipped
            while "boom: no weights here" not in (reason := _show(c)["rollout"]["reason"]):
                assert time.monotonic() < deadline, reason
                time.sleep(0.2)
            kinds = [e["kind"] for e in stalled["events"]]
            assert kinds.count("stalled") == 1, kinds
            # the waiting new replica says why it waits
            deadline = time.monotonic() + 30
            while True:
                out = _show(c)
                waiting = [r for r in out["replicas"] if r["generation"] == 2 and r["state"] == "PENDING"]
                if waiting and "CrashLoopBackOff" in (waiting[0]["reason"] or ""):
                    break
                assert _ready(out, 1) == 3, out
                assert time.monotonic() < deadline, out
                time.sleep(0.1)
            assert "exit code 3" in waiting[0]["reason"], waiting
            job = ok(c.get(f"/jobs/{waiting[0]['job_id']}"))
            assert "CrashLoopBackOff" in (job["wait_reason"] or ""), job
            # kubectl logs -p: the slot's previous job said why
            prev = waiting[0]["previous_job_id"]
            assert prev is not None and prev != waiting[0]["job_id"], waiting
            while "boom: no weights here" not in c.get(f"/jobs/{prev}/logs").text:
                assert time.monotonic() < deadline
                time.sleep(0.2)
            time.sleep(1.0)
            out = _show(c)
            assert _ready(out, 1) == 3 and out["rollout"]["state"] == "stalled", out
            # rollback: generation 1's replicas again, as generation 3, rolled without a gap
            out = ok(c.post(f"/services/{NAME}/rollback", json={}))
            assert out["generation"] == 3 and out["spec"]["command"] == launch.command
            deadline = time.monotonic() + 90
            while not (_ready(out := _show(c), 3) == 3 and out["rollout"]["state"] == "complete"):
                assert _ready(out, 1) + _ready(out, 3) >= 3, out  # never fewer ready than asked
                assert time.monotonic() < deadline, out
                time.sleep(0.1)
            assert c.delete(f"/services/{NAME}").status_code == 202
            deadline = time.monotonic() + 30
            while c.get(f"/services/{NAME}").status_code != 404:
                assert time.monotonic() < deadline
                time.sleep(0.2)
    finally:
        for n in nodes:
            n.close()


def test_the_readme_service_example_runs_as_written(srv: Server, tmp_path: Path) -> None:
    """The README's spec names ``.venv/bin/gpufleet`` (relative to where the user typed it);
    the replica, another account in its own working directory, runs this node's gpufleet
    (``agent/selfcmd.py``) and gets ready."""
    passable(tmp_path)
    team = make_team(srv)
    pool = unique("xpool")
    with srv.client() as c:
        ok(c.post("/pools", json={"name": pool}), 201)
    node = sim_node(srv, tmp_path, pool=pool, gpus=2, grace_s=2.0)
    name = "readme-mlp"
    try:
        with srv.client() as c:
            spec = {
                "name": name,
                "team": team,
                "pool": pool,
                "command": [".venv/bin/gpufleet", "model-server", "--model", "mlp"],  # as the README
                "replicas": 1,
                "gpus_per_replica": 1,
                "protocol": "kserve-v2",
            }
            ok(c.put(f"/services/{name}", json=spec))
            deadline = time.monotonic() + 60
            while (out := ok(c.get(f"/services/{name}")))["replicas_ready"] < 1:
                assert time.monotonic() < deadline, out
                assert out["rollout"]["state"] != "stalled", out["rollout"]
                time.sleep(0.2)
            assert c.delete(f"/services/{name}").status_code == 202
    finally:
        node.close()
