"""The API's request and response bodies. Requests forbid unknown fields, so a typo is
a 422 instead of a silently ignored option.

Every request body (``Request`` and its subclasses, here and in ``maint_schemas``,
``reservation_schemas``) refuses, in any field and at any depth (list items, dict keys
and values), what no database column can hold: a NUL character (PostgreSQL's text
cannot store U+0000), a lone surrogate (not Unicode: it cannot be encoded as UTF-8),
an integer beyond 64 bits. One validator on the base class, so a field added later is
covered without thinking of it. The one exception is log output from a node
(``LogChunkIn.data``): shown, never interpreted, so it is cleaned instead of refused.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal, Self, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
NODE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
"""A node's name: at most 63 characters (a host name's first label, what the agent
takes by default), letters, digits, ``.``, ``_``, ``-``, not starting with a symbol.
It is joined with commas (``Job.stopping_on``) and prefixed in actors (``node:<name>``),
so it never holds a comma, and every column it goes into has room for it."""
NodeName = Annotated[str, StringConstraints(pattern=NODE_NAME)]
Role = Literal["admin", "operator", "user"]
INT32 = 2**31 - 1
"""The largest value of an ``Integer`` column (PostgreSQL's ``integer``)."""
INT64 = 2**63 - 1
MAX_GPU_INDEX = 1023
_SURROGATE = re.compile("[\ud800-\udfff]")
_FINE: frozenset[type] = frozenset({float, bool, type(None)})


def unstorable(value: object) -> str | None:
    """Why ``value`` (a validated field value) cannot be stored, or None. Nested models
    are skipped: their own validator has run."""
    kind = type(value)
    if kind in _FINE:
        return None
    if kind is str:
        text: str = value  # type: ignore[assignment]
        if "\x00" in text:
            return "contains a NUL character (U+0000), which cannot be stored"
        if not text.isascii() and _SURROGATE.search(text) is not None:
            return "is not valid Unicode text (it holds a lone surrogate)"
        return None
    if kind is int:
        return None if -INT64 - 1 <= value <= INT64 else "is out of range (at most 64-bit integers)"  # type: ignore[operator]
    if isinstance(value, str | int):  # a subclass (an enum member...): as its base
        return unstorable(str(value) if isinstance(value, str) else int(value))
    if isinstance(value, list | tuple | set | frozenset):
        for i, item in enumerate(value):
            why = unstorable(item)
            if why is not None:
                return f"item {i} {why}"
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            shown = repr(key[:40] if isinstance(key, str) else key)
            why = unstorable(key)
            if why is not None:
                return f"key {shown} {why}"
            why = unstorable(item)
            if why is not None:
                return f"the value of {shown} {why}"
    return None


def clean_text(text: str) -> str:
    """Output to show, made storable: NUL becomes U+2400 "\u2400" (the symbol for it), a
    lone surrogate U+FFFD; every other character stays as it is."""
    if "\x00" in text:
        text = text.replace("\x00", "\u2400")
    if not text.isascii():
        text = _SURROGATE.sub("\ufffd", text)
    return text


def _may_be_unstorable(annotation: object) -> bool:
    """Whether a field of this type can hold a value ``unstorable`` refuses: not for
    floats, booleans, literals and nested models (those check themselves)."""
    if annotation in _FINE or annotation is type(None):
        return False
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return False
    origin = get_origin(annotation)
    if origin is Literal:
        return False
    if origin is Annotated:
        return _may_be_unstorable(get_args(annotation)[0])
    if origin is not None:
        return any(_may_be_unstorable(a) for a in get_args(annotation) if a is not Ellipsis)
    return True


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    _checked: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls._checked = tuple(n for n, f in cls.model_fields.items() if _may_be_unstorable(f.annotation))

    @model_validator(mode="after")
    def _storable(self) -> Self:
        """One pass over the fields that may hold text or integers (a validator per
        field cost several times more: a sync with eight GPUs has some 250 fields)."""
        errors: list[InitErrorDetails] = []
        values = self.__dict__
        for name in self._checked:
            value = values[name]
            kind = type(value)
            if (
                kind in _FINE
                or (kind is int and -INT64 - 1 <= value <= INT64)
                or (kind is str and value.isascii() and "\x00" not in value)
                or (kind is list and not value)
            ):
                continue  # the common cases, without a call
            why = unstorable(value)
            if why is not None:
                unfit = PydanticCustomError("unstorable", "{why}", {"why": why})
                errors.append(InitErrorDetails(type=unfit, loc=(name,), input=value))
        if errors:
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        return self


class Reply(BaseModel):
    model_config = ConfigDict(frozen=True)


# -- jobs ---------------------------------------------------------------------------------


class JobSubmit(Request):
    command: list[Annotated[str, StringConstraints(max_length=65_536)]] = Field(min_length=1, max_length=4096)
    name: Annotated[str, StringConstraints(max_length=128)] = ""
    gpus: int = Field(
        default=1, ge=0, le=100_000, description="GPUs in all: at least 1; 0 only in a CPU-only pool"
    )
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

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpus_not_negative(cls, value: object) -> object:
        """Below 0: say what is allowed, not only the schema's bound (0 is refused in a
        GPU pool, which only the service knows)."""
        if isinstance(value, int) and not isinstance(value, bool) and value < 0:
            raise PydanticCustomError(
                "gpus_negative", "a job needs at least 1 GPU (0 only in a CPU-only pool)"
            )
        return value


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


class GpuPut(GpuIn):
    """A GPU as an operator registers it (``PUT /v1/nodes/{name}``): a bad index is a 422."""

    index: int = Field(ge=0, le=MAX_GPU_INDEX)


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

    @field_validator("data", mode="before")
    @classmethod
    def _clean(cls, value: object) -> object:
        """Cleaned, not refused: a job's output may hold any byte, and refusing it would
        stop the node's syncs for as long as that output is unshipped."""
        return clean_text(value) if isinstance(value, str) else value


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
    node: NodeName | None = Field(
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
    default_team: str | None = Field(
        default=None,
        description="the team a job is charged to when its submission names none (Slurm's DefaultAccount)",
    )


class DefaultTeamIn(Request):
    team: Name


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
    expires_in: str | float | None = Field(
        default=None,
        description="lifetime: seconds, or a duration such as 1h or 30d; at most (and by default) "
        "the server's --token-ttl",
    )


class TokenOut(Reply):
    id: int
    user: str
    name: str
    hint: str
    created_at: float
    revoked: bool
    kind: str = Field(default="api", description="api, session (a web sign-in) or bootstrap")
    expires_at: float | None = Field(default=None, description="null: never (the bootstrap token)")


class TokenCreated(TokenOut):
    token: str = Field(description="shown only once")


class Health(Reply):
    status: str
    detail: str = ""
