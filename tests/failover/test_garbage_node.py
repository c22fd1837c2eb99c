"""One node that sends garbage stops nothing: while it does, for a minute, 200 jobs run
on the other nodes; every job completes, no scheduling pass fails, no sync is answered
with a 5xx (issue 12: "one bad item never stops a loop").

The garbage node holds a real node credential and first registers like any agent, so a
job can be placed on it; then it sends, in a seeded random order: a GPU model change
under that allocation, duplicate and impossible GPU indices, NUL bytes in log data and
names, logs and states for jobs it does not run (other nodes' and never-placed ones),
wrong types, huge numbers, deep nesting and bodies that are not JSON."""

from __future__ import annotations

import json
import os
import random
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from failover.conftest import Node, make_pool
from server.conftest import ADMIN_TOKEN, Server, ok, unique

JOBS = 200


def garbage_seconds(server: Server) -> float:
    """A quarter of the issue's minute on PostgreSQL, the production database (where a NUL
    in a text column was fatal); SQLite, the same code over another dialect, gets less
    (CI has 15 minutes for everything). ``GPUFLEET_GARBAGE_SECONDS=60`` runs the
    issue's minute on both."""
    raw = os.environ.get("GPUFLEET_GARBAGE_SECONDS")
    if raw:
        return float(raw)
    return 15.0 if server.db_url.startswith("postgresql") else 6.0


def _gpus(model: str = "H100", n: int = 2) -> list[dict[str, Any]]:
    return [{"index": i, "uuid": f"GPU-g-{i}", "model": model, "memory_mb": 81559} for i in range(n)]


def _bodies(victim: int, others: list[int]) -> list[Callable[[random.Random], Any]]:
    """Each returns one bad sync body (or raw bytes, sent as they are); ``others`` are
    jobs of the good nodes (or of nobody yet), which the garbage node claims."""

    def foreign(r: random.Random) -> int:
        return r.choice(others) if others else victim + 1_000_000

    return [
        lambda r: {"gpus": _gpus("A100")},  # a model change under an allocation
        lambda r: {"gpus": [*_gpus(), {**_gpus()[0]}]},  # a duplicate index
        lambda r: {"gpus": [{**g, "index": g["index"] + 1000} for g in _gpus()]},
        lambda r: {"gpus": [{**g, "index": -1} for g in _gpus()]},
        lambda r: {"gpus": [{**g, "model": "H1\x0000"} for g in _gpus()]},
        lambda r: {"logs": [{"job_id": victim, "attempt": 0, "offset": 0, "end": 5, "data": "a\x00b\x00c"}]},
        lambda r: {"logs": [{"job_id": foreign(r), "attempt": 0, "offset": 0, "end": 6, "data": "forged"}]},
        lambda r: {
            "jobs": [{"job_id": foreign(r), "attempt": r.randrange(2**40), "state": "exited", "exit_code": 0}]
        },
        lambda r: {"jobs": [{"job_id": foreign(r), "state": "exited", "exit_code": 0}]},
        lambda r: {"jobs": [{"job_id": 2**70, "attempt": 2**70, "state": "running"}]},
        lambda r: {"gpus": "eight"},
        lambda r: {"telemetry": [{"index": 0, "temperature_c": 1e308, "power_w": float("nan")}]},
        lambda r: {"telemetry": [{"index": 10**6, "utilization_pct": -5}]},
        lambda r: {"leaf": "x" * 10_000, "rack": "\x00"},
        lambda r: json.loads("[" * 50 + "]" * 50),
        lambda r: b"\x00\xff not json",
        lambda r: b"{" * 100_000,
        lambda r: {"jobs": [{"job_id": "1; drop table jobs", "state": "running"}]},
    ]


def _state(c: httpx.Client, job_id: int) -> str:
    """A job's state; a 429 (200 jobs polled in a row drain even an admin's bucket) is
    waited out as it says."""
    while True:
        resp = c.get(f"/jobs/{job_id}")
        if resp.status_code != 429:
            return str(ok(resp)["state"])
        time.sleep(float(resp.headers.get("Retry-After", "1")))


