"""Hot model load and unload for a service (issue 30), on a running server with real
agents running real ``gpufleet model-server`` replicas, and a real gateway:

* ``PUT /v1/services/NAME/models/MODEL`` (``service model load|unload``) reaches every
  ready replica (each one's own ``/v2/repository/index`` says so), and ``service show``
  counts it;
* a replica started later (scale up) is ready only with the wished set already applied;
* an unknown model is refused by each replica with its reason, shown per replica, and
  nothing restarts;
* another user's service is 404, bad input 422;
* ``tritonclient.http``'s own repository calls through the gateway: the index, load and
  unload; with a wish recorded, the wish is what every replica converges back to.

SQLite only: the API's rules are those of every service write (tested on both
databases in ``tests/server/test_services_api.py``); this is about processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from failover.conftest import FAST, Node
from gpufleet.modelserver.launch import model_server
from jobaccounts import ROOT, passable
from server.conftest import Server, free_port, make_team, make_user, ok, start_server, stop_server, unique
from services.simnodes import OPERATOR_ENV, gateway_up, sim_node, start_gateway

triton = pytest.importorskip("tritonclient.http")
NAME = "hot-mlp"


@dataclass
class Fleet:
    srv: Server
    team: str
    nodes: list[Node]
    gateway: str
    token: str

    def client(self) -> httpx.Client:
        return self.srv.client()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("hot")
    passable(work)
    srv = start_server(f"sqlite:///{work / 'g.db'}", extra=(*FAST, "--service-drain", "1"))
    nodes: list[Node] = []
    gateway = None
    try:
        team = make_team(srv)
        pool = unique("hpool")
        with srv.client() as c:
            ok(c.post("/pools", json={"name": pool}), 201)
        nodes = [sim_node(srv, work, pool=pool, gpus=2, grace_s=2.0) for _ in range(2)]
        port = free_port()
        gateway = start_gateway(srv, port, env=OPERATOR_ENV)
        gateway_up(gateway, port)
        launch = model_server(as_other_account=ROOT, args=("--model", "mlp", "--no-access-log"))
        assert launch.runnable, launch.why
        spec = {
            "name": NAME,
            "team": team,
            "pool": pool,
            "command": launch.command,
            "env": launch.env,
            "replicas": 2,
            "gpus_per_replica": 1,
            "protocol": "kserve-v2",
            "readiness_timeout": 60,
        }
        with srv.client() as c:
            ok(c.put(f"/services/{NAME}", json=spec))
            _until(c, lambda o: _ready(o) == 2, 60, "2 ready replicas")
            token = ok(c.post(f"/services/{NAME}/tokens"), 201)["token"]
        yield Fleet(srv=srv, team=team, nodes=nodes, gateway=f"127.0.0.1:{port}", token=token)
    finally:
        if gateway is not None:
            gateway.terminate()
            gateway.wait(10)
        for n in nodes:
            n.close()
        stop_server(srv)


def _show(c: httpx.Client) -> dict[str, Any]:
    return ok(c.get(f"/services/{NAME}"))  # type: ignore[no-any-return]


def _serving(out: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in out["replicas"] if r["ready"] and not r["draining"] and not r["warm"]]


def _ready(out: dict[str, Any]) -> int:
    return len(_serving(out))


def _until(
    c: httpx.Client, check: Callable[[dict[str, Any]], bool], timeout: float, what: str
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        out = _show(c)
        if check(out):
            return out
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {json.dumps(out, indent=1)}"
        time.sleep(0.1)


def _model(out: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((m for m in out["models"] if m["name"] == name), None)


def _converged(name: str, n: int) -> Callable[[dict[str, Any]], bool]:
    def check(out: dict[str, Any]) -> bool:
        m = _model(out, name)
        return m is not None and m["replicas"] == n and m["converged"] == n and _ready(out) == n

    return check


def _index(endpoint: str) -> dict[str, str]:
    """A replica's own repository index, asked directly (not through anything of ours)."""
    doc = httpx.post(f"{endpoint}/v2/repository/index", timeout=5).json()
    return {e["name"]: e["state"] for e in doc}


