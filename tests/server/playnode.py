"""Playing a node agent through the sync endpoint, for server tests that need exact
control over what a node reports: node credentials, placed jobs and their attempts, and
the server's Prometheus series."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from server.conftest import ADMIN_TOKEN, Server, ok, unique, wait_for


def join_token(srv: Server, node: str) -> str:
    """A node credential bound to ``node``."""
    with srv.client() as c:
        return str(ok(c.post("/nodes/join-tokens", json={"node": node}), 201)["token"])


def gpu_list(n: int, *, node: str, model: str = "H100") -> list[dict[str, Any]]:
    return [{"index": i, "model": model, "uuid": f"GPU-{node}-{i}"} for i in range(n)]


def post_sync(srv: Server, node: str, body: dict[str, Any], *, token: str = ADMIN_TOKEN) -> httpx.Response:
    """JSON with escapes (``ensure_ascii``), so any Python string can be sent as a node could."""
    with srv.client(token) as c:
        return c.post(
            f"/nodes/{node}/sync",
            content=json.dumps(body).encode(),
            headers={"content-type": "application/json"},
        )


def sync(srv: Server, node: str, body: dict[str, Any], *, token: str = ADMIN_TOKEN) -> dict[str, Any]:
    return ok(post_sync(srv, node, body, token=token))  # type: ignore[no-any-return]


def register(srv: Server, *, pool: str, gpus: int = 2, name: str | None = None) -> tuple[str, str]:
    """A node registered by an operator in ``pool`` and seen by its agent: (name, its credential)."""
    name = name or unique("pn")
    with srv.client() as c:
        ok(c.put(f"/nodes/{name}", json={"pool": pool, "gpus": gpu_list(gpus, node=name)}))
    token = join_token(srv, name)
    sync(srv, name, {"gpus": gpu_list(gpus, node=name), "jobs": []}, token=token)
    return name, token


def submit(srv: Server, *, token: str = ADMIN_TOKEN, **spec: Any) -> dict[str, Any]:
    with srv.client(token) as c:
        return ok(c.post("/jobs", json={"command": ["python", "train.py"], "gpus": 1, **spec}), 201)  # type: ignore[no-any-return]


def attempt_of(job: dict[str, Any]) -> int:
    """The attempt id the server gives a placement (``DesiredJob.attempt``)."""
    return round((job["scheduled_at"] or 0.0) * 1000)


def placed(srv: Server, job_id: int) -> tuple[dict[str, Any], int]:
    """The job once SCHEDULED, and its attempt."""
    job = wait_for(srv, job_id, "SCHEDULED")
    return job, attempt_of(job)


def log_text(srv: Server, job_id: int) -> str:
    with srv.client() as c:
        resp = c.get(f"/jobs/{job_id}/logs")
    assert resp.status_code == 200, resp.text
    return resp.text


def metric(srv: Server, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` with these labels (0 when there are none)."""
    with srv.client() as c:  # /metrics takes an operator's or admin's token
        text = c.get(srv.url + "/metrics").text
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def eventually(check: Any, *, timeout: float = 10.0) -> Any:
    """``check()`` once it is truthy (its last value otherwise)."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.05)
