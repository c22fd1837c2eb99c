"""Simulator invariants under every policy, failures, time limits and overheads."""

from __future__ import annotations

import itertools

import pytest

from gpufleet.scheduler import POLICIES, Policy, make_policy
from gpufleet.sim import FleetSpec, SimConfig, SimResult, Simulator, TraceJob
from gpufleet.sim.synth import synthesize

FLEET = FleetSpec(nodes=4, gpus_per_node=8, nodes_per_leaf=2)


def small_trace(n: int = 300, seed: int = 3) -> list[TraceJob]:
    return synthesize(jobs=n, seed=seed, load=1.1, nodes=FLEET.nodes, gpus_per_node=FLEET.gpus_per_node)


def run(policy: str, jobs: list[TraceJob], **cfg: float) -> tuple[Simulator, SimResult]:
    sim = Simulator(jobs, FLEET.build(), make_policy(policy), SimConfig(**cfg), record=True)  # type: ignore[arg-type]
    return sim, sim.run()


def assert_no_gpu_shared(sim: Simulator) -> None:
    """Replay the start/stop log: a GPU is never held by two jobs, a job never runs twice."""
    owner: dict[tuple[str, int], str] = {}
    live: set[str] = set()
    for _, what, job_id, placement in sim.log:
        gpus = [(p.node, g) for p in placement for g in p.gpus]
        if what == "start":
            assert job_id not in live, f"{job_id} started twice"
            live.add(job_id)
            for key in gpus:
                assert key not in owner, f"GPU {key} given to {job_id} while {owner.get(key)} holds it"
                owner[key] = job_id
        else:
            live.remove(job_id)
            for key in gpus:
                assert owner.pop(key) == job_id
    assert not live and not owner


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_job_finishes_once_and_no_gpu_is_shared(policy: str) -> None:
    jobs = small_trace()
    sim, result = run(policy, jobs)
    assert sorted(o.job_id for o in result.outcomes) == sorted(j.job_id for j in jobs)
    by_id = {j.job_id: j for j in jobs}
    for o in result.outcomes:
        assert o.jct_s >= by_id[o.job_id].duration_s - 1e-6
        assert 0 <= o.queue_s <= o.jct_s + 1e-6
        assert o.first_start_s >= o.submit_s
    assert_no_gpu_shared(sim)
    m = result.metrics()
    assert 0 < m["utilization"] <= 1
    assert 0 <= m["fragmentation"] <= 1
    if not make_policy(policy).preemptive:
        assert m["preemptions"] == 0


def test_failures_requeue_jobs_and_nothing_is_lost() -> None:
    jobs = small_trace()
    sim, result = run(
        "default", jobs, gpu_failures_per_gpu_day=0.5, node_failures_per_node_day=0.1, repair_s=3600, seed=7
    )
    assert result.failures_injected > 10
    assert sum(o.failures for o in result.outcomes) > 0
    assert len(result.outcomes) == len(jobs)
    assert_no_gpu_shared(sim)


def test_same_seed_same_result() -> None:
    jobs = small_trace(150)
    _, a = run("default", jobs, gpu_failures_per_gpu_day=0.5, seed=11)
    _, b = run("default", jobs, gpu_failures_per_gpu_day=0.5, seed=11)
    _, c = run("default", jobs, gpu_failures_per_gpu_day=0.5, seed=12)
    assert a.outcomes == b.outcomes
    assert a.outcomes != c.outcomes


def test_preempted_jobs_pay_the_restart_overhead() -> None:
    jobs = small_trace()
    _, result = run("las", jobs, restart_overhead_s=500)
    hit = [o for o in result.outcomes if o.preemptions]
    assert hit, "the trace should cause preemptions under las"
    for o in hit:
        assert o.jct_s >= o.duration_s + 500 * o.preemptions - 1e-6


def test_time_limit_stops_a_job_and_too_big_jobs_are_rejected() -> None:
    jobs = [
        TraceJob(job_id="long", user="u", team="t", submit_s=0, duration_s=5000, gpus=1, time_limit_s=1000),
        TraceJob(job_id="huge", user="u", team="t", submit_s=0, duration_s=10, gpus=64),
    ]
    _, result = run("fifo", jobs)
    (long,) = result.outcomes
    assert long.timed_out and long.finish_s == pytest.approx(1000, abs=11)
    assert [r[0] for r in result.rejected] == ["huge"]
    assert "needs 64 GPUs on 8 nodes" in result.rejected[0][1]


