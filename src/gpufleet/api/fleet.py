"""Bodies of the fleet page's read endpoints (``routers/web.py``)."""

from __future__ import annotations

from pydantic import Field

from gpufleet.api.base import Reply


class Suspicion(Reply):
    """Why failed jobs' output makes a node suspect (issue 34, ``decide/suspicion.py``):
    the signature that blames it most, in failed jobs of how many distinct users."""

    signature: str
    diagnosis: str = Field(description="the signature's diagnosis ('' : no longer in the table)")
    users: int = Field(description="distinct users whose failed jobs on the node carry it, within the window")
    threshold: int = Field(description="users that cordon the node (0: never cordoned for it)")
    window_s: float
    jobs: list[int] = Field(description="the evidence's last jobs, oldest first (at most 5)")
    cordoned: bool = Field(description="the diagnosis cordoned the node for it (it still is)")


class SnapshotNode(Reply):
    name: str
    pool: str
    leaf: str
    rack: str
    ready: bool
    cordoned: bool
    cordon_reason: str | None = Field(default=None, description="why the node is cordoned (null: it is not)")
    warning: str | None = Field(
        default=None, exclude_if=lambda v: v is None, description="what its agent says it cannot enforce"
    )
    cordoned_gpus: dict[int, str] = Field(
        default_factory=dict,
        description="GPU index -> reason, for each GPU cordoned on its own (a node cordon covers all)",
    )
    model: str
    gpus: list[list[float | int | None]] = Field(
        description="per GPU: [index, util %, temp C, memory used MiB, memory MiB, flags, job id]; "
        "flags: 1 hot, 2 error, 4 cordoned, 8 allocated"
    )
    mig: dict[int, list[tuple[str, int, int]]] = Field(
        default_factory=dict,
        exclude_if=lambda v: not v,
        description="GPU index -> its MIG instances as [profile, first memory slice 0..7, memory slices "
        "1..8], by first slice, for each GPU in MIG mode (left out of the JSON on a node with none)",
    )
    mig_pending: dict[int, str] = Field(
        default_factory=dict,
        exclude_if=lambda v: not v,
        description='GPU index -> the MIG layout asked for and not yet applied ("2g.20gb,3g.40gb", or '
        '"whole": MIG off), for each GPU with one (left out of the JSON on a node with none)',
    )
    suspect: Suspicion | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="the failure diagnosis suspects the node, or cordoned it (left out of the JSON when not)",
    )


class FleetSnapshot(Reply):
    at: float
    hot_c: float
    jobs: dict[str, int]
    nodes: list[SnapshotNode]


class NodeJob(Reply):
    id: int
    name: str
    user: str
    team: str
    state: str
    gpus: int
    gpus_here: list[int]
    started_at: float | None


class NodeFailure(Reply):
    """A failed job attempt whose output this node shipped, and what it matched (issue 34).
    ``name``, ``user`` and ``line`` are the job owner's: empty for others' jobs unless
    you are an operator. All of it is data: the page sets it as text, never as markup."""

    job_id: int
    attempt: int
    name: str
    user: str
    at: float = Field(description="when it was read (queued, while pending)")
    pending: bool = Field(description="its output is not read yet")
    signature: str | None = Field(description="the signature found (null: none matched, or pending)")
    diagnosis: str = ""
    hint: str = ""
    blame: str | None = Field(default=None, description="node, job or unknown")
    line: str = Field(default="", description="the matching line, cut to 200 characters")


class NodeHistory(Reply):
    node: str
    now: float
    series: list[str]
    samples: list[list[float | list[list[float | None]]]] = Field(
        description="[at, [[value of each series] per GPU]] oldest first"
    )
    jobs: list[NodeJob]
    failures: list[NodeFailure] = Field(
        default_factory=list, description="its last failed job attempts (at most 10), newest first"
    )


class ServerOut(Reply):
    id: str = Field(description="host:pid:random, one per server process")
    url: str
    version: str
    started_at: float
    seen_s_ago: float = Field(description="since its last heartbeat (every third of the lease TTL)")
    up: bool = Field(description="heartbeat within the lease TTL")
    leader: bool


class ServersOut(Reply):
    """``GET /v1/fleet/servers`` (``gpufleet status``): the servers of this database and the
    leader's lease (PostgreSQL); one server, its own leader, on SQLite."""

    mode: str = Field(description="'single' (SQLite: one server) or 'ha' (PostgreSQL: one leader)")
    me: str = Field(description="the server that answered")
    leader: str | None = Field(description="the server holding the lease (None: no leader now)")
    epoch: int = Field(description="the fencing token: raised at every change of leader")
    lease_age_s: float | None = Field(description="since the leader last renewed its lease")
    lease_expires_in_s: float | None = None
    servers: list[ServerOut]
