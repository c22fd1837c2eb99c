"""Request and response bodies of the maintenance API (cordon, drain, rollouts, fleet
events)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints, model_validator

from gpufleet.api.base import Name, NodeName, Reply, Request

Reason = Annotated[str, StringConstraints(max_length=200)]
Duration = str | float


class CordonIn(Request):
    gpu: int | None = Field(default=None, ge=0, le=1023, description="only this GPU (default: the node)")
    reason: Reason = ""


class UncordonIn(Request):
    gpu: int | None = Field(default=None, ge=0, le=1023, description="only this GPU (default: the node)")


class DrainIn(Request):
    grace: Duration = Field(default="10m", description="how long running jobs may finish before requeue")
    requeue: bool = Field(default=False, description="requeue running jobs at once")
    reason: Reason = ""


class RolloutIn(Request):
    nodes: list[NodeName] = Field(default_factory=list, max_length=10_000, description="in this order")
    all: bool = Field(default=False, description="every node (of ``pool`` if given), by name")
    pool: Name | None = None
    max_unavailable: int = Field(default=1, ge=1, le=10_000)
    grace: Duration = "10m"
    requeue: bool = False
    reason: Reason = ""


class RolloutNodeOut(Reply):
    node: str
    state: str
    started_at: float | None
    finished_at: float | None
    reason: str | None = Field(default=None, description="why it failed, or what it waits for")
    driver: str | None = Field(default=None, description="the driver its last verification saw")
    attempt: int = Field(default=0, description="an upgrade: the order its agent carries out")


class RolloutOut(Reply):
    id: int
    state: str
    created_at: float
    created_by: str
    max_unavailable: int
    grace_s: float
    requeue: bool
    reason: str
    finished_at: float | None
    counts: dict[str, int] = Field(
        description="nodes per state: waiting, draining, drained, done (an upgrade: also upgrading, "
        "verifying, failed)"
    )
    nodes: list[RolloutNodeOut]
    kind: str = Field(default="drain", description="drain, or upgrade (a driver upgrade that verifies)")
    expect_driver: str | None = None
    hook: str | None = None
    pause_reason: str | None = None


class FleetEventOut(Reply):
    id: int
    at: float
    node: str
    gpu_index: int | None
    kind: str
    severity: str = Field(description="critical and warning events are alerts")
    reason: str
    actor: str
    job_id: int | None


class ShareIn(Request):
    """``PUT /v1/nodes/{name}/gpus/{index}/share``: share a GPU (``shared: true``: it takes
    jobs asking for part of one, under MPS, and is no longer handed out whole) or make it
    whole again (``false``)."""

    shared: bool


class MigLayoutIn(Request):
    """``PUT /v1/nodes/{name}/gpus/{index}/mig``: slice a GPU with MIG (``layout``, names of
    ``gpufleet.mig``'s table for the GPU's model, e.g. ["2g.20gb", "2g.20gb", "3g.40gb"]) or
    make it whole again (``whole``). Exactly one of them."""

    layout: list[Annotated[str, StringConstraints(min_length=1, max_length=32)]] | None = Field(
        default=None, min_length=1, max_length=7
    )
    whole: bool = False

    @model_validator(mode="after")
    def _one(self) -> MigLayoutIn:
        if (self.layout is None) == (not self.whole):
            raise ValueError("give either layout (MIG profiles) or whole: true, not both")
        return self
