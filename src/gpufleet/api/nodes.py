"""Nodes and GPUs: inventory, telemetry, the agent's sync and its reply, the fleet summary."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    Field,
    StringConstraints,
    field_validator,
)

from gpufleet.api.base import INT32, MAX_GPU_INDEX, Name, NodeName, Reply, Request, clean_text
from gpufleet.api.servicemodels import MAX_MODELS, ReplicaModel
from gpufleet.api.steps import DesiredStep, StepAck, StepTaskIn
from gpufleet.api.upgrades import UpgradeOrder, UpgradeReport

Feature = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.:+-]{0,63}$")]
"""A node feature (``--constraint`` matches them): a word of letters, digits, ``_.:+-``."""


class MigInstanceIn(Request):
    """One MIG device of a GPU as its agent reports it (``nvidia-smi -L``'s MIG lines)."""

    uuid: Annotated[str, StringConstraints(min_length=1, max_length=96)]
    profile: Annotated[str, StringConstraints(min_length=1, max_length=32)] = Field(
        description="e.g. 1g.10gb (gpufleet.mig's names)"
    )
    gpu_instance_id: int = Field(ge=0, le=INT32)
    compute_instance_id: int = Field(ge=0, le=INT32)
    start: int = Field(ge=0, le=7, description="first memory slice of its placement")
    size: int = Field(ge=1, le=8, description="memory slices it spans")
    memory_mb: int = Field(default=0, ge=0, le=INT32)


class GpuIn(Request):
    """A GPU as a node's agent reports it in a sync. An index no GPU can have is not a
    malformed request but the node contradicting itself: the server judges the whole
    inventory (``services/nodes.judge_inventory``) and cordons the node, while the rest
    of the sync (heartbeat, jobs, logs) still counts."""

    index: int = Field(ge=-INT32 - 1, le=INT32)
    uuid: Annotated[str, StringConstraints(max_length=64)] = ""
    model: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    memory_mb: int = Field(default=81_920, ge=0, le=INT32)
    nvlink_domain: int = Field(default=0, ge=0, le=INT32)
    healthy: bool = True
    mig_enabled: bool | None = Field(
        default=None, description="MIG mode on (never handed out whole then); None: not reported"
    )
    mig_instances: list[MigInstanceIn] = Field(default_factory=list, max_length=7)


class GpuPut(GpuIn):
    """A GPU as an operator registers it (``PUT /v1/nodes/{name}``): a bad index is a 422."""

    index: int = Field(ge=0, le=MAX_GPU_INDEX)


class NodeLabels(Request):
    """``POST /nodes/{name}/labels`` (``gpufleet node label NODE +a -b``): features an
    operator adds to a node or takes off, for jobs' ``--constraint``."""

    add: list[Feature] = Field(default_factory=list, max_length=64)
    remove: list[Feature] = Field(default_factory=list, max_length=64)


class NodePut(Request):
    pool: Name = "default"
    leaf: Name = "leaf-0"
    rack: Name = "rack-0"
    cordoned: bool = False
    gpus: list[GpuPut] = Field(default_factory=list, max_length=1024)


class ObservedJob(Request):
    job_id: int
    state: Literal["running", "exited", "lost"] = Field(
        description="lost: the attempt vanished without an exit code (its node restarted); it is requeued"
    )
    exit_code: int | None = Field(default=None, ge=-INT32 - 1, le=INT32)
    attempt: int | None = Field(
        default=None,
        description="the DesiredJob.attempt this is about; required to change anything: an observation "
        "without one, or about an attempt the node does not hold, is dropped",
    )
    endpoint: Annotated[str, StringConstraints(pattern=r"^https?://[!-~]{1,240}$")] | None = Field(
        default=None, description="a service replica: where it serves (its node's address and $PORT)"
    )
    ready: bool | None = Field(default=None, description="a service replica: its health path answers 2xx")
    models: list[ReplicaModel] | None = Field(
        default=None,
        max_length=MAX_MODELS,
        description="a service replica: its wished models as it has them (api/servicemodels.py)",
    )


class MigTelemetry(Request):
    """Latest memory readings of one MIG instance (its GPU instance's: the compute
    instances in it share that memory). No utilisation: NVML reports none per instance
    (dcgm-exporter reads DCGM's profiling counters for it)."""

    gpu_instance_id: int = Field(ge=0, le=INT32)
    memory_used_mb: int | None = None
    memory_total_mb: int | None = None


class GpuTelemetry(Request):
    """Latest readings of one GPU (hot data: kept in the server's memory, not in SQL).
    Readings of an index no GPU can have are dropped by the sync (like its inventory,
    they do not refuse the whole sync)."""

    index: int = Field(ge=-INT32 - 1, le=INT32)
    utilization_pct: float | None = None
    memory_used_mb: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    throttle_reasons: list[Annotated[str, StringConstraints(max_length=64)]] = Field(
        default_factory=list, max_length=32
    )
    ecc_sbe: int | None = None
    ecc_dbe: int | None = None
    xid_events: list[int] = Field(default_factory=list, max_length=256)
    pcie_replay: int | None = None
    retired_pages: int | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    pcie_max_gen: int | None = Field(
        default=None, ge=0, le=64, description="the most the GPU and its slot can do (issue 34)"
    )
    pcie_max_width: int | None = Field(default=None, ge=0, le=64)
    nvlink_down: list[Annotated[int, Field(ge=0, le=1024)]] = Field(
        default_factory=list, max_length=64, description="NVLink links NVML supports but reports inactive"
    )
    ecc_enabled: bool | None = Field(default=None, description="ECC mode now; None: not supported")
    ecc_pending: bool | None = Field(default=None, description="ECC mode after the next reboot")
    nvlink_peers: list[int] = Field(default_factory=list, max_length=1024)
    mig_enabled: bool | None = None
    lost: bool = False
    health: list[Annotated[str, StringConstraints(max_length=128)]] = Field(
        default_factory=list, max_length=32, description="why the agent calls this GPU unhealthy"
    )
    mig_instances: list[MigTelemetry] = Field(
        default_factory=list,
        max_length=7,
        description="a GPU in MIG mode: each instance's memory, by GPU instance id (older agents send none)",
    )


class LogChunkIn(Request):
    """Bytes ``offset``..``end`` of a job attempt's log file on the sending node, decoded
    as UTF-8 (``data`` may be shorter: a skipped hole or the cap's marker line). Stored
    only if ``offset`` is where the server's copy ends (idempotent). The agent reports an
    exit before all of the log is shipped: ``more`` then keeps the log open on the
    server, ``last`` (``offset == end`` if need be) closes it."""

    job_id: int
    attempt: int
    offset: int = Field(ge=0)
    end: int = Field(ge=0)
    data: Annotated[str, StringConstraints(max_length=262_144)]
    more: bool = Field(
        default=False, description="the attempt is over and more of its log follows this chunk"
    )
    last: bool = Field(
        default=False, description="the attempt is over and this chunk ends its log: nothing more will come"
    )

    @field_validator("data", mode="before")
    @classmethod
    def _clean(cls, value: object) -> object:
        """Cleaned, not refused: a job's output may hold any byte, and refusing it would
        stop the node's syncs for as long as that output is unshipped."""
        return clean_text(value) if isinstance(value, str) else value


class MigResult(Request):
    """What became of a MIG layout the server asked for (``SyncReply.mig``)."""

    gpu: int = Field(ge=0, le=MAX_GPU_INDEX)
    layout: list[Annotated[str, StringConstraints(min_length=1, max_length=32)]] = Field(max_length=7)
    error: Annotated[str, StringConstraints(max_length=512)] | None = Field(
        default=None, description="why the node could not apply it; None: applied"
    )


class PreflightFinding(Request):
    """One check of the agent's preflight (``agent/preflight.py``) that did not pass:
    ``fatal`` cordons the node with ``reason`` (the server uncordons nothing by itself),
    ``warning`` is an event."""

    check: Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,31}$")]
    severity: Literal["fatal", "warning"]
    gpu: int | None = Field(default=None, ge=0, le=MAX_GPU_INDEX)
    reason: Annotated[str, StringConstraints(min_length=1, max_length=256)]

    @field_validator("reason", mode="before")
    @classmethod
    def _clean(cls, value: object) -> object:
        """A driver's words: cleaned, not refused (it must not cost the node its sync)."""
        return clean_text(value) if isinstance(value, str) else value


