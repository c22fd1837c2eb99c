"""The filter point of a pass (``scheduler/filters.py``), run on a real ``CycleState``:
which limit holds a job back before any placement, with what reason, for GPU jobs and
0-GPU jobs alike (one table, as Kubernetes' plugin tests)."""

from __future__ import annotations

import dataclasses

import pytest

from factories import job, node, running
from gpufleet.scheduler import Fleet, JobRequest, QosLimit, Snapshot, Status, make_policy
from gpufleet.scheduler.cycle import new_cycle
from gpufleet.scheduler.filters import limit_wait

# Two 16-CPU nodes; running: task 1 of array "a", one job of user u in QOS "q", both
# licenses "lic" held.
FLEET = Fleet(nodes=tuple(dataclasses.replace(node(f"n{i}"), cpus=16) for i in range(2)))
RUNNING = (
    running("a1", {"n0": (0,)}, array="a", array_limit=1),
    running("q1", {"n0": (1,)}, qos="q", user="u"),
    running("l1", {"n1": (0,)}, licenses=(("lic", 2),)),
)

CASES = [
    ("free", job("p", 1, cpus=4), None),
    ("array_full", job("p", 1, array="a", array_limit=1), (Status.UNSCHEDULABLE, "JobArrayTaskLimit")),
    ("array_room", job("p", 1, array="a", array_limit=2), None),
    ("qos_jobs", job("p", 1, qos="q", user="u"), (Status.UNSCHEDULABLE, "QOSMaxJobsPerUserLimit")),
    ("qos_other_user", job("p", 1, qos="q", user="v"), None),
    ("licenses", job("p", 1, licenses=(("lic", 1),)), (Status.UNSCHEDULABLE, "Licenses")),
    ("cpus_never", job("p", 1, cpus=32), (Status.UNRESOLVABLE, "Unschedulable")),
    ("cpu_job_never", job("p", 0, cpus=32), (Status.UNRESOLVABLE, "Unschedulable")),
    ("array_before_licenses", job("p", 0, array="a", array_limit=1, licenses=(("lic", 1),)),
     (Status.UNSCHEDULABLE, "JobArrayTaskLimit")),
]  # fmt: skip


@pytest.mark.parametrize(("pending", "want"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_limit_wait(pending: JobRequest, want: tuple[Status, str] | None) -> None:
    snap = Snapshot(
        now=100.0,
        fleet=FLEET,
        running=RUNNING,
        pending=(pending,),
        qos=(QosLimit(name="q", max_jobs_per_user=1),),
        licenses=(("lic", 2),),
    )
    cs = new_cycle(snap, make_policy("fifo"), explain=True, cache=None)
    asks = cs.res is not None and bool(pending.cpus or pending.mem_mb)
    got = limit_wait(cs, pending, None, asks)
    assert (None if got is None else (got.status, got.code)) == want
    if got is not None:
        assert got.detail  # the reason says which limit, and by how much
