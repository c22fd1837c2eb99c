"""Replicas on a draining node (a drain, a rolling driver upgrade) are moved surge first
(``decide/replicas.py``, ``Replica.evicted``): the service never drops below its ready
count while the fleet has room for the surge."""

from __future__ import annotations

import pytest

from gpufleet.server.decide.replicas import Action, Create, Drain, Replica, Stop, Wish, decide

WISH = Wish(replicas=2, generation=1, readiness_timeout_s=60, drain_s=5)


def r(job: int, slot: int, *, ready: bool = True, evicted: bool = False, warm: bool = False) -> Replica:
    return Replica(
        job_id=job,
        slot=slot,
        generation=1,
        running=True,
        ready=ready,
        started_at=90.0,
        evicted=evicted,
        warm=warm,
    )


CASES: list[tuple[str, list[Replica], list[Action]]] = [
    ("nothing-evicted", [r(1, 0), r(2, 1)], []),
    (
        "evicted-gets-a-surge-first",
        [r(1, 0, evicted=True), r(2, 1)],
        [Create(slot=2, reason="moved off its draining node")],
    ),
    (
        "surge-not-ready-yet-keeps-the-evicted",
        [r(1, 0, evicted=True), r(2, 1), r(3, 2, ready=False)],
        [],
    ),
    (
        "surge-ready-then-the-evicted-drains",
        [r(1, 0, evicted=True), r(2, 1), r(3, 2)],
        [Drain(job_id=1, reason="moved off its draining node")],
    ),
    (
        "an-evicted-replica-not-ready-is-stopped-at-once",
        [r(1, 0, evicted=True, ready=False), r(2, 1)],
        [
            Stop(job_id=1, reason="moved off its draining node (it was not ready)"),
            Create(slot=0, reason="moved off its draining node"),
        ],
    ),
]


@pytest.mark.parametrize(("replicas", "want"), [(c[1], c[2]) for c in CASES], ids=[c[0] for c in CASES])
def test_evicted_replicas_move_surge_first(replicas: list[Replica], want: list[Action]) -> None:
    assert decide(WISH, replicas, now=100.0) == want


def test_ready_count_never_drops_while_a_node_drains() -> None:
    """Step the controller as the replicas change: ready serving replicas stay >= 2."""
    replicas = [r(1, 0, evicted=True), r(2, 1, evicted=True)]
    next_job = 10
    for _ in range(10):
        actions = decide(WISH, replicas, now=100.0)
        for a in actions:
            if isinstance(a, Create):
                replicas.append(r(next_job, a.slot))  # placed elsewhere, ready by the next step
                next_job += 1
            elif isinstance(a, Drain | Stop):
                replicas = [x for x in replicas if x.job_id != a.job_id]
        serving = [x for x in replicas if x.ready and not x.warm]
        assert len(serving) >= 2, replicas
    assert not any(x.evicted for x in replicas)