class Preflight(Request):
    """The checks an agent ran at start or after an upgrade, sent until a sync is answered."""

    at: float = Field(ge=0, le=1e11, description="when it ran (the agent's clock)")
    findings: list[PreflightFinding] = Field(default_factory=list, max_length=1024)


class NodeSync(Request):
    gpus: list[GpuIn] | None = Field(default=None, max_length=1024)
    telemetry: list[GpuTelemetry] | None = Field(default=None, max_length=1024)
    jobs: list[ObservedJob] = Field(default_factory=list, max_length=10_000)
    logs: list[LogChunkIn] = Field(default_factory=list, max_length=1024)
    leaf: Name | None = None
    rack: Name | None = None
    address: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = None
    driver_version: Annotated[str, StringConstraints(max_length=64)] | None = None
    cuda_version: Annotated[str, StringConstraints(max_length=32)] | None = None
    cpus: int | None = Field(default=None, ge=0, le=1_000_000)
    memory_mb: int | None = Field(default=None, ge=0, le=2**40)
    features: list[Feature] | None = Field(
        default=None, max_length=64, description="Slurm's node features (gpufleet agent --features)"
    )
    mig_results: list[MigResult] = Field(default_factory=list, max_length=1024)
    warning: Annotated[str, StringConstraints(max_length=512)] | None = Field(
        default=None,
        description="what the agent cannot enforce on this node (e.g. no cgroups: no job limits)",
    )
    steps: list[StepTaskIn] = Field(
        default_factory=list, max_length=10_000, description="job step tasks (srun) and their output"
    )
    upgrade: UpgradeReport | None = Field(
        default=None, description="how the driver upgrade the server asked for goes (api/upgrades.py)"
    )
    preflight: Preflight | None = Field(
        default=None, description="its preflight's result, after start or an upgrade (issue 34)"
    )


