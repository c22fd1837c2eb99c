"""Request and response bodies of ``/v1/reservations``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from gpufleet.api.base import Label, Name, NodeName, Reply, Request

Repeat = Literal["daily", "weekly"]


LATEST = 253_402_300_799.0
"""9999-12-31T23:59:59Z: the last instant a calendar (and datetime) can show."""


class ReservationIn(Request):
    """``start`` is UNIX seconds (UTC). A repeat books ``count`` windows, each at the same
    *local wall-clock time* in ``timezone`` (an IANA name; the CLI sends the caller's), so
    a daily 09:00 booking stays at 09:00 across a daylight-saving change."""

    start: float = Field(ge=0, le=LATEST)
    duration_s: float = Field(gt=0, le=366 * 86400)
    gpus: int = Field(default=0, ge=0, le=100_000, description="0 with nodes_named: every GPU of them")
    gpus_per_node: int = Field(default=0, ge=0, le=1024)
    nodes: int = Field(default=0, ge=0, le=10_000)
    gpu_type: Annotated[str, StringConstraints(min_length=1, max_length=64)] | None = None
    pool: Name = "default"
    team: Name | None = None
    users: list[Name] = Field(default_factory=list, max_length=1000)
    name: Label = ""
    repeat: Repeat | None = None
    count: int = Field(default=1, ge=1, le=366)
    timezone: Annotated[str, StringConstraints(min_length=1, max_length=64)] = "UTC"
    node_names: list[NodeName] = Field(default_factory=list, max_length=1000, description="operators only")
    maintenance: bool = Field(default=False, description="operators only: keep the GPUs empty")


class ReservationOut(Reply):
    id: int
    name: str
    owner: str = Field(description="who booked it (they, or an operator, may cancel it)")
    team: str | None = Field(description="whom it is for: this team's jobs may run in it")
    users: list[str] = Field(description="whom it is for: these users' jobs may run in it")
    pool: str
    gpu_type: str | None
    gpus: int
    start: float
    end: float
    nodes: list[tuple[str, int]]
    maintenance: bool
    state: str = Field(description="BOOKED, ACTIVE (booked, window now), ENDED, CANCELLED, RELEASED")
    reason: str
    last_used_at: float | None
