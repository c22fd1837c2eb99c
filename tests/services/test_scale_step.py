"""A step in load on an autoscaled service with one warm replica, on a running server
(issue 30: "scaling that catches a step"): a gateway report that shows the surge wakes
the autoscaler at once, and each report after it while the step sinks in (the
server runs with a 30-s ``--service-interval``, so a decision within seconds can only
come from that wake), the warm replica is promoted in the same decision and the
gateways' feed lists it, and nothing scales down while the load lasts (no flap).

Real processes: the server, three agents on simulated GPUs (in-process), ``gpufleet
model-server`` replicas (the toy completions endpoint, 40 ms per token: in flight without
CPU), a ``gpufleet gateway`` (feed and report every 0.2 s)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from failover.conftest import FAST
from gpufleet.modelserver.launch import model_server
from jobaccounts import ROOT, passable
from server.conftest import Server, free_port, make_team, ok, start_server, stop_server, unique
from services.simnodes import OPERATOR_ENV, gateway_up, sim_node, start_gateway

NAME = "stepped"
PERIOD_S = 30.0
"""The replica loop's period here: far longer than any wait in this test."""


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(
        f"sqlite:///{tmp_path_factory.mktemp('step') / 'g.db'}",
        extra=(*FAST, "--service-drain", "2", "--service-interval", f"{PERIOD_S:g}s"),
    )
    yield s
    stop_server(s)


class Callers:
    """Threads calling the completions endpoint back to back; failures kept."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token
        self.stop = threading.Event()
        self.failures: list[str] = []
        self.answered = 0
        self.threads: list[threading.Thread] = []

    def add(self, n: int) -> None:
        for _ in range(n):
            t = threading.Thread(target=self._run, daemon=True)
            t.start()
            self.threads.append(t)

    def _run(self) -> None:
        body = {"model": "mlp", "prompt": "step", "max_tokens": 12}
        with httpx.Client(headers={"Authorization": f"Bearer {self.token}"}, timeout=30) as h:
            while not self.stop.is_set():
                try:
                    r = h.post(self.url, json=body)
                    if r.status_code == 200:
                        self.answered += 1
                    else:
                        self.failures.append(str(r.status_code))
                except httpx.HTTPError as exc:
                    self.failures.append(type(exc).__name__)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(35)


def test_a_step_in_load_scales_at_once_promotes_the_warm_replica_and_never_flaps(
    srv: Server, tmp_path: Path
) -> None:
    def oldest_first(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return sorted(events, key=lambda e: float(e["at"]))  # stable: one decision's keep their order

    passable(tmp_path)
    team = make_team(srv)
    pool = unique("stpool")
    with srv.client() as c:
        ok(c.post("/pools", json={"name": pool}), 201)
    nodes = [sim_node(srv, tmp_path, pool=pool, leaf=f"leaf-{i % 2}") for i in range(3)]
    launch = model_server(as_other_account=ROOT, args=("--model", "mlp", "--token-delay-ms", "40"))
    gw_port = free_port()
    gateway = start_gateway(srv, gw_port, env=OPERATOR_ENV)
    gateway_up(gateway, gw_port)  # before the replicas pick their ports
    callers: Callers | None = None
    try:
        with srv.client() as c:
            # scale-down: the default 300-s cooldown (HPA's)
            spec = {
                "name": NAME, "team": team, "pool": pool, "command": launch.command, "env": launch.env,
                "replicas": 1, "min_replicas": 1, "max_replicas": 3, "warm": 1, "metric": "inflight",
                "target": 2, "scale_up_stabilization": 60, "protocol": "openai",
            }  # fmt: skip
            ok(c.put(f"/services/{NAME}", json=spec))

            def until(check: Callable[[dict[str, Any]], bool], timeout: float, what: str) -> dict[str, Any]:
                deadline = time.monotonic() + timeout
                while True:
                    out: dict[str, Any] = ok(c.get(f"/services/{NAME}"))
                    if check(out):
                        return out
                    assert time.monotonic() < deadline, f"timed out waiting for {what}: {out['events']}"
                    time.sleep(0.1)

            # the first replica and the warm one come up through the loop's wakes (a deploy,
            # the scheduler, the agents), not its period
            until(
                lambda o: o["replicas_ready"] == 1 and any(r["warm"] and r["ready"] for r in o["replicas"]),
                90,
                "1 serving and 1 warm replica",
            )
            token = ok(c.post(f"/services/{NAME}/tokens"), 201)["token"]
            url = f"http://127.0.0.1:{gw_port}/s/{NAME}/v1/completions"
            deadline = time.monotonic() + 10
            auth = {"Authorization": f"Bearer {token}"}
            while httpx.get(url.replace("/completions", "/models"), headers=auth).status_code != 200:
                assert time.monotonic() < deadline, "the gateway never learnt the token"
                time.sleep(0.1)
            callers = Callers(url, token)
            callers.add(1)  # calm: about one in flight, under the target of 2
            time.sleep(2.0)
            events = ok(c.get(f"/services/{NAME}/events", params={"limit": 50}))
            assert not any(e["kind"] == "scale" for e in events), events
            callers.add(11)  # the step: ~12 in flight, 6 replicas' worth at the target
            stepped = time.time()
            until(lambda o: o["replicas_desired"] == 3, 15, "the scale-up to 3")
            events = oldest_first(ok(c.get(f"/services/{NAME}/events", params={"limit": 50})))
            scales = [e for e in events if e["kind"] == "scale"]
            # up only, past the 60-s stabilisation (the promoted replica is ready at once):
            # the HPA rule on the in-flight metric, or the panic rule on the gateways'
            # demand, whichever the windows' means reach first (tests/test_autoscale.py)
            assert all(e["reason"].startswith(("panic: scale up", "scale up")) for e in scales), scales
            assert scales[-1]["at"] - stepped < 10.0, (scales, stepped)  # the surge's wakes, not a period
            promote = next(e for e in events if e["kind"] == "promote")
            assert promote["at"] == scales[0]["at"], (promote, scales)  # in the same decision
            promoted = int(promote["reason"].split()[1].rstrip(":"))
            feed = ok(c.get("/gateway/endpoints"))
            ours = next(s for s in feed["services"] if s["name"] == NAME)
            assert promoted in {e["job_id"] for e in ours["endpoints"]}, ours
            until(lambda o: o["replicas_ready"] == 3, 90, "3 ready replicas")
            answered = callers.answered
            time.sleep(3.0)  # the load goes on, the count holds: no flap
            assert callers.answered > answered
            callers.close()
            time.sleep(2.0)  # and just after it: the scale-down waits for its cooldown
            out = ok(c.get(f"/services/{NAME}"))
            assert out["replicas_desired"] == 3, out["events"]
            events = oldest_first(ok(c.get(f"/services/{NAME}/events", params={"limit": 100})))
            assert [e for e in events if e["kind"] == "scale"] == scales, events  # none since
            assert callers.failures == [], callers.failures
            ok(c.delete(f"/services/{NAME}"), 202)
    finally:
        if callers is not None:
            callers.close()
        gateway.terminate()
        gateway.wait(10)
        for n in nodes:
            n.close()
