"""Licenses (Slurm's ``-L``): counts an operator declares, which jobs hold while they run."""

from __future__ import annotations

from pydantic import Field

from gpufleet.api.base import Reply, Request


class LicenseIn(Request):
    count: int = Field(ge=0, le=1_000_000, description="how many jobs' worth there are (0: none now)")


class LicenseOut(Reply):
    name: str
    count: int
    used: int = Field(description="held by running jobs")


class LicenseList(Reply):
    items: list[LicenseOut]
