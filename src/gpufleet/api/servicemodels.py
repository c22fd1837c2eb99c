"""Hot model load and unload for a service (issue 30): the models a service wants
loaded or unloaded on every replica, beyond what its spec starts them with.

The shape follows Kubernetes' declarative writes rather than Triton's imperative calls:
``PUT /v1/services/{name}/models/{model}`` with ``{"state": "loaded"}`` (or
``"unloaded"``) records what is wanted, and each replica's agent converges to it
(Triton's ``/v2/repository/models/{m}/load|unload`` on the replica, after comparing with
its ``/v2/repository/index``), also on replicas that start later. ``DELETE`` forgets the
wish (replicas keep what they have; new ones start as their server starts them).
``GET /v1/services/{name}/models`` lists the wishes with where each replica stands.

Observed state travels up with the agent's sync (``ReplicaModel`` in
``ObservedJob.models``); desired state down in ``ServiceProbe.models``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from gpufleet.api.base import Reply, Request

MODEL_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
"""A model's name in a repository (Triton's are directory names): letters, digits,
``.``, ``_``, ``-``, at most 128, not starting with a symbol (never ``..``)."""
ModelName = Annotated[str, StringConstraints(pattern=MODEL_NAME)]
Wanted = Literal["loaded", "unloaded"]
ReplicaModelState = Literal["READY", "LOADING", "UNAVAILABLE", "FAILED", "UNKNOWN"]
"""``READY``/``LOADING``/``UNAVAILABLE``: Triton's index states as the replica reports
them; ``FAILED``: the agent's load or unload call was refused (``reason``: the
replica's own words); ``UNKNOWN``: its index could not be read."""
MAX_MODELS = 32
"""Wishes per service (each is a call per replica when it changes, and a row)."""
Reason = Annotated[str, StringConstraints(max_length=512)]


class ServiceModelIn(Request):
    """The body of ``PUT /v1/services/{name}/models/{model}``."""

    state: Wanted = Field(description="loaded: every replica loads it; unloaded: every replica unloads it")


class ReplicaModel(Request):
    """One model on one replica, as its agent last saw it (up with the sync)."""

    name: ModelName
    state: ReplicaModelState
    reason: Reason = ""
    wanted: Wanted | None = Field(default=None, description="the wish the agent worked toward")


class ReplicaModelOut(Reply):
    job_id: int
    replica: int
    state: ReplicaModelState | Literal["PENDING"] = Field(
        description="PENDING: the replica's agent has not reported this model yet"
    )
    reason: str = ""


class ServiceModelOut(Reply):
    """A wish and where the service's serving replicas stand with it."""

    name: str
    wanted: Wanted
    at: float
    actor: str
    replicas: int = Field(description="the replicas counted: running and ready (in rotation or warm)")
    converged: int = Field(description="of those, the ones whose state is the wanted one")
    failed: int
    per_replica: list[ReplicaModelOut] = Field(default_factory=list)


def converged(wanted: str, state: str) -> bool:
    """Whether a replica's state of a model is what is wanted: loaded is READY, unloaded
    is UNAVAILABLE (a model not in the repository is unavailable: not loaded)."""
    return state == ("READY" if wanted == "loaded" else "UNAVAILABLE")


__all__ = [
    "MAX_MODELS",
    "MODEL_NAME",
    "ModelName",
    "ReplicaModel",
    "ReplicaModelOut",
    "ReplicaModelState",
    "ServiceModelIn",
    "ServiceModelOut",
    "Wanted",
    "converged",
]
