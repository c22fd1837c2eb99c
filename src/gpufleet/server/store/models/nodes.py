"""The fleet: nodes and their GPUs, the nodes' join credentials and certificates, the health
and maintenance log, and rolling maintenance."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column

from gpufleet.server.store.models.base import Base


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
    cuda_version: Mapped[str | None] = mapped_column(String(32), nullable=True)
    """The newest CUDA its driver supports, as its agent reports it (NVML's
    ``nvmlSystemGetCudaDriverVersion``): jobs that need a newer one go elsewhere."""
    gpu_power: Mapped[dict[str, float] | None] = mapped_column(JSON, nullable=True)
    """Its GPUs' latest power readings, ``{"<index>": watts}``, and when they were taken
    (``gpu_power_at``): written only when one moved or aged (``services/racks.py``)."""
    gpu_power_at: Mapped[float | None] = mapped_column(Float, nullable=True)


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
    """Rolling maintenance: drain at most ``max_unavailable`` of its nodes at a time.
    A driver upgrade (``expect_driver`` set) also upgrades and verifies each node before
    it is uncordoned (``services/upgrades.py``)."""

    __tablename__ = "rollouts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    created_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))
    """active, paused (an operator, or the first failed verification), done, cancelled
    (a drain rollout), aborted (an upgrade)."""
    max_unavailable: Mapped[int] = mapped_column(Integer)
    grace_s: Mapped[float] = mapped_column(Float)
    requeue: Mapped[bool] = mapped_column(Boolean)
    reason: Mapped[str] = mapped_column(String(256))
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    expect_driver: Mapped[str | None] = mapped_column(String(64), nullable=True)
    """An upgrade: the driver version each node must report afterwards (None: a drain)."""
    hook: Mapped[str | None] = mapped_column(String(64), nullable=True)
    """The upgrade hook the nodes' agents run (their own operator configured it by name;
    None: the operator upgrades each drained node by hand, then resumes)."""
    pause_reason: Mapped[str | None] = mapped_column(String(512), nullable=True)
    """Why it is paused (the failed verification, or who paused it)."""


class RolloutNode(Base):
    __tablename__ = "rollout_nodes"
    __table_args__ = (Index("ix_rollout_nodes_node", "node"),)
    rollout_id: Mapped[int] = mapped_column(ForeignKey("rollouts.id", ondelete="CASCADE"), primary_key=True)
    node: Mapped[str] = mapped_column(String(128), primary_key=True)
    position: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))
    """A drain: waiting -> draining -> drained -> done (done: uncordoned or marked done).
    An upgrade: waiting -> draining -> upgrading -> verifying -> done, or failed."""
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """An upgrade: the order the node's agent is asked to carry out (0: none yet); a
    retry (``upgrade resume``) asks again with the next number."""
    reason: Mapped[str | None] = mapped_column(String(512), nullable=True)
    """Why it failed, or what it waits for."""
    driver: Mapped[str | None] = mapped_column(String(64), nullable=True)
    """The driver its agent reported at the last verification."""
    phase_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    """When it entered its current state."""
