"""Slurm job steps end to end (issue 31): a real server, two agents on simulated GPUs in
this process running real job processes as the job account, and the real ``srun`` the
agent puts on every job's PATH. The batch script runs once, on the first node; ``srun``
fans tasks out over both nodes with Slurm's variables, labels, exit codes, cancel, and
the steps are recorded (``JOB.0``) and shown by ``gpufleet history``.

SQLite only: the step rules are in one service (``server/services/steps.py``) whose
statements are plain; these tests are about processes on nodes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from failover.conftest import FAST
from jobaccounts import passable
from server.conftest import (
    ADMIN_TOKEN,
    Server,
    make_pool,
    make_team,
    make_user,
    ok,
    start_server,
    stop_server,
    wait_for,
)
from services.simnodes import sim_node


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(f"sqlite:///{tmp_path_factory.mktemp('steps') / 'g.db'}", extra=FAST)
    yield s
    stop_server(s)


@pytest.fixture(scope="module")
def pool(srv: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A pool of two nodes with two simulated GPUs each, their agents running."""
    work = tmp_path_factory.mktemp("stepnodes")
    passable(work)
    name = make_pool(srv)
    nodes = [sim_node(srv, work, pool=name, gpus=2, grace_s=2.0) for _ in range(2)]
    yield name
    for n in nodes:
        n.close()


def run_job(srv: Server, pool: str, script: str, *, token: str = ADMIN_TOKEN, **spec: Any) -> dict[str, Any]:
    with srv.client(token) as c:
        job = ok(
            c.post(
                "/jobs", json={"command": ["bash", "-c", script], "nodes": 2, "gpus": 4, "pool": pool, **spec}
            ),
            201,
        )
    return dict(job)


def ended(srv: Server, job_id: int, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    with srv.client() as c:
        while True:
            job = ok(c.get(f"/jobs/{job_id}"))
            if job["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
                return dict(job)
            assert time.monotonic() < deadline, job
            time.sleep(0.1)


def log_of(srv: Server, job_id: int) -> str:
    deadline = time.monotonic() + 10
    with srv.client() as c:
        while True:
            text = c.get(f"/jobs/{job_id}/logs").text
            if "script-end" in text or time.monotonic() > deadline:
                return text
            time.sleep(0.1)


def steps_of(srv: Server, job_id: int) -> list[dict[str, Any]]:
    with srv.client() as c:
        return list(ok(c.get(f"/jobs/{job_id}/steps"))["steps"])


def test_script_runs_once_and_srun_fans_out_tasks_with_slurm_variables(srv: Server, pool: str) -> None:
    script = (
        "echo batch-on-$SLURMD_NODENAME; "
        "srun -l -N2 --ntasks-per-node=2 bash -c "
        "'echo P=$SLURM_PROCID L=$SLURM_LOCALID N=$SLURM_NODEID S=$SLURM_STEP_ID T=$SLURM_NTASKS "
        "H=$SLURMD_NODENAME'; "
        "echo rc=$?; srun hostname >/dev/null; echo script-end"
    )
    job = ended(srv, run_job(srv, pool, script)["id"])
    assert job["state"] == "COMPLETED", job
    text = log_of(srv, job["id"])
    assert text.count("batch-on-") == 1, text
    tasks = sorted(line for line in text.splitlines() if "P=" in line)
    assert len(tasks) == 4, text
    seen = {}
    for line in tasks:
        label, rest = line.split(": ", 1)
        fields = dict(kv.split("=") for kv in rest.split())
        assert fields["P"] == label.strip()
        assert fields["S"] == "0" and fields["T"] == "4"
        seen[int(fields["P"])] = (int(fields["L"]), int(fields["N"]), fields["H"])
    assert [seen[p][:2] for p in range(4)] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert seen[0][2] == seen[1][2] != seen[2][2] == seen[3][2]
    assert "rc=0" in text
    steps = steps_of(srv, job["id"])
    assert [(s["id"], s["state"], s["ntasks"]) for s in steps] == [
        (f"{job['id']}.0", "COMPLETED", 4),
        (f"{job['id']}.1", "COMPLETED", 2),
    ]
    history = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufleet",
            "history",
            "-j",
            str(job["id"]),
            "-P",
            "-o",
            "JobID,State,ExitCode",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **srv.env()},
        check=True,
    ).stdout.splitlines()
    jid = job["id"]
    assert history[1:] == [f"{jid}|COMPLETED|0:0", f"{jid}.0|COMPLETED|0:0", f"{jid}.1|COMPLETED|0:0"], (
        history
    )