def _send(http: httpx.Client, url: str, body: Any) -> int:
    if isinstance(body, bytes):
        return http.post(url, content=body, headers={"Content-Type": "application/json"}).status_code
    return http.post(url, content=json.dumps(body), headers={"Content-Type": "application/json"}).status_code


def _failures(server: Server) -> float:
    text = httpx.get(server.url + "/metrics", headers={"Authorization": "Bearer " + ADMIN_TOKEN}).text
    m = re.search(r"^gpufleet_scheduling_failures(?:_total)? ([0-9.e+]+)$", text, re.M)
    assert m, "gpufleet_scheduling_failures is not exported"
    return float(m.group(1))


def test_a_node_sending_garbage_stops_nothing(
    fast_server: Server, team: str, nodes: Callable[..., Node]
) -> None:
    pool = make_pool(fast_server)
    garbage_s = garbage_seconds(fast_server)
    bad = unique("garbage")
    with fast_server.client() as c:
        ok(c.put(f"/nodes/{bad}", json={"pool": pool, "gpus": []}))
        credential = ok(c.post("/nodes/join-tokens", json={"node": bad}), 201)["token"]
    http = httpx.Client(base_url=fast_server.url + "/v1", headers={"Authorization": f"Bearer {credential}"})
    url = f"/nodes/{bad}/sync"
    ok(http.post(url, json={"gpus": _gpus(), "address": "127.0.0.1"}))
    with fast_server.client() as c:  # a job on the garbage node, so a model change is under it
        victim = ok(c.post("/jobs", json={"command": ["true"], "pool": pool, "team": team, "gpus": 2}), 201)[
            "id"
        ]
    deadline = time.monotonic() + 10
    with fast_server.client() as c:
        while ok(c.get(f"/jobs/{victim}"))["state"] == "PENDING":
            assert time.monotonic() < deadline, "the victim job was never placed"
            # heartbeats, as an agent sends them: the node stays Ready (its timeout is 1 s
            # here) until the scheduler, maybe still starting, places the victim
            ok(http.post(url, json={"gpus": _gpus(), "address": "127.0.0.1"}))
            time.sleep(0.1)
    failures_before = _failures(fast_server)
    good = [nodes(pool=pool, gpus=4) for _ in range(3)]
    statuses: list[int] = []
    stop = threading.Event()

    def garbage() -> None:
        rng = random.Random(12)
        makers = _bodies(victim, ids)
        while not stop.is_set():
            statuses.append(_send(http, url, rng.choice(makers)(rng)))
            stop.wait(0.02)

    ids: list[int] = []
    sender = threading.Thread(target=garbage, daemon=True)
    sender.start()
    t0 = time.monotonic()
    with fast_server.client() as c:
        for i in range(JOBS):  # spread over the garbage minute
            env = {"GPUFLEET_SIMULATE_S": "0.3"}
            spec = {"command": ["true"], "pool": pool, "team": team, "name": f"g{i}", "env": env}
            ids.append(ok(c.post("/jobs", json=spec), 201)["id"])
            time.sleep(max(0.0, (t0 + (i + 1) * garbage_s * 0.6 / JOBS) - time.monotonic()))
        while time.monotonic() - t0 < garbage_s:
            time.sleep(0.5)
        stop.set()
        sender.join(10)
        deadline = time.monotonic() + 60
        while True:
            states = [_state(c, j) for j in ids]
            if all(s == "COMPLETED" for s in states) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    for n in good:
        n.pause()
    assert states.count("COMPLETED") == JOBS, {s: states.count(s) for s in set(states)}
    assert len(statuses) > 100 and all(s < 500 for s in statuses), sorted(set(statuses))
    assert _failures(fast_server) == failures_before
    with fast_server.client() as c:
        node = ok(c.get(f"/nodes/{bad}"))
    assert node["cordoned"] and node["cordon_reason"], node  # quarantined with the reason
