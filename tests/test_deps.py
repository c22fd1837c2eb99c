"""Job dependencies (``scheduler/deps.py``: Slurm's ``--dependency`` grammar and
meaning, table-driven) and how ``plan()`` treats what they block, and job arrays'
``%N`` limit, enforced by the core for GPU and 0-GPU tasks alike."""

from __future__ import annotations

import pytest

from factories import fleet, job, node, running
from gpufleet.scheduler import Blocked, Snapshot, Status, make_policy, plan
from gpufleet.scheduler.deps import DependencyError, Phase, Ref, judge, parse

OK, NOT_OK, STARTED, WAITING = Phase.OK, Phase.NOT_OK, Phase.STARTED, Phase.WAITING

PARSE = [
    ("afterok:12", "afterok:12"),
    ("afterok:12:13,after:9", "afterok:12:13,after:9"),
    ("afterany:5?afternotok:6", "afterany:5?afternotok:6"),
    ("AFTEROK:12_3", "afterok:12_3"),
    ("singleton", "singleton"),
    ("singleton,afterok:1", "singleton,afterok:1"),
]


@pytest.mark.parametrize(("text", "canonical"), PARSE)
def test_parse_reads_slurms_grammar(text: str, canonical: str) -> None:
    assert str(parse(text)) == canonical


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "empty"),
        ("afterok", "needs job ids"),
        ("afterok:x", "is not a job id"),
        ("afterok:1,afterany:2?after:3", "not both"),
        ("after:12+30", "delay"),
        ("aftercorr:5", "not supported"),
        ("expand:5", "unknown type"),
        ("singleton:5", "takes no job ids"),
    ],
)
def test_parse_refuses_what_it_cannot_honour_with_words(text: str, words: str) -> None:
    with pytest.raises(DependencyError, match=words):
        parse(text)


STATES = {"1": OK, "2": NOT_OK, "3": STARTED, "4": WAITING}
ARRAY = {"10": [("10", OK), ("11", STARTED), ("12", OK)]}


def lookup(ref: Ref) -> list[tuple[str, Phase]]:
    if str(ref.job) in ARRAY and ref.task is None:
        return ARRAY[str(ref.job)]
    if ref.task is not None:
        return [(f"{ref.job + ref.task}", ARRAY[str(ref.job)][ref.task][1])]
    phase = STATES.get(str(ref.job))
    return [] if phase is None else [(str(ref.job), phase)]


# text, satisfied, never, waiting on
JUDGE = [
    ("after:3", True, False, ()),
    ("after:2", True, False, ()),  # ended (here: without success) counts as started
    ("after:4", False, False, ("4",)),
    ("afterany:1:2", True, False, ()),
    ("afterany:3", False, False, ("3",)),
    ("afterok:1", True, False, ()),
    ("afterok:2", False, True, ()),
    ("afterok:3:4", False, False, ("3", "4")),
    ("afterok:1:2:4", False, True, ()),
    ("afternotok:2", True, False, ()),
    ("afternotok:1", False, True, ()),
    ("afterok:99", False, True, ()),  # unknown: never
    ("afterany:99", True, False, ()),  # unknown: ended long ago
    ("afterok:2?afterok:1", True, False, ()),  # any of
    ("afterok:2?afterok:3", False, False, ("3",)),
    ("afterok:2?afternotok:1", False, True, ()),  # every branch impossible
    ("afterok:1,afterok:2", False, True, ()),  # all of: one impossible
    ("afterok:10", False, False, ("11",)),  # a whole array: every task
    ("afterok:10_0,afterok:10_2", True, False, ()),  # tasks one by one
]


@pytest.mark.parametrize(("text", "satisfied", "never", "waits"), JUDGE)
def test_judge_follows_slurms_meaning(
    text: str, satisfied: bool, never: bool, waits: tuple[str, ...]
) -> None:
    v = judge(parse(text), lookup)
    assert (v.satisfied, v.never, v.waiting_on) == (satisfied, never, waits)
    if not satisfied:
        assert v.code == ("DependencyNeverSatisfied" if never else "Dependency") and v.detail