def test_exit_code_is_the_worst_tasks_and_kill_on_bad_exit_stops_the_rest(srv: Server, pool: str) -> None:
    script = (
        "srun -N2 bash -c 'exit $((SLURM_PROCID * 3))'; echo worst=$?; "
        "srun -K -N2 bash -c 'if [ $SLURM_PROCID = 1 ]; then exit 5; fi; sleep 60'; echo killed=$?; "
        "echo script-end"
    )
    t0 = time.monotonic()
    job = ended(srv, run_job(srv, pool, script)["id"])
    assert time.monotonic() - t0 < 30
    text = log_of(srv, job["id"])
    assert "worst=3" in text and "killed=5" in text, text
    assert "task 1: Exited with exit code 3" in text
    steps = steps_of(srv, job["id"])
    assert [(s["state"], s["exit_code"]) for s in steps] == [("FAILED", 3), ("FAILED", 5)]


def test_cancel_of_the_job_ends_the_steps_tasks_on_every_node(srv: Server, pool: str, tmp_path: Path) -> None:
    job = run_job(srv, pool, "srun -N2 bash -c 'echo up-$SLURM_PROCID; sleep 300'; echo script-end")
    job_id = job["id"]
    wait_for(srv, job_id, "RUNNING", timeout=30)
    deadline = time.monotonic() + 15
    while True:
        steps = steps_of(srv, job_id)
        if steps and all(t for t in steps):
            with srv.client() as c:
                step = ok(c.get(f"/jobs/{job_id}/steps/0", params={"after": 0}))
            if sum("up-" in o["data"] for o in step["output"]) == 2:
                break
        assert time.monotonic() < deadline, steps
        time.sleep(0.1)
    with srv.client() as c:
        ok(c.post(f"/jobs/{job_id}/cancel"))
    deadline = time.monotonic() + 15
    while _sleepers(job_id):
        assert time.monotonic() < deadline, "step tasks outlived their job"
        time.sleep(0.1)
    assert steps_of(srv, job_id)[0]["state"] == "CANCELLED"


def _sleepers(job_id: int) -> list[str]:
    """Processes of this job's step tasks still alive (by their environment mark)."""
    out = subprocess.run(["pgrep", "-f", "^sleep 300$"], capture_output=True, text=True).stdout.split()
    found = []
    for pid in out:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"SLURM_JOB_ID={job_id}".encode() in env:
            found.append(pid)
    return found


def test_job_credential_works_only_while_the_job_runs_and_only_as_its_owner(srv: Server, pool: str) -> None:
    owner = make_user(srv, team=make_team(srv))
    with srv.client() as c:  # someone else's job (the admin's), waiting in a pool of no nodes
        theirs = ok(c.post("/jobs", json={"command": ["true"], "pool": make_pool(srv)}), 201)["id"]
    probe = 'curl -s -o /dev/null -w "%{http_code}" -H "Authorization: Bearer $GPUFLEET_TOKEN"'
    script = (
        f'echo own=$({probe} "$GPUFLEET_URL/v1/jobs/$SLURM_JOB_ID"); '
        f'echo theirs=$({probe} "$GPUFLEET_URL/v1/jobs/{theirs}"); '
        f'echo nodecred=$({probe} -X POST "$GPUFLEET_URL/v1/nodes/x/sync" -d "{{}}"); '
        f'echo mint=$({probe} -X POST "$GPUFLEET_URL/v1/tokens" -H "Content-Type: application/json" '
        """-d '{"name": "keep"}'); """
        f'echo session=$({probe} -X POST "$GPUFLEET_URL/v1/sessions"); '
        'echo on-cmdline=$(grep -lF -f <(printf %s "$GPUFLEET_TOKEN") /proc/[0-9]*/cmdline 2>/dev/null '
        "| wc -l); "
        'echo "token=$GPUFLEET_TOKEN"; echo script-end'
    )
    job = ended(srv, run_job(srv, pool, script, token=owner)["id"])
    text = log_of(srv, job["id"])
    assert job["state"] == "COMPLETED", text
    lines = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    assert lines["own"] == "200" and lines["theirs"] == "404", text
    assert lines["nodecred"] in ("401", "403"), text  # a job's credential never speaks for a node
    assert lines["mint"] == "403" and lines["session"] == "403", text  # nothing outlives the job
    assert lines["on-cmdline"] == "0", text
    token = lines["token"]
    assert token.startswith("gfj."), "the job's own credential, not the node's"
    with srv.client(token) as c:  # its job is over: so is its credential
        gone = c.get(f"/jobs/{job['id']}")
    assert gone.status_code == 401 and "no longer valid" in gone.text