class PeerNode(Reply):
    node: str
    address: str
    gpus: list[int]


class ServiceProbe(Reply):
    """What an agent needs to run a service replica: where to probe its readiness, and
    (in a container) the port inside to publish on the node's ``$PORT``."""

    health_path: str
    port: int
    models: dict[str, bool] = Field(
        default_factory=dict, description="the service's wished models: name -> loaded (api/servicemodels.py)"
    )


class ArrayTask(Reply):
    """A job array's task, for ``SLURM_ARRAY_*``."""

    array_job_id: int
    task_id: int
    count: int
    min: int
    max: int


class DesiredJob(Reply):
    job_id: int
    attempt: int = Field(description="identifies this placement of the job (a requeued job gets a new one)")
    name: str
    command: list[str]
    env: dict[str, str]
    image: str | None
    gpus: list[int]
    time_limit_s: float | None
    deadline: float | None
    user: str
    output: str | None
    error: str | None
    nodes: list[PeerNode] = Field(default_factory=list, description="the whole placement, master first")
    node_rank: int = 0
    master_addr: str = ""
    master_port: int = 0
    world_size: int = 0
    service: ServiceProbe | None = Field(
        default=None, description="set for a replica of an inference service: it gets $PORT and is probed"
    )
    pool: str = ""
    array: ArrayTask | None = None
    submit_dir: str | None = None
    workdir: str | None = None
    input: str | None = None
    signal: str | None = Field(default=None, description="[B:]NAME@SECONDS before the deadline")
    cpus_per_task: int = 0
    ntasks_per_node: int = 0
    cpus_per_node: int = 0
    mem_per_node_mb: int = 0
    steps: list[DesiredStep] = Field(default_factory=list, description="job step tasks to run here (srun)")
    credential: str | None = Field(
        default=None,
        description="the job's own credential (GPUFLEET_TOKEN in its environment): its owner's, "
        "valid while the job runs",
    )


class LogAck(Reply):
    job_id: int
    attempt: int
    end: int


class MigChange(Reply):
    """A MIG layout an operator set for one of the node's GPUs (``gpufleet node mig``),
    sent once no job holds that GPU: the agent applies it when idle and answers with a
    ``MigResult``. ``layout`` [] : the whole GPU (its instances removed, MIG mode off)."""

    gpu: int
    layout: list[str]


