"""Rack power budgets (issue 34): a rack's feed and the share kept free
(``gpufleet admin rack set RACK --power-kw 40 --headroom 30%``), each rack's estimated
draw against it, and the power figures that override the scheduler's defaults."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints, model_validator

from gpufleet.api.base import Reply, Request

GpuModelName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._()+-]{0,63}$")]
"""A GPU model as agents report it ("NVIDIA H100 80GB HBM3")."""


class RackIn(Request):
    power_kw: float = Field(gt=0, le=10_000, description="the rack's power feed, kW")
    headroom: float = Field(
        default=0.3, ge=0, lt=1, description="the share of the feed kept free (0.3: new work up to 70 %)"
    )


class RackOut(Reply):
    rack: str
    nodes: int = Field(description="its nodes the server knows")
    gpus: int
    busy_gpus: int = Field(description="GPUs held by running jobs")
    draw_kw: float = Field(description="estimated draw now, as the scheduler counts it")
    power_kw: float | None = Field(default=None, description="its feed (None: no budget)")
    headroom: float | None = None
    cap_kw: float | None = Field(default=None, description="feed less headroom: what new work may fill")
    updated_by: str | None = None
    updated_at: float | None = None


class RackList(Reply):
    items: list[RackOut]


class PowerFigureIn(Request):
    """One figure over the defaults: ``kind`` "model" names a GPU model (its board power),
    "node" a node (its GPUs' board power, its base draw, or both)."""

    kind: Literal["model", "node"]
    name: GpuModelName
    board_w: float | None = Field(default=None, gt=0, le=5_000, description="a GPU's board power (TDP), W")
    base_w: float | None = Field(
        default=None, ge=0, le=100_000, description="a node's draw besides its GPUs (CPUs, fans...), W"
    )

    @model_validator(mode="after")
    def _one_figure(self) -> PowerFigureIn:
        if self.board_w is None and self.base_w is None:
            raise ValueError("give board_w, base_w or both")
        if self.kind == "model" and self.base_w is not None:
            raise ValueError("base_w is a node's figure, not a GPU model's")
        return self


class PowerFigureOut(Reply):
    kind: str
    name: str
    board_w: float | None = None
    base_w: float | None = None


class PowerFigureList(Reply):
    items: list[PowerFigureOut]
