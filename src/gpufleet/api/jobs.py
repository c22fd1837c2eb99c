"""Jobs: submit, the job as listed and shown, its events and pages."""

from __future__ import annotations

from typing import Annotated

from pydantic import (
    AfterValidator,
    Field,
    StringConstraints,
    field_validator,
)
from pydantic_core import PydanticCustomError

from gpufleet.api.base import INT32, MAX_ENV, EnvKey, Id, Label, Name, NodeName, Reply, Request
from gpufleet.cudaver import format_cuda, parse_cuda


def _canonical_cuda(value: str) -> str:
    """Canonical (``12.4``); anything else is refused with the reason (``gpufleet.cudaver``)."""
    try:
        return format_cuda(parse_cuda(value))
    except ValueError as exc:
        raise PydanticCustomError("cuda_version", "{why}", {"why": str(exc)}) from None


CudaVersion = Annotated[str, StringConstraints(min_length=1, max_length=16), AfterValidator(_canonical_cuda)]
"""The CUDA version a job or a service's replicas need (``--cuda 12.4``), canonical."""

POOL_LIST = r"^(?:[A-Za-z0-9][A-Za-z0-9._-]{0,63}(?:,[A-Za-z0-9][A-Za-z0-9._-]{0,63}){0,15})?$"
"""A pool's name, or up to 16 of them comma-separated (Slurm's ``-p a,b``), or nothing."""


class JobSubmit(Request):
    command: list[Annotated[str, StringConstraints(max_length=65_536)]] = Field(min_length=1, max_length=4096)
    name: Label = ""
    gpus: int = Field(
        default=0,
        ge=0,
        le=100_000,
        description="GPUs in all (0, the default as in Slurm: none; a CPU-only pool takes only 0)",
    )
    gpus_per_node: int = Field(default=0, ge=0, le=1024)
    nodes: int = Field(default=0, ge=0, le=10_000)
    gpu_type: Annotated[str, StringConstraints(min_length=1, max_length=64)] | None = None
    team: Name | None = None
    pool: Annotated[str, StringConstraints(pattern=POOL_LIST)] = Field(
        default="",
        description="the pool (Slurm's partition), or several, comma-separated: the first that can "
        "ever run the job; empty: the operator's default pool (admin create-pool --default)",
    )
    priority: int = Field(default=0, ge=-1000, le=1000)
    time_limit: str | float | None = Field(
        default=None, description="seconds, or a duration such as 90s, 30m, 2h, 1-00:00:00"
    )
    image: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = None
    env: dict[EnvKey, Annotated[str, StringConstraints(max_length=65_536)]] = Field(
        default_factory=dict, max_length=MAX_ENV
    )
    requeue: bool = True
    max_attempts: int = Field(default=5, ge=1, le=1000, description="attempts in all, the first included")
    requeue_backoff: str | float = Field(
        default=10.0,
        description="delay before the 2nd requeue (doubling after, at most 10 min); the 1st is immediate",
    )
    output: Annotated[str, StringConstraints(max_length=512)] | None = None
    error: Annotated[str, StringConstraints(max_length=512)] | None = None
    reservation: int | None = Field(
        default=None, ge=1, le=INT32, description="run only inside this reservation (its owners only)"
    )
    array: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = Field(
        default=None,
        description="a job array, as sbatch --array: 0-15, 0,6,16-32, 0-15:4, 0-99%10 (one job per task)",
    )
    dependency: Annotated[str, StringConstraints(min_length=1, max_length=1024)] | None = Field(
        default=None,
        description="as sbatch --dependency: afterok:12:13, afterany:12?afternotok:14, singleton "
        "(your own jobs only)",
    )
    kill_on_invalid_dep: bool = Field(
        default=False, description="cancel the job once its dependency can never be satisfied"
    )
    hold: bool = Field(default=False, description="submitted held: it waits until released (sbatch --hold)")
    submit_dir: Annotated[str, StringConstraints(min_length=1, max_length=1024)] | None = Field(
        default=None, description="where it was submitted (SLURM_SUBMIT_DIR; the default working dir)"
    )
    workdir: Annotated[str, StringConstraints(min_length=1, max_length=1024)] | None = Field(
        default=None, description="--chdir: the working directory on the node"
    )
    input: Annotated[str, StringConstraints(min_length=1, max_length=512)] | None = Field(
        default=None, description="--input: a file for standard input (patterns as --output)"
    )
    signal: Annotated[str, StringConstraints(min_length=1, max_length=32)] | None = Field(
        default=None,
        description="--signal=[B:]SIG[@SECONDS]: sent that long before the time limit, and before a "
        "preemption, which then waits SECONDS (at most the server's --max-preempt-grace) before stopping it",
    )
    checkpoint_every: str | float | None = Field(
        default=None,
        description="how often it saves its state: 30m, 2h, 1800 (seconds); a preemption then prefers "
        "a job that just checkpointed (none: a preemption counts its whole run as lost)",
    )
    exclusive: bool = Field(
        default=False, description="whole nodes (sbatch --exclusive): all their GPUs, CPUs and memory"
    )
    constraint: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = Field(
        default=None,
        description="node features, as sbatch --constraint: ib, a100&ib, a|b, [rack1|rack2] "
        "(a GPU model is a feature too)",
    )
    qos: Name | None = Field(
        default=None, description="its QOS (sbatch --qos; gpufleet admin qos list); none: the default QOS"
    )
    licenses: dict[Name, Annotated[int, Field(ge=1, le=1_000_000)]] | None = Field(
        default=None, max_length=32, description="sbatch -L: license -> count it holds while it runs"
    )
    exclude: list[NodeName] | None = Field(
        default=None, max_length=1024, description="nodes it never runs on (sbatch --exclude)"
    )
    cpus_per_task: int | None = Field(default=None, ge=1, le=4096)
    ntasks: int | None = Field(default=None, ge=1, le=1_000_000)
    ntasks_per_node: int | None = Field(default=None, ge=1, le=4096)
    mem: str | int | None = Field(
        default=None, description="memory per node: 16G, 512M, 16000 (MB); 0: all of each node's"
    )
    mem_per_cpu: str | int | None = None
    mem_per_gpu: str | int | None = None
    begin: str | float | None = Field(
        default=None, description="not before: epoch seconds, now+1hour, 16:00, 2026-12-05T16:00 (UTC)"
    )
    deadline: str | float | None = Field(
        default=None, description="cancelled once it can no longer end by then (as begin)"
    )
    max_price: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="wait until a GPU-hour costs at most this (starting in time for the deadline)",
    )
    gpu_memory: str | int | None = Field(
        default=None,
        description="GPU memory each GPU must have: 10G, 40960 (MB); the job gets the smallest MIG slice "
        "that has it, else a share of a shared GPU of that much, else the smallest whole GPU of its pool "
        "(its gpu_type is set to that; not with gpu_type)",
    )
    gpu_fraction: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        allow_inf_nan=False,
        description="part of one shared GPU (0.25): that share of its compute and memory, enforced by MPS "
        "(gpus 1; with gpu_memory the larger of the two)",
    )
    cuda: CudaVersion | None = Field(
        default=None,
        description="the CUDA version it needs (12.4): it runs only on nodes whose driver supports it",
    )

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpus_not_negative(cls, value: object) -> object:
        """Below 0: say what is allowed, not only the schema's bound."""
        if isinstance(value, int) and not isinstance(value, bool) and value < 0:
            raise PydanticCustomError(
                "gpus_negative", "gpus: 0 (none) or more; a negative count means nothing"
            )
        return value


