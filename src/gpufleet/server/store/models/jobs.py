"""Jobs and what hangs off them: the job row, the GPUs it holds, its events, its output,
and its steps (``srun`` inside an allocation) with their tasks and output."""

from __future__ import annotations

from collections.abc import Iterable
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
)
from sqlalchemy.orm import Mapped, mapped_column

from gpufleet.server.store.models.base import Base


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_state_id", "state", "id"),
        Index("ix_jobs_ended_at", "ended_at"),  # the scheduling pass's history (``loops/history.py``)
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
    thousands of nodes. Code reads and writes it as a list (``stopping_nodes``, or
    ``stopping_list`` / ``stopping_value`` on a dict of column values); only the SQL
    filters that find a node's jobs (``contains``, ``like``) look at the text."""
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
    # Inference services (``server/services/replicaset.py``): a replica is a job of kind
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
    cuda: Mapped[str | None] = mapped_column(String(16), nullable=True)
    """``--cuda``: the CUDA version it needs (``gpufleet.cudaver``, canonical: ``12.4``);
    it runs only on nodes whose driver supports it (``scheduler/cuda.py``)."""
    diagnosis: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    """What its failed output matched (``api.jobs.JobDiagnosis`` as JSON; issue 34,
    ``services/diagnoses.py``); None: it did not fail, or nothing known matched."""
    checkpoint_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    """``--checkpoint-every``, seconds (None: not declared): what a preemption costs it
    (``scheduler/victims.lost_work``)."""
    preempt_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    """A preemption under way after ``--signal`` (``jobstate/preemption.py``): when its
    grace ends and it is stopped; ``preempt_by`` the job it makes room for (which waits
    until then), ``preempt_reason`` the plan's reason. None: none under way."""
    preempt_by: Mapped[int | None] = mapped_column(Integer, nullable=True)
    preempt_reason: Mapped[str | None] = mapped_column(String(512), nullable=True)
    # The run time the scheduling pass predicted when it first saw the job (``loops/history.py``).
    predicted_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    predicted_conf: Mapped[float | None] = mapped_column(Float, nullable=True)
    prediction_basis: Mapped[str | None] = mapped_column(String(64), nullable=True)

    @property
    def stopping_nodes(self) -> list[str]:
        """The nodes that have not yet confirmed the stop (``stopping_on`` as a list)."""
        return stopping_list(self.stopping_on)

    @stopping_nodes.setter
    def stopping_nodes(self, nodes: Iterable[str]) -> None:
        self.stopping_on = stopping_value(nodes)


def stopping_list(value: str | None) -> list[str]:
    """The node names a ``stopping_on`` value holds, in order ([] for None)."""
    return [n for n in (value or "").split(",") if n]


def stopping_value(nodes: Iterable[str]) -> str | None:
    """The ``stopping_on`` value that holds ``nodes``: None when there are none (the
    partial index ``ix_jobs_stopping`` holds only the jobs that wait for a stop)."""
    return ",".join(nodes) or None


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
    """The leader's epoch when a loop of a leader wrote it (``store/leader.py``); None for an API
    request or a single server."""


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