class SyncReply(Reply):
    node: str
    jobs: list[DesiredJob]
    log_acks: list[LogAck] = Field(default_factory=list)
    mig: list[MigChange] = Field(default_factory=list)
    step_acks: list[StepAck] = Field(default_factory=list)
    upgrade: UpgradeOrder | None = Field(
        default=None, description="a driver upgrade to carry out and verify (api/upgrades.py)"
    )
    lease: str | None = Field(
        default=None,
        description="an idle node's lease: while nothing changes, renew it (POST /v1/nodes/{name}/renew) "
        "instead of syncing in full",
    )


class NodeRenew(Request):
    """``POST /v1/nodes/{name}/renew``: an idle node that has nothing new to say (the same
    inventory, no job, no log, telemetry within its dead bands) renews the lease of its
    last full sync (Kubernetes' node lease: tens of bytes)."""

    lease: str = Field(min_length=1, max_length=64)


class RenewReply(Reply):
    """``renewed``: the node's liveness was renewed; false: sync in full now (the lease is
    unknown here, expired, or the node's desired state may have changed since)."""

    node: str
    renewed: bool


class WaitReply(Reply):
    """``GET /v1/nodes/{name}/wait``: the node's dispatch version (``BOOT.N``). A version
    other than the one the agent sent means its desired set may have changed: sync now."""

    node: str
    version: str


class JoinTokenIn(Request):
    node: NodeName | None = Field(
        default=None, description="bind to this node; default: the first node that uses it"
    )
    ttl: float | None = Field(
        default=None,
        gt=0,
        le=366 * 86_400,
        description="seconds the token may buy the node's certificate (it does so once); default 1 h",
    )


class JoinTokenOut(Reply):
    id: int
    node: str | None
    hint: str
    created_at: float
    expires_at: float | None = Field(default=None, description="it buys a certificate until then, once")
    token: str = Field(description="shown only once")


class SyncStats(Reply):
    """Server-side sync handling time over the last minute; ``count``: syncs since start."""

    count: int
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None


class FleetSummary(Reply):
    nodes: int
    nodes_ready: int
    gpus: int
    gpus_busy: int
    gpus_unhealthy: int
    jobs: dict[str, int]
    sync: SyncStats


class MigInstanceOut(Reply):
    uuid: str
    profile: str
    gpu_instance_id: int
    compute_instance_id: int
    start: int
    size: int
    memory_mb: int


class GpuOut(Reply):
    index: int
    uuid: str
    model: str
    memory_mb: int
    nvlink_domain: int
    healthy: bool
    job_id: int | None
    telemetry: GpuTelemetry | None = None
    cordoned: bool = False
    cordon_reason: str | None = None
    mig_enabled: bool | None = None
    mig_instances: list[MigInstanceOut] = Field(default_factory=list)
    mig_pending: list[str] | None = Field(
        default=None, description="a layout asked for and not yet applied ([]: the whole GPU)"
    )
    mig_error: str | None = Field(default=None, description="why the node could not apply the last layout")
    shared: bool = Field(default=False, description="takes GPU shares (gpufleet node share), not whole jobs")


class NodeOut(Reply):
    name: str
    pool: str
    leaf: str
    rack: str
    state: Literal["Ready", "NotReady"]
    cordoned: bool
    last_seen: float | None
    model: str
    gpus_total: int
    gpus_used: int
    gpus_free: int
    gpus: list[GpuOut]
    address: str | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    telemetry_at: float | None = None
    cordon_reason: str | None = None
    lost: bool = Field(default=False, description="declared lost: its jobs were requeued")
    draining: bool = False
    drain_deadline: float | None = None
    gpus_cordoned: int = 0
    cpus: int = Field(default=0, description="as its agent reports them (0: not reported)")
    memory_mb: int = Field(default=0, description="as its agent reports it, MiB (0: not reported)")
    warning: str | None = Field(default=None, description="what its agent says it cannot enforce")
    features: list[str] = Field(default_factory=list, description="as its agent reports them (--features)")
    labels: list[str] = Field(default_factory=list, description="features operators added (node label)")
