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
