"""A node credential speaks only for the job attempts its node holds.

A sync may report state and ship log bytes only for a job attempt placed on that node
(the exact attempt), or for the attempt that node was told to stop and that is still
shipping its last output (``stopping_on``). Anything else in the sync is dropped (the
rest is applied) and counted in ``gpufleet_sync_rejected_items_total{kind, reason}``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import text

from server.conftest import Server, make_pool, make_team, ok, wait_for
from server.playnode import log_text, metric, placed, register, submit, sync

REJECTED = "gpufleet_sync_rejected_items_total"


@dataclass(frozen=True, slots=True, kw_only=True)
class Scene:
    """Job ``job`` (attempt ``attempt``) RUNNING on node ``a``; node ``b`` in the same
    pool; job ``pending`` waiting in a pool without nodes; job ``dropped`` cancelled
    before it was ever placed."""

    team: str
    a: str
    a_token: str
    b: str
    b_token: str
    job: int
    attempt: int
    pending: int
    dropped: int

    def token(self, node: str) -> str:
        return self.a_token if node == self.a else self.b_token


@pytest.fixture(scope="module")
def team(server: Server) -> str:
    return make_team(server)


def scene(server: Server, team: str) -> Scene:
    pool, empty = make_pool(server), make_pool(server)
    a, a_token = register(server, pool=pool, gpus=2)
    jid = submit(server, gpus=1, pool=pool, team=team)["id"]
    _, attempt = placed(server, jid)
    sync(server, a, {"jobs": [{"job_id": jid, "state": "running", "attempt": attempt}]}, token=a_token)
    wait_for(server, jid, "RUNNING")
    b, b_token = register(server, pool=pool, gpus=2)
    pending = submit(server, gpus=1, pool=empty, team=team)["id"]
    dropped = submit(server, gpus=1, pool=empty, team=team)["id"]
    with server.client() as c:
        ok(c.post(f"/jobs/{dropped}/cancel"))
    return Scene(
        team=team,
        a=a,
        a_token=a_token,
        b=b,
        b_token=b_token,
        job=jid,
        attempt=attempt,
        pending=pending,
        dropped=dropped,
    )


def report(
    server: Server, sc: Scene, node: str, job: int, state: str, attempt: int | None, **kw: Any
) -> None:
    item: dict[str, Any] = {"job_id": job, "state": state, **kw}
    if attempt is not None:
        item["attempt"] = attempt
    sync(server, node, {"jobs": [item]}, token=sc.token(node))


def nothing(server: Server, sc: Scene) -> None:
    pass


def complete_on_a(server: Server, sc: Scene) -> None:
    report(server, sc, sc.a, sc.job, "exited", sc.attempt, exit_code=0)
    wait_for(server, sc.job, "COMPLETED")


def cancel(server: Server, sc: Scene) -> None:
    with server.client() as c:
        ok(c.post(f"/jobs/{sc.job}/cancel"))


Prepare = Callable[[Server, Scene], None]

LOGS: list[tuple[str, Prepare, str, Callable[[Scene], tuple[int, int]], str | None]] = [
    # id, before, sender, (job, attempt) -> the reason it is rejected (None: stored)
    ("own-job", nothing, "a", lambda sc: (sc.job, sc.attempt), None),
    ("own-job-other-attempt", nothing, "a", lambda sc: (sc.job, sc.attempt + 1), "stale_attempt"),
    ("another-nodes-job", nothing, "b", lambda sc: (sc.job, sc.attempt), "not_assigned"),
    ("pending-job-attempt-0", nothing, "a", lambda sc: (sc.pending, 0), "not_assigned"),
    ("never-placed-cancelled-job", nothing, "a", lambda sc: (sc.dropped, 0), "not_assigned"),
    ("unknown-job", nothing, "a", lambda sc: (10**9, 0), "unknown_job"),
    ("job-completed-on-another-node", complete_on_a, "b", lambda sc: (sc.job, sc.attempt), "not_assigned"),
    ("stopping-attempt-ships-its-tail", cancel, "a", lambda sc: (sc.job, sc.attempt), None),
    ("job-stopping-on-another-node", cancel, "b", lambda sc: (sc.job, sc.attempt), "not_assigned"),
]


@pytest.mark.parametrize(
    ("before", "sender", "target", "reason"),
    [case[1:] for case in LOGS],
    ids=[case[0] for case in LOGS],
)
def test_logs_only_for_attempts_the_node_holds(
    server: Server,
    team: str,
    before: Prepare,
    sender: str,
    target: Callable[[Scene], tuple[int, int]],
    reason: str | None,
) -> None:
    sc = scene(server, team)
    before(server, sc)
    node = sc.a if sender == "a" else sc.b
    job, attempt = target(sc)
    data = f"from {node}\n"
    chunk = {"job_id": job, "attempt": attempt, "offset": 0, "end": len(data), "data": data}
    jobs = [{"job_id": job, "state": "running", "attempt": attempt}] if reason is None else []
    counted = metric(server, REJECTED, kind="log", reason=reason or "")
    reply = sync(server, node, {"jobs": jobs, "logs": [chunk]}, token=sc.token(node))
    if reason is None:
        assert reply["log_acks"] == [{"job_id": job, "attempt": attempt, "end": len(data)}]
        assert log_text(server, job) == data
    else:
        assert reply["log_acks"] == []
        assert metric(server, REJECTED, kind="log", reason=reason) == counted + 1
        for jid in {sc.job, sc.pending, sc.dropped}:
            assert data not in log_text(server, jid)


STATES: list[tuple[str, str, Callable[[Scene], int | None], str, str | None]] = [
    # id, sender, attempt, the job's state afterwards, the reason it is rejected
    ("own-job", "a", lambda sc: sc.attempt, "COMPLETED", None),
    ("own-job-without-attempt", "a", lambda sc: None, "RUNNING", "no_attempt"),
    ("own-job-other-attempt", "a", lambda sc: sc.attempt - 1, "RUNNING", "stale_attempt"),
    ("another-nodes-job", "b", lambda sc: sc.attempt, "RUNNING", "not_assigned"),
]


@pytest.mark.parametrize(
    ("sender", "attempt", "after", "reason"), [case[1:] for case in STATES], ids=[case[0] for case in STATES]
)
def test_job_state_only_from_the_node_that_runs_that_attempt(
    server: Server,
    team: str,
    sender: str,
    attempt: Callable[[Scene], int | None],
    after: str,
    reason: str | None,
) -> None:
    sc = scene(server, team)
    node = sc.a if sender == "a" else sc.b
    counted = metric(server, REJECTED, kind="state", reason=reason or "")
    report(server, sc, node, sc.job, "exited", attempt(sc), exit_code=0)
    with server.client() as c:
        assert ok(c.get(f"/jobs/{sc.job}"))["state"] == after
    if reason is not None:
        assert metric(server, REJECTED, kind="state", reason=reason) == counted + 1
    if after == "RUNNING":
        cancel(server, sc)


def _stopping_on(server: Server, job: int) -> str | None:
    with server.engine.connect() as conn:
        got = conn.execute(text("SELECT stopping_on FROM jobs WHERE id = :i"), {"i": job}).scalar()
    return None if got is None else str(got)


def test_multi_node_job_other_nodes_ship_their_tail_after_the_first_exit(server: Server, team: str) -> None:
    pool = make_pool(server)
    a, a_token = register(server, pool=pool, gpus=1)
    b, b_token = register(server, pool=pool, gpus=1)
    job, attempt = placed(server, submit(server, gpus=2, gpus_per_node=1, pool=pool, team=team)["id"])
    jid = job["id"]
    tokens = {a: a_token, b: b_token}
    for n in (a, b):
        sync(server, n, {"jobs": [{"job_id": jid, "state": "running", "attempt": attempt}]}, token=tokens[n])
    wait_for(server, jid, "RUNNING")
    first, second = a, b
    sync(
        server,
        first,
        {"jobs": [{"job_id": jid, "state": "exited", "exit_code": 0, "attempt": attempt}]},
        token=tokens[first],
    )
    wait_for(server, jid, "COMPLETED")
    assert _stopping_on(server, jid) == second  # the other node still has to confirm
    tail = "rank 1 done\n"
    reply = sync(
        server,
        second,
        {
            "jobs": [{"job_id": jid, "state": "running", "attempt": attempt}],
            "logs": [{"job_id": jid, "attempt": attempt, "offset": 0, "end": len(tail), "data": tail}],
        },
        token=tokens[second],
    )
    assert reply["jobs"] == [] and reply["log_acks"] == [
        {"job_id": jid, "attempt": attempt, "end": len(tail)}
    ]
    assert log_text(server, jid) == tail
    sync(
        server,
        second,
        {"jobs": [{"job_id": jid, "state": "exited", "exit_code": 0, "attempt": attempt}]},
        token=tokens[second],
    )
    assert _stopping_on(server, jid) is None
    with server.client() as c:  # over and confirmed: following the log ends
        assert c.get(f"/jobs/{jid}/logs", params={"follow": "true"}).text == tail


def test_the_same_observation_twice_in_one_sync_is_applied_once(server: Server, team: str) -> None:
    sc = scene(server, team)
    item = {"job_id": sc.job, "state": "exited", "exit_code": 0, "attempt": sc.attempt}
    assert sync(server, sc.a, {"jobs": [item, item]}, token=sc.a_token)["jobs"] == []
    done = wait_for(server, sc.job, "COMPLETED")
    assert [e["to_state"] for e in done["events"]].count("COMPLETED") == 1


def test_a_job_that_ended_before_any_sync_saw_it_running_still_ran(server: Server, team: str) -> None:
    """An exit is reported at once (log shipping or not), so a short job may go from
    SCHEDULED straight to its end: it still has a start (its placement), a run time and an
    end after that start, as a job a sync saw running."""
    pool = make_pool(server)
    a, a_token = register(server, pool=pool, gpus=2)
    jid = submit(server, gpus=2, pool=pool, team=team)["id"]
    _, attempt = placed(server, jid)
    item = {"job_id": jid, "state": "exited", "exit_code": 0, "attempt": attempt}
    sync(server, a, {"jobs": [item]}, token=a_token)
    done = wait_for(server, jid, "COMPLETED")
    assert done["started_at"] is not None and done["ended_at"] is not None
    assert done["scheduled_at"] <= done["started_at"] <= done["ended_at"]
