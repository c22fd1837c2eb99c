"""Table-driven tests of the replica controller's decisions (``server/decide/replicas.py``)."""

from __future__ import annotations

import pytest

from gpufleet.server.decide.replicas import (
    Create,
    Demote,
    Drain,
    Progress,
    Promote,
    Replica,
    Stop,
    Wish,
    decide,
    rollout_status,
)

NOW = 1000.0


def wish(n: int = 2, gen: int = 1, **kw: object) -> Wish:
    base: dict[str, object] = {"readiness_timeout_s": 60.0, "drain_s": 5.0}
    base.update(kw)
    return Wish(replicas=n, generation=gen, **base)  # type: ignore[arg-type]


def rep(
    job: int, slot: int, gen: int = 1, *, ready: bool = True, running: bool = True, **kw: object
) -> Replica:
    started = kw.pop("started_at", NOW - 10)
    return Replica(
        job_id=job,
        slot=slot,
        generation=gen,
        ready=ready,
        running=running,
        started_at=started,
        **kw,  # type: ignore[arg-type]
    )


CASES = [
    pytest.param(
        wish(3),
        [],
        [
            Create(slot=0, reason="0 of 3 replicas"),
            Create(slot=1, reason="0 of 3 replicas"),
            Create(slot=2, reason="0 of 3 replicas"),
        ],
        id="creates-missing",
    ),
    pytest.param(wish(2), [rep(1, 0), rep(2, 1)], [], id="steady-state-does-nothing"),
    pytest.param(wish(2), [rep(1, 1)], [Create(slot=0, reason="1 of 2 replicas")], id="refills-lowest-slot"),
    pytest.param(
        wish(1),
        [rep(1, 0), rep(2, 1, ready=False)],
        [Stop(job_id=2, reason="scaled down to 1 replica")],
        id="scale-down-stops-not-ready-first",
    ),
    pytest.param(
        wish(1),
        [rep(1, 0), rep(2, 1)],
        [Drain(job_id=2, reason="scaled down to 1 replica")],
        id="scale-down-drains-highest-slot",
    ),
    pytest.param(
        wish(2),
        [rep(1, 0), rep(2, 1, ready=False, started_at=NOW - 61)],
        [
            Stop(job_id=2, reason="not ready 60s after it started", failed=True),
            Create(slot=1, reason="1 of 2 replicas"),
        ],
        id="readiness-timeout-replaces",
    ),
    pytest.param(
        wish(2),
        [rep(1, 0), rep(2, 1, ready=False, running=False, started_at=None)],
        [],
        id="pending-replica-waits",
    ),
    pytest.param(
        wish(2),
        [rep(1, 0), rep(2, 1), rep(3, 1, draining_at=NOW - 5)],
        [Stop(job_id=3, reason="drained for 5s")],
        id="drained-long-enough-stops",
    ),
    pytest.param(
        wish(2),
        [rep(1, 0), rep(2, 1), rep(3, 1, draining_at=NOW - 1)],
        [],
        id="draining-waits",
    ),
    # rolling update: 2 replicas of gen 1 -> gen 2
    pytest.param(
        wish(2, gen=2),
        [rep(1, 0), rep(2, 1)],
        [Create(slot=2, reason="rolling update to generation 2")],
        id="update-surges-one",
    ),
    pytest.param(
        wish(2, gen=2),
        [rep(1, 0), rep(2, 1), rep(3, 2, gen=2, ready=False)],
        [],
        id="update-waits-for-the-surge-to-be-ready",
    ),
    pytest.param(
        wish(2, gen=2),
        [rep(1, 0), rep(2, 1), rep(3, 2, gen=2)],
        [Drain(job_id=2, reason="replaced by generation 2")],
        id="update-drains-one-old-when-new-ready",
    ),
    pytest.param(
        wish(2, gen=2),
        [rep(1, 0), rep(2, 1, draining_at=NOW - 1), rep(3, 2, gen=2)],
        [Create(slot=1, reason="rolling update to generation 2")],
        id="update-next-surge-after-drain",
    ),
    pytest.param(
        wish(2, gen=2),
        [rep(1, 0), rep(3, 2, gen=2), rep(4, 1, gen=2)],
        [Drain(job_id=1, reason="replaced by generation 2")],
        id="update-drains-the-last-old",
    ),
    pytest.param(
        wish(2, gen=2),
        [rep(1, 0, ready=False), rep(2, 1)],
        [
            Stop(job_id=1, reason="replaced by generation 2 (it was not ready)"),
            Create(slot=0, reason="rolling update to generation 2"),
            Create(slot=2, reason="rolling update to generation 2"),  # 1 old + 2 new: 2 + surge 1
        ],
        id="update-stops-old-not-ready-at-once",
    ),
    pytest.param(
        wish(2, gen=2),
        [
            rep(1, 0),
            rep(2, 1),
            rep(3, 2, gen=2, ready=False, running=False, started_at=None, pending_since=NOW - 600),
        ],
        [],
        id="update-surge-waiting-for-room-or-in-back-off-never-costs-a-ready-replica",
    ),
    pytest.param(
        wish(3, gen=2),
        [rep(1, 0), rep(2, 1), rep(3, 2), rep(4, 3, gen=2, ready=False, started_at=NOW - 30)],
        [],
        id="update-new-generation-not-ready-keeps-every-old-one",
    ),
    pytest.param(
        wish(2, gen=2, max_unavailable=1),
        [
            rep(1, 0),
            rep(2, 1),
            rep(3, 2, gen=2, ready=False, running=False, started_at=None, pending_since=NOW - 1),
        ],
        [Drain(job_id=2, reason="replaced by generation 2")],
        id="update-max-unavailable-1-drains-one-old-at-once",
    ),
    pytest.param(
        wish(3, gen=2, max_surge=2),
        [rep(1, 0), rep(2, 1), rep(3, 2)],
        [
            Create(slot=3, reason="rolling update to generation 2"),
            Create(slot=4, reason="rolling update to generation 2"),
        ],
        id="update-max-surge-2-creates-two",
    ),
    pytest.param(
        wish(2, gen=2, max_surge=0, max_unavailable=1),
        [rep(1, 0), rep(2, 1)],
        [Drain(job_id=2, reason="replaced by generation 2")],
        id="update-max-surge-0-drains-first",
    ),
    pytest.param(
        wish(2, gen=2, max_surge=0, max_unavailable=1),
        [rep(1, 0), rep(2, 1, draining_at=NOW - 1)],
        [Create(slot=1, reason="rolling update to generation 2")],
        id="update-max-surge-0-creates-in-the-room-made",
    ),
    pytest.param(
        wish(1, gen=2),
        [rep(1, 0), rep(3, 1, gen=2, ready=False, running=False, started_at=None, pending_since=NOW - 60)],
        [],
        id="update-of-a-single-replica-never-drops-it",
    ),
    pytest.param(
        wish(2, deleting=True),
        [rep(1, 0), rep(2, 1, ready=False)],
        [Drain(job_id=1, reason="service deleted"), Stop(job_id=2, reason="service deleted")],
        id="delete-drains-ready-stops-the-rest",
    ),
    pytest.param(wish(0), [rep(1, 0)], [Drain(job_id=1, reason="scaled down to 0 replicas")], id="zero"),
    # the warm pool
    pytest.param(
        wish(1, warm=1),
        [],
        [Create(slot=0, reason="0 of 1 replica"), Create(slot=1, reason="warm pool 0 of 1", warm=True)],
        id="warm-pool-created-behind-the-replicas",
    ),
    pytest.param(wish(1, warm=1), [rep(1, 0), rep(2, 1, warm=True)], [], id="warm-steady"),
    pytest.param(
        wish(2, warm=1),
        [rep(1, 0), rep(2, 1, warm=True)],
        [
            Promote(job_id=2, reason="1 of 2 replicas: promoted from the warm pool"),
            Create(slot=2, reason="warm pool 0 of 1", warm=True),
        ],
        id="scale-up-promotes-warm-then-refills",
    ),
    pytest.param(
        wish(3, warm=1),
        [rep(1, 0), rep(2, 1, warm=True, ready=False), rep(3, 2, warm=True)],
        [
            Promote(job_id=3, reason="1 of 3 replicas: promoted from the warm pool"),
            Promote(job_id=2, reason="1 of 3 replicas: promoted from the warm pool"),
            Create(slot=3, reason="warm pool 0 of 1", warm=True),
        ],
        id="ready-warm-promoted-first",
    ),
    pytest.param(
        wish(1, warm=1),
        [rep(1, 0), rep(2, 1)],
        [Demote(job_id=2, reason="scaled down to 1 replica: to the warm pool")],
        id="scale-down-demotes-to-a-short-pool",
    ),
    pytest.param(
        wish(1, warm=1),
        [rep(1, 0), rep(2, 1), rep(3, 2, warm=True)],
        [Drain(job_id=2, reason="scaled down to 1 replica")],
        id="scale-down-drains-when-the-pool-is-full",
    ),
    pytest.param(
        wish(1, warm=0),
        [rep(1, 0), rep(2, 1, warm=True)],
        [Stop(job_id=2, reason="warm pool down to 0")],
        id="pool-shrunk",
    ),
    pytest.param(
        wish(1, gen=2, warm=1),
        [rep(1, 0), rep(2, 1, warm=True)],
        [
            Stop(job_id=2, reason="warm replica replaced by generation 2"),
            Create(slot=1, reason="rolling update to generation 2"),
        ],
        id="update-stops-old-warm-at-once",
    ),
    pytest.param(
        wish(1, gen=2, warm=1),
        [rep(1, 0), rep(2, 1, gen=2, warm=True)],
        [
            Promote(job_id=2, reason="rolling update to generation 2"),
            Drain(job_id=1, reason="replaced by generation 2"),
        ],
        id="update-promotes-a-new-warm-as-the-surge",
    ),
]


