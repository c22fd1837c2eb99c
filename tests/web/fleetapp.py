"""A small in-process gpufleet server (FastAPI TestClient on a temp SQLite file) with
nodes, telemetry, a placed and a waiting job, prices, a team budget and an open
reservation: what the /metrics, alerts, rules and dashboard tests read. With
``service=True`` also an autoscaled inference service with one ready replica and two
gateway reports of its traffic (every ``gpufleet_service_*`` series exists)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.server.app import create_app
from gpufleet.server.config import ServerConfig
from gpufleet.server.store import db

TOKEN = "gf_metrics_test_admin"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@dataclass
class Fleet:
    client: TestClient
    job_id: int

    def scrape(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        """Sample name -> [(labels, value)] from ``GET /metrics`` (an admin's token)."""
        r = self.client.get("/metrics", headers=AUTH)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/plain")
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for fam in text_string_to_metric_families(r.text):
            for s in fam.samples:
                out.setdefault(s.name, []).append((dict(s.labels), s.value))
        return out

    def get(self, path: str, **kw: Any) -> Any:
        r = self.client.get(path, headers=AUTH, **kw)
        assert r.status_code == 200, r.text
        return r.json()


def gpu(index: int, **kw: Any) -> dict[str, Any]:
    base = {
        "index": index,
        "utilization_pct": 0.0,
        "memory_used_mb": 0,
        "temperature_c": 35.0,
        "power_w": 70.0,
    }
    return base | {"ecc_dbe": 0} | kw


TELEMETRY = {
    "node-a": [
        gpu(0, utilization_pct=97.5, memory_used_mb=40_000, temperature_c=91.0, power_w=650.0),
        gpu(1, utilization_pct=10.0, memory_used_mb=1_000, xid_events=[79]),
        gpu(2, ecc_dbe=2),
        gpu(3),
    ],
    "node-b": [gpu(i, utilization_pct=50.0) for i in range(4)],
}


SERVICE = {
    "name": "chat",
    "command": ["model-server"],
    "team": "vision",
    "replicas": 1,
    "min_replicas": 1,
    "max_replicas": 3,
    "gpus_per_replica": 1,
    "slo_p99_ms": 250.0,
}


def gateway_report(requests: int, *, errors: int = 0, gateway: str = "gw-1") -> dict[str, Any]:
    """A gateway's cumulative counters for ``chat``: ``requests`` answers, ``errors`` of
    them 503, answer times spread over the buckets (most under 100 ms)."""
    ok = requests - errors
    le = [0.05, 0.1, 0.25, 0.5, 1e9]
    counts = [requests * 6 // 10, requests * 9 // 10, requests * 99 // 100, requests, requests]
    latency = {"le": le, "counts": counts, "sum": requests * 0.07, "count": requests}
    codes = {"200": ok} | ({"503": errors} if errors else {})
    return {"gateway": gateway, "services": {"chat": {"codes": codes, "inflight": 3, "latency": latency}}}


def _serve(c: TestClient) -> None:
    """Deploy ``SERVICE``, wait for its replica's placement, report it running and ready
    from its node (as its agent would), and post two gateway reports."""
    r = c.put("/v1/services/chat", json=SERVICE, headers=AUTH)
    assert r.status_code in (200, 201), r.text
    deadline = time.monotonic() + 10
    while not (reps := c.get("/v1/services/chat", headers=AUTH).json()["replicas"]) or not reps[0]["nodes"]:
        assert time.monotonic() < deadline, "the service replica was not placed"
        time.sleep(0.05)
    node, jid = reps[0]["nodes"][0], reps[0]["job_id"]
    r = c.post(f"/v1/nodes/{node}/sync", json={"telemetry": TELEMETRY[node]}, headers=AUTH)
    assert r.status_code == 200, r.text
    attempt = next(j["attempt"] for j in r.json()["jobs"] if j["job_id"] == jid)
    seen = {"job_id": jid, "state": "running", "attempt": attempt, "endpoint": "http://10.0.0.9:8000"}
    r = c.post(f"/v1/nodes/{node}/sync", json={"jobs": [seen | {"ready": True}]}, headers=AUTH)
    assert r.status_code == 200, r.text
    for n in (100, 400):
        r = c.post("/v1/gateway/report", json=gateway_report(n, errors=n // 100), headers=AUTH)
        assert r.status_code == 204, r.text
        time.sleep(0.2)


@contextmanager
def fleet(tmp: Path, *, service: bool = False, **config: Any) -> Iterator[Fleet]:
    url = f"sqlite:///{tmp / 'gpufleet.db'}"
    db.upgrade(url)
    app = create_app(ServerConfig(database_url=url, admin_token=TOKEN, schedule_interval_s=0.2, **config))
    with TestClient(app) as c:
        for name, tel in TELEMETRY.items():
            gpus = [
                {"index": g["index"], "model": "H100-80GB", "uuid": f"GPU-{name}-{g['index']}"} for g in tel
            ]
            r = c.put(
                f"/v1/nodes/{name}", json={"gpus": gpus, "leaf": "leaf-0", "rack": "rack-0"}, headers=AUTH
            )
            assert r.status_code == 200, r.text
            r = c.post(f"/v1/nodes/{name}/sync", json={"telemetry": tel}, headers=AUTH)
            assert r.status_code == 200, r.text
        # the health rules cordon node-a's GPUs 1 (XID 79) and 2 (ECC) in the lifecycle
        # loop, after the sync: wait for that, or the job below may land on one of them
        # and be requeued off it (a real race, handled by the server, not what this
        # fixture is about)
        deadline = time.monotonic() + 10
        while c.get("/v1/nodes/node-a", headers=AUTH).json()["gpus_cordoned"] < 2:
            assert time.monotonic() < deadline, "the health rules did not cordon node-a's GPUs"
            time.sleep(0.02)
        assert c.post("/v1/teams", json={"name": "vision"}, headers=AUTH).status_code == 201
        assert c.post("/v1/teams/vision/members", json={"user": "admin"}, headers=AUTH).status_code == 200
        job = c.post("/v1/jobs", json={"command": ["true"], "gpus": 2, "team": "vision"}, headers=AUTH)
        assert job.status_code == 201, job.text
        jid = int(job.json()["id"])
        deadline = time.monotonic() + 10
        while c.get(f"/v1/jobs/{jid}", headers=AUTH).json()["state"] != "SCHEDULED":
            assert time.monotonic() < deadline, "the job was not placed"
            time.sleep(0.05)
        if service:
            _serve(c)
        # and one that cannot be placed now (8 GPUs; 2 are held, 2 cordoned by health rules)
        wait = c.post("/v1/jobs", json={"command": ["true"], "gpus": 8, "team": "vision"}, headers=AUTH)
        assert wait.status_code == 201, wait.text
        # chargeback: prices, a budget (its series exist), an open reservation of vision
        r = c.put("/v1/prices", json={"timezone": "UTC", "base": {"*": 2.0}}, headers=AUTH)
        assert r.status_code == 200, r.text
        r = c.put("/v1/teams/vision/budget", json={"soft": 10.0, "hard": 100.0}, headers=AUTH)
        assert r.status_code == 200, r.text
        spec = {"start": time.time() - 1, "duration_s": 3600, "gpus": 1, "team": "vision", "name": "demo-r"}
        r = c.post("/v1/reservations", json=spec, headers=AUTH)
        assert r.status_code == 201, r.text
        yield Fleet(client=c, job_id=jid)
