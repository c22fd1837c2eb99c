"""The API's request and response bodies. Requests forbid unknown fields, so a typo is
a 422 instead of a silently ignored option."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
Role = Literal["admin", "operator", "user"]


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Reply(BaseModel):
    model_config = ConfigDict(frozen=True)


# -- jobs ---------------------------------------------------------------------------------


class JobSubmit(Request):
    command: list[Annotated[str, StringConstraints(max_length=65_536)]] = Field(min_length=1, max_length=4096)
    name: Annotated[str, StringConstraints(max_length=128)] = ""
    gpus: int = Field(default=1, ge=0, le=100_000)
    gpus_per_node: int = Field(default=0, ge=0, le=1024)
    nodes: int = Field(default=0, ge=0, le=10_000)
    gpu_type: Annotated[str, StringConstraints(min_length=1, max_length=64)] | None = None
    team: Name | None = None
    pool: Name = "default"
    priority: int = Field(default=0, ge=-1000, le=1000)
    time_limit: str | float | None = Field(
        default=None, description="seconds, or a duration such as 90s, 30m, 2h, 1-00:00:00"
    )
    image: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = None
    env: dict[str, Annotated[str, StringConstraints(max_length=65_536)]] = Field(default_factory=dict)
    requeue: bool = True
    max_attempts: int = Field(default=5, ge=1, le=1000, description="attempts in all, the first included")
    requeue_backoff: str | float = Field(
        default=10.0,
        description="delay before the 2nd requeue (doubling after, at most 10 min); the 1st is immediate",
    )
    output: Annotated[str, StringConstraints(max_length=512)] | None = None
    error: Annotated[str, StringConstraints(max_length=512)] | None = None
    reservation: int | None = Field(
        default=None, ge=1, description="run only inside this reservation (its owners only)"
    )


class PriorityChange(Request):
    priority: int = Field(ge=-1000, le=1000)


class JobEventOut(Reply):
    at: float
    actor: str
    from_state: str | None
    to_state: str
    reason: str


class AllocationOut(Reply):
    node: str
    gpus: list[int]


class JobOut(Reply):
    id: int
    name: str
    user: str
    team: str
    pool: str
    state: str
    gpus: int
    gpus_per_node: int
    nodes: int
    gpu_type: str | None
    priority: int
    time_limit_s: float | None
    command: list[str]
    image: str | None
    requeue: bool
    max_attempts: int = 5
    attempts: int = Field(default=0, description="requeues after failures (node lost, GPU fault, drain)")
    submit_time: float
    scheduled_at: float | None
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    attained_service_s: float
    queue_position: int | None
    estimated_start: float | None
    wait_reason: str | None
    allocation: list[AllocationOut]
    reservation: int | None = Field(
        default=None, description="the reservation it runs in (submit --reservation)"
    )
    cost: float = Field(default=0.0, description="accrued while it held GPUs, at the prices in force")
    energy_kwh: float = Field(default=0.0, description="from its GPUs' power telemetry")
    warnings: list[str] = Field(default_factory=list, description="e.g. its team is over its soft budget")


class JobDetail(JobOut):
    env: dict[str, str]
    output: str | None
    error: str | None
    events: list[JobEventOut]


class JobPage(Reply):
    items: list[JobOut]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null at the end")
    total: int | None = None


# -- nodes --------------------------------------------------------------------------------


class GpuIn(Request):
    index: int = Field(ge=0, le=1023)
    uuid: Annotated[str, StringConstraints(max_length=64)] = ""
    model: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    memory_mb: int = Field(default=81_920, ge=0)
    nvlink_domain: int = Field(default=0, ge=0)
    healthy: bool = True


class NodePut(Request):
    pool: Name = "default"
    leaf: Name = "leaf-0"
    rack: Name = "rack-0"
    cordoned: bool = False
    gpus: list[GpuIn] = Field(default_factory=list, max_length=1024)


class ObservedJob(Request):
    job_id: int
    state: Literal["running", "exited", "lost"] = Field(
        description="lost: the attempt vanished without an exit code (its node restarted); it is requeued"
    )
    exit_code: int | None = None
    attempt: int | None = Field(
        default=None, description="the DesiredJob.attempt this is about; a stale attempt changes no state"
    )


class GpuTelemetry(Request):
    """Latest readings of one GPU (hot data: kept in the server's memory, not in SQL)."""

    index: int = Field(ge=0, le=1023)
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
    nvlink_peers: list[int] = Field(default_factory=list, max_length=1024)
    mig_enabled: bool | None = None
    lost: bool = False
    health: list[Annotated[str, StringConstraints(max_length=128)]] = Field(
        default_factory=list, max_length=32, description="why the agent calls this GPU unhealthy"
    )


class LogChunkIn(Request):
    """Bytes ``offset``..``end`` of a job attempt's log file on the sending node, decoded
    as UTF-8. Stored only if ``offset`` is where the server's copy ends (idempotent)."""

    job_id: int
    attempt: int
    offset: int = Field(ge=0)
    end: int = Field(ge=0)
    data: Annotated[str, StringConstraints(max_length=262_144)]


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


class PeerNode(Reply):
    node: str
    address: str
    gpus: list[int]


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


class LogAck(Reply):
    job_id: int
    attempt: int
    end: int


class SyncReply(Reply):
    node: str
    jobs: list[DesiredJob]
    log_acks: list[LogAck] = Field(default_factory=list)


class JoinTokenIn(Request):
    node: Name | None = Field(
        default=None, description="bind to this node; default: the first node that uses it"
    )


class JoinTokenOut(Reply):
    id: int
    node: str | None
    hint: str
    created_at: float
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


# -- pools, users, teams, tokens ---------------------------------------------------------


class PoolIn(Request):
    name: Name
    gpu: bool = Field(default=True, description="false: a CPU-only pool, for 0-GPU jobs")
    description: Annotated[str, StringConstraints(max_length=256)] = ""


class PoolPatch(Request):
    description: Annotated[str, StringConstraints(max_length=256)] | None = None


class PoolOut(Reply):
    name: str
    gpu: bool
    description: str
    nodes: int


class UserIn(Request):
    name: Name
    role: Role = "user"
    teams: list[Name] = Field(default_factory=list, max_length=64)


class UserOut(Reply):
    id: int
    name: str
    role: Role
    teams: list[str]


class UserCreated(UserOut):
    token: str = Field(description="shown only once")


class TeamIn(Request):
    name: Name


class MemberIn(Request):
    user: Name


class QuotaIn(Request):
    gpus: int = Field(ge=0, le=1_000_000)
    limit: int | None = Field(default=None, ge=0, le=1_000_000)


class TeamOut(Reply):
    name: str
    members: list[str]
    quota_gpus: int | None
    quota_limit: int | None
    budget_soft: float | None = None
    budget_hard: float | None = None
    month_cost: float | None = Field(default=None, description="spent this month (with a budget set)")


class BudgetIn(Request):
    soft: float | None = Field(default=None, ge=0, description="monthly spend that warns; null: none")
    hard: float | None = Field(
        default=None, ge=0, description="monthly spend that holds new jobs; null: none"
    )


# -- prices and usage ---------------------------------------------------------------------------


class PriceNow(Reply):
    gpu_type: str
    price: float = Field(description="per GPU-hour now, priority 0")
    base: float
    next_cheaper_at: float | None = Field(description="when the price first drops, within a week")
    next_cheaper_price: float | None
    in_fleet: bool = Field(default=False, description="some registered GPU is of this model")


class PricesOut(Reply):
    schedule: dict[str, object] | None = Field(description="the schedule in force; null: no prices set")
    set_at: float | None
    set_by: str | None
    now: float
    prices: list[PriceNow]


class UsageRowOut(Reply):
    key: str
    jobs: int
    gpu_hours: float
    cost: float
    energy_kwh: float
    avg_util_pct: float | None = Field(description="of allocated GPUs, over the time with telemetry")
    idle_gpu_hours: float = Field(description="allocated GPU-hours observed at under 5% utilisation")


class UsageReport(Reply):
    by: str
    start: float
    end: float
    timezone: str
    rows: list[UsageRowOut]
    total: UsageRowOut


class TokenIn(Request):
    name: Annotated[str, StringConstraints(min_length=1, max_length=64)] = "cli"
    user: Name | None = Field(default=None, description="admins only: create for another user")


class TokenOut(Reply):
    id: int
    user: str
    name: str
    hint: str
    created_at: float
    revoked: bool


class TokenCreated(TokenOut):
    token: str = Field(description="shown only once")


class Health(Reply):
    status: str
    detail: str = ""
