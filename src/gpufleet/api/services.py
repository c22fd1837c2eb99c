"""Inference services: the spec a user deploys, the service as shown, its tokens, and
the endpoint feed the gateway polls.

A service is a model server run as ``replicas`` copies (each a job of kind ``service``
on ``gpus_per_replica`` GPUs). Its process gets ``$PORT`` (a free port on its node,
chosen by the agent) and must answer ``health_path`` with 2xx once it can serve; only
ready replicas receive traffic. ``image`` runs it in a container instead (``port`` is
then the port inside the container, published on ``$PORT`` of the node).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, RootModel, StringConstraints, ValidationError, model_validator

from gpufleet.api.base import Name, Reply, Request
from gpufleet.api.jobs import CudaVersion
from gpufleet.api.servicemodels import ServiceModelOut

SERVICE_NAME = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
"""A DNS label (Kubernetes' Service names): it is a path segment of the gateway's URLs."""
ServiceName = Annotated[str, StringConstraints(pattern=SERVICE_NAME)]
Protocol = Literal["http", "openai", "kserve-v2"]
ScaleMetric = Literal["gpu_util", "inflight", "qps"]
HEALTH_PATHS: dict[str, str] = {"http": "/", "openai": "/v1/models", "kserve-v2": "/v2/health/ready"}
"""The readiness probe of each protocol when the spec names none."""
MAX_REPLICAS = 64
DEFAULT_TARGETS: dict[str, float] = {"gpu_util": 70.0, "inflight": 4.0, "qps": 50.0}
EnvValue = Annotated[str, StringConstraints(max_length=65_536)]
Text = Annotated[str, StringConstraints(min_length=1, max_length=256)]
RateText = Annotated[
    str, StringConstraints(pattern=r"^(off|\d{1,9}(\.\d{1,6})?/\d{1,9}(\.\d{1,6})?(ms|s|m|h)?)$")
]
"""A gateway rate limit per caller token: ``BURST/PER_SECOND`` (``200/100``) or
``N/WINDOW`` (``1000/1m``), as the server's ``--rate-user``; ``off``: none."""


class ServiceSpec(Request):
    """What ``gpufleet service deploy`` sends (from a YAML/JSON file or flags)."""

    name: ServiceName
    team: Name | None = None
    command: list[Annotated[str, StringConstraints(max_length=65_536)]] | None = Field(
        default=None, max_length=4096, description="the model server; it listens on $PORT"
    )
    image: Text | None = None
    port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="with an image: the port inside the container (default 8000)",
    )
    replicas: int = Field(default=1, ge=0, le=MAX_REPLICAS)
    min_replicas: int | None = Field(default=None, ge=0, le=MAX_REPLICAS)
    max_replicas: int | None = Field(default=None, ge=1, le=MAX_REPLICAS)
    gpus_per_replica: int = Field(default=1, ge=0, le=1024)
    gpu_type: Annotated[str, StringConstraints(min_length=1, max_length=64)] | None = Field(
        default=None, description="a GPU model, or MIG slices: 'MIG 1g.10gb'"
    )
    gpu_fraction: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        allow_inf_nan=False,
        description="each replica on part of one shared GPU (0.25), under MPS limits (gpus_per_replica 1)",
    )
    cuda: CudaVersion | None = Field(
        default=None,
        description="the CUDA version replicas need (12.4): they run only on nodes whose driver supports it",
    )
    pool: Name = "default"
    health_path: Annotated[str, StringConstraints(pattern=r"^/[!-~]{0,255}$")] | None = Field(
        default=None, description="readiness probe path; default by protocol (kserve-v2: /v2/health/ready)"
    )
    readiness_timeout: float = Field(
        default=300.0, gt=0, le=86_400, description="seconds a new replica has to become ready"
    )
    env: dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")], EnvValue] = Field(
        default_factory=dict, max_length=256
    )
    priority: int = Field(default=0, ge=-1000, le=1000)
    protocol: Protocol = "http"
    model_version: Annotated[str, StringConstraints(min_length=1, max_length=64)] | None = Field(
        default=None, description="given to replicas as GPUFLEET_MODEL_VERSION; changing it rolls them"
    )
    rate_limit: RateText | None = Field(
        default=None,
        description="per caller token at the gateway: BURST/PER_SECOND or N/WINDOW; none: no limit",
    )
    # Autoscaling (``server/decide/autoscale.py``): on when min_replicas < max_replicas.
    metric: ScaleMetric = Field(default="gpu_util", description="what the autoscaler holds at the target")
    target: float | None = Field(
        default=None,
        gt=0,
        le=1e6,
        description="per ready replica; default gpu_util 70 (%), inflight 4, qps 50",
    )
    scale_up_stabilization: float = Field(
        default=30.0, ge=0, le=86_400, description="seconds after a scale-up before the next one"
    )
    scale_down_cooldown: float = Field(
        default=300.0,
        ge=0,
        le=86_400,
        description="seconds of lower load (and no scaling) before a scale-down",
    )
    warm: int = Field(
        default=0, ge=0, le=MAX_REPLICAS, description="standby replicas: started and ready, not in rotation"
    )
    slo_p99_ms: float | None = Field(
        default=None, gt=0, le=3_600_000, description="the p99 latency objective (the alert rule's threshold)"
    )
    # Rollouts (``server/decide/replicas.py``), as a Kubernetes Deployment's rolling update.
    max_surge: int = Field(
        default=1, ge=0, le=MAX_REPLICAS, description="replicas a rollout may add above `replicas`"
    )
    max_unavailable: int = Field(
        default=0,
        ge=0,
        le=MAX_REPLICAS,
        description="ready replicas a rollout may take below `replicas` (0: an old one goes only "
        "once a new one is ready)",
    )
    progress_deadline: float = Field(
        default=600.0,
        gt=0,
        le=86_400,
        description="seconds a generation may take to be ready before its rollout is called stalled",
    )

    @model_validator(mode="after")
    def _shape(self) -> ServiceSpec:
        if not self.command and self.image is None:
            raise ValueError("a service needs a command (its model server) or an image")
        if self.max_surge == 0 and self.max_unavailable == 0:
            raise ValueError("max_surge and max_unavailable cannot both be 0: a rollout could never move")
        lo = self.min_replicas if self.min_replicas is not None else self.replicas
        hi = self.max_replicas if self.max_replicas is not None else self.replicas
        if not lo <= self.replicas <= hi:
            raise ValueError(
                f"replicas ({self.replicas}) must lie within min_replicas..max_replicas ({lo}..{hi})"
            )
        return self

    @property
    def probe_path(self) -> str:
        return self.health_path or HEALTH_PATHS[self.protocol]

    @property
    def autoscaled(self) -> bool:
        return (
            self.min_replicas is not None
            and self.max_replicas is not None
            and self.min_replicas < self.max_replicas
        )

    @property
    def scale_target(self) -> float:
        return self.target if self.target is not None else DEFAULT_TARGETS[self.metric]


