"""Reservations inside a pass (who may use booked GPUs, when) and their admission."""

from __future__ import annotations

import pytest

from factories import job, placed, running, snapshot, uniform_fleet
from gpufleet.scheduler import Reservation, ReservationMove, admit_reservation, plan

ALL8 = tuple(range(8))
NOW = 10_000.0


def booking(
    rid: str = "r", *, start: float = NOW - 100, end: float = NOW + 3600, **kw: object
) -> Reservation:
    nodes = kw.pop("nodes", (("n0", 8),))
    return Reservation(id=rid, start=start, end=end, nodes=nodes, **kw)  # type: ignore[arg-type]


def run_plan(
    pending: tuple, reservations: tuple, running_jobs: tuple = (), policy: str = "backfill", n: int = 2
):  # type: ignore[no-untyped-def, type-arg]
    snap = snapshot(
        uniform_fleet(n), now=NOW, pending=pending, running_jobs=running_jobs, reservations=reservations
    )
    return plan(snap, policy)


CASES = [
    pytest.param(
        (job("bob1", 8, user="bob"), job("bob2", 8, user="bob", submit=1)),
        (booking(users=("alice",)),),
        {"bob1": {"n1": ALL8}},
        id="active-window-keeps-non-owners-out",
    ),
    pytest.param(
        (job("a", 8, user="alice"),),
        (booking(users=("alice",)),),
        {"a": {"n0": ALL8}},
        id="owner-uses-own-reservation-first",
    ),
    pytest.param(
        (job("t", 4, team="ml"), job("u", 4, team="ml", submit=1)),
        (booking(team="ml", nodes=(("n1", 4),)),),
        {"t": {"n1": (0, 1, 2, 3)}, "u": {"n1": (4, 5, 6, 7)}},
        id="team-owner-falls-back-to-general-pool",
    ),
    pytest.param(
        (job("x", 2, reservation="r", user="carol"),),
        (booking(users=("alice",)),),
        {"x": {"n0": (0, 1)}},
        id="naming-the-reservation-makes-an-owner",
    ),
    pytest.param(
        (
            job("short", 8, user="bob", time_limit_s=3000),
            job("long", 8, user="bob", submit=1, time_limit_s=9000),
        ),
        (booking(start=NOW + 3600, end=NOW + 7200, users=("alice",)),),
        {"short": {"n0": ALL8}, "long": {"n1": ALL8}},
        id="backfill-before-window-only-if-it-ends-in-time",
    ),
    pytest.param(
        (
            job("long1", 8, user="bob", time_limit_s=9000),
            job("long2", 8, user="bob", submit=1, time_limit_s=9000),
        ),
        (booking(start=NOW + 3600, end=NOW + 7200, users=("alice",)),),
        {"long1": {"n1": ALL8}},
        id="long-jobs-stay-off-upcoming-window",
    ),
    pytest.param(
        (job("m", 1, user="alice"),),
        (booking(maintenance=True, nodes=(("n0", 8), ("n1", 8))),),
        {},
        id="maintenance-owns-nobody",
    ),
]


@pytest.mark.parametrize(("pending", "reservations", "want"), CASES)
def test_who_may_use_reserved_gpus(pending: tuple, reservations: tuple, want: dict) -> None:  # type: ignore[type-arg]
    assert placed(run_plan(pending, reservations).starts) == want


def test_named_reservation_job_waits_inside_it() -> None:
    full = (running("a0", {"n0": ALL8}, user="alice"),)
    got = run_plan((job("x", 2, reservation="r", user="alice"),), (booking(users=("alice",)),), full)
    assert got.starts == ()
    assert got.pending[0].reason == "Reservation: reservation r has 0 unused GPUs, job needs 2"


def test_window_start_preempts_preemptible_intruders() -> None:
    intruder = (running("bob", {"n0": (0, 1, 2, 3)}, user="bob", started=NOW - 500),)
    got = run_plan((job("a", 8, user="alice"),), (booking(users=("alice",)),), intruder, policy="fifo")
    assert [(p.job_id, p.by) for p in got.preemptions] == [("bob", "r")]
    assert placed(got.starts) == {"a": {"n0": ALL8}}


def test_window_moves_off_non_preemptible_jobs() -> None:
    stuck = (running("bob", {"n0": (0, 1, 2, 3)}, user="bob", preemptible=False),)
    pend = (
        job("a", 4, user="alice"),
        job("a2", 4, user="alice", submit=1),
        job("bob2", 4, user="bob", submit=2),
    )
    got = run_plan(pend, (booking(users=("alice",)),), stuck, policy="fifo")
    assert got.preemptions == ()
    assert got.reservation_moves == (ReservationMove(reservation="r", from_node="n0", to_node="n1", gpus=4),)
    # The reservation now holds n0's 4 free GPUs and 4 of n1's: alice gets both halves,
    # bob the unreserved half of n1.
    assert placed(got.starts) == {
        "a": {"n0": (4, 5, 6, 7)},
        "a2": {"n1": (0, 1, 2, 3)},
        "bob2": {"n1": (4, 5, 6, 7)},
    }


def test_estimated_start_waits_for_the_window_to_end() -> None:
    got = run_plan((job("bob", 8, user="bob"),), (booking(users=("alice",)),), n=1)
    assert got.starts == ()
    assert got.pending[0].estimated_start == NOW + 3600


ADMIT = [
    pytest.param((), 16, 0, 3600, (("n0", 8), ("n1", 8)), id="empty-fleet-gets-a-leaf"),
    pytest.param((booking("a", start=0, end=3600, nodes=(("n0", 8), ("n1", 8))),), 16, 3600, 7200,
                 (("n0", 8), ("n1", 8)), id="back-to-back-windows-share-gpus"),
    pytest.param((booking("a", start=0, end=3600, nodes=(("n0", 4),)),), 8, 1800, 5400,
                 (("n1", 8),), id="overlap-takes-the-whole-free-node"),
    pytest.param((booking("a", start=0, end=3600, nodes=(("n0", 4),)),), 4, 1800, 5400,
                 (("n0", 4),), id="overlap-shares-a-partly-booked-node"),
]  # fmt: skip


@pytest.mark.parametrize(("existing", "gpus", "start", "end", "want"), ADMIT)
def test_admission(existing: tuple, gpus: int, start: float, end: float, want: tuple) -> None:  # type: ignore[type-arg]
    assert admit_reservation(uniform_fleet(2), existing, gpus=gpus, start=start, end=end) == want


def test_admission_refusal_names_the_conflict() -> None:
    existing = (booking("night-run", start=0, end=3600, nodes=(("n0", 8), ("n1", 4))),)
    got = admit_reservation(uniform_fleet(2), existing, gpus=8, start=1000, end=2000)
    assert got == (
        "cannot guarantee 8 GPUs on 1 node of H100 in that window: 4 unreserved, largest block 4; "
        "overlapping reservations: night-run"
    )


def test_maintenance_booking_of_named_nodes() -> None:
    existing = (booking("a", start=0, end=3600, nodes=(("n0", 2),)),)
    assert admit_reservation(uniform_fleet(2), existing, gpus=0, start=0, end=100, node_names=("n1",)) == (
        ("n1", 8),
    )
    assert (
        admit_reservation(uniform_fleet(2), existing, gpus=0, start=0, end=100, node_names=("n0",))
        == "node n0 is already reserved in that window by a"
    )
