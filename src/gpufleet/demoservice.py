"""The demo's inference service: ``gpufleet model-server`` deployed as service ``mlp``
(autoscaled 1..4 replicas on GPU utilisation, one warm replica, 1 GPU each, spread over
nodes, as the demo's admin in team ``demo``), a gateway token for it, a gateway embedded
in the demo process (uvicorn in a thread) following the server's endpoint feed, and a
load on it: a "daily" curve compressed into ``LOAD_PERIOD_S`` (``gpufleet.loadgen``'s
sine, ``LOAD_LOW``..``LOAD_HIGH`` requests/s), so the page shows it scale out and back.
Each request costs its replica ``COMPUTE_US`` of simulated GPU time (the model server's
``--launch-overhead-us``): on the simulated GPUs a replica's utilisation follows that
busy time. The banner prints a curl line that calls it.

Replicas are real processes, run as ``nobody`` when the demo runs as root; when that
account cannot run this installation's Python (``modelserver.launch``), the service is
not deployed and the banner says why.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import httpx

SERVICE = "mlp"
REPLICAS = 1
MAX_REPLICAS = 4
WARM = 1
PRIORITY = 100
"""Above the trace workload's jobs: the service's replicas are placed first."""
COMPUTE_US = 4000
LOAD_LOW, LOAD_HIGH, LOAD_PERIOD_S = 10.0, 260.0, 600.0


@dataclass(slots=True)
class DemoService:
    server_url: str
    admin_token: str
    host: str
    port: int
    ca_file: str | None = None
    token: str = ""
    problem: str = ""
    _server: Any = None
    _thread: threading.Thread | None = None
    _load: threading.Thread | None = None
    _stop_load: Any = None
    warm: int = 0
    desired: int = 0
    qps: float | None = None
    ready: int = 0
    replicas: list[dict[str, Any]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/s/{SERVICE}"

    def deploy(self, api: httpx.Client, *, team: str) -> bool:
        """Deploy (or keep, on a reused data dir) the service and make a token."""
        from gpufleet.modelserver.launch import model_server

        launch = model_server(
            as_other_account=os.geteuid() == 0,
            args=("--model", "mlp", "--launch-overhead-us", str(COMPUTE_US)),
        )
        if not launch.runnable:
            self.problem = f"service {SERVICE} not deployed: {launch.why}"
            return False
        spec = {
            "name": SERVICE,
            "team": team,
            "command": launch.command,
            "env": launch.env,
            "replicas": REPLICAS,
            "min_replicas": REPLICAS,
            "max_replicas": MAX_REPLICAS,
            "warm": WARM,
            "metric": "gpu_util",
            "slo_p99_ms": 100,
            "gpus_per_replica": 1,
            "protocol": "kserve-v2",
            "priority": PRIORITY,
            "readiness_timeout": 120,
        }
        r = api.put(f"/services/{SERVICE}", json=spec)
        if r.status_code != 200:
            self.problem = f"service {SERVICE} not deployed: {r.status_code} {r.text[:200]}"
            return False
        made = api.post(f"/services/{SERVICE}/tokens")
        if made.status_code != 201:
            self.problem = f"service {SERVICE}: no token: {made.status_code} {made.text[:200]}"
            return False
        self.token = made.json()["token"]
        return True

    def start_gateway(self) -> None:
        """A gateway in this process: uvicorn's server on its own thread and loop."""
        import uvicorn

        from gpufleet.gateway import GatewayConfig, ServerSource, create_app

        source = ServerSource(self.server_url, self.admin_token, ca_file=self.ca_file)
        scrape = frozenset({hashlib.sha256(self.admin_token.encode()).hexdigest()})  # as `gpufleet gateway`
        app = create_app(source, config=GatewayConfig(refresh_s=1.0, metrics_tokens=scrape))
        from gpufleet import netguard

        guard = netguard.uvicorn_options(netguard.GuardLimits(), netguard.GuardStats())
        config = uvicorn.Config(  # no Date/Server of its own: the replica's pass through, once
            app,
            host=self.host,
            port=self.port,
            log_level="warning",
            access_log=False,
            lifespan="on",
            server_header=False,
            date_header=False,
            **guard,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="gateway", daemon=True)
        self._thread.start()

    def poll(self, api: httpx.Client) -> None:
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            r = api.get(f"/services/{SERVICE}")
            if r.status_code == 200:
                out = r.json()
                self.ready = int(out["replicas_ready"])
                self.desired = int(out["replicas_desired"])
                self.warm = int(out["replicas_warm"])
                self.replicas = list(out["replicas"])
                traffic = out.get("traffic")
                self.qps = None if traffic is None else float(traffic["qps"])

    def curl(self) -> str:
        body = (
            '{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"FP32","data":['
            + ",".join(["0.5"] * 16)
            + "]}]}"
        )
        return (
            f"curl -s -H 'Authorization: Bearer {self.token}' -H 'Content-Type: application/json' "
            f"-d '{body}' {self.url}/v2/models/mlp/infer"
        )

    def status(self) -> str:
        if self.problem:
            return self.problem
        qps = "" if self.qps is None else f", {self.qps:.0f} req/s"
        scaled = f"autoscaled {REPLICAS}..{MAX_REPLICAS}"
        return f"{self.ready}/{self.desired} ready, {self.warm} warm ({scaled}){qps}"

    def start_load(self) -> None:
        """The daily curve on the service through the gateway, until ``stop``."""
        import asyncio

        from gpufleet.loadgen import LoadShape, Target, kserve_body, run_load

        target = Target(
            url=f"{self.url}/v2/models/mlp/infer",
            method="POST",
            body=kserve_body(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
            timeout_s=30,
        )
        shape = LoadShape(
            kind="sine", qps=LOAD_LOW, peak_qps=LOAD_HIGH, period_s=LOAD_PERIOD_S, duration_s=LOAD_PERIOD_S
        )
        loop = asyncio.new_event_loop()
        stopping = threading.Event()

        async def forever() -> None:
            lap = 0
            while not stopping.is_set():
                with contextlib.suppress(Exception):  # the gateway not up yet, a replica gone: go on
                    await run_load(target, shape, seed=lap, report_every_s=30.0)
                lap += 1
                await asyncio.sleep(1.0)

        task = loop.create_task(forever())

        def cancel() -> None:
            stopping.set()
            loop.call_soon_threadsafe(task.cancel)

        def run() -> None:
            with contextlib.suppress(asyncio.CancelledError):
                loop.run_until_complete(task)
            loop.close()

        self._stop_load = cancel
        self._load = threading.Thread(target=run, name="service-load", daemon=True)
        self._load.start()

    def stop(self) -> None:
        if self._stop_load is not None:
            self._stop_load()
            if self._load is not None:
                self._load.join(timeout=10)
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
