"""The rack power rule of the core (``scheduler/power.py``), as tables on real plans:
a job fits a rack's budget, goes to another rack, or waits with reason ``Power``;
headroom; board power against readings (and readings of a job that has not settled);
gangs over several racks; strict order; never a preemption for power, nor one that would
overrun a rack.

Figures (``powermodel.py``): an "H100" GPU draws 700 W busy and 70 W idle, so a start
adds 630 W a GPU; an 8-GPU node's base is 1.5 kW. A rack of two idle 8-GPU nodes draws
2 x (1500 + 8 x 70) = 4120 W.
"""

from __future__ import annotations

import dataclasses

import pytest

from factories import job, node, placed, running
from gpufleet.scheduler import Fleet, JobRequest, RunningJob, Snapshot, plan
from gpufleet.scheduler.powermodel import PowerModel, RackBudget, board_power_w

TWO_RACKS = Fleet(
    nodes=(node("a0", rack="r0"), node("a1", rack="r0"), node("b0", rack="r1"), node("b1", rack="r1"))
)
ONE_RACK = Fleet(nodes=(node("a0", rack="r0"), node("a1", rack="r0")))


def model(
    *budgets: tuple[str, float, float], measured: tuple[tuple[str, int, float], ...] = ()
) -> PowerModel:
    """Budgets as (rack, kW, headroom)."""
    return PowerModel(
        racks=tuple(RackBudget(rack=r, budget_w=kw * 1000, headroom=h) for r, kw, h in budgets),
        measured=measured,
    )


def busy(node_name: str, watts: float) -> tuple[tuple[str, int, float], ...]:
    return tuple((node_name, g, watts) for g in range(8))


FULL_A0 = running("r", {"a0": tuple(range(8))}, started=0.0)
READ_300 = model(("r0", 10, 0.3), measured=busy("a0", 300))
IDLE_20 = model(("r0", 9, 0.0), measured=busy("a0", 20) + busy("a1", 20))
READ_100 = model(("r0", 12, 0.0), measured=busy("a0", 100) + busy("a1", 100))

