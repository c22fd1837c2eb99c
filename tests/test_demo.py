"""``gpufleet demo`` end to end: 50 agents (real HTTP clients) come up Ready with 400
GPUs within 30 s, a job submitted with the CLI runs as a real process and its log is
readable, a MIG layout asked with ``node mig --wait`` on node-007 (in MIG mode) is in
effect when the command returns and a job runs on its slice, the inference service
answers through the embedded gateway, and Ctrl-C
(SIGINT) stops everything with exit 0 and no process left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from server.conftest import free_port, gpufleet

TOKEN = "gf_demo_test_admin"


def test_demo_fleet_runs_jobs_and_stops_cleanly(tmp_path: Path) -> None:
    port, gw_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "GPUFLEET_ADMIN_TOKEN": TOKEN}
    started = time.monotonic()
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "gpufleet", "demo", "--port", str(port), "--gateway-port", str(gw_port)),
            *("--data-dir", str(tmp_path / "demo")),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    family: set[int] = set()
    try:
        nodes: list[dict[str, object]] = []
        with httpx.Client(
            base_url=url + "/v1", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
        ) as c:
            while time.monotonic() - started < 30:
                try:
                    nodes = c.get("/nodes", params={"limit": 1000}).json()["items"]
                except (httpx.HTTPError, ValueError, KeyError):
                    nodes = []
                if len(nodes) == 50 and all(n["state"] == "Ready" for n in nodes):
                    break
                assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
                time.sleep(0.5)
            assert len(nodes) == 50 and {n["state"] for n in nodes} == {"Ready"}
            assert sum(int(n["gpus_total"]) for n in nodes) == 400  # type: ignore[call-overload]
            assert len({n["leaf"] for n in nodes}) == 5
            family = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}

            cli = {"GPUFLEET_URL": url, "GPUFLEET_TOKEN": TOKEN}
            sub = gpufleet("submit", "--", "sh", "-c", "echo hi from $GPUFLEET_JOB_ID", env=cli)
            assert sub.returncode == 0, sub.stderr
            jid = int(sub.stdout.strip())
            deadline = time.monotonic() + 20
            while (state := c.get(f"/jobs/{jid}").json()["state"]) != "COMPLETED":
                assert state in ("PENDING", "SCHEDULED", "RUNNING") and time.monotonic() < deadline, state
                time.sleep(0.2)
            logs = gpufleet("logs", str(jid), env=cli)
            assert logs.returncode == 0 and logs.stdout == f"hi from {jid}\n", logs.stderr
            assert c.get("/fleet/summary").json()["jobs"].get("COMPLETED", 0) >= 1

            # MIG as the README shows it: node-007's GPUs are in MIG mode; a layout asked
            # with --wait is in effect when the command returns, and a job runs on its slice
            # (4g.40gb: a profile only this new layout has)
            mig = gpufleet(
                *("node", "mig", "node-007", "--gpu", "4", "--layout", "4g.40gb,3g.40gb"),
                *("--wait", "--timeout", "60s"),
                env=cli,
            )
            assert mig.returncode == 0 and "in effect mig=[4g.40gb,3g.40gb]" in mig.stdout, mig
            sub = gpufleet(
                "submit", "--mig", "4g.40gb", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES", env=cli
            )
            assert sub.returncode == 0, sub.stderr
            jid = int(sub.stdout.strip())
            deadline = time.monotonic() + 30
            while (job := c.get(f"/jobs/{jid}").json())["state"] != "COMPLETED":
                assert job["state"] in ("PENDING", "SCHEDULED", "RUNNING") and time.monotonic() < deadline, (
                    job
                )
                time.sleep(0.2)
            gpu4 = c.get("/nodes/node-007").json()["gpus"][4]
            slices = {m["uuid"] for m in gpu4["mig_instances"] if m["profile"] == "4g.40gb"}
            assert gpufleet("logs", str(jid), env=cli).stdout.strip() in slices  # node-007's new slice

            # the inference service, through the demo's gateway, with a token of its own
            svc_token = c.post("/services/mlp/tokens").json()["token"]
            infer = f"http://127.0.0.1:{gw_port}/s/mlp/v2/models/mlp/infer"
            body = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]}
            deadline = time.monotonic() + 60
            while True:
                try:
                    r = httpx.post(infer, json=body, headers={"Authorization": f"Bearer {svc_token}"})
                except httpx.HTTPError:
                    r = None
                if r is not None and r.status_code == 200:
                    break
                assert time.monotonic() < deadline, None if r is None else r.text
                time.sleep(0.5)
            assert r.json()["outputs"][0]["shape"] == [1, 4]
            for name in ("date", "server"):  # the replica's, passed on once (not a second of its own)
                assert len(r.headers.get_list(name)) <= 1, r.headers
            family = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}  # now with replicas
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0, out.decode()
    assert b"admin    " + TOKEN.encode() in out and f"{url}/docs".encode() in out
    assert f"http://127.0.0.1:{gw_port}/s/mlp/v2/models/mlp/infer".encode() in out
    assert family and not [
        p for p in family if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
    ]


def test_demo_agents_have_a_driver_upgrade_hook_that_passes_the_agents_checks(tmp_path: Path) -> None:
    """``gpufleet upgrade start --command driver`` works on the demo: its agents get the hook
    ``driver``, a script the agent's own hook checks accept, that runs without a shell."""
    from gpufleet.agent.upgrade import check_hook
    from gpufleet.demo import demo_upgrade_hooks

    work = tmp_path / "agents"
    tmp_path.chmod(0o755)
    hooks = demo_upgrade_hooks(work)
    assert set(hooks) == {"driver"}
    check_hook(hooks["driver"])  # raises if the agent would refuse it
    done = subprocess.run([str(hooks["driver"]), "560.35.03"], capture_output=True, text=True, timeout=10)
    assert done.returncode == 0 and "560.35.03" in done.stdout
    work.chmod(0o777)  # a directory others may change: refused, and the demo goes on without
    assert demo_upgrade_hooks(work) == {}