@pytest.fixture
def clean(fleet: Fleet) -> Iterator[httpx.Client]:
    """The service as the fixture made it: 2 ready replicas, the model loaded, no wish."""
    with fleet.client() as c:
        _reset(c)
        yield c
        _reset(c)


def _reset(c: httpx.Client) -> None:
    for m in ok(c.get(f"/services/{NAME}/models")):
        ok(c.delete(f"/services/{NAME}/models/{m['name']}"))
    if _show(c)["spec"]["replicas"] != 2:
        ok(c.patch(f"/services/{NAME}", json={"replicas": 2}))
        _until(c, lambda o: _ready(o) == 2 and len(o["replicas"]) == 2, 30, "back to 2 replicas")
    ok(c.put(f"/services/{NAME}/models/mlp", json={"state": "loaded"}))
    _until(c, _converged("mlp", 2), 20, "mlp loaded again")
    ok(c.delete(f"/services/{NAME}/models/mlp"))


def test_unload_load_a_later_replica_and_an_unknown_model(fleet: Fleet, clean: httpx.Client) -> None:
    c = clean
    # unload: every ready replica's own index says so, and show counts it
    got = ok(c.put(f"/services/{NAME}/models/mlp", json={"state": "unloaded"}))
    assert (got["name"], got["wanted"], got["actor"]) == ("mlp", "unloaded", "admin")
    out = _until(c, _converged("mlp", 2), 20, "mlp unloaded on 2 replicas")
    for r in _serving(out):
        assert _index(r["endpoint"]) == {"mlp": "UNAVAILABLE"}
    assert [p["state"] for p in _model(out, "mlp")["per_replica"]] == ["UNAVAILABLE"] * 2  # type: ignore[index]
    assert any(e["kind"] == "model-unload" and "mlp" in e["reason"] for e in out["events"]), out["events"]
    # the same wish again changes nothing (no second event)
    ok(c.put(f"/services/{NAME}/models/mlp", json={"state": "unloaded"}))
    assert [e["kind"] for e in _show(c)["events"]].count("model-unload") == 1

    # scale up: the new replica is ready only once it has the wished set
    before = {r["job_id"] for r in out["replicas"]}
    ok(c.patch(f"/services/{NAME}", json={"replicas": 3}))
    deadline = time.monotonic() + 60
    while not (new := [r for r in _serving(_show(c)) if r["job_id"] not in before]):
        assert time.monotonic() < deadline, _show(c)
        time.sleep(0.05)
    assert _index(new[0]["endpoint"]) == {"mlp": "UNAVAILABLE"}, new  # at its first ready moment
    _until(c, _converged("mlp", 3), 20, "mlp unloaded on 3 replicas")

    # load again: every replica
    ok(c.put(f"/services/{NAME}/models/mlp", json={"state": "loaded"}))
    out = _until(c, _converged("mlp", 3), 20, "mlp loaded on 3 replicas")
    for r in _serving(out):
        assert _index(r["endpoint"]) == {"mlp": "READY"}
        assert httpx.get(f"{r['endpoint']}/v2/models/mlp/ready", timeout=5).status_code == 200

    # an unknown model: each replica's refusal shown with its reason; nothing restarts
    serving = {r["job_id"] for r in _serving(out)}
    ok(c.put(f"/services/{NAME}/models/nope", json={"state": "loaded"}))

    def refused(o: dict[str, Any]) -> bool:
        m = _model(o, "nope")
        return m is not None and m["failed"] == 3

    out = _until(c, refused, 20, "nope refused by 3 replicas")
    nope = _model(out, "nope")
    assert nope is not None and nope["converged"] == 0
    for p in nope["per_replica"]:
        assert p["state"] == "FAILED" and "no such model" in p["reason"] and "404" in p["reason"], p
    time.sleep(1.0)  # a few probe passes later: the same replicas, all serving
    out = _show(c)
    assert {r["job_id"] for r in _serving(out)} == serving
    assert {r["job_id"] for r in out["replicas"]} == serving
    assert _model(out, "mlp")["converged"] == 3  # type: ignore[index]

    # the CLI: service show and service model list (text and JSON)
    env = fleet.srv.env()
    shown = subprocess.run(
        [sys.executable, "-m", "gpufleet", "service", "show", NAME], env=env, capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    assert "mlp: wanted loaded; 3/3 replicas READY" in shown.stdout, shown.stdout
    assert "nope: wanted loaded; 0/3 replicas READY, 3 failed" in shown.stdout, shown.stdout
    assert "FAILED: load: HTTP 404" in shown.stdout, shown.stdout
    listed = subprocess.run(
        [sys.executable, "-m", "gpufleet", "service", "model", "list", NAME, "--json"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert listed.returncode == 0, listed.stderr
    assert {m["name"]: m["failed"] for m in json.loads(listed.stdout)} == {"mlp": 0, "nope": 3}
    waited = subprocess.run(
        [sys.executable, "-m", "gpufleet", "service", "model", "unload", NAME, "mlp", "--wait", "20"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert waited.returncode == 0, waited.stderr
    assert waited.stdout.strip() == f"service {NAME}: mlp: wanted unloaded; 3/3 replicas UNAVAILABLE"


def test_another_users_service_is_404_and_bad_input_is_refused(fleet: Fleet) -> None:
    other = make_user(fleet.srv, team=fleet.team)
    with fleet.srv.client(other) as c:
        assert c.get(f"/services/{NAME}/models").status_code == 404
        r = c.put(f"/services/{NAME}/models/mlp", json={"state": "unloaded"})
        assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json"
        assert c.delete(f"/services/{NAME}/models/mlp").status_code == 404
    with fleet.client() as c:
        for bad in ("..", "-x", "a" * 129, "sp ace"):
            assert c.put(f"/services/{NAME}/models/{bad}", json={"state": "loaded"}).status_code in (404, 422)
        assert c.put(f"/services/{NAME}/models/mlp", json={"state": "maybe"}).status_code == 422
        assert c.put(f"/services/{NAME}/models/mlp", json={"state": "loaded", "x": 1}).status_code == 422
        assert c.delete(f"/services/{NAME}/models/never-wished").status_code == 404
        assert c.put("/services/no-such/models/mlp", json={"state": "loaded"}).status_code == 404
        assert not ok(c.get(f"/services/{NAME}/models"))  # nothing was written


def test_tritonclient_repository_calls_through_the_gateway(fleet: Fleet, clean: httpx.Client) -> None:
    c = clean
    auth = {"Authorization": f"Bearer {fleet.token}"}
    with triton.InferenceServerClient(f"{fleet.gateway}/s/{NAME}") as client:
        assert client.get_model_repository_index(headers=auth) == [
            {"name": "mlp", "version": "1", "state": "READY"}
        ]
        # no wish: the gateway's fan-out is the whole story
        client.unload_model("mlp", headers=auth)
        assert not client.is_model_ready("mlp", headers=auth)
        assert client.get_model_repository_index(headers=auth)[0]["state"] == "UNAVAILABLE"
        client.load_model("mlp", headers=auth)
        assert client.is_model_ready("mlp", headers=auth)

        # a wish: what tritonclient sees on every replica it reaches
        ok(c.put(f"/services/{NAME}/models/mlp", json={"state": "unloaded"}))
        _until(c, _converged("mlp", 2), 20, "mlp unloaded")
        for _ in range(4):  # the gateway spreads these over both replicas
            assert client.get_model_repository_index(headers=auth)[0]["state"] == "UNAVAILABLE"
            assert not client.is_model_ready("mlp", headers=auth)
        # a direct load through the gateway is undone (at the next index read): the wish is the truth
        client.load_model("mlp", headers=auth)
        deadline = time.monotonic() + 30
        while any(_index(r["endpoint"])["mlp"] != "UNAVAILABLE" for r in _serving(_show(c))):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        ok(c.put(f"/services/{NAME}/models/mlp", json={"state": "loaded"}))
        _until(c, _converged("mlp", 2), 20, "mlp loaded")
        assert client.is_model_ready("mlp", headers=auth)
        assert client.get_model_repository_index(headers=auth)[0]["state"] == "READY"