class CancelMany(Request):
    """Jobs to cancel (Slurm's ``scancel`` filters): all that match every field given,
    among the caller's own jobs (an operator's: anyone's). At least one field."""

    ids: list[Id] | None = Field(default=None, max_length=10_000, description="these jobs")
    array: int | None = Field(default=None, ge=1, le=INT32, description="every task of this array")
    user: Name | None = Field(default=None, description="operators: this user's jobs")
    states: list[str] | None = Field(default=None, max_length=16, description="only in these states")
    name: Annotated[str, StringConstraints(min_length=1, max_length=128)] | None = None


class Cancelled(Reply):
    cancelled: list[int]
    skipped: list[int] = Field(description="matched but already finished, or changing too fast")


class JobUpdate(Request):
    """``PATCH /v1/jobs/{id}`` (Slurm's ``scontrol update``): the fields given change.
    A time limit may only go down, except for operators (as in Slurm); ``held`` holds a
    PENDING job or releases a HELD one."""

    time_limit: str | float | None = Field(
        default=None, description="seconds, or a duration such as 90s, 30m, 2h, 1-00:00:00"
    )
    name: Annotated[Label, StringConstraints(min_length=1)] | None = None
    held: bool | None = None


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
    array_job_id: int | None = Field(default=None, description="its array (the first task's id)")
    array_task_id: int | None = None
    dependency: str | None = None
    cpus_per_node: int = Field(default=0, description="CPUs it holds on each node (0: none asked)")
    mem_per_node_mb: int = Field(default=0, description="memory it holds on each node, MiB (0: none asked)")
    begin_at: float | None = None
    deadline: float | None = None
    max_price: float | None = None
    qos: str | None = Field(default=None, description="its QOS (--qos, else the default QOS)")
    licenses: dict[str, int] | None = Field(default=None, description="-L: license -> count")
    cuda: str | None = Field(default=None, description="the CUDA version it needs (--cuda)")
    predicted_s: float | None = Field(
        default=None,
        description="its whole run time as the scheduler predicted it from the jobs like it that ended "
        "before (same user, name and GPUs, down to its team); None: no history enough",
    )
    prediction_confidence: float | None = Field(default=None, description="0..1: how far to trust it")
    prediction_basis: str | None = Field(
        default=None, description="which history it came from: user+name+gpus (12 jobs)"
    )
    predicted_end: float | None = Field(
        default=None, description="a running job: when it is predicted to end (at most its time limit)"
    )


class JobDiagnosis(Reply):
    """What a failed job's output matched (issue 34: ``gpufleet.diagnosis``)."""

    signature: str = Field(description="the signature's id (nccl-ib-completion-error, cuda-oom...)")
    diagnosis: str
    hint: str
    blame: str = Field(description="node (the hardware), job (its code) or unknown")
    priority: int = 0
    node: str = Field(description="the node whose output of the job matched")
    line: str = Field(description="the first matching line, cut to 300 characters")
    at: float


class JobDetail(JobOut):
    env: dict[str, str]
    output: str | None
    error: str | None
    input: str | None = None
    submit_dir: str | None = None
    workdir: str | None = None
    signal: str | None = None
    checkpoint_s: float | None = Field(default=None, description="--checkpoint-every, seconds")
    cpus_per_task: int = 0
    ntasks_per_node: int = 0
    events: list[JobEventOut]
    diagnosis: JobDiagnosis | None = Field(
        default=None, description="what its failed output matched (None: not failed, or nothing known)"
    )


class JobPage(Reply):
    items: list[JobOut]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null at the end")
    total: int | None = None
