"""Rolling driver upgrades on the wire (issue 34): what an operator asks for
(``UpgradeIn``), and what the server and a node's agent say to each other about one
node's upgrade in a sync (``UpgradeOrder`` down, ``UpgradeReport`` up).

The server never sends a command: an order names a hook, and the agent runs only hooks
its own operator configured on the node (``gpufleet agent --upgrade-hook NAME=/path``);
the expected driver version is the hook's one argument, so both are plain words here.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from gpufleet.api.base import NodeName, Reply, Request

DRIVER_VERSION = r"^[0-9A-Za-z][0-9A-Za-z._+-]{0,63}$"
"""A driver version as NVML reports it (``550.54.15``): a word, never an option
(it cannot start with ``-``) nor a path."""
HOOK_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"

DriverVersion = Annotated[str, StringConstraints(pattern=DRIVER_VERSION)]
HookName = Annotated[str, StringConstraints(pattern=HOOK_NAME)]
Text = Annotated[str, StringConstraints(max_length=512)]
OUTPUT_CHARS = 4096
"""What an upgrade report carries of the hook's output: its tail."""


class UpgradeIn(Request):
    """``POST /v1/upgrades``: roll a driver upgrade through ``nodes`` (in this order),
    ``max_unavailable`` at a time."""

    nodes: list[NodeName] = Field(min_length=1, max_length=10_000)
    expect_driver: DriverVersion = Field(description="the driver version each node must report afterwards")
    hook: HookName | None = Field(
        default=None,
        description="the upgrade hook each node's agent runs (configured there by name); "
        "none: the operator upgrades each drained node by hand and resumes",
    )
    max_unavailable: int = Field(default=1, ge=1, le=10_000)
    drain_timeout: str | float = Field(
        default="1h", description="how long running jobs may finish before they are requeued"
    )
    reason: Annotated[str, StringConstraints(max_length=200)] = ""


class ResumeIn(Request):
    """``POST /v1/upgrades/{id}/resume``: go on; nodes waiting for a manual upgrade are
    verified, failed ones are tried again (or ``skip``: left out, still cordoned)."""

    skip: list[NodeName] = Field(default_factory=list, max_length=10_000)


class UpgradeOrder(Reply):
    """In a sync reply: carry out upgrade ``attempt`` of rollout ``rollout``: run the
    hook (None: the operator upgraded by hand, verify only), then verify. The agent
    does it once per (rollout, attempt) and reports until the server stops asking."""

    rollout: int
    attempt: int
    hook: str | None
    expect_driver: str


class GpuCheck(Request):
    """One GPU after an upgrade: NVML's health verdict and the smoke kernel's result."""

    index: int = Field(ge=0, le=1023)
    healthy: bool
    smoke_ok: bool
    detail: Text = ""


class UpgradeReport(Request):
    """In a sync: how upgrade ``attempt`` of rollout ``rollout`` went on this node.
    ``stage`` running_hook / verifying while under way; done once the facts are in. The
    server judges them (``decide/upgrade.py``): the agent only reports."""

    rollout: int = Field(ge=0)
    attempt: int = Field(ge=0)
    stage: Literal["running_hook", "verifying", "done"]
    hook_error: Text | None = Field(default=None, description="the hook failed: why (exit code, timeout)")
    output: Annotated[str, StringConstraints(max_length=OUTPUT_CHARS)] = ""
    driver_version: Annotated[str, StringConstraints(max_length=64)] | None = None
    cuda_version: Annotated[str, StringConstraints(max_length=32)] | None = None
    gpus: list[GpuCheck] = Field(default_factory=list, max_length=1024)
    error: Text | None = Field(default=None, description="the verification could not run: why")
