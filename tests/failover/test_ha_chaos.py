"""Issue 19's chaos test, sized for CI: three servers on one PostgreSQL (a database of its
own; skipped without GPUFLEET_TEST_DATABASE_URL), six ``gpufleet agent --simulate-gpus``
processes given all three URLs, 90 short real jobs submitted round-robin through the
servers while the faults run: SIGKILL the leader (restarted 2 s later), then SIGSTOP the
next leader and its scheduling child, and SIGCONT them.

The pause is 10 s, not the issue's 40 s (CI time). That is still five times
``--leader-ttl`` (2 s) and twice PostgreSQL's ``idle_in_transaction_session_timeout`` for
fenced writes (5 s, ``leader.IDLE_IN_TXN``): the lease expires and another server takes
over while the leader is stopped, even when it stopped inside a fenced write (the database
then ends that write, and the takeover waits for it), and the stopped server wakes long
after the new term began, with whatever it had computed before. What 40 s adds is on the
agents' side: those whose server is stopped wait out their sync's read timeout (30 s)
before they move to another server.
The issue's own scenario (``chaos.issue_scenario``) is the last part of ``bench/bench_ha.py``;
alone: ``bench/bench_ha.py --no-takeover --no-submits --no-agents``.

Checked from the jobs' own start/end lines and the database's rows: every job that got a
201 exists and completed, none ran twice at once, no GPU held two jobs at once, and no job
event of a stale epoch landed (``chaos.check_epochs``).
"""

from __future__ import annotations

from pathlib import Path

from failover.chaos import ChaosConfig, run_chaos
from server.conftest import scratch_postgres


def test_three_servers_lose_a_leader_and_pause_the_next(tmp_path: Path) -> None:
    with scratch_postgres("hachaos") as url:  # skips without GPUFLEET_TEST_DATABASE_URL
        cfg = ChaosConfig(
            seed=19,
            jobs=90,
            agents=6,
            plan=("leader-kill", "leader-pause"),
            in_order=True,
            gap_s=(3.0, 3.0),
            node_timeout_s=10.0,  # lost window 40 s: longer than any agent's stall (chaos.issue_scenario)
            requeue_after_s=30.0,
            servers=3,
            database_url=url,
            leader_pause_s=10.0,
            storm_s=18.0,
        )
        summary = run_chaos(cfg, tmp_path)
    print(summary.line())
    assert summary.problems == []
    assert summary.leader_kills == 1 and summary.leader_pauses == 1
    assert summary.terms >= 3  # the first leader, the one after the kill, the one during the pause
    assert summary.lost == 0 and summary.duplicates == 0 and summary.gpu_conflicts == 0
    assert summary.stale_writes == 0 and summary.not_exactly_once == 0
    assert summary.completed == summary.jobs == cfg.jobs - summary.unanswered
    assert summary.jobs >= cfg.jobs * 0.8  # the storm went through while servers died and stopped
    # No bound on wall time (it follows the machine's load); each phase has its own timeout.
