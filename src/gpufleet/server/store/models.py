"""SQLAlchemy models: the durable state. Times are UNIX seconds (float) from the
server's clock, so the scheduler core gets them as they are."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
    true,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class User(Base):
    __tablename__ = "users"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float] = mapped_column(Float)


class Team(Base):
    __tablename__ = "teams"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    quota_gpus: Mapped[int | None] = mapped_column(Integer, nullable=True)
    quota_limit: Mapped[int | None] = mapped_column(Integer, nullable=True)
    budget_soft: Mapped[float | None] = mapped_column(Float, nullable=True)
    """Monthly spend at which the team is warned (None: no warning)."""
    budget_hard: Mapped[float | None] = mapped_column(Float, nullable=True)
    """Monthly spend at which its pending jobs are held (None: never held)."""


class Membership(Base):
    __tablename__ = "memberships"
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), primary_key=True)
    is_default: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """The user's default team (Slurm's DefaultAccount): at most one per user."""


class Token(Base):
    """An API token; ``token_hash`` is HMAC-SHA256 with the server's key (``tokenkey.py``;
    plain sha256 in rows older than 0008 until their first use)."""

    __tablename__ = "tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    hint: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    """None: never (only the bootstrap admin token; ``services/tokens.py``)."""
    kind: Mapped[str] = mapped_column(String(16), default="api", server_default="api")
    """``api``, ``session`` (the fleet page's sign-in) or ``bootstrap`` (the first admin's)."""


DEFAULT_POOL = "default"
"""The pool created with the schema; it cannot be deleted (``services/pools.delete_pool``)."""


class Pool(Base):
    __tablename__ = "pools"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    gpu: Mapped[bool] = mapped_column(Boolean, default=True)
    description: Mapped[str] = mapped_column(String(256), default="")
    default_cpus_per_gpu: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """CPUs a GPU job asks for per GPU when it says nothing (0: none; Slurm's
    ``DefCpuPerGPU``). A 0-GPU job that says nothing asks for 1 CPU."""
    default_mem_per_cpu_mb: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """Memory per requested CPU when a job says nothing (0: none; ``DefMemPerCPU``)."""
    is_default: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """Slurm's ``Default=YES``: a job that names no pool goes here (at most one pool;
    none: the pool ``default``)."""


class QosRow(Base):
    """A Slurm QOS (``gpufleet admin qos``): a priority added to its jobs', per-user
    limits the scheduler enforces (``scheduler/qos.py``), whether its jobs may be
    preempted; one may be the default (jobs without ``--qos`` get it)."""

    __tablename__ = "qos"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    priority: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    max_gpus_per_user: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_jobs_per_user: Mapped[int | None] = mapped_column(Integer, nullable=True)
    preemptable: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    is_default: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    description: Mapped[str] = mapped_column(String(256), default="", server_default="")


class LicenseRow(Base):
    """A license an operator declared (Slurm's ``Licenses=NAME:COUNT``), for ``-L``."""

    __tablename__ = "licenses"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    count: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class NodeRow(Base):
    __tablename__ = "nodes"
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    pool: Mapped[str] = mapped_column(ForeignKey("pools.name"), index=True)
    leaf: Mapped[str] = mapped_column(String(64), default="leaf-0")
    rack: Mapped[str] = mapped_column(String(64), default="rack-0")
    cordoned: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[float] = mapped_column(Float)
    last_seen: Mapped[float | None] = mapped_column(Float, nullable=True)
    address: Mapped[str | None] = mapped_column(String(256), nullable=True)
    cpus: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """CPUs the agent reports (0: unknown, not a limit)."""
    memory_mb: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """Memory the agent reports, MiB (0: unknown, not a limit)."""
    """Where other nodes reach this one (MASTER_ADDR of multi-node jobs); from its agent."""
    cordon_reason: Mapped[str | None] = mapped_column(String(256), nullable=True)
    lost_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    """When the node-lifecycle loop declared it lost (its jobs requeued); None once back."""
    drain_deadline: Mapped[float | None] = mapped_column(Float, nullable=True)
    """Draining: jobs still here at this time are requeued (None: not draining)."""
    drain_requeue: Mapped[bool] = mapped_column(Boolean, default=False)
    warning: Mapped[str | None] = mapped_column(String(512), nullable=True)
    """What its agent says it cannot enforce (no cgroups: no memory/pids limits)."""
    features: Mapped[list[str]] = mapped_column(JSON, default=list, server_default="[]")
    """Slurm's node features as its agent reports them (``gpufleet agent --features``)."""
    labels: Mapped[list[str]] = mapped_column(JSON, default=list, server_default="[]")
    """Features an operator added (``gpufleet node label``); ``--constraint`` matches
    both, and the GPU model."""


class GpuRow(Base):
    __tablename__ = "gpus"
    node: Mapped[str] = mapped_column(ForeignKey("nodes.name", ondelete="CASCADE"), primary_key=True)
    index: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(64), default="")
    model: Mapped[str] = mapped_column(String(64))
    memory_mb: Mapped[int] = mapped_column(Integer)
    nvlink_domain: Mapped[int] = mapped_column(Integer, default=0)
    healthy: Mapped[bool] = mapped_column(Boolean, default=True)
    """The agent's own verdict (it sends it with every inventory)."""
    cordoned: Mapped[bool] = mapped_column(Boolean, default=False)
    """The server's: a health rule or an operator took this GPU out of service."""
    cordon_reason: Mapped[str | None] = mapped_column(String(256), nullable=True)
    cordon_rule: Mapped[str | None] = mapped_column(String(32), nullable=True)
    """The health rule that cordoned it (None: an operator)."""
    cordoned_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    mig_enabled: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    """MIG mode, as the agent reports it (None: not reported). A MIG GPU is never
    scheduled whole."""
    mig_instances: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list, server_default="[]")
    """Its MIG devices (``api.nodes.MigInstanceIn``'s fields), as the agent reports them."""
    mig_pending: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    """The layout an operator asked for, until the agent answers ([]: the whole GPU)."""
    mig_error: Mapped[str | None] = mapped_column(String(512), nullable=True)
    """Why the node could not apply the last layout asked for."""
    shared: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """An operator marked it shared (``gpufleet node share``): it takes GPU shares
    (``migindex.SHARE_UNITS`` units) and is never handed out whole."""


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_state_id", "state", "id"),
        # Every agent sync asks whether a job waits for this node's stop confirmation:
        # only the few jobs with ``stopping_on`` set are in this index. It holds their
        # ids, not the node list (a B-tree entry has a size limit; the list does not).
        Index(
            "ix_jobs_stopping",
            "id",
            sqlite_where=text("stopping_on IS NOT NULL"),
            postgresql_where=text("stopping_on IS NOT NULL"),
        ),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id"))
    pool: Mapped[str] = mapped_column(ForeignKey("pools.name"))
    gpus: Mapped[int] = mapped_column(Integer)
    gpus_per_node: Mapped[int] = mapped_column(Integer, default=0)
    nodes: Mapped[int] = mapped_column(Integer, default=0)
    gpu_type: Mapped[str | None] = mapped_column(String(64), nullable=True)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    time_limit_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    command: Mapped[list[str]] = mapped_column(JSON)
    env: Mapped[dict[str, Any]] = mapped_column(JSON)
    image: Mapped[str | None] = mapped_column(String(256), nullable=True)
    requeue: Mapped[bool] = mapped_column(Boolean, default=True)
    max_attempts: Mapped[int] = mapped_column(Integer, default=5)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    """Requeues after a failure (node lost, GPU fault, drain); preemptions do not count."""
    requeue_backoff_s: Mapped[float] = mapped_column(Float, default=10.0)
    not_before: Mapped[float | None] = mapped_column(Float, nullable=True)
    """A requeued job is not placed before this time (its backoff)."""
    output: Mapped[str | None] = mapped_column(String(512), nullable=True)
    error: Mapped[str | None] = mapped_column(String(512), nullable=True)
    state: Mapped[str] = mapped_column(String(16))
    version: Mapped[int] = mapped_column(Integer, default=0)
    submit_time: Mapped[float] = mapped_column(Float)
    pending_since: Mapped[float] = mapped_column(Float)
    scheduled_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    attained_service_s: Mapped[float] = mapped_column(Float, default=0.0)
    executed_s: Mapped[float] = mapped_column(Float, default=0.0)
    stopping_on: Mapped[str | None] = mapped_column(Text, nullable=True)
    """Nodes (comma-separated: node names hold no comma) told to stop this job's attempt
    ``stopping_attempt`` that have not confirmed yet. Unbounded: a job may span
    thousands of nodes."""
    stopping_attempt: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    """The attempt (``transitions.attempt_of``) the ``stopping_on`` nodes were told to
    stop: the only one of this job they may still ship output for. Meaningful while
    ``stopping_on`` is set; None in rows stopped before it existed (any attempt then)."""
    # The last scheduling pass's view of a waiting job (PendingStatus).
    queue_position: Mapped[int | None] = mapped_column(Integer, nullable=True)
    estimated_start: Mapped[float | None] = mapped_column(Float, nullable=True)
    wait_reason: Mapped[str | None] = mapped_column(String(512), nullable=True)
    reservation_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    """The reservation this job must run in (``submit --reservation``); None: any GPUs."""
    # Accounting (``server/store/ledger.py``): accrued while the job holds GPUs.
    cost: Mapped[float] = mapped_column(Float, default=0.0)
    energy_wh: Mapped[float] = mapped_column(Float, default=0.0)
    accrued_to: Mapped[float | None] = mapped_column(Float, nullable=True)
    """Cost is accrued up to here; None: the job holds no GPUs (nothing accrues)."""
    charge_model: Mapped[str | None] = mapped_column(String(64), nullable=True)
    """The GPU model of its current allocation (its price)."""
    # Inference services (``server/services/servicectl.py``): a replica is a job of kind
    # ``service``; the columns below are NULL/False for a batch job.
    kind: Mapped[str] = mapped_column(String(16), default="batch", server_default="batch")
    service_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    replica: Mapped[int | None] = mapped_column(Integer, nullable=True)
    """The replica's slot in its service (0..replicas-1; a surge replica takes the next)."""
    generation: Mapped[int | None] = mapped_column(Integer, nullable=True)
    """The service spec generation this replica runs."""
    endpoint: Mapped[str | None] = mapped_column(String(256), nullable=True)
    """Where the replica serves (``http://host:port``), as its agent reports it."""
    ready: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    ready_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    draining_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    """Taken out of the gateway's endpoints at this time; stopped after the drain time."""
    warm: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """A standby replica of a service's warm pool: ready, not in rotation (priced at the
    price schedule's ``warm`` factor)."""
    model_states: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)
    """A replica's wished models as its agent last saw them (``api.servicemodels.
    ReplicaModel`` as JSON: name, state, reason); None: nothing reported."""
    # Job arrays and dependencies (Slurm's ``--array``, ``--dependency``).
    array_job_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    """The array this job is a task of: the id of its first task (Slurm's ArrayJobId)."""
    array_task_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    array_limit: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """``%N``: at most this many tasks of the array run at once (0: no limit)."""
    array_info: Mapped[dict[str, int] | None] = mapped_column(JSON, nullable=True)
    """The array's task count, min and max (``SLURM_ARRAY_TASK_COUNT/MIN/MAX``)."""
    dependency: Mapped[str | None] = mapped_column(String(1024), nullable=True)
    """The dependency as given, in canonical form (``scheduler/deps.py``)."""
    kill_on_invalid_dep: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # Slurm's batch options (``cli/sbatch.py``), as the agent and the scheduler need them.
    submit_dir: Mapped[str | None] = mapped_column(String(1024), nullable=True)
    """Where it was submitted from (``SLURM_SUBMIT_DIR``; the default working dir)."""
    workdir: Mapped[str | None] = mapped_column(String(1024), nullable=True)
    """``--chdir``."""
    input: Mapped[str | None] = mapped_column(String(512), nullable=True)
    signal: Mapped[str | None] = mapped_column(String(32), nullable=True)
    """``--signal``: ``[B:]SIG[@SECONDS]`` (``slurmopts.parse_signal``)."""
    cpus_per_task: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    ntasks_per_node: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    cpus_per_node: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """CPUs it needs on each of its nodes (0: none asked, the pool's default applied)."""
    mem_per_node_mb: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """Memory it needs on each of its nodes, MiB (0: none)."""
    begin_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    """``--begin``: not started before this time."""
    deadline: Mapped[float | None] = mapped_column(Float, nullable=True)
    """``--deadline``: cancelled once it can no longer end by then."""
    max_price: Mapped[float | None] = mapped_column(Float, nullable=True)
    """``--max-price``: waits until a GPU-hour costs at most this (but starts in time for
    ``deadline``)."""
    constraint: Mapped[str | None] = mapped_column(String(256), nullable=True)
    """``--constraint`` over node features, canonical (``scheduler/features.py``)."""
    exclude: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    """``--exclude``: nodes it never runs on."""
    qos: Mapped[str | None] = mapped_column(String(64), nullable=True)
    """Its QOS (``--qos``, else the default QOS; None: none), by name (``QosRow``)."""
    licenses: Mapped[dict[str, int] | None] = mapped_column(JSON, nullable=True)
    """``-L``: license name -> count it holds while it runs."""