class ServicePatch(Request):
    """``gpufleet service update``: the fields to change (the rest stays). A change of
    what replicas run (command, image, env, model version, port, GPUs) rolls them one by
    one; a change of ``replicas`` only adds or drains replicas."""

    command: list[Annotated[str, StringConstraints(max_length=65_536)]] | None = Field(
        default=None, max_length=4096
    )
    image: Text | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    replicas: int | None = Field(default=None, ge=0, le=MAX_REPLICAS)
    min_replicas: int | None = Field(default=None, ge=0, le=MAX_REPLICAS)
    max_replicas: int | None = Field(default=None, ge=1, le=MAX_REPLICAS)
    gpus_per_replica: int | None = Field(default=None, ge=0, le=1024)
    gpu_type: Annotated[str, StringConstraints(min_length=1, max_length=64)] | None = None
    gpu_fraction: float | None = Field(default=None, gt=0, lt=1, allow_inf_nan=False)
    cuda: CudaVersion | None = None
    health_path: Annotated[str, StringConstraints(pattern=r"^/[!-~]{0,255}$")] | None = None
    readiness_timeout: float | None = Field(default=None, gt=0, le=86_400)
    env: (
        dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")], EnvValue] | None
    ) = Field(default=None, max_length=256)
    priority: int | None = Field(default=None, ge=-1000, le=1000)
    protocol: Protocol | None = None
    model_version: Annotated[str, StringConstraints(min_length=1, max_length=64)] | None = None
    rate_limit: RateText | None = None
    metric: ScaleMetric | None = None
    target: float | None = Field(default=None, gt=0, le=1e6)
    scale_up_stabilization: float | None = Field(default=None, ge=0, le=86_400)
    scale_down_cooldown: float | None = Field(default=None, ge=0, le=86_400)
    warm: int | None = Field(default=None, ge=0, le=MAX_REPLICAS)
    slo_p99_ms: float | None = Field(default=None, gt=0, le=3_600_000)
    max_surge: int | None = Field(default=None, ge=0, le=MAX_REPLICAS)
    max_unavailable: int | None = Field(default=None, ge=0, le=MAX_REPLICAS)
    progress_deadline: float | None = Field(default=None, gt=0, le=86_400)


class ServiceRollback(Request):
    """``gpufleet service rollback``: run an earlier generation's replica template again
    (what replicas run; the count, bounds and rollout knobs stay), as a new generation."""

    generation: int | None = Field(default=None, ge=1, le=2**31 - 1, description="default: the previous one")


class RolloutOut(Reply):
    """Where the current generation stands (``server/replicas.rollout_status``)."""

    state: Literal["complete", "progressing", "stalled"]
    generation: int
    reason: str


