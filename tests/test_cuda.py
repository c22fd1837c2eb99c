"""CUDA compatibility at placement (issue 34): versions as ``gpufleet.cudaver`` reads
them, and the core's rule (``scheduler/cuda.py``) as tables run through ``plan``: a job
that needs CUDA X goes only to nodes whose driver supports at least X, and waits with
the reason when no node of its pool does."""

from __future__ import annotations

import dataclasses

import pytest

from factories import job, node, running
from gpufleet.cudaver import at_least, parse_cuda, parse_reported
from gpufleet.scheduler import Fleet, JobRequest, Plan, Snapshot, Status, make_policy, plan

VERSIONS = [
    ("12.4", (12, 4)),
    ("12", (12, 0)),
    ("12.4.1", (12, 4)),
    (" 11.8 ", (11, 8)),
    ("12.10", (12, 10)),
]  # fmt: skip


@pytest.mark.parametrize(("text", "want"), VERSIONS, ids=[v[0].strip() for v in VERSIONS])
def test_parse_cuda(text: str, want: tuple[int, int]) -> None:
    assert parse_cuda(text) == want


BAD = ["abc", "1e9", "12.x", "0.5", "100.0", "-12.4", "12.4.1.2", "", "12..4", "1e9.0"]


@pytest.mark.parametrize("text", BAD, ids=[b or "empty" for b in BAD])
def test_parse_cuda_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="CUDA version"):
        parse_cuda(text)
    assert parse_reported(text) is None  # a node reporting nonsense supports nothing


def test_ordering_is_numeric_not_textual() -> None:
    assert at_least((12, 10), (12, 4)) and not at_least((12, 4), (12, 10))
    assert not at_least(None, (11, 0))


def _fleet() -> Fleet:
    """n-old: driver for CUDA 12.2; n-new: 12.4; n-none: reports none; pool q: 11.8 only."""
    return Fleet(
        nodes=(
            dataclasses.replace(node("n-new", gpus=4), cuda=(12, 4)),
            dataclasses.replace(node("n-none", gpus=4), cuda=None),
            dataclasses.replace(node("n-old", gpus=4), cuda=(12, 2)),
            dataclasses.replace(node("q-1", gpus=4, pool="q"), cuda=(11, 8)),
        )
    )


def _plan(pending: tuple[JobRequest, ...], *, busy: tuple[str, ...] = (), policy: str = "fifo") -> Plan:
    held = tuple(running(f"r-{n}", {n: (0, 1, 2, 3)}) for n in busy)
    snap = Snapshot(now=100.0, fleet=_fleet(), running=held, pending=pending)
    return plan(snap, make_policy(policy))


CASES = [
    # name, job, nodes busy, where it starts (None: waits), (status, reason start) when it waits
    ("no_need_any_node", job("j", 4), (), "n-new", None),
    ("needs_12.2_first_fit", job("j", 4, cuda=(12, 2)), (), "n-new", None),
    ("needs_12.4_only_new", job("j", 4, cuda=(12, 4)), (), "n-new", None),
    ("needs_12.4_new_busy_waits", job("j", 4, cuda=(12, 4)), ("n-new",), None,
     (Status.UNSCHEDULABLE, "Resources")),
    ("needs_12.2_old_when_new_busy", job("j", 4, cuda=(12, 2)), ("n-new",), "n-old", None),
    ("needs_12.3_never_old", job("j", 4, cuda=(12, 3)), ("n-new",), None,
     (Status.UNSCHEDULABLE, "Resources")),
    ("needs_12.5_none_in_pool", job("j", 4, cuda=(12, 5)), (), None,
     (Status.UNSCHEDULABLE,
      "BadConstraints: needs CUDA 12.5; the newest driver in pool default supports 12.4")),
    ("other_pool_12.0", job("j", 4, cuda=(12, 0), pool="q"), (), None,
     (Status.UNSCHEDULABLE, "BadConstraints: needs CUDA 12.0; the newest driver in pool q supports 11.8")),
    ("cpu_job_needs_driver", job("j", 0, cuda=(12, 4)), (), "n-new", None),
    ("cpu_job_none_in_pool", job("j", 0, cuda=(13, 0)), (), None,
     (Status.UNSCHEDULABLE, "BadConstraints: needs CUDA 13.0")),
    ("with_exclude", job("j", 4, cuda=(12, 2), exclude=frozenset({"n-new"})), (), "n-old", None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("pending", "busy", "where", "waits"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_cuda_filter(
    pending: JobRequest, busy: tuple[str, ...], where: str | None, waits: tuple[Status, str] | None
) -> None:
    for policy in ("fifo", "backfill"):
        p = _plan((pending,), busy=busy, policy=policy)
        starts = {s.job_id: [pn.node for pn in s.placement] for s in p.starts}
        if where is not None:
            assert starts == {"j": [where]}, policy
            continue
        assert starts == {}, policy
        (st,) = [w for w in p.pending if w.job_id == "j"]
        assert waits is not None
        assert (st.status, st.reason[: len(waits[1])]) == waits, (policy, st.reason)


def test_no_node_reporting_a_version() -> None:
    snap = Snapshot(
        now=0.0, fleet=Fleet(nodes=(node("a", gpus=2),)), running=(), pending=(job("j", 1, cuda=(11, 0)),)
    )
    (st,) = plan(snap, make_policy("fifo")).pending
    assert st.reason == "BadConstraints: needs CUDA 11.0; no node in pool default reports a CUDA version"


def test_preemptive_policy_does_not_evict_for_a_node_it_cannot_use() -> None:
    """A low-priority job on n-old is no victim for a 12.4 job: n-old's driver could not run it."""
    low = running("low", {"n-old": (0, 1, 2, 3)}, priority=-10)
    busy_new = running("hi", {"n-new": (0, 1, 2, 3)}, priority=100, preemptible=False)
    snap = Snapshot(
        now=100.0, fleet=_fleet(), running=(low, busy_new), pending=(job("j", 4, cuda=(12, 4), priority=50),)
    )
    p = plan(snap, make_policy("default"))
    assert not p.starts and not p.preemptions