def test_singleton_waits_for_the_earlier_job_of_the_same_name() -> None:
    assert judge(parse("singleton"), lookup).satisfied
    v = judge(parse("singleton"), lookup, singleton_blockers=["7"])
    assert not v.satisfied and not v.never and v.waiting_on == ("7",) and "job 7" in v.detail


F = fleet(node("n1", gpus=4))


def test_a_blocked_job_waits_outside_the_queue_with_its_predecessors_end_as_estimate() -> None:
    pred = running("p", {"n1": (0, 1)}, time_limit_s=3600.0, started=0.0)
    blocked = job("b", 1, blocked=Blocked(code="Dependency", detail="afterok: job p running", after=("p",)))
    after_blocked = job("c", 1, blocked=Blocked(code="Dependency", detail="afterok: job b", after=("b",)))
    never = job("n", 1, blocked=Blocked(code="DependencyNeverSatisfied", detail="x", never=True))
    free = job("f", 1)
    p = plan(
        Snapshot(now=100.0, fleet=F, running=(pred,), pending=(blocked, after_blocked, never, free)), "fifo"
    )
    assert [s.job_id for s in p.starts] == ["f"]  # 2 GPUs free, but only f may start
    st = {s.job_id: s for s in p.pending}
    assert st["b"].position is None and st["b"].reason.startswith("Dependency: ")
    assert st["b"].estimated_start == 3600.0  # p's time limit
    assert st["c"].estimated_start == 3600.0 + make_policy("fifo").limit(blocked)  # b's start + b's limit
    assert st["n"].status is Status.UNRESOLVABLE and st["n"].estimated_start is None


@pytest.mark.parametrize("gpus", [1, 0])
def test_an_array_limit_caps_the_tasks_running_at_once(gpus: int) -> None:
    pool = "default" if gpus else "cpu"
    f = fleet(node("n1", gpus=8), node("c1", gpus=0, pool="cpu"))
    one = running("t0", {"n1": (0,)} if gpus else {"c1": ()}, array="7", array_limit=2)
    tasks = tuple(
        job(f"t{i}", gpus, submit=float(i), pool=pool, array="7", array_limit=2) for i in range(1, 5)
    )
    other = job("x", gpus, submit=9.0, pool=pool)
    p = plan(Snapshot(now=10.0, fleet=f, running=(one,), pending=(*tasks, other)), "fifo")
    assert sorted(s.job_id for s in p.starts) == ["t1", "x"]
    reasons = {s.job_id: s.reason for s in p.pending}
    assert all(reasons[f"t{i}"].startswith("JobArrayTaskLimit") for i in (2, 3, 4)), reasons


def test_a_job_held_until_a_time_is_estimated_to_start_then() -> None:
    held = job("h", 1, blocked=Blocked(code="BeginTime", detail="not before", not_before=500.0))
    after = job("d", 1, blocked=Blocked(code="Dependency", detail="x", after=("h",), not_before=50.0))
    p = plan(Snapshot(now=100.0, fleet=F, pending=(held, after)), "fifo")
    st = {s.job_id: s for s in p.pending}
    assert not p.starts and st["h"].estimated_start == 500.0 and st["h"].reason == "BeginTime: not before"
    assert st["d"].estimated_start == 500.0 + make_policy("fifo").limit(held)


def test_tasks_held_by_their_array_limit_are_estimated_from_their_siblings_ends() -> None:
    f = fleet(node("n1", gpus=8))
    run = tuple(
        running(f"t{i}", {"n1": (i,)}, started=10.0 * i, time_limit_s=100.0, array="7", array_limit=2)
        for i in range(2)
    )
    waiting = tuple(
        job(f"t{i}", 1, submit=float(i), time_limit_s=100.0, array="7", array_limit=2) for i in range(2, 5)
    )
    p = plan(Snapshot(now=20.0, fleet=f, running=run, pending=waiting), "fifo")
    eta = {s.job_id: s.estimated_start for s in p.pending}
    assert not p.starts and eta == {"t2": 100.0, "t3": 110.0, "t4": 200.0}
