"""The chaos test (seeded, bounded): real server and agent processes, a few hundred
short real jobs, SIGKILL of the server several times, SIGKILL / crash / SIGSTOP of
agents. Checked from the jobs' own start/end lines: lost = 0, duplicates = 0."""

from __future__ import annotations

from pathlib import Path

from failover.chaos import ChaosConfig, run_chaos


def test_chaos_loses_nothing_and_runs_nothing_twice(tmp_path: Path) -> None:
    summary = run_chaos(ChaosConfig(seed=7), tmp_path)
    print(summary.line())
    assert summary.problems == []
    assert summary.lost == 0 and summary.duplicates == 0 and summary.gpu_conflicts == 0
    assert summary.completed == summary.jobs == 200
    assert summary.server_kills >= 3
    # No bound on wall time here (it follows the machine's load: 65 s quiet, 136 s with
    # benchmarks beside it); each phase has its own timeout (settle_timeout_s).