@pytest.mark.parametrize(("w", "reps", "want"), CASES)
def test_decide(w: Wish, reps: list[Replica], want: list[object]) -> None:
    assert decide(w, reps, NOW) == want


def test_a_whole_rolling_update_never_drops_below_the_wish() -> None:
    """Simulate the controller step by step: new replicas become ready one step after
    they are created; drained ones stop after the drain time. Ready serving replicas
    never fall below 3, and it ends with 3 of generation 2."""
    w = wish(3, gen=2, drain_s=2.0)
    reps = {i: rep(i, i - 1) for i in (1, 2, 3)}
    next_id, now = 10, NOW
    for _ in range(40):
        for a in decide(w, list(reps.values()), now):
            if isinstance(a, Create):
                reps[next_id] = rep(next_id, a.slot, gen=2, ready=False)
                next_id += 1
            elif isinstance(a, Drain):
                reps[a.job_id] = rep(
                    a.job_id, reps[a.job_id].slot, reps[a.job_id].generation, draining_at=now
                )
            else:
                reps.pop(a.job_id)
        now += 1.0
        ready_serving = [r for r in reps.values() if r.ready and r.draining_at is None]
        assert len(ready_serving) >= 3
        for k, r in list(reps.items()):  # created last step: ready now
            if not r.ready:
                reps[k] = rep(k, r.slot, r.generation)
    assert sorted((r.generation, r.draining_at is None) for r in reps.values()) == [(2, True)] * 3