# name, fleet, running, pending, power, want: {job: nodes it starts on} or (job, reason)
CASES = [
    ("fits", ONE_RACK, (), job("p", 8), model(("r0", 10, 0.0)), {"p": {"a0"}}),
    ("waits_for_power", ONE_RACK, (), job("p", 16), model(("r0", 10, 0.0)),
     ("p", "Power: rack r0 at 4.1/10.0 kW, job adds 10.1 kW")),
    ("no_budget_no_rule", ONE_RACK, (), job("p", 16), None, {"p": {"a0", "a1"}}),
    ("headroom_leaves_4", ONE_RACK, (), job("p", 4), model(("r0", 10, 0.3)), {"p": {"a0"}}),
    ("headroom_holds_5", ONE_RACK, (), job("p", 5), model(("r0", 10, 0.3)),
     ("p", "Power: rack r0 at 4.1/7.0 kW, job adds 3.1 kW")),
    ("goes_to_other_rack", TWO_RACKS, (), job("p", 8), model(("r0", 5, 0.0), ("r1", 20, 0.0)), {"p": {"b0"}}),
    ("rack_without_budget_takes_it", TWO_RACKS, (), job("p", 8), model(("r0", 5, 0.0)), {"p": {"b0"}}),
    # 16 GPUs fit in no rack (10 kW: 9 GPUs), but one node of each rack powers them.
    ("gang_split_over_racks", TWO_RACKS, (), job("p", 16, gpus_per_node=8),
     model(("r0", 10, 0.0), ("r1", 10, 0.0)), {"p": {"a0", "b0"}}),
    # a0 busy at board power: 1500x2 + 8x700 + 8x70 = 9160 W, over a 7 kW cap.
    ("tdp_of_running_job", ONE_RACK, (FULL_A0,), job("p", 1), model(("r0", 10, 0.3)),
     ("p", "Power: rack r0 at 9.2/7.0 kW, job adds 0.6 kW")),
    # a0 read at 300 W a GPU: 1500x2 + 8x300 + 8x70 = 5960 W: room for one GPU (630 W).
    ("measured_running_job", ONE_RACK, (FULL_A0,), job("p", 1), READ_300, {"p": {"a1"}}),
    ("measured_leaves_one", ONE_RACK, (FULL_A0,), job("p", 2), READ_300,
     ("p", "Power: rack r0 at 6.0/7.0 kW, job adds 1.3 kW")),
    # started 40 s before now (100): not settled, so counted at board power.
    ("unsettled_reading_ignored", ONE_RACK, (dataclasses.replace(FULL_A0, started_at=60.0),), job("p", 1),
     READ_300, ("p", "Power: rack r0 at 9.2/7.0 kW, job adds 0.6 kW")),
    # idle GPUs read at 20 W instead of 70: 1500x2 + 16x20 = 3320 W, room for 5 GPUs.
    ("measured_idle", ONE_RACK, (), job("p", 5), IDLE_20,
     {"p": {"a0"}}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("fleet", "run", "pending", "power", "want"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_power_rule(
    fleet: Fleet,
    run: tuple[RunningJob, ...],
    pending: JobRequest,
    power: PowerModel | None,
    want: dict[str, set[str]] | tuple[str, str],
) -> None:
    snap = Snapshot(now=100.0, fleet=fleet, running=run, pending=(pending,), power=power)
    p = plan(snap, "backfill")
    if isinstance(want, dict):
        assert {j: set(nodes) for j, nodes in placed(p.starts).items()} == want
    else:
        assert p.starts == ()
        (status,) = [s for s in p.pending if s.job_id == want[0]]
        assert status.reason == want[1]
        assert status.estimated_start is None  # watts, not GPUs: no estimate


def test_fills_a_rack_to_its_cap_and_no_further() -> None:
    """One-GPU jobs fill a 10 kW rack (room 5880 W) with exactly 9 GPUs: 9 x 630 W."""
    snap = Snapshot(
        now=100.0,
        fleet=ONE_RACK,
        pending=tuple(job(f"p{i}", 1) for i in range(16)),
        power=model(("r0", 10, 0.0)),
    )
    p = plan(snap, "backfill")
    assert len(p.starts) == 9
    assert {s.reason.split(":")[0] for s in p.pending} == {"Power"}


@pytest.mark.parametrize(
    ("policy", "second_starts"), [("fifo", False), ("backfill", True)], ids=["fifo", "backfill"]
)
def test_strict_order_waits_behind_power(policy: str, second_starts: bool) -> None:
    """fifo keeps a job held back by power at the head; backfill lets a smaller one by."""
    snap = Snapshot(
        now=100.0,
        fleet=ONE_RACK,
        pending=(job("big", 16), job("small", 1, submit=1.0)),
        power=model(("r0", 10, 0.0)),
    )
    p = plan(snap, policy)
    assert ("small" in placed(p.starts)) is second_starts


LAS_VICTIM = running("v", {"a0": tuple(range(8)), "a1": tuple(range(8))}, started=0.0, attained_service_s=1e7)


def test_no_preemption_for_power() -> None:
    """GPUs are free but the rack has no power: the running job is not preempted."""
    small = running("v", {"a0": (0,)}, started=0.0, attained_service_s=1e7)
    snap = Snapshot(
        now=100.0, fleet=ONE_RACK, running=(small,), pending=(job("p", 8),), power=model(("r0", 5, 0.0))
    )
    p = plan(snap, "las")
    assert p.preemptions == () and p.starts == ()
    assert p.pending[0].reason.startswith("Power: rack r0")


@pytest.mark.parametrize(("power", "preempts"), [(None, True), (READ_100, False)],
                         ids=["no_budget", "would_overrun"])  # fmt: skip
def test_preemption_that_would_overrun_a_rack_is_not_made(power: PowerModel | None, preempts: bool) -> None:
    """The victim reads 100 W a GPU (3.2 kW for 16): the new job at board power (11.2 kW
    for 16) would take the rack (3000 + 3200 W now) past 12 kW."""
    snap = Snapshot(now=100.0, fleet=ONE_RACK, running=(LAS_VICTIM,), pending=(job("p", 16),), power=power)
    p = plan(snap, "las")
    assert bool(p.preemptions) is preempts
    assert bool(p.starts) is preempts


@pytest.mark.parametrize(
    ("name", "watts"),
    [
        ("NVIDIA H100 80GB HBM3", 700),
        ("H100-80GB", 700),
        ("NVIDIA H100 PCIe", 350),
        ("NVIDIA H100 NVL", 400),
        ("NVIDIA A100-SXM4-80GB", 400),
        ("NVIDIA A100-PCIE-40GB", 250),
        ("NVIDIA A100 80GB PCIe", 300),
        ("NVIDIA L40S", 350),
        ("NVIDIA L4", 72),
        ("Tesla V100S-PCIE-32GB", 250),
        ("Tesla T4", 70),
        ("Mystery GPU 9000", 700),
    ],
)
def test_board_power_table(name: str, watts: float) -> None:
    assert board_power_w(name) == watts