class ReplicaOut(Reply):
    job_id: int
    replica: int
    generation: int
    state: str
    ready: bool
    draining: bool
    warm: bool = Field(default=False, description="a standby replica: ready, not in rotation")
    endpoint: str | None
    nodes: list[str]
    gpus: list[int]
    started_at: float | None
    ready_at: float | None
    reason: str | None = Field(default=None, description="why it waits (a pending replica)")
    previous_job_id: int | None = Field(
        default=None, description="the job that served this slot before (logs: service logs --previous)"
    )


class ServiceTraffic(Reply):
    """What the gateways saw of a service over the last ``window_s`` (their reports)."""

    window_s: float
    qps: float
    error_rate: float = Field(description="5xx answers / all answers")
    inflight: int
    inflight_avg: float = Field(default=0.0, description="in flight, averaged over the window's reports")
    p50_ms: float | None
    p99_ms: float | None
    gateways: int


class ServiceEventOut(Reply):
    at: float
    actor: str
    kind: str
    reason: str


class ServiceOut(Reply):
    name: str
    owner: str
    team: str
    state: Literal["active", "deleting"]
    generation: int
    spec: ServiceSpec
    replicas_desired: int
    replicas_ready: int
    replicas_warm: int = 0
    traffic: ServiceTraffic | None = Field(default=None, description="from the gateways' reports, last 30 s")
    rollout: RolloutOut | None = Field(default=None, description="the current generation's rollout")
    replicas: list[ReplicaOut] = Field(default_factory=list)
    models: list[ServiceModelOut] = Field(
        default_factory=list, description="models wished loaded or unloaded on every replica (issue 30)"
    )
    events: list[ServiceEventOut] = Field(default_factory=list)
    created_at: float
    updated_at: float
    url_path: str = Field(description="the path under the gateway: /s/NAME/")


class ServiceTokenOut(Reply):
    id: int
    hint: str
    created_at: float
    created_by: str
    revoked_at: float | None
    token: str | None = Field(default=None, description="shown only once, when created")


class GatewayRate(Reply):
    burst: float
    per_s: float


class GatewayEndpoint(Reply):
    id: str = Field(description="JOB.REPLICA")
    job_id: int
    replica: int
    url: str
    node: str
    generation: int
    gpu_util: float | None = Field(description="mean utilisation (0-100) of the replica's GPUs, if fresh")


class GatewayService(Reply):
    name: str
    protocol: str
    tokens: list[str] = Field(description="sha256 hex digests of the service's live tokens")
    rate: GatewayRate | None
    endpoints: list[GatewayEndpoint]


class GatewayFeed(Reply):
    at: float
    services: list[GatewayService]


class LatencyIn(Request):
    """A cumulative histogram: ``counts[i]`` answers took at most ``le[i]`` seconds."""

    le: list[float] = Field(max_length=64)
    counts: list[int] = Field(max_length=64)
    sum: float = Field(ge=0)
    count: int = Field(ge=0)


class ServiceCounters(Request):
    codes: dict[Annotated[str, StringConstraints(pattern=r"^[1-5][0-9][0-9]$")], int] = Field(
        default_factory=dict, max_length=64
    )
    inflight: int = Field(default=0, ge=0)
    latency: LatencyIn | None = None


class ReportEntries(RootModel[dict[Annotated[str, StringConstraints(max_length=256)], Any]]):
    """A report's entries as they came, each ``ServiceCounters`` under a service's name:
    checked one by one (``GatewayReport.entries``), so that one bad entry is skipped
    and counted instead of refusing the report (a Pydantic model, so the report's own
    storability pass leaves them to that check)."""

    root: dict[Annotated[str, StringConstraints(max_length=256)], Any] = Field(
        default_factory=dict, max_length=10_000
    )


SkipReason = Literal["name", "counters"]
"""Why a report's entry was skipped: not a service's name, or its counters malformed."""


class GatewayReport(Request):
    """What one gateway process counted per service since it started (cumulative, like
    Prometheus counters); sent after every feed read. A bad envelope (no gateway id) is
    a 422; a bad entry is skipped (``entries``) and the others are taken."""

    gateway: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    services: ReportEntries = Field(
        default_factory=ReportEntries,
        description="per service name, a ServiceCounters object (codes, inflight, latency)",
    )

    def entries(self) -> tuple[dict[str, ServiceCounters], dict[str, SkipReason]]:
        """The valid entries, and the reason each other one was skipped."""
        good: dict[str, ServiceCounters] = {}
        skipped: dict[str, SkipReason] = {}
        for name, raw in self.services.root.items():
            if _SERVICE_NAME.fullmatch(name) is None:
                skipped[name] = "name"
                continue
            try:
                good[name] = ServiceCounters.model_validate(raw)
            except ValidationError:
                skipped[name] = "counters"
        return good, skipped


_SERVICE_NAME = re.compile(SERVICE_NAME)
