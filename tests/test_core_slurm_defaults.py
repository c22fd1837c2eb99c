"""Issue 31 in the core, table-driven against ``plan()``: ``--constraint`` over node
features (``gpufleet.constraint``: parse and match), ``--exclude``, and a QOS's per-user
limits with Slurm's pending reasons."""

from __future__ import annotations

import dataclasses

import pytest

from factories import fleet, job, node, running
from gpufleet.constraint import Unsupported, parse
from gpufleet.scheduler import Fleet, JobRequest, Node, QosLimit, RunningJob, Snapshot, plan


def featured(name: str, *features: str, gpus: int = 8, model: str = "H100") -> Node:
    return dataclasses.replace(node(name, gpus=gpus, model=model), features=frozenset(features))


F = fleet(
    featured("a", "ib", "rack1"),
    featured("b", "rack2"),
    featured("c", "ib", "rack2", model="A100"),
    featured("d", "rack2"),
)


def placed(
    f: Fleet, *jobs: JobRequest, run: tuple[RunningJob, ...] = (), qos: tuple[QosLimit, ...] = ()
) -> dict[str, object]:
    """{job: its nodes, or its pending reason}."""
    p = plan(Snapshot(now=10.0, fleet=f, running=run, pending=jobs, qos=qos), "fifo")
    got: dict[str, object] = {s.job_id: tuple(n.node for n in s.placement) for s in p.starts}
    got |= {w.job_id: w.reason for w in p.pending}
    return got


@pytest.mark.parametrize(
    ("text", "canonical", "terms"),
    [
        ("ib", "ib", (("ib",),)),
        ("a100&ib", "a100&ib", (("a100", "ib"),)),
        ("ib|nvme", "ib|nvme", (("ib",), ("nvme",))),
        ("(ib|nvme)&gpu80", "gpu80&ib|gpu80&nvme", (("gpu80", "ib"), ("gpu80", "nvme"))),
        ("[rack1|rack2]", "[rack1|rack2]", (("rack1",), ("rack2",))),
        (" v100-32g ", "v100-32g", (("v100-32g",),)),
    ],
    ids=["one", "and", "or", "parens", "matching-or", "dashes"],
)
def test_constraints_parse_to_a_canonical_form_that_reads_back_the_same(
    text: str, canonical: str, terms: tuple[tuple[str, ...], ...]
) -> None:
    got = parse(text)
    assert (str(got), got.terms) == (canonical, terms)
    assert parse(str(got)) == got


@pytest.mark.parametrize(
    ("text", "words"),
    [("a&", "missing at the end"), ("(a", "not closed"), ("a b", "unexpected 'b'"), ("[a]|b", "brackets"),
     ("a;b", "';'"), ("", "give a feature")],
    ids=["dangling", "open-paren", "two-words", "inner-brackets", "symbol", "empty"],
)  # fmt: skip
def test_bad_constraints_say_what_is_wrong(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse(text)


def test_counts_are_refused_as_unsupported_not_as_a_bad_value() -> None:
    with pytest.raises(Unsupported):
        parse("a100*2")


@pytest.mark.parametrize(
    ("ask", "want"),
    [
        ({"constraint": "rack1"}, ("a",)),
        ({"constraint": "ib&rack2"}, ("c",)),
        ({"constraint": "A100"}, ("c",)),  # a GPU model is a feature
        ({"constraint": "nope|rack1"}, ("a",)),
        ({"constraint": "[nope|rack1]"}, ("a",)),
        ({"exclude": frozenset({"a", "b", "d"})}, ("c",)),
        ({"constraint": "ib", "exclude": frozenset({"a"})}, ("c",)),
        (
            {"constraint": "ib|rack2", "gpus": 16, "nodes": 2, "gpu_type": "H100", "exclude": frozenset("b")},
            ("a", "d"),
        ),
        ({"constraint": "[rack1|rack2]", "gpus": 16, "nodes": 2, "gpu_type": "H100"}, ("b", "d")),  # one rack
    ],
    ids=["feature", "and", "gpu-model", "or", "matching-or", "exclude", "both", "two-nodes", "matching-two"],
)
def test_a_job_lands_only_on_nodes_its_constraint_and_exclude_allow(
    ask: dict[str, object], want: tuple[str, ...]
) -> None:
    shape = {"gpus": 8, **ask}
    got = placed(F, job("j", **shape))  # type: ignore[arg-type]
    assert tuple(sorted(got["j"])) == want  # type: ignore[arg-type]


def test_no_allowed_node_free_is_a_wait_and_cpu_jobs_are_filtered_too() -> None:
    busy = running("r", {"b": tuple(range(8))})
    got = placed(
        F,
        job("g", 8, constraint="rack2&H100", exclude=frozenset("d")),
        job("c", 0, exclude=frozenset({"a", "c", "d"})),
        run=(busy,),
    )
    assert str(got["g"]).startswith("Resources") and got["c"] == ("b",)
    assert str(placed(F, job("n", 0, constraint="gone"))["n"]).startswith("Unschedulable")


LIMITED = (QosLimit(name="low", max_gpus_per_user=8, max_jobs_per_user=2),)


U_LOW: dict[str, object] = {"user": "u", "qos": "low"}


def low(job_id: str, gpus: int, *, user: str = "u") -> JobRequest:
    return job(job_id, gpus, user=user, qos="low")


@pytest.mark.parametrize(
    ("run", "pend", "want"),
    [
        ((), (low("a", 8), low("b", 1)), {"a": True, "b": "QOSMaxGRESPerUser"}),
        ((), (low("a", 1), low("b", 1, user="v")), {"a": True, "b": True}),
        (
            (running("r1", {"a": (0,)}, **U_LOW), running("r2", {"b": (1,)}, **U_LOW)),
            (job("c", 1, user="u", qos="low"), job("d", 0, user="u", qos="low", pool="default")),
            {"c": "QOSMaxJobsPerUserLimit", "d": "QOSMaxJobsPerUserLimit"},
        ),
        ((), (job("a", 16, user="u", qos="other"),), {"a": True}),  # a QOS without limits
    ],
    ids=["gpus-per-user", "per-user-not-per-qos", "jobs-per-user-gpu-and-cpu", "unlimited"],
)  # fmt: skip
def test_a_qos_limits_each_user_with_slurms_reasons(
    run: tuple[RunningJob, ...], pend: tuple[JobRequest, ...], want: dict[str, object]
) -> None:
    got = placed(F, *pend, run=run, qos=LIMITED)
    for jid, w in want.items():
        assert isinstance(got[jid], tuple) if w is True else str(got[jid]).startswith(str(w)), got[jid]


def test_licenses_are_held_by_running_jobs_and_a_job_waits_for_them() -> None:
    """Slurm's reason Licenses; 0-GPU jobs hold them too."""
    held = running("r", {"a": (0,)}, licenses=(("matlab", 2),))
    jobs = (job("x", 1, licenses=(("matlab", 1),)), job("y", 0, licenses=(("matlab", 1),)), job("z", 1))
    p = plan(Snapshot(now=1.0, fleet=F, running=(held,), pending=jobs, licenses=(("matlab", 3),)), "fifo")
    started = {s.job_id for s in p.starts}
    reasons = {w.job_id: w.reason for w in p.pending}
    assert started == {"x", "z"} and reasons["y"].startswith(
        "Licenses: needs 1 of license matlab, 0 of 3 free"
    )
