"""Each policy's decisions on small hand-made snapshots."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from factories import job, placed, running, snapshot, uniform_fleet
from gpufleet.scheduler import Quota, make_policy, plan

H = 3600.0


def started(p: object) -> list[str]:
    return sorted(s.job_id for s in p.starts)  # type: ignore[attr-defined]


def preempted(p: object) -> list[str]:
    return sorted(x.job_id for x in p.preemptions)  # type: ignore[attr-defined]


# One 8-GPU node; 4 GPUs busy until t=1000 (limit 900 from t=100).
BUSY4 = (running("r", {"n0": (0, 1, 2, 3)}, started=100.0, time_limit_s=900.0),)

ORDER_CASES = [
    pytest.param(
        "fifo",
        (job("wide", 8, submit=1), job("small", 2, submit=2, time_limit_s=60)),
        [],
        id="fifo-head-blocks-everyone",
    ),
    pytest.param(
        "backfill",
        (job("wide", 8, submit=1), job("small", 2, submit=2, time_limit_s=60)),
        ["small"],
        id="backfill-short-job-before-shadow",
    ),
    pytest.param(
        "backfill",
        (job("wide", 8, submit=1), job("long", 2, submit=2, time_limit_s=5000)),
        [],
        id="backfill-refuses-job-that-delays-head",
    ),
    pytest.param(
        "sjf",
        (job("slow", 4, submit=1, time_limit_s=5000), job("quick", 4, submit=2, time_limit_s=60)),
        ["quick"],
        id="sjf-shortest-limit-first",
    ),
    pytest.param(
        "fifo",
        (job("slow", 4, submit=1, time_limit_s=5000), job("quick", 4, submit=2, time_limit_s=60)),
        ["slow"],
        id="fifo-first-come",
    ),
    pytest.param(
        "fifo",
        (job("lo", 4, submit=1), job("hi", 4, submit=2, priority=10)),
        ["hi"],
        id="priority-beats-submit-order",
    ),
]


@pytest.mark.parametrize(("policy", "pending", "want"), ORDER_CASES)
def test_order_and_backfill(policy: str, pending: tuple, want: list[str]) -> None:  # type: ignore[type-arg]
    got = plan(snapshot(uniform_fleet(1), running_jobs=BUSY4, pending=pending), policy)
    assert started(got) == want


def test_backfill_long_job_may_use_gpus_the_head_leaves_spare() -> None:
    # Two nodes: n0 fully busy until t=1000, n1 has 4 busy until t=1000 and 4 free.
    # Head needs 8 on one node: reserved at t=1000 on n0 (best fit leaves n1's for later)
    # ... a long 2-GPU job may use n1's free GPUs only if the head does not need them.
    f = uniform_fleet(2)
    run = (
        running("r0", {"n0": tuple(range(8))}, started=100.0, time_limit_s=900.0),
        running("r1", {"n1": (0, 1, 2, 3)}, started=100.0, time_limit_s=900.0),
    )
    pend = (job("head", 8, submit=1), job("long", 2, submit=2, time_limit_s=99999))
    got = plan(snapshot(f, running_jobs=run, pending=pend), "backfill")
    assert started(got) == ["long"]
    head = next(p for p in got.pending if p.job_id == "head")
    assert head.estimated_start == 1000.0


def test_estimated_starts_follow_queue_order_and_time_limits() -> None:
    pend = (job("a", 8, submit=1, time_limit_s=500), job("b", 4, submit=2), job("c", 4, submit=3))
    got = plan(snapshot(uniform_fleet(1), running_jobs=BUSY4, pending=pend), "fifo")
    etas = {p.job_id: (p.position, p.estimated_start) for p in got.pending}
    # r ends at 1000 -> a runs 1000..1500 -> b and c start at 1500 side by side.
    assert etas == {"a": (1, 1000.0), "b": (2, 1500.0), "c": (3, 1500.0)}
    assert [p.reason.split(":")[0] for p in got.pending] == ["Resources", "Priority", "Priority"]


def test_job_past_its_limit_is_expected_to_end_now() -> None:
    late = (running("r", {"n0": tuple(range(8))}, started=0.0, time_limit_s=10.0),)
    got = plan(snapshot(uniform_fleet(1), now=100.0, running_jobs=late, pending=(job("a", 8),)), "fifo")
    assert got.pending[0].estimated_start == 100.0


PREEMPT_CASES = [
    pytest.param(
        "las",
        (running("old", {"n0": tuple(range(8))}, started=0.0),),  # 8 GPUs x 100 s = 800 GPU-s: queue 0
        (job("new", 8, submit=50),),
        [],
        id="las-same-queue-no-preemption",
    ),
    pytest.param(
        "las",
        (running("old", {"n0": tuple(range(8))}, started=-10_000.0),),  # 80,800 GPU-s: lowest queue
        (job("new", 8, submit=50),),
        ["old"],
        id="las-lower-queue-is-preempted",
    ),
    pytest.param(
        "srtf-oracle",
        (running("big", {"n0": tuple(range(8))}, started=0.0, oracle_remaining_s=10_000.0),),
        (job("tiny", 8, submit=50, oracle_remaining_s=60.0),),
        ["big"],
        id="srtf-preempts-much-longer-remaining",
    ),
    pytest.param(
        "srtf-oracle",
        (running("big", {"n0": tuple(range(8))}, started=0.0, oracle_remaining_s=200.0),),
        (job("tiny", 8, submit=50, oracle_remaining_s=150.0),),
        [],
        id="srtf-hysteresis-keeps-similar-job",
    ),
    pytest.param(
        "las",
        (running("old", {"n0": tuple(range(8))}, started=-10_000.0, preemptible=False),),
        (job("new", 8, submit=50),),
        [],
        id="non-preemptible-job-is-never-a-victim",
    ),
    pytest.param(
        "default",
        (running("old", {"n0": tuple(range(8))}, started=-10_000.0),),
        (job("new", 8, submit=50),),
        ["old"],
        id="default-preempts-far-lower-level",
    ),
    pytest.param(
        "default",
        (running("old", {"n0": tuple(range(8))}, started=-10_000.0, attained_service_s=0.0),),
        (job("new", 8, submit=50, attained_service_s=200_000.0),),
        [],
        id="default-never-preempts-for-a-lower-level",
    ),
]


@pytest.mark.parametrize(("policy", "run", "pending", "victims"), PREEMPT_CASES)
def test_preemption(policy: str, run: tuple, pending: tuple, victims: list[str]) -> None:  # type: ignore[type-arg]
    got = plan(snapshot(uniform_fleet(1), running_jobs=run, pending=pending), policy)
    assert preempted(got) == victims
    assert started(got) == ([pending[0].id] if victims else [])


def test_preemption_takes_fewest_victims_lowest_priority_first() -> None:
    f = uniform_fleet(1)
    run = (
        running("a", {"n0": (0, 1, 2, 3)}, started=-100_000.0),  # most service: lowest priority
        running("b", {"n0": (4, 5)}, started=-20_000.0),
        running("c", {"n0": (6, 7)}, started=-20_000.0),
    )
    got = plan(snapshot(f, running_jobs=run, pending=(job("new", 4, submit=50),)), "default")
    assert preempted(got) == ["a"]
    assert placed(got.starts) == {"new": {"n0": (0, 1, 2, 3)}}
    # Tiresias keeps FIFO order inside a queue: all three share the lowest queue, so
    # the latest-submitted jobs are its lowest priority and go first.
    got = plan(snapshot(f, running_jobs=run, pending=(job("new", 4, submit=50),)), "las")
    assert preempted(got) == ["b", "c"]


def test_default_protects_a_victim_that_just_started() -> None:
    run = (running("fresh", {"n0": tuple(range(8))}, started=90.0, attained_service_s=500_000.0),)
    got = plan(
        snapshot(uniform_fleet(1), now=100.0, running_jobs=run, pending=(job("new", 8, submit=95),)),
        "default",
    )
    assert preempted(got) == []


def test_default_promotes_a_starving_job_over_newer_short_ones() -> None:
    pol = make_policy("default", starve_min_s=3600.0, starve_factor=2.0)
    old = job("old", 8, submit=0.0, attained_service_s=90_000.0, executed_s=1000.0, pending_since=0.0)
    new = job("new", 8, submit=5000.0)
    got = plan(snapshot(uniform_fleet(1), now=6000.0, pending=(new, old)), pol)
    assert started(got) == ["old"]


def test_quota_limit_holds_jobs_for_every_policy() -> None:
    run = (running("r", {"n0": (0, 1, 2, 3)}, team="ml"),)
    quotas = (Quota(team="ml", gpus=4, limit=6),)
    pend = (job("over", 4, submit=1, team="ml"), job("fine", 2, submit=2, team="ml"))
    for name in ("fifo", "backfill", "sjf", "las", "fairshare", "default"):
        got = plan(snapshot(uniform_fleet(2), running_jobs=run, pending=pend, quotas=quotas), name)
        assert started(got) == ["fine"], name
        # "fine" may be considered before or after "over" depending on the policy's order.
        assert re.fullmatch(
            r"QuotaLimit: team ml holds [46] of its 6-GPU limit, job needs 4", got.pending[0].reason
        )


def test_fairshare_interleaves_teams_by_share() -> None:
    pend = (
        *(job(f"a{i}", 1, submit=i, team="a") for i in range(4)),
        job("b0", 1, submit=10, team="b"),
        job("b1", 1, submit=11, team="b"),
    )
    quotas = (Quota(team="a", gpus=4), Quota(team="b", gpus=4))
    run = (running("ra", {"n0": (0, 1, 2, 3, 4)}, team="a"),)
    got = plan(snapshot(uniform_fleet(1), running_jobs=run, pending=pend, quotas=quotas), "fairshare")
    # 3 free GPUs: team b (share 0) gets both of its jobs before team a (share 5/4) gets one.
    assert started(got) == ["a0", "b0", "b1"]


def test_fairshare_reclaims_quota_from_a_borrowing_team() -> None:
    run = (running("borrow", {"n0": tuple(range(8))}, team="a", started=0.0),)
    quotas = (Quota(team="a", gpus=4), Quota(team="b", gpus=4))
    got = plan(
        snapshot(uniform_fleet(1), running_jobs=run, pending=(job("mine", 4, team="b"),), quotas=quotas),
        "fairshare",
    )
    assert preempted(got) == ["borrow"]
    assert started(got) == ["mine"]


def test_fairshare_does_not_reclaim_beyond_nominal_quota() -> None:
    run = (running("borrow", {"n0": tuple(range(8))}, team="a", started=0.0),)
    quotas = (Quota(team="a", gpus=4), Quota(team="b", gpus=4))
    got = plan(
        snapshot(uniform_fleet(1), running_jobs=run, pending=(job("greedy", 8, team="b"),), quotas=quotas),
        "fairshare",
    )
    assert preempted(got) == []


def test_unknown_policy_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        make_policy("nope")


@pytest.mark.parametrize(
    ("ran_for", "victims"),
    [
        pytest.param(600.0, [], id="promoted-job-protected-for-an-hour"),
        pytest.param(7200.0, ["old"], id="then-fair-game"),
    ],
)
def test_default_promoted_job_gets_a_real_run(ran_for: float, victims: list[str]) -> None:
    # "old" waited 10 h (> starve_min 6 h) before it started: it was promoted.
    now = 50_000.0
    started = now - ran_for
    old = running("old", {"n0": tuple(range(8))}, started=started, attained_service_s=900_000.0)
    old = replace(old, job=replace(old.job, pending_since=started - 36_000.0))
    got = plan(
        snapshot(uniform_fleet(1), now=now, running_jobs=(old,), pending=(job("new", 8, submit=now - 60),)),
        "default",
    )
    assert preempted(got) == victims


def test_higher_user_priority_preempts_even_a_fresh_job() -> None:
    run = (running("low", {"n0": tuple(range(8))}, started=95.0),)
    got = plan(
        snapshot(uniform_fleet(1), now=100.0, running_jobs=run, pending=(job("vip", 8, priority=10),)),
        "default",
    )
    assert preempted(got) == ["low"]


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"use_limits": False},
        {"width_aware": False, "tie_break": "width"},
        {"starve_max_s": 7200.0},
        {"predict_fresh": False},
        {"predict_confidence": 2.0},
    ],
    ids=["default", "no-limits", "narrow-width-tie", "starve-cap", "fresh-by-floor", "no-predictions"],
)
def test_default_order_agrees_with_key(options: dict[str, object]) -> None:
    """``DefaultPolicy.order`` inlines ``key`` for waiting jobs (it runs for every job
    of a 10,000-job queue each pass): both must rank every waiting job the same."""
    from gpufleet.scheduler.policies.base import Context
    from gpufleet.scheduler.policies.default import DefaultPolicy

    policy = DefaultPolicy(**options)  # type: ignore[arg-type]
    waiting = [
        job(
            f"j{i}",
            g,
            submit=float(i * 300),
            priority=p,
            time_limit_s=lim,
            executed_s=ran,
            attained_service_s=ran * g,
            pending_since=since,
            predicted_s=pred,
            predicted_confidence=conf,
        )
        for i, (g, p, lim, ran, since, pred, conf) in enumerate(
            [
                (1, 0, None, 0.0, None, None, 0.0),
                (8, 0, 3600.0, 0.0, None, None, 0.0),
                (4, 1, None, 5_000.0, 20_000.0, None, 0.0),
                (2, 0, 600.0, 900.0, 10_000.0, None, 0.0),  # ran past its limit
                (16, 0, None, 40_000.0, 1_000.0, None, 0.0),
                (1, -1, 7200.0, 100.0, None, None, 0.0),
                (2, 0, None, 200.0, 30_000.0, None, 0.0),
                (8, 0, None, 0.0, None, 36_000.0, 0.9),  # fresh, predicted long
                (1, 0, 7200.0, 600.0, 5_000.0, 900.0, 0.9),  # predicted short, has run
                (4, 0, None, 3_000.0, 2_000.0, 2_000.0, 0.9),  # past its prediction
                (2, 0, None, 0.0, None, 600.0, 0.1),  # not confident
            ]
        )
    ]
    for now in (1_000.0, 30_000.0, 200_000.0):
        ctx = Context(now=now, quotas={})
        got = policy.order(waiting, ctx)
        assert [k for k, _ in got] == sorted(policy.key(j, None, ctx) for j in waiting)
        assert [k for k, _ in policy.order(waiting, ctx)] == [k for k, _ in got]  # memoised
