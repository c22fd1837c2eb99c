"""The demo's inference service: ``gpufleet model-server`` deployed as service ``mlp``
(2 replicas, 1 GPU each, spread over nodes, as the demo's admin in team ``demo``), a
gateway token for it, and a gateway embedded in the demo process (uvicorn in a thread)
following the server's endpoint feed. The banner prints a curl line that calls it.

Replicas are real processes, run as ``nobody`` when the demo runs as root; when that
account cannot run this installation's Python (``modelserver.launch``), the service is
not deployed and the banner says why.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import httpx

SERVICE = "mlp"
REPLICAS = 2
PRIORITY = 100
"""Above the trace workload's jobs: the service's replicas are placed first."""


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
    ready: int = 0
    replicas: list[dict[str, Any]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/s/{SERVICE}"

    def deploy(self, api: httpx.Client, *, team: str) -> bool:
        """Deploy (or keep, on a reused data dir) the service and make a token."""
        from gpufleet.modelserver.launch import model_server

        launch = model_server(as_other_account=os.geteuid() == 0, args=("--model", "mlp"))
        if not launch.runnable:
            self.problem = f"service {SERVICE} not deployed: {launch.why}"
            return False
        spec = {
            "name": SERVICE,
            "team": team,
            "command": launch.command,
            "env": launch.env,
            "replicas": REPLICAS,
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
        app = create_app(source, config=GatewayConfig(refresh_s=1.0))
        config = uvicorn.Config(
            app, host=self.host, port=self.port, log_level="warning", access_log=False, lifespan="on"
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
                self.replicas = list(out["replicas"])

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
        where = ", ".join(
            f"{(r['nodes'] or ['-'])[0]}:{'ready' if r['ready'] else r['state'].lower()}"
            for r in self.replicas
        )
        return f"{self.ready}/{REPLICAS} ready  {where}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