class ServiceRow(Base):
    """A long-running inference service: its spec (``api.services.ServiceSpec`` as JSON)
    and the generation of that spec (each update makes a new one; replicas of an older
    generation are replaced one by one). ``state``: ``active`` or ``deleting`` (its
    replicas are being stopped; the row goes once none is left)."""

    __tablename__ = "services"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id"))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    generation: Mapped[int] = mapped_column(Integer, default=1)
    scaled_replicas: Mapped[int | None] = mapped_column(Integer, nullable=True)
    """The autoscaler's current count (None: not autoscaled, ``spec.replicas`` holds)."""
    state: Mapped[str] = mapped_column(String(16), default="active")
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    version: Mapped[int] = mapped_column(Integer, default=0)


class ServiceSpecRow(Base):
    """A service's spec as it was when one of its generations began (``gpufleet service
    rollback`` deploys an earlier generation's replica template again, as ``kubectl
    rollout undo``)."""

    __tablename__ = "service_specs"
    __table_args__ = (UniqueConstraint("service_id", "generation", name="uq_service_specs_generation"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    service_id: Mapped[int] = mapped_column(ForeignKey("services.id", ondelete="CASCADE"), index=True)
    generation: Mapped[int] = mapped_column(Integer)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    at: Mapped[float] = mapped_column(Float)
    actor: Mapped[str] = mapped_column(String(140))


class ServiceModelRow(Base):
    """A model a service wants loaded or unloaded on every replica (``gpufleet service
    model load|unload``, issue 30): ``wanted`` is ``loaded`` or ``unloaded``; the agents
    converge their replicas to it (``agent/replicamodels.py``)."""

    __tablename__ = "service_models"
    service_id: Mapped[int] = mapped_column(ForeignKey("services.id", ondelete="CASCADE"), primary_key=True)
    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    wanted: Mapped[str] = mapped_column(String(16))
    at: Mapped[float] = mapped_column(Float)
    actor: Mapped[str] = mapped_column(String(140))


class ServiceToken(Base):
    """A token callers present at the gateway (``gpufleet service token NAME``); only
    its sha256 is kept (256 random bits: a plain hash is enough, and the gateway can
    check it without the server's key)."""

    __tablename__ = "service_tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    service_id: Mapped[int] = mapped_column(ForeignKey("services.id", ondelete="CASCADE"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    hint: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(64))
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class ServiceEvent(Base):
    """What happened to a service (deployed, updated, replica started/replaced, drained)."""

    __tablename__ = "service_events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    service_id: Mapped[int] = mapped_column(ForeignKey("services.id", ondelete="CASCADE"), index=True)
    at: Mapped[float] = mapped_column(Float)
    actor: Mapped[str] = mapped_column(String(140))
    kind: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(String(512), default="")


class Allocation(Base):
    """GPUs held by a SCHEDULED/RUNNING job. ``gpu_index`` is NULL for a CPU-only job.
    The unique (node, gpu_index) constraint makes a double allocation impossible."""

    __tablename__ = "allocations"
    __table_args__ = (UniqueConstraint("node", "gpu_index", name="uq_allocations_gpu"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    node: Mapped[str] = mapped_column(String(128), index=True)
    gpu_index: Mapped[int | None] = mapped_column(Integer, nullable=True)


class JobEvent(Base):
    __tablename__ = "job_events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    at: Mapped[float] = mapped_column(Float)
    actor: Mapped[str] = mapped_column(String(140))
    """A user's name (64 at most), ``node:<name>`` (the sync of a node credential), or a
    loop (``scheduler``, ``lifecycle``)."""
    from_state: Mapped[str | None] = mapped_column(String(16), nullable=True)
    to_state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(String(512), default="")
    epoch: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    """The leader's epoch when a loop of a leader wrote it (``leader.py``); None for an API
    request or a single server."""


class LeaderLease(Base):
    """Who leads the servers of one PostgreSQL (``leader.py``): one row, ``name`` "leader"."""

    __tablename__ = "leader_lease"
    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    holder: Mapped[str] = mapped_column(String(160))
    epoch: Mapped[int] = mapped_column(BigInteger)
    """The fencing token: raised by every change of holder."""
    expires_at: Mapped[float] = mapped_column(Float)
    """The database's clock (seconds since the epoch)."""
    renewed_at: Mapped[float] = mapped_column(Float)


class LeaderTerm(Base):
    __tablename__ = "leader_terms"
    epoch: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    holder: Mapped[str] = mapped_column(String(160))
    acquired_at: Mapped[float] = mapped_column(Float)


class ServerRow(Base):
    """A server process's heartbeat (``gpufleet status``)."""

    __tablename__ = "servers"
    id: Mapped[str] = mapped_column(String(160), primary_key=True)
    url: Mapped[str] = mapped_column(String(512), default="", server_default="")
    version: Mapped[str] = mapped_column(String(64), default="", server_default="")
    started_at: Mapped[float] = mapped_column(Float)
    last_seen: Mapped[float] = mapped_column(Float)


class NodeCredential(Base):
    """A node's join token (``gpufleet node join-token``); only its sha256 is stored.
    ``node`` NULL: not yet bound; the first node that syncs with it owns it from then on.
    ``expires_at``: it buys a certificate until then (NULL: made before 0017, never);
    ``used_at``: it bought one then, and is spent (``services/nodecreds.py``)."""

    __tablename__ = "node_credentials"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node: Mapped[str | None] = mapped_column(String(128), nullable=True, index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    hint: Mapped[str] = mapped_column(String(16))
    created_by: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    used_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class NodeCertificate(Base):
    """A client certificate the server's CA issued to a node (``gpufleet.pki``): the
    serial is what a sync's certificate is checked against (revoked: refused)."""

    __tablename__ = "node_certificates"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node: Mapped[str] = mapped_column(String(128), index=True)
    serial: Mapped[str] = mapped_column(String(64), unique=True)
    not_after: Mapped[float] = mapped_column(Float)
    credential_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_by: Mapped[str] = mapped_column(String(140))
    created_at: Mapped[float] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class JobLogChunk(Base):
    """A piece of one job attempt's output on one node, as shipped by its agent.
    ``offset``/``end`` are byte offsets in the agent's log file; a chunk is stored only
    when ``offset`` is the stream's current end, so a resent chunk is never stored twice."""

    __tablename__ = "job_logs"
    __table_args__ = (
        UniqueConstraint("job_id", "attempt", "node", "offset", name="uq_job_logs_chunk"),
        Index("ix_job_logs_job_id_id", "job_id", "id"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(BigInteger)
    node: Mapped[str] = mapped_column(String(128))
    offset: Mapped[int] = mapped_column(BigInteger)
    end: Mapped[int] = mapped_column(BigInteger)
    data: Mapped[str] = mapped_column(Text)
    at: Mapped[float] = mapped_column(Float)


class JobStep(Base):
    """A Slurm job step (``srun`` inside an allocation, issue 31): ``step`` counts from 0
    per job (``123.0``). ``layout`` is the step's nodes in order with how many tasks each
    runs (block distribution: PROCIDs run on in that order). ``state`` RUNNING until every
    task reported its exit, then COMPLETED/FAILED (``exit_code``: the highest of the tasks
    that ended on their own); CANCELLED when ``srun`` was interrupted or the job ended
    first; ``stopping`` once its tasks are told to stop (cancel, ``--kill-on-bad-exit``)."""

    __tablename__ = "job_steps"
    __table_args__ = (UniqueConstraint("job_id", "step", name="uq_job_steps_step"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(BigInteger)
    name: Mapped[str] = mapped_column(String(128))
    command: Mapped[list[str]] = mapped_column(JSON)
    env: Mapped[dict[str, Any]] = mapped_column(JSON)
    layout: Mapped[list[Any]] = mapped_column(JSON)
    options: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16))
    stopping: Mapped[bool] = mapped_column(Boolean, default=False)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class JobStepTask(Base):
    """One task of a step: where it runs, its exit, how much of its output is stored."""

    __tablename__ = "job_step_tasks"
    __table_args__ = (UniqueConstraint("step_id", "procid", name="uq_job_step_tasks_task"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    step_id: Mapped[int] = mapped_column(ForeignKey("job_steps.id", ondelete="CASCADE"), index=True)
    procid: Mapped[int] = mapped_column(Integer)
    node: Mapped[str] = mapped_column(String(128))
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    killed: Mapped[bool] = mapped_column(Boolean, default=False)
    output_end: Mapped[int] = mapped_column(BigInteger, default=0)


class JobStepOutput(Base):
    """A piece of one task's output (stdout and stderr as they came), in the order it was
    stored: ``srun`` prints the step's pieces by ``id``, which merges its tasks."""

    __tablename__ = "job_step_output"
    __table_args__ = (Index("ix_job_step_output_step_id_id", "step_id", "id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    step_id: Mapped[int] = mapped_column(ForeignKey("job_steps.id", ondelete="CASCADE"))
    procid: Mapped[int] = mapped_column(Integer)
    data: Mapped[str] = mapped_column(Text)


class GpuEvent(Base):
    """The fleet's health and maintenance log (a GPU cordoned by a rule, a node lost,
    a drain...). ``gpu_index`` NULL: about the whole node. Rows of severity
    ``critical``/``warning`` are the alerts."""

    __tablename__ = "gpu_events"
    __table_args__ = (Index("ix_gpu_events_node_id", "node", "id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[float] = mapped_column(Float)
    node: Mapped[str] = mapped_column(String(128))
    gpu_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    kind: Mapped[str] = mapped_column(String(32))
    severity: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(String(512))
    actor: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[int | None] = mapped_column(Integer, nullable=True)


class Rollout(Base):
    """Rolling maintenance: drain at most ``max_unavailable`` of its nodes at a time."""

    __tablename__ = "rollouts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    created_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))
    max_unavailable: Mapped[int] = mapped_column(Integer)
    grace_s: Mapped[float] = mapped_column(Float)
    requeue: Mapped[bool] = mapped_column(Boolean)
    reason: Mapped[str] = mapped_column(String(256))
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class RolloutNode(Base):
    __tablename__ = "rollout_nodes"
    rollout_id: Mapped[int] = mapped_column(ForeignKey("rollouts.id", ondelete="CASCADE"), primary_key=True)
    node: Mapped[str] = mapped_column(String(128), primary_key=True)
    position: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))
    """waiting -> draining -> drained -> done (done: uncordoned or marked done)."""
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class ReservationRow(Base):
    """GPUs booked on named nodes for ``[start, end)`` (UNIX seconds, UTC).

    ``node_map`` holds [node, GPU count] pairs chosen at admission (and changed by the
    scheduler's reservation moves). ``state``: BOOKED, CANCELLED (by a person) or
    RELEASED (reclaimed unused); a BOOKED row past ``end`` is simply over.
    """

    __tablename__ = "reservations"
    __table_args__ = (Index("ix_reservations_state_end", "state", "end"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    team: Mapped[str | None] = mapped_column(String(64), nullable=True)
    users: Mapped[list[str]] = mapped_column(JSON)
    pool: Mapped[str] = mapped_column(String(64))
    gpu_type: Mapped[str | None] = mapped_column(String(64), nullable=True)
    gpus: Mapped[int] = mapped_column(Integer)
    start: Mapped[float] = mapped_column(Float)
    end: Mapped[float] = mapped_column(Float)
    node_map: Mapped[list[list[Any]]] = mapped_column(JSON)
    maintenance: Mapped[bool] = mapped_column(Boolean, default=False)
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(String(512), default="")
    version: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[float] = mapped_column(Float)
    last_used_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    """Last scheduling pass that saw an owner job on its GPUs inside the window."""


class ReservationEvent(Base):
    """What happened to a reservation (booked, moved, cancelled, released), and who did it."""

    __tablename__ = "reservation_events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    reservation_id: Mapped[int] = mapped_column(ForeignKey("reservations.id", ondelete="CASCADE"), index=True)
    at: Mapped[float] = mapped_column(Float)
    actor: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(String(512), default="")


class UsageRow(Base):
    """What one job used in one UTC hour: the ledger ``gpufleet usage`` sums.

    Written as cost accrues (every accrual tick and when the job lets its GPUs go),
    so a report over any whole hours is a sum, never a recomputation. ``observed_gpu_s``
    is the part of ``gpu_s`` with fresh telemetry; utilisation and idle waste are over it.
    """

    __tablename__ = "usage"
    __table_args__ = (
        UniqueConstraint("job_id", "hour", name="uq_usage_job_hour"),
        Index("ix_usage_hour", "hour"),
        Index("ix_usage_team_hour", "team_id", "hour"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(Integer)
    hour: Mapped[float] = mapped_column(Float)
    user_id: Mapped[int] = mapped_column(Integer)
    team_id: Mapped[int] = mapped_column(Integer)
    pool: Mapped[str] = mapped_column(String(64))
    gpu_type: Mapped[str] = mapped_column(String(64))
    gpu_s: Mapped[float] = mapped_column(Float, default=0.0)
    cost: Mapped[float] = mapped_column(Float, default=0.0)
    energy_wh: Mapped[float] = mapped_column(Float, default=0.0)
    observed_gpu_s: Mapped[float] = mapped_column(Float, default=0.0)
    util_gpu_s: Mapped[float] = mapped_column(Float, default=0.0)
    """Sum of utilisation (0..1) x GPU-seconds over the observed part."""
    idle_gpu_s: Mapped[float] = mapped_column(Float, default=0.0)
    """Observed GPU-seconds at under 5% utilisation."""


class PriceScheduleRow(Base):
    """Every price schedule ever set; the newest is in force (``PUT /v1/prices``)."""

    __tablename__ = "price_schedules"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    created_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(64))
    body: Mapped[dict[str, Any]] = mapped_column(JSON)


class AuditRow(Base):
    """One mutating API request: who, from where, what, and how it ended. Append-only:
    rows are never updated (a trigger refuses it); the retention loop deletes rows older
    than ``--audit-days`` (``server/http/audit.py``)."""

    __tablename__ = "audit"
    __table_args__ = (Index("ix_audit_at", "at"), Index("ix_audit_actor_id", "actor", "id"))
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[float] = mapped_column(Float)
    actor: Mapped[str | None] = mapped_column(String(140), nullable=True)
    """A user's name, ``node:NAME`` for a node credential, None when not authenticated."""
    role: Mapped[str | None] = mapped_column(String(16), nullable=True)
    token_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    address: Mapped[str] = mapped_column(String(64))
    method: Mapped[str] = mapped_column(String(8))
    path: Mapped[str] = mapped_column(String(512))
    object: Mapped[str | None] = mapped_column(String(256), nullable=True)
    status: Mapped[int] = mapped_column(Integer)


class Setting(Base):
    """Server-wide facts kept with the data, e.g. the token key's fingerprint."""

    __tablename__ = "settings"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(256))
