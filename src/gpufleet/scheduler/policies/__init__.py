"""The policy registry: one map from name to plugin class, as in the Kubernetes
scheduler framework's registry."""

from __future__ import annotations

from typing import Any

from gpufleet.scheduler.policies.backfill import BackfillPolicy
from gpufleet.scheduler.policies.base import Context, Policy
from gpufleet.scheduler.policies.default import DefaultPolicy
from gpufleet.scheduler.policies.fairshare import FairSharePolicy
from gpufleet.scheduler.policies.fifo import FifoPolicy
from gpufleet.scheduler.policies.las import LasPolicy
from gpufleet.scheduler.policies.sjf import SjfPolicy
from gpufleet.scheduler.policies.srtf import SrtfOraclePolicy

POLICIES: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (
        FifoPolicy,
        BackfillPolicy,
        SjfPolicy,
        LasPolicy,
        SrtfOraclePolicy,
        FairSharePolicy,
        DefaultPolicy,
    )
}


def make_policy(name: str, **params: Any) -> Policy:
    """Build a policy by its registered name; ``params`` set its dataclass fields."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}") from None
    return cls(**params)


__all__ = [
    "POLICIES",
    "BackfillPolicy",
    "Context",
    "DefaultPolicy",
    "FairSharePolicy",
    "FifoPolicy",
    "LasPolicy",
    "Policy",
    "SjfPolicy",
    "SrtfOraclePolicy",
    "make_policy",
]
