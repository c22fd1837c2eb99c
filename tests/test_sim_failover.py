"""The simulator's failure model matches the server's: a failed GPU's job is requeued at
once (the GPU is out), a failed node's jobs only after ``requeue_after_s``."""

from __future__ import annotations

import pytest

from test_sim import assert_no_gpu_shared, run, small_trace


@pytest.mark.parametrize("delay", [0.0, 90.0, 1800.0], ids=["at-once", "server-default", "half-hour"])
def test_node_failure_requeues_after_the_delay_and_loses_nothing(delay: float) -> None:
    jobs = small_trace()
    sim, result = run(
        "default", jobs, node_failures_per_node_day=0.5, repair_s=3600, seed=5, requeue_after_s=delay
    )
    assert result.failures_injected > 3
    assert len(result.outcomes) == len(jobs)
    assert_no_gpu_shared(sim)
    hit = [o for o in result.outcomes if o.failures]
    assert hit
    for o in hit:  # only node failures here: each one kept the job out of the queue >= delay
        assert o.queue_s >= o.failures * delay - 1e-6


def test_a_requeued_job_starts_at_the_next_pass_when_gpus_are_free() -> None:
    """A job back from a lost node must reach the very next pass (it once waited for an
    unrelated event to make the simulator rebuild its snapshot)."""
    from gpufleet.scheduler import make_policy
    from gpufleet.sim import FleetSpec, SimConfig, Simulator
    from gpufleet.sim.synth import synthesize

    fleet = FleetSpec(nodes=16, gpus_per_node=8, nodes_per_leaf=4)
    jobs = synthesize(jobs=200, seed=4, load=0.2, nodes=16, gpus_per_node=8)
    cfg = SimConfig(node_failures_per_node_day=0.5, repair_s=1800, seed=2, requeue_after_s=90.0)
    sim = Simulator(jobs, fleet.build(), make_policy("default"), cfg, record=True)
    result = sim.run()
    assert len(result.outcomes) == len(jobs) and result.failures_injected > 0
    stopped: dict[str, float] = {}
    restarts = []
    for at, what, job_id, _ in sim.log:
        if what == "start" and job_id in stopped:
            restarts.append(at - stopped.pop(job_id))
        elif what == "stop":
            stopped[job_id] = at
    assert restarts, "no job was restarted: pick another seed"
    # at 20 % load there are free GPUs: back after the 90 s delay, started by the next pass
    assert max(restarts) <= 90.0 + cfg.sched_interval_s + 1e-6