def test_srun_outside_an_allocation_says_so(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "GPUFLEET_URL": "http://127.0.0.1:9"}
    out = subprocess.run(
        [sys.executable, "-m", "gpufleet.slurm", "srun", "hostname"], capture_output=True, text=True, env=env
    )
    assert out.returncode == 1 and "no job allocation" in out.stderr


def test_torchrun_style_script_with_scontrol_and_exported_variables(srv: Server, pool: str) -> None:
    """The multi-node launcher pattern of real scripts: MASTER_ADDR from ``scontrol show
    hostnames``, exported, one task per node that sees it and its own node rank."""
    script = (
        "export MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1); "
        "export MASTER_PORT=29500; "
        "srun --ntasks-per-node=1 bash -c "
        "'echo M=$MASTER_ADDR:$MASTER_PORT R=$SLURM_NODEID W=$SLURM_NNODES H=$SLURMD_NODENAME'; "
        "echo first=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1); echo script-end"
    )
    job = ended(srv, run_job(srv, pool, script)["id"])
    text = log_of(srv, job["id"])
    assert job["state"] == "COMPLETED", text
    first = next(line.split("=", 1)[1] for line in text.splitlines() if line.startswith("first="))
    tasks = sorted(line for line in text.splitlines() if line.startswith("M="))
    assert len(tasks) == 2, text
    fields = [dict(kv.split("=", 1) for kv in line.split()) for line in tasks]
    assert {f["M"] for f in fields} == {f"{first}:29500"}
    assert sorted(f["R"] for f in fields) == ["0", "1"] and {f["W"] for f in fields} == {"2"}
    assert {f["H"] for f in fields if f["R"] == "0"} == {first}


def test_sigterm_to_srun_cancels_its_step(srv: Server, pool: str) -> None:
    script = (
        "srun -N2 bash -c 'echo up; sleep 300' & pid=$!; "
        # its own tasks run (another test's `sleep 300` on this machine must not count)
        "mine() { for p in $(pgrep -f '^sleep 300$'); do "
        'grep -qsaz "^SLURM_JOB_ID=$SLURM_JOB_ID$" /proc/$p/environ && return 0; done; return 1; }; '
        "until mine; do sleep 0.1; done; "
        "kill -TERM $pid; wait $pid; echo rc=$?; echo script-end"
    )
    t0 = time.monotonic()
    job = ended(srv, run_job(srv, pool, script)["id"])
    text = log_of(srv, job["id"])
    assert time.monotonic() - t0 < 40, text
    assert job["state"] == "COMPLETED", text
    rc = next(line for line in text.splitlines() if line.startswith("rc="))
    assert rc != "rc=0", text
    assert [s["state"] for s in steps_of(srv, job["id"])] == ["CANCELLED"]
    assert not _sleepers(job["id"])


def test_steps_refused_outside_a_running_job_and_on_others_jobs(srv: Server) -> None:
    owner = make_user(srv, team=make_team(srv))
    with srv.client() as c:
        waiting = ok(c.post("/jobs", json={"command": ["true"], "pool": make_pool(srv)}), 201)["id"]
        assert c.post(f"/jobs/{waiting}/steps", json={"command": ["true"]}).status_code == 409
        assert c.post(f"/jobs/{waiting}/steps", json={"command": []}).status_code == 422
        assert c.post(f"/jobs/{waiting}/steps", json={"command": ["x"], "ntasks": 0}).status_code == 422
        assert c.get(f"/jobs/{waiting}/steps/0").status_code == 404
        assert c.get(f"/jobs/{waiting}/steps/99999999999").status_code in (404, 422)
    with srv.client(owner) as c:  # the admin's job: not the owner's to see
        assert c.post(f"/jobs/{waiting}/steps", json={"command": ["true"]}).status_code == 404
        assert c.get(f"/jobs/{waiting}/steps").status_code == 404
        assert ok(c.get("/steps", params={"job": [waiting]}))["steps"] == []
    with srv.client("gfj.1.2.forged") as c:
        assert c.get(f"/jobs/{waiting}").status_code == 401