def test_oracle_bound_beats_fifo() -> None:
    jobs = small_trace(400)
    fifo = run("fifo", jobs)[1].metrics()
    oracle = run("srtf-oracle", jobs)[1].metrics()
    assert oracle["avg_jct_s"] < fifo["avg_jct_s"]


def test_reservation_replay_keeps_the_window_for_its_owner() -> None:
    from gpufleet.sim.loaders.reservations import ReservationRequest
    from gpufleet.sim.runner import admit_reservations

    fleet = FleetSpec(nodes=1, gpus_per_node=8).build()
    jobs = [
        TraceJob(
            job_id="bob-long", user="bob", team="b", submit_s=0, duration_s=3000, gpus=8, time_limit_s=3000
        ),
        TraceJob(
            job_id="bob-short", user="bob", team="b", submit_s=0, duration_s=400, gpus=8, time_limit_s=500
        ),
        TraceJob(job_id="alice", user="alice", team="a", submit_s=500, duration_s=2000, gpus=8),
    ]
    booked, refused = admit_reservations(
        fleet,
        [
            ReservationRequest(id="demo", start_s=1000, duration_s=4000, gpus=8, users=("alice",)),
            ReservationRequest(id="clash", start_s=2000, duration_s=100, gpus=8, users=("bob",)),
        ],
    )
    assert [r.id for r in booked] == ["demo"]
    assert [rid for rid, _ in refused] == ["clash"]
    sim = Simulator(jobs, fleet, make_policy("backfill"), SimConfig(sched_interval_s=1), reservations=booked)
    starts = {o.job_id: o.first_start_s for o in sim.run().outcomes}
    assert starts["bob-short"] == 0  # ends before the window: backfilled
    assert starts["alice"] == 1000  # the window opens for its owner
    assert starts["bob-long"] >= 5000  # would have crossed into the window


class _Uncached:
    """Mixin: a policy that gives no key lifetimes, so every pass ranks running jobs
    afresh (the core's path before victims.RunningKeys)."""

    running_key = Policy.running_key


@pytest.mark.parametrize("policy", ["default", "las"])
@pytest.mark.parametrize(
    "cfg",
    [{}, {"gpu_failures_per_gpu_day": 0.5, "node_failures_per_node_day": 0.1, "repair_s": 3600, "seed": 7}],
    ids=["plain", "failures"],
)
def test_running_keys_kept_across_passes_change_no_decision(policy: str, cfg: dict[str, float]) -> None:
    """The ranking kept from pass to pass (victims.py) replays exactly like ranking
    every running job afresh in every pass."""
    jobs = small_trace(400)
    base = type(make_policy(policy))
    uncached = type("Uncached", (_Uncached, base), {})
    a = Simulator(jobs, FLEET.build(), make_policy(policy), SimConfig(**cfg), record=True)  # type: ignore[arg-type]
    b = Simulator(jobs, FLEET.build(), uncached(), SimConfig(**cfg), record=True)  # type: ignore[arg-type]
    ra, rb = a.run(), b.run()
    assert ra.preemptions > 0
    assert ra.outcomes == rb.outcomes
    assert a.log == b.log


def test_the_timeline_is_sampled_on_a_regular_clock_to_the_end() -> None:
    """Plots end where the run ends, not at the last scheduling pass, and the busy GPUs
    at each grid point are the state then (the last point: an empty fleet)."""
    jobs = small_trace(120)
    _, result = run("backfill", jobs, sample_interval_s=600.0)
    t = result.timeline["t"]
    steps = {round(b - a, 6) for a, b in itertools.pairwise(t)}
    assert steps == {600.0}
    last_finish = max(o.finish_s for o in result.outcomes)
    assert t[0] == min(j.submit_s for j in jobs) and t[-1] >= last_finish - 600.0
    assert result.timeline["busy_gpus"][-1] == 0 and result.timeline["pending_jobs"][-1] == 0
    assert max(result.timeline["busy_gpus"]) <= FLEET.nodes * FLEET.gpus_per_node