ROLLOUTS = [
    pytest.param(
        wish(2), [rep(1, 0), rep(2, 1)], Progress(since=NOW - 9999), "complete", id="all-ready-is-complete"
    ),
    pytest.param(
        wish(2, gen=2),
        [rep(1, 0), rep(2, 1), rep(3, 2, gen=2, ready=False)],
        Progress(since=NOW - 30),
        "progressing",
        id="surge-starting-is-progressing",
    ),
    pytest.param(
        wish(2, gen=2),
        [rep(1, 0), rep(2, 1), rep(3, 2, gen=2, ready=False, running=False, started_at=None)],
        Progress(since=NOW - 30, exits=3, last_exit="exit code 3"),
        "stalled",
        id="crash-loop-stalls-before-the-deadline",
    ),
    pytest.param(
        wish(2, gen=2, progress_deadline_s=120.0),
        [rep(1, 0), rep(2, 1), rep(3, 2, gen=2, ready=False)],
        Progress(since=NOW - 121),
        "stalled",
        id="past-the-progress-deadline-stalls",
    ),
    pytest.param(
        wish(2, progress_deadline_s=120.0),
        [rep(1, 0, ready=False, running=False, started_at=None)],
        Progress(since=NOW - 121, exits=1),
        "stalled",
        id="a-first-deploy-that-never-gets-ready-stalls-too",
    ),
    pytest.param(
        wish(1, gen=2),
        [rep(3, 1, gen=2), rep(2, 0, draining_at=NOW - 1)],
        Progress(since=NOW - 9999, exits=5),
        "complete",
        id="draining-old-does-not-hold-completion",
    ),
]


@pytest.mark.parametrize(("w", "reps", "progress", "state"), ROLLOUTS)
def test_rollout_status(w: Wish, reps: list[Replica], progress: Progress, state: str) -> None:
    got = rollout_status(w, reps, progress, NOW)
    assert got.state == state, got
    assert got.generation == w.generation
    if state == "stalled":
        assert "exited" in got.reason or "deadline" in got.reason


def test_a_rollout_to_a_generation_that_never_gets_ready_keeps_every_old_replica() -> None:
    """Step the controller with a new generation that never becomes ready (it crashes and
    is replaced): the three old replicas stay ready throughout."""
    w = wish(3, gen=2, drain_s=2.0)
    reps = {i: rep(i, i - 1) for i in (1, 2, 3)}
    next_id, now = 10, NOW
    for _ in range(40):
        for a in decide(w, list(reps.values()), now):
            if isinstance(a, Create):
                reps[next_id] = rep(next_id, a.slot, gen=2, ready=False, started_at=now)
                next_id += 1
            elif isinstance(a, Drain):
                reps[a.job_id] = rep(a.job_id, reps[a.job_id].slot, draining_at=now)
            elif isinstance(a, Stop):
                del reps[a.job_id]
        ready_old = [r for r in reps.values() if r.generation == 1 and r.ready and r.draining_at is None]
        assert len(ready_old) == 3
        now += 1.0
