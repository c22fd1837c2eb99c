"""Issue 29, finding 1, end to end: ``#SBATCH --export=ALL,LD_PRELOAD=...`` through
``gpufleet submit`` to a real server and a real root agent. The preload library (built
here with the C compiler) writes the uid of every process that loads it: only the
job's account may appear, never root (before the fix the root wrapper loaded it)."""

from __future__ import annotations

import pwd
from pathlib import Path

import pytest

from agent.test_root_env import CC, preload
from jobaccounts import JOB_ACCOUNT, ROOT
from server.conftest import Server, gpufleet, make_team, wait_for
from server.test_hardening_node_logs import Node, log_of

pytestmark = pytest.mark.skipif(CC is None or not ROOT, reason="needs a C compiler and root")


def test_sbatch_export_of_ld_preload_never_runs_as_root(server: Server, tmp_path: Path) -> None:
    lib, mark = preload(tmp_path)
    (tmp_path / "node").mkdir()
    node = Node(server, tmp_path / "node", gpus=1)
    try:
        work = tmp_path / "work"
        work.mkdir()
        work.chmod(0o777)  # the job writes slurm-%j.out here (one it cannot open fails the job)
        script = work / "job.sh"
        script.write_text(
            "#!/bin/sh\n"
            f"#SBATCH --export=ALL,LD_PRELOAD={lib},PRELOAD_MARK={mark}\n"
            f"#SBATCH -p {node.pool}\n"
            'echo "seen=$LD_PRELOAD"\n'
        )
        team = make_team(server)
        sub = gpufleet("submit", "--parsable", "--team", team, "-D", str(work), str(script), env=server.env())
        assert sub.returncode == 0, sub.stderr
        job = int(sub.stdout.strip())
        wait_for(server, job, "COMPLETED", timeout=30)
        assert f"seen={lib}" in log_of(server, job, follow=True)
        uids = {int(u) for u in mark.read_text().split()}
        assert 0 not in uids and pwd.getpwnam(JOB_ACCOUNT).pw_uid in uids
    finally:
        node.close()
