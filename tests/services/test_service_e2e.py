"""An inference service end to end, every part a real process or a real client: the
server, five agents (in-process, simulated GPUs, real replica processes run as the job
account), ``gpufleet model-server`` replicas, a ``gpufleet gateway`` process, and clients
nobody here wrote (``tritonclient.http`` and ``openai``). Under a steady load: one
replica's node dies (its agent stops and its process is killed), then a rolling update
to a new model version; at the end the service is deleted.

SQLite only: the API tests (``tests/server/test_services_api.py``) cover both databases;
this one is about processes and traffic."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from failover.conftest import FAST
from gpufleet.modelserver.launch import model_server
from gpufleet.modelserver.model import MLP
from jobaccounts import ROOT, passable
from server.conftest import Server, free_port, make_team, ok, start_server, stop_server, unique
from services.simnodes import OPERATOR_ENV, gateway_up, sim_node, start_gateway

tritonclient_http = pytest.importorskip("tritonclient.http")
openai = pytest.importorskip("openai")

NAME = "echo-mlp"
CONCURRENCY = 4


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(
        f"sqlite:///{tmp_path_factory.mktemp('svc') / 'g.db'}", extra=(*FAST, "--service-drain", "2")
    )
    yield s
    stop_server(s)


class Load:
    """CONCURRENCY threads calling KServe v2 infer through the gateway, back to back;
    every outcome is counted per phase."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token
        self.phase = "warm"
        self.outcomes: dict[str, Counter[str]] = {}
        self.versions: list[str] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(CONCURRENCY)]

    def run(self) -> None:
        body = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]}
        with httpx.Client(headers={"Authorization": f"Bearer {self.token}"}, timeout=30) as c:
            while not self.stop.is_set():
                phase = self.phase
                try:
                    r = c.post(f"{self.url}/v2/models/mlp/infer", json=body)
                    what = str(r.status_code)
                    if r.status_code == 200:
                        self.versions.append(r.json()["model_version"])
                except httpx.HTTPError as exc:
                    what = type(exc).__name__
                self.outcomes.setdefault(phase, Counter())[what] += 1

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(35)

    def failed(self, phase: str) -> int:
        return sum(n for k, n in self.outcomes.get(phase, Counter()).items() if k != "200")