def test_steps_started_at_once_get_their_own_numbers(srv: Server, pool: str) -> None:
    script = "for i in 1 2 3 4; do srun -n1 bash -c 'echo one-$SLURM_STEP_ID' & done; wait; echo script-end"
    job = ended(srv, run_job(srv, pool, script)["id"])
    text = log_of(srv, job["id"])
    steps = steps_of(srv, job["id"])
    assert sorted(s["step"] for s in steps) == [0, 1, 2, 3], text
    assert {s["state"] for s in steps} == {"COMPLETED"}
    assert sorted(line for line in text.splitlines() if line.startswith("one-")) == [
        f"one-{i}" for i in range(4)
    ]


def test_gpufleet_run_still_runs_its_command_on_every_node(srv: Server, pool: str) -> None:
    """``gpufleet run`` is srun outside an allocation: a multi-node command runs on every
    node (a batch script, on the first only)."""
    out = subprocess.run(
        [sys.executable, "-m", "gpufleet", "run", "-N", "2", "-G", "4", "-p", pool, "--", "bash", "-c",
         "echo on-$SLURMD_NODENAME"],
        capture_output=True, text=True, env={**os.environ, **srv.env()}, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert len({line for line in out.stdout.splitlines() if line.startswith("on-")}) == 2, out.stdout


def test_log_retention_deletes_the_steps_output_with_the_jobs_log(srv: Server, pool: str) -> None:
    """``--log-days`` purges a step's stored output (what ``srun`` followed) with the job's
    own log; the job and its step records stay."""
    from sqlalchemy import func, select

    from gpufleet.server.services import logs
    from gpufleet.server.store.db import Database
    from gpufleet.server.store.models import JobStep, JobStepOutput

    job = ended(srv, run_job(srv, pool, "srun -N2 echo kept-for-a-while; echo script-end")["id"])
    with srv.client() as c:
        before = ok(c.get(f"/jobs/{job['id']}/steps/0", params={"after": 0}))
    assert sum("kept-for-a-while" in o["data"] for o in before["output"]) == 2, before
    db = Database.connect(srv.db_url)
    try:
        logs.purge(db, before=time.time() + 1)
        with db.read() as s:
            left = s.scalar(
                select(func.count())
                .select_from(JobStepOutput)
                .join(JobStep, JobStep.id == JobStepOutput.step_id)
                .where(JobStep.job_id == job["id"])
            )
    finally:
        db.dispose()
    assert left == 0
    with srv.client() as c:
        after = ok(c.get(f"/jobs/{job['id']}/steps/0", params={"after": 0}))
    assert after["output"] == [] and after["state"] == "COMPLETED", after


def test_a_jobs_credential_passes_while_its_address_is_throttled(
    srv: Server, pool: str, tmp_path: Path
) -> None:
    """Made-up tokens from loopback (where the jobs' srun calls from too) keep the address
    throttled (429) the whole time; the job's own credential is told by its signature
    and still gets through: its srun runs. Last in this module: it throttles loopback."""
    import threading
    import uuid

    import httpx

    passable(tmp_path)
    mark = tmp_path / "go"
    script = (
        f"until [ -e {mark} ]; do sleep 0.1; done; "
        "srun -N2 bash -c 'echo through-$SLURM_PROCID'; echo script-end"
    )
    job_id = run_job(srv, pool, script)["id"]
    wait_for(srv, job_id, "RUNNING", timeout=30)
    done = threading.Event()
    codes: list[int] = []

    def flood() -> None:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            while not done.is_set():
                bad = {"Authorization": f"Bearer gf_{uuid.uuid4().hex}"}
                codes.append(c.get("/v1/users/me", headers=bad).status_code)
                time.sleep(0.02)

    t = threading.Thread(target=flood)
    t.start()
    try:
        deadline = time.monotonic() + 20
        while 429 not in codes:
            assert time.monotonic() < deadline, codes[-5:]
            time.sleep(0.05)
        mark.touch()
        job = ended(srv, job_id, timeout=40)
    finally:
        done.set()
        t.join()
    text = log_of(srv, job_id)
    assert job["state"] == "COMPLETED", (job, text)
    assert "through-0" in text and "through-1" in text, text
    assert codes[-1] == 429, codes[-5:]
