"""Slurm job steps (``srun`` inside an allocation, issue 31): what ``srun`` asks for, what
it follows, and the steps' part of the agent's sync.

A step is ``POST /v1/jobs/{id}/steps`` (``StepIn``), usually with the job's own
credential (``GPUFLEET_TOKEN`` in the job's environment); ``GET
/v1/jobs/{id}/steps/{step}?after=N`` (``StepOut``) is its state and the output its tasks
wrote since output piece ``N``; ``POST .../cancel`` stops it. In the sync, the reply's
``DesiredJob.steps`` are the step tasks a node should run (``DesiredStep``), the agent
reports them (``StepTaskIn``: state, exit and output, offsets as for job logs) and the
reply acknowledges how much of each task's output is stored (``StepAck``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints, field_validator

from gpufleet.api.base import INT32, MAX_ENV, EnvKey, Label, Reply, Request, clean_text

MAX_TASKS = 65_536
"""Tasks in one step (Slurm's own bound is the allocation's CPUs; this one keeps a step
one bounded insert)."""
MAX_STEPS = 10_000
"""Steps per job (Slurm numbers them up to 0xfffffff0; real scripts launch a handful)."""
STEP_STATES = ("RUNNING", "COMPLETED", "FAILED", "CANCELLED")

Arg = Annotated[str, StringConstraints(max_length=65_536)]


class StepIn(Request):
    """``srun``'s request. Left out: Slurm's defaults inside an allocation (all of the
    job's nodes; ``ntasks`` one per node unless ``ntasks_per_node`` says more; ``-n``
    alone takes as few nodes as hold that many tasks, one per node)."""

    command: list[Arg] = Field(min_length=1, max_length=4096)
    name: Label = ""
    env: dict[EnvKey, Annotated[str, StringConstraints(max_length=65_536)]] = Field(
        default_factory=dict,
        max_length=MAX_ENV,
        description="--export: the tasks' environment besides what the node sets (srun's own, by default)",
    )
    workdir: Annotated[str, StringConstraints(min_length=1, max_length=1024)] | None = Field(
        default=None, description="where the tasks start (srun's working directory, or --chdir)"
    )
    ntasks: int | None = Field(default=None, ge=1, le=MAX_TASKS)
    nodes: int | None = Field(default=None, ge=1, le=10_000)
    ntasks_per_node: int | None = Field(default=None, ge=1, le=4096)
    gpus_per_task: int | None = Field(default=None, ge=0, le=1024)
    cpus_per_task: int | None = Field(default=None, ge=1, le=100_000)
    kill_on_bad_exit: bool = Field(default=False, description="a task that exits non-zero stops the others")
    overlap: bool = Field(default=False, description="accepted: steps always share the job's resources here")


class StepTaskOut(Reply):
    procid: int
    node: str
    state: Literal["RUNNING", "EXITED"]
    exit_code: int | None


class StepChunk(Reply):
    id: int
    procid: int
    data: str


class StepOut(Reply):
    id: str = Field(description="JOB.STEP, as sacct prints it")
    job_id: int
    step: int
    name: str
    command: list[str]
    state: Literal["RUNNING", "COMPLETED", "FAILED", "CANCELLED"]
    exit_code: int | None
    ntasks: int
    nodes: list[str]
    tasks_per_node: list[int]
    created_at: float
    ended_at: float | None
    job_state: str
    tasks: list[StepTaskOut] = Field(default_factory=list)
    output: list[StepChunk] = Field(
        default_factory=list, description="output pieces after ?after=, in the order they were stored"
    )


class StepList(Reply):
    steps: list[StepOut]


# -- the sync's part ---------------------------------------------------------------------------


class DesiredStep(Reply):
    """The tasks of one step a node should run (those not over yet)."""

    step: int
    command: list[str]
    env: dict[str, str]
    workdir: str | None = None
    procids: list[int] = Field(description="this node's tasks (SLURM_PROCID), SLURM_LOCALID in this order")
    node_index: int = Field(description="SLURM_NODEID: this node's place in the step's nodes")
    ntasks: int
    nodes: list[str]
    tasks_per_node: list[int]
    gpus_per_task: int = 0
    cpus_per_task: int = 0


class StepTaskIn(Request):
    """A step task as its node reports it: bytes ``offset``..``end`` of its output file
    (stored only if ``offset`` is where the stored output ends) and, once it is over and
    this chunk reaches the end of its output, its exit."""

    job_id: int = Field(ge=1, le=INT32)
    step: int = Field(ge=0, le=INT32)
    procid: int = Field(ge=0, le=INT32)
    state: Literal["running", "exited"]
    exit_code: int | None = Field(default=None, ge=-INT32 - 1, le=INT32)
    killed: bool = Field(default=False, description="the agent stopped it (cancel, --kill-on-bad-exit)")
    offset: int = Field(default=0, ge=0)
    end: int = Field(default=0, ge=0)
    data: Annotated[str, StringConstraints(max_length=262_144)] = ""

    @field_validator("data", mode="before")
    @classmethod
    def _clean(cls, value: object) -> object:
        """Cleaned, not refused (as job logs: a task's output may hold any byte)."""
        return clean_text(value) if isinstance(value, str) else value


class StepAck(Reply):
    job_id: int
    step: int
    procid: int
    end: int
    done: bool = Field(default=False, description="its exit is recorded: the node may forget it")