def _until(c: httpx.Client, check: Any, timeout: float, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        r = c.get(f"/services/{NAME}")
        out = r.json() if r.status_code == 200 else {"status": r.status_code}
        if check(out):
            return out  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {out}"
        time.sleep(0.1)


def _serving(out: dict[str, Any], gen: int, n: int = 3) -> bool:
    live = out.get("replicas", [])
    return sum(1 for r in live if r["ready"] and not r["draining"] and r["generation"] == gen) == n and all(
        r["generation"] == gen for r in live
    )


def test_service_through_the_gateway_survives_a_node_loss_and_a_rolling_update(
    srv: Server, tmp_path: Path
) -> None:
    passable(tmp_path)
    team = make_team(srv)
    pool = unique("spool")
    with srv.client() as c:
        ok(c.post("/pools", json={"name": pool}), 201)
    nodes = [sim_node(srv, tmp_path, pool=pool, leaf=f"leaf-{i % 2}") for i in range(5)]
    launch = model_server(as_other_account=ROOT, args=("--model", "mlp", "--seed", "3"))
    assert launch.runnable, launch.why
    gw_port = free_port()
    gateway: subprocess.Popen[bytes] | None = None
    try:
        with srv.client() as c:
            spec = {
                "name": NAME,
                "team": team,
                "pool": pool,
                "command": launch.command,
                "env": launch.env,
                "replicas": 3,
                "gpus_per_replica": 1,
                "protocol": "kserve-v2",
                "readiness_timeout": 60,
            }
            ok(c.put(f"/services/{NAME}", json=spec))
            out = _until(c, lambda o: _serving(o, 1), 60, "3 ready replicas")
            placed = [r["nodes"][0] for r in out["replicas"]]
            assert len(set(placed)) == 3, placed  # spread: one replica per node
            token = ok(c.post(f"/services/{NAME}/tokens"), 201)["token"]
        gateway = start_gateway(srv, gw_port, env=OPERATOR_ENV)
        base = f"http://127.0.0.1:{gw_port}/s/{NAME}"
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(httpx.HTTPError):
                r = httpx.get(f"{base}/v2/health/ready", headers={"Authorization": f"Bearer {token}"})
                if r.status_code == 200:
                    break
            assert gateway.poll() is None and time.monotonic() < deadline, "gateway did not route"
            time.sleep(0.1)
        assert httpx.get(f"{base}/v2/health/ready").status_code == 401  # no token
        assert (
            httpx.get(f"{base}/v2/health/ready", headers={"Authorization": "Bearer nope"}).status_code == 401
        )

        # Triton's own client (binary tensors) through the gateway: the replica's numbers
        triton = tritonclient_http.InferenceServerClient(url=f"127.0.0.1:{gw_port}/s/{NAME}")
        auth = {"Authorization": f"Bearer {token}"}
        assert triton.is_server_ready(headers=auth)
        x = np.random.default_rng(0).random((5, 16), dtype=np.float32)
        inp = tritonclient_http.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        res = triton.infer("mlp", [inp], headers=auth)
        np.testing.assert_allclose(res.as_numpy("OUTPUT0"), MLP.from_seed(3).forward(x), rtol=1e-5)
        triton.close()

        # the openai client, plain and streaming
        oai = openai.OpenAI(base_url=f"{base}/v1", api_key=token, max_retries=0)
        whole = oai.completions.create(model="mlp", prompt="hello fleet", max_tokens=8)
        parts = [ch.choices[0].text for ch in oai.completions.create(
            model="mlp", prompt="hello fleet", max_tokens=8, stream=True
        )]  # fmt: skip
        assert "".join(parts) == whole.choices[0].text and len(parts) > 1

        with Load(base, token) as load:
            time.sleep(1.0)
            # a node dies: its agent stops, its replica's process is killed
            load.phase = "node-loss"
            with srv.client() as c:
                victim_job = next(r for r in c.get(f"/services/{NAME}").json()["replicas"])
            dead = next(n for n in nodes if n.name == victim_job["nodes"][0])
            dead.pause()
            for job in dead.agent.running():
                if job.pid:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(job.pid, signal.SIGKILL)
            with srv.client() as c:
                out = _until(
                    c,
                    lambda o: (
                        _serving(o, 1) and dead.name not in {n for r in o["replicas"] for n in r["nodes"]}
                    ),
                    60,
                    "the lost replica replaced on another node",
                )
            # a rolling update under load: zero failed requests
            load.phase = "update"
            with srv.client() as c:
                ok(c.patch(f"/services/{NAME}", json={"model_version": "2"}))
                out = _until(c, lambda o: _serving(o, 2), 90, "3 ready replicas of generation 2")
            time.sleep(0.5)
            load.phase = "after"
            time.sleep(0.5)
        assert load.failed("warm") == 0, load.outcomes
        assert load.failed("node-loss") <= CONCURRENCY, load.outcomes  # the ones in flight on it
        assert load.failed("update") == 0, load.outcomes
        assert load.failed("after") == 0, load.outcomes
        assert sum(load.outcomes["update"].values()) > 20, load.outcomes
        assert load.versions[-1] == "2"
        assert "1" in load.versions

        with srv.client() as c:
            assert c.delete(f"/services/{NAME}").status_code == 202
            _until(c, lambda o: o.get("status") == 404, 30, "the service gone")
        deadline = time.monotonic() + 10
        while (
            httpx.get(f"{base}/v2/health/ready", headers={"Authorization": f"Bearer {token}"}).status_code
            != 404
        ):
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        if gateway is not None:
            gateway.terminate()
            gateway.wait(10)
        for n in nodes:
            n.close()


def test_autoscaling_promotes_a_warm_replica_under_load_and_scales_back(srv: Server, tmp_path: Path) -> None:
    """Slow requests (the toy completions endpoint, 40 ms per token) from 8 callers at
    once: in-flight per replica far above the target of 2, so the autoscaler goes to its
    maximum of 3; the first new replica is the warm one (promoted at once), and the pool
    is refilled behind it. Without load, after the cooldown, back to 1."""
    passable(tmp_path)
    team = make_team(srv)
    pool = unique("apool")
    with srv.client() as c:
        ok(c.post("/pools", json={"name": pool}), 201)
    nodes = [sim_node(srv, tmp_path, pool=pool, leaf=f"leaf-{i % 2}") for i in range(5)]
    name = "scaled-llm"
    launch = model_server(as_other_account=ROOT, args=("--model", "mlp", "--token-delay-ms", "40"))
    gw_port = free_port()
    gateway = start_gateway(srv, gw_port, env=OPERATOR_ENV)
    gateway_up(gateway, gw_port)  # before the replicas pick their ports
    stop = threading.Event()
    try:
        with srv.client() as c:
            spec = {
                "name": name, "team": team, "pool": pool, "command": launch.command, "env": launch.env,
                "replicas": 1, "min_replicas": 1, "max_replicas": 3, "warm": 1, "metric": "inflight",
                "target": 2, "scale_up_stabilization": 2, "scale_down_cooldown": 4, "protocol": "openai",
            }  # fmt: skip
            ok(c.put(f"/services/{name}", json=spec))

            def state(o: dict[str, Any]) -> tuple[int, int, int]:
                return (
                    o.get("replicas_desired", -1),
                    o.get("replicas_ready", -1),
                    o.get("replicas_warm", -1),
                )

            def until(check: Any, timeout: float, what: str) -> dict[str, Any]:
                deadline = time.monotonic() + timeout
                while True:
                    out = ok(c.get(f"/services/{name}"))
                    if check(out):
                        return out  # type: ignore[no-any-return]
                    assert time.monotonic() < deadline, (
                        f"timed out waiting for {what}: {state(out)} {out['events']}"
                    )
                    time.sleep(0.1)

            until(lambda o: state(o) == (1, 1, 1) and _ready_warm(o), 60, "1 serving and 1 warm replica")
            token = ok(c.post(f"/services/{name}/tokens"), 201)["token"]
            url = f"http://127.0.0.1:{gw_port}/s/{name}/v1/completions"
            body = {"model": "mlp", "prompt": "scale me", "max_tokens": 12}
            deadline = time.monotonic() + 10  # the token reaches the gateway with its next feed read
            while (
                httpx.get(
                    url.replace("/completions", "/models"), headers={"Authorization": f"Bearer {token}"}
                ).status_code
                != 200
            ):
                assert time.monotonic() < deadline, "the gateway never learnt the token"
                time.sleep(0.1)
            failures: list[str] = []

            def caller() -> None:
                with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=30) as h:
                    while not stop.is_set():
                        try:
                            r = h.post(url, json=body)
                            if r.status_code != 200:
                                failures.append(str(r.status_code))
                        except httpx.HTTPError as exc:
                            failures.append(type(exc).__name__)

            callers = [threading.Thread(target=caller, daemon=True) for _ in range(8)]
            for t in callers:
                t.start()
            started = time.monotonic()
            out = until(lambda o: o["replicas_desired"] == 3, 20, "a scale-up to 3")
            out = until(lambda o: o["replicas_ready"] >= 2, 20, "the warm replica promoted")
            promoted_after = time.monotonic() - started
            assert any(e["kind"] == "promote" for e in out["events"]), out["events"]
            scale = next(e for e in out["events"] if e["kind"] == "scale")
            assert "in flight per replica" in scale["reason"] and "target 2" in scale["reason"]
            assert promoted_after < 10, promoted_after
            out = until(lambda o: o["traffic"] is not None and o["traffic"]["qps"] > 0, 10, "traffic stats")
            assert out["traffic"]["p99_ms"] is not None
            until(lambda o: state(o) == (3, 3, 1), 60, "3 serving replicas and the pool refilled")
            stop.set()
            for t in callers:
                t.join(35)
            assert failures == [], failures
            out = until(lambda o: o["replicas_desired"] == 1, 30, "the scale-down after the cooldown")
            events = ok(c.get(f"/services/{name}/events", params={"limit": 200}))
            assert any(e["kind"] == "scale" and e["reason"].startswith("scale down") for e in events), events
            until(lambda o: state(o) == (1, 1, 1), 30, "1 serving, 1 warm again")
            ok(c.delete(f"/services/{name}"), 202)
    finally:
        stop.set()
        gateway.terminate()
        gateway.wait(10)
        for n in nodes:
            n.close()


def _ready_warm(out: dict[str, Any]) -> bool:
    return any(r["warm"] and r["ready"] for r in out["replicas"])
