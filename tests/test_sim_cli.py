"""``gpufleet trace synth`` and ``gpufleet simulate`` as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

METRICS = {
    "avg_jct_s",
    "p50_jct_s",
    "p99_jct_s",
    "avg_queue_s",
    "p99_queue_s",
    "makespan_s",
    "utilization",
    "fragmentation",
    "preemptions",
    "sim_wall_s",
}


def gpufleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufleet", *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_synth_then_simulate_writes_json_and_report(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    made = gpufleet("trace", "synth", "--jobs", "300", "--seed", "5", "--out", str(trace), "--nodes", "4")
    assert made.returncode == 0, made.stderr
    assert "wrote 300 jobs" in made.stdout
    assert trace.read_text().splitlines()[0] == (
        "job_id,user,team,submit_s,duration_s,gpus,gpus_per_node,time_limit_s,priority,gpu_type"
    )

    out = tmp_path / "summary.json"
    report = tmp_path / "report"
    ran = gpufleet(
        "simulate", "--trace", str(trace), "--format", "gpufleet", "--nodes", "4", "--policy", "fifo,default",
        "--json", str(out), "--report", str(report), "--seed", "1",
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    summary = json.loads(out.read_text())
    assert summary["jobs"] == 300
    assert summary["fleet"]["gpus"] == 32
    assert set(summary["bounds"]) == {"avg_jct_lower_s", "utilization_upper"}
    assert set(summary["policies"]) == {"fifo", "default"}
    for metrics in summary["policies"].values():
        assert set(metrics) == METRICS
        assert metrics["avg_jct_s"] >= summary["bounds"]["avg_jct_lower_s"]
    assert {p.name for p in report.iterdir()} == {"report.md", "jct_cdf.png", "utilization.png", "queue.png"}
    assert "| default |" in (report / "report.md").read_text()
    for png in report.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_max_jobs_on_the_bundled_sample(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    ran = gpufleet("simulate", "--sample", "--max-jobs", "200", "--policy", "backfill", "--json", str(out))
    assert ran.returncode == 0, ran.stderr
    summary = json.loads(out.read_text())
    assert summary["jobs"] == 200
    assert summary["config"]["predict"] is True  # as the server does, unless --no-predict
    off = gpufleet(
        "simulate",
        "--sample",
        "--max-jobs",
        "200",
        "--policy",
        "backfill",
        "--no-predict",
        "--json",
        str(out),
    )
    assert off.returncode == 0, off.stderr
    assert json.loads(out.read_text())["config"]["predict"] is False


def test_bad_inputs_are_one_line_errors(tmp_path: Path) -> None:
    missing = gpufleet("simulate", "--trace", str(tmp_path / "nope.csv"))
    assert missing.returncode == 2
    assert "nope.csv" in missing.stderr and "Traceback" not in missing.stderr
    bad_policy = gpufleet("simulate", "--sample", "--policy", "magic")
    assert bad_policy.returncode == 2 and "unknown policy" in bad_policy.stderr
    bad_format = gpufleet("simulate", "--format", "xml", "--trace", "x")
    assert bad_format.returncode == 2 and "unknown format" in bad_format.stderr
    both = gpufleet("simulate", "--sample", "--trace", "x")
    assert both.returncode == 2 and "either --trace FILE or --sample" in both.stderr


def test_simulate_prints_lost_work_estimates_and_the_trace_facts(tmp_path: Path) -> None:
    """A trace without limits: sjf's note, the peak weekly load, the lost-work table (on at
    30 min by default, off with --checkpoint-every 0) and the estimated-start errors, in
    the output, the JSON and report.md; a bad interval is a one-line usage error."""
    trace = tmp_path / "t.csv"
    rows = ["job_id,user,team,submit_s,duration_s,gpus,gpus_per_node,time_limit_s,priority,gpu_type"]
    rows += [f"{i},u,t,{i * 900},{7200 + 600 * (i % 5)},{4 if i % 3 else 8},0,,{i % 2}," for i in range(300)]
    trace.write_text("\n".join(rows) + "\n")
    out, report = tmp_path / "s.json", tmp_path / "r"
    args = ("simulate", "--trace", str(trace), "--nodes", "2", "--policy", "sjf,default")
    on = gpufleet(*args, "--json", str(out), "--report", str(report))
    assert on.returncode == 0, on.stderr
    assert "sjf (shortest limit first) counts every job as 4h00m" in on.stdout
    assert "FIFO with skipping" in on.stdout and "peak weekly offered load" in on.stdout
    assert "Lost work (checkpoint every 30m00s" in on.stdout and "est. error p50" in on.stdout
    summary = json.loads(out.read_text())
    assert summary["config"]["checkpoint_interval_s"] == 1800
    assert summary["costs"]["default"]["lost_gpu_h_preemption"] > 0
    assert summary["estimates"]["sjf"]["estimated_jobs"] > 0
    assert summary["trace"]["peak_weekly_load"] == max(summary["trace"]["weekly_loads"])
    md = (report / "report.md").read_text()
    assert "FIFO with skipping" in md and "| GPU-h lost |" in md
    off = gpufleet(*args, "--checkpoint-every", "0", "--no-estimates", "--json", str(out))
    assert off.returncode == 0, off.stderr
    assert "Lost work: off" in off.stdout
    summary = json.loads(out.read_text())
    assert summary["costs"]["default"]["lost_gpu_h_preemption"] == 0
    assert summary["estimates"] == {"sjf": None, "default": None}
    bad = gpufleet(*args, "--checkpoint-every", "soon")
    assert bad.returncode == 2 and "--checkpoint-every" in bad.stderr and "Traceback" not in bad.stderr


def test_simulate_foresee_preemptions_reaches_default(tmp_path: Path) -> None:
    """``--foresee-preemptions``: a short job behind a day-long one on the only node is
    estimated to start when it may preempt it (600 s, default's ``min_run_s``), as it
    does, not at the day-long job's limit (the estimate without the flag)."""
    trace = tmp_path / "t.csv"
    trace.write_text(
        "job_id,user,team,submit_s,duration_s,gpus,gpus_per_node,time_limit_s,priority,gpu_type\n"
        "0,u,t,0,20000,8,0,86400,0,\n1,u,t,50,60,8,0,60,0,\n"
    )
    err = []
    for extra in ((), ("--foresee-preemptions",)):
        out = tmp_path / f"s{len(extra)}.json"
        args = ("simulate", "--trace", str(trace), "--nodes", "1", "--policy", "default", *extra)
        ran = gpufleet(*args, "--json", str(out))
        assert ran.returncode == 0, ran.stderr
        est = json.loads(out.read_text())["estimates"]["default"]
        assert est["estimated_jobs"] == 1
        err.append(est["median_abs_error_s"])
    assert err[0] > 80_000 and err[1] < 120
