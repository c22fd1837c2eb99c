"""The failure signatures and their matcher (``gpufleet.diagnosis``), the operators' TOML
rules, and the suspicion rule (``server/decide/suspicion.py``): tables over real log
excerpts (``tests/data/diagnosis/README.md`` says where each comes from) and over
hostile output (huge lines, binary garbage, NULs, patterns that backtrack)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpufleet import diagnosis
from gpufleet.diagnosis import BUILTIN, LINE_MAX, RulesError, Signature, diagnose, parse_rules, table
from gpufleet.server.decide.suspicion import Evidence, SuspicionRule, judge

DATA = Path(__file__).parent / "data" / "diagnosis"

EXCERPTS = [
    ("nccl_ib_peer.log", "nccl-ib-completion-error", "node", "status=12"),
    ("nccl_ib_old.log", "nccl-ib-completion-error", "node", "Got completion with error 12"),
    ("nccl_watchdog.log", "nccl-watchdog-timeout", "unknown", "OpType=ALLREDUCE"),
    ("cuda_illegal_address.log", "cuda-illegal-address", "job", "an illegal memory access"),
    ("cuda_oom.log", "cuda-oom", "job", "Tried to allocate 1.70 GiB"),
    ("cuda_oom_runtime.log", "cuda-oom", "job", "CUDA error: out of memory"),
    ("xid_79.log", "xid-79-fell-off-bus", "node", "79, pid="),
    ("xid_ecc.log", "xid-ecc", "node", "Contained ECC error"),
    ("cuda_ecc.log", "cuda-ecc-uncorrectable", "node", "uncorrectable ECC error encountered"),
    ("xid_nvlink.log", "xid-nvlink", "node", "149, NETIR_LINK_EVT"),
    ("nccl_system_error.log", "nccl-system-error", "unknown", "NCCL communication aborted"),
    ("xid_13.log", "xid-other", "unknown", "Graphics SM Warp Exception"),
    ("segfault.log", "segfault", "job", "Segmentation fault (core dumped)"),
    ("not_started_output.log", "not-started", "job", "cannot open --output slurm-28.out"),
    ("not_started_command.log", "not-started", "job", "cannot start './train.sh'"),
]


@pytest.mark.parametrize(("name", "signature", "blame", "shown"), EXCERPTS, ids=[e[0] for e in EXCERPTS])
def test_each_signature_on_a_real_excerpt(name: str, signature: str, blame: str, shown: str) -> None:
    got = diagnose((DATA / name).read_text())
    assert got.finding is not None
    assert (got.finding.signature, got.finding.blame) == (signature, blame)
    assert shown in got.finding.line
    assert got.finding.diagnosis and got.finding.hint


def test_every_builtin_has_an_excerpt() -> None:
    assert {s.id for s in BUILTIN} == {e[1] for e in EXCERPTS}


def test_a_failure_no_signature_knows_is_no_finding() -> None:
    got = diagnose((DATA / "clean_failure.log").read_text())
    assert got.finding is None and got.lines == 5 and not got.exhausted


XID79 = "NVRM: Xid (PCI:0000:44:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
OOM = "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB"
WATCHDOG = "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=8, OpType=ALLREDUCE)"
IB = "x:1:2 [0] NCCL WARN NET/IB : Got completion with error 12, opcode 0, len 0, vendor err 129"
IB_ID = "nccl-ib-completion-error"
BACKREF = '[[signature]]\nid = "x"\npattern = \'(abc)\\1\'\ndiagnosis = "d"\n'
MATCHER = [
    ("empty", "", None),
    ("no match", "epoch 1 loss 0.3\nepoch 2 loss 0.2\n", None),
    ("the most specific wins, whatever the order", f"{WATCHDOG}\n{OOM}\n{IB}\n", "nccl-ib-completion-error"),
    ("XID 79 over the CUDA error it causes", f"{OOM}\n{XID79}\n", "xid-79-fell-off-bus"),
    ("a timeout is only a symptom", f"{WATCHDOG}\n", "nccl-watchdog-timeout"),
    ("carriage returns end lines (progress bars)", "10%|#   |\r20%|##  |\r" + OOM, "cuda-oom"),
    ("a huge line is cut, its start still read", "x" * 5_000_000 + "\n" + OOM + " x" * 9_000, "cuda-oom"),
    ("a 5 MB line without a newline", "x" * 5_000_000 + OOM, None),
    ("a line past LINE_MAX characters is not read past it", "y" * (LINE_MAX + 5) + OOM, None),
    ("binary garbage around it", "\x01\xff\ufffd" * 1000 + "\n" + IB + "\n" + "\x07" * 300, IB_ID),
    ("NULs before the line", "\x00" * 5000 + OOM, "cuda-oom"),
    ("a NUL inside the message", "RuntimeError: CUDA out\x00 of memory", None),
    ("only the tail is read", IB + "\n" + "ok\n" * 40_000, None),
    ("the tail is read", "ok\n" * 40_000 + IB + "\n", "nccl-ib-completion-error"),
]


@pytest.mark.parametrize(("text", "want"), [m[1:] for m in MATCHER], ids=[m[0] for m in MATCHER])
def test_the_matcher(text: str, want: str | None) -> None:
    got = diagnose(text)
    assert (got.finding.signature if got.finding else None) == want


def test_of_equal_priority_the_earliest_line_wins() -> None:
    first = "RuntimeError: CUDA error: out of memory (rank 3)"
    got = diagnose(f"{first}\nsomething\n{OOM}\n")
    assert got.finding is not None and got.finding.line == first


def test_the_line_shown_is_printable_and_cut() -> None:
    got = diagnose(OOM + "\x1b[31m" + "z" * 900)
    assert got.finding is not None
    assert got.finding.line.startswith("torch.cuda.OutOfMemoryError")
    assert len(got.finding.line) <= diagnosis.SHOWN_MAX and got.finding.line.isprintable()


def test_the_time_budget_stops_matching_and_says_so() -> None:
    ticks = iter(range(10_000))
    got = diagnose("ok\n" * 1000 + IB, budget_s=5, clock=lambda: float(next(ticks)))
    assert got.exhausted and got.finding is None and got.lines < 1000


def test_hostile_output_costs_little_on_the_builtins() -> None:
    """Lines made of the needles themselves: every signature runs its expression on
    every line. 64 KiB of it must still be quick (a coarse bound: no timing claims)."""
    hostile = "\n".join(("Xid (Got completionOutOfMemoryError" * 40)[:LINE_MAX] for _ in range(64))
    t0 = time.perf_counter()
    got = diagnose(hostile)
    assert time.perf_counter() - t0 < 2.0 and not got.exhausted


# -- operators' rules ---------------------------------------------------------------------------

GOOD = """
[[signature]]
id = "nccl-socket-timeout"
pattern = 'NCCL WARN .*socket timed out'
diagnosis = "an NCCL socket connection timed out"
hint = "check the node's Ethernet link"
blame = "node"
priority = 60
"""


def test_a_rules_file_adds_a_signature_that_then_matches() -> None:
    rules = parse_rules(GOOD)
    assert rules.skipped == () and [s.id for s in rules.signatures] == ["nccl-socket-timeout"]
    got = diagnose("a:1 [0] NCCL WARN Call to connect socket timed out\n", table(rules.signatures))
    assert got.finding is not None and got.finding.signature == "nccl-socket-timeout"
    assert got.finding.blame == "node" and got.finding.priority == 60


def test_an_operators_signature_replaces_the_builtin_of_its_id() -> None:
    rules = parse_rules(
        '[[signature]]\nid = "cuda-oom"\npattern = "CUDA out of memory"\ndiagnosis = "ours"\npriority = 99\n'
    )
    merged = table(rules.signatures)
    assert [s.diagnosis for s in merged if s.id == "cuda-oom"] == ["ours"]
    assert len(merged) == len(BUILTIN) and merged[0].id == "cuda-oom"


def _entry(**fields: object) -> str:
    body = {"id": "x", "pattern": "abc def", "diagnosis": "d", **fields}
    return "[[signature]]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in body.items())


def _toml(v: object) -> str:
    return str(v).lower() if isinstance(v, bool) else (str(v) if isinstance(v, int) else repr(str(v)))


BAD_ENTRIES = [
    ("nested repeat", _entry(pattern="(a+)+b"), "a repeat inside a repeat"),
    ("alternatives in a repeat", _entry(pattern="(?:ab|a)*c"), "alternatives inside a repeat"),
    ("back reference", BACKREF, "a back reference"),
    ("three wide repeats", _entry(pattern="abc.*d.*e.*f"), "3 wide repeats"),
    ("no needle", _entry(pattern=".*a.*b"), "no literal of 3 characters"),
    ("does not compile", _entry(pattern="abc(def"), "does not compile"),
    ("too long", _entry(pattern="a" * 300), "1 to 256 characters"),
    ("bad id", _entry(id="Bad Id!"), "id 'Bad Id!'"),
    ("bad blame", _entry(blame="gpu"), "blame must be one of"),
    ("bad priority", _entry(priority=500), "priority must be an integer"),
    ("priority is a bool", _entry(priority=True), "priority must be an integer"),
    ("unknown key", _entry(severity="high"), "unknown key(s) severity"),
    ("missing pattern", '[[signature]]\nid = "x"\ndiagnosis = "d"\n', "missing pattern"),
]


@pytest.mark.parametrize(("text", "why"), [b[1:] for b in BAD_ENTRIES], ids=[b[0] for b in BAD_ENTRIES])
def test_a_bad_entry_is_skipped_and_said_why(text: str, why: str) -> None:
    rules = parse_rules(GOOD + text)
    assert [s.id for s in rules.signatures] == ["nccl-socket-timeout"]  # the good one stays
    assert len(rules.skipped) == 1 and why in rules.skipped[0], rules.skipped


def test_a_slow_pattern_is_refused_by_its_probe() -> None:
    ticks = iter([0.0, 1.0] * 50)  # every probe "takes" a second
    got = diagnosis.compile_signature(id="x", pattern="abc.*d", diagnosis="d", clock=lambda: next(ticks))
    assert isinstance(got, str) and "too slow" in got


def test_duplicate_ids_and_too_many_entries_are_counted() -> None:
    twice = parse_rules(_entry(id="s1") + _entry(id="s1"))
    assert len(twice.signatures) == 1 and "given twice" in twice.skipped[0]
    many = parse_rules("".join(_entry(id=f"s{i}") for i in range(diagnosis.RULES_MAX_ENTRIES + 2)))
    assert len(many.signatures) == diagnosis.RULES_MAX_ENTRIES
    assert len(many.skipped) == 2 and "more than" in many.skipped[0]


def test_an_entry_that_is_no_table_is_skipped() -> None:
    rules = parse_rules("signature = [1, 'x']\n")
    assert rules.signatures == () and [s.split(": ")[-1] for s in rules.skipped] == ["not a table"] * 2


@pytest.mark.parametrize(
    ("content", "why"),
    [(b"[[signature]\nid=", "not TOML"), (b"signature = 3\n", "array of tables"), (b"\xff\xfe", "not UTF-8")],
    ids=["syntax", "shape", "encoding"],
)
def test_a_file_that_cannot_be_read_is_one_error(tmp_path: Path, content: bytes, why: str) -> None:
    f = tmp_path / "rules.toml"
    f.write_bytes(content)
    with pytest.raises(RulesError, match=why):
        diagnosis.load_rules(f)
    with pytest.raises(RulesError, match="cannot read"):
        diagnosis.load_rules(tmp_path / "missing.toml")


def test_needles_are_what_every_match_contains() -> None:
    assert diagnosis.needles_of(r"NCCL WARN .*socket timed out") == ("socket timed out",)
    assert diagnosis.needles_of(r"foo bar|baz qux") == ("foo bar", "baz qux")
    assert diagnosis.needles_of(r"(?:abc)+") == ()
    assert diagnosis.needles_of(r".*a.*b") == ()


def test_a_case_insensitive_rule_matches_any_case() -> None:
    sig = diagnosis.compile_signature(id="x", pattern="(?i)nccl warn.*boom", diagnosis="d")
    assert isinstance(sig, Signature)
    got = diagnose("NCCL WARN it went BOOM\n", [sig])
    assert got.finding is not None and got.finding.signature == "x"


# -- the suspicion rule -----------------------------------------------------------------------------

DAY = 86_400.0


def ev(job: int, user: int, at: float) -> Evidence:
    return Evidence(job_id=job, user_id=user, at=at)


SUSPICION = [
    ("no evidence", [], SuspicionRule(), (0, False)),
    ("one user's many jobs", [ev(i, 7, 100.0 + i) for i in range(10)], SuspicionRule(), (1, False)),
    ("two users", [ev(1, 1, 100.0), ev(2, 2, 200.0)], SuspicionRule(), (2, False)),
    ("three users", [ev(1, 1, 100.0), ev(2, 2, 200.0), ev(3, 3, 300.0)], SuspicionRule(), (3, True)),
    (
        "one of three outside the window",
        [ev(1, 1, 0.0), ev(2, 2, DAY), ev(3, 3, DAY + 5)],
        SuspicionRule(),
        (2, False),
    ),
    ("users 0 never cordons", [ev(i, i, 100.0) for i in range(9)], SuspicionRule(users=0), (9, False)),
    ("a lower threshold", [ev(1, 1, 100.0), ev(2, 2, 200.0)], SuspicionRule(users=2), (2, True)),
]


@pytest.mark.parametrize(
    ("evidence", "rule", "want"), [s[1:] for s in SUSPICION], ids=[s[0] for s in SUSPICION]
)
def test_the_suspicion_rule(evidence: list[Evidence], rule: SuspicionRule, want: tuple[int, bool]) -> None:
    got = judge(evidence, rule, now=DAY + 10)
    assert (got.users, got.cordon) == want
    assert list(got.jobs) == sorted(got.jobs, key=lambda j: next(e.at for e in evidence if e.job_id == j))
