"""Triton's model repository extension for the one model this server holds:
``POST /v2/repository/index``, ``/v2/repository/models/{m}/load`` and ``/unload``
(``tritonclient``'s ``get_model_repository_index``, ``load_model``, ``unload_model``).

Why here at all: ``GET /v2`` advertises ``model_repository``, and the field reports
drive hot load and unload through it. Unload makes the model not ready (its ``ready``
is 503, infer is Triton's 400 "has no available versions") and load makes it ready
again; the index shows ``READY``, ``LOADING`` (the simulated load delay) or
``UNAVAILABLE`` with the reason ``unloaded``. The server's own readiness
(``/v2/health/ready``, the replica's probe) is not the model's: a replica whose model
was unloaded stays in its service, so a later load can reach it.

Loading from a config or files (``load_model(config=..., files=...)``) is refused: this
server has one built-in model and no repository on disk.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gpufleet.modelserver.kserve import ProtocolError


@dataclass(slots=True)
class ModelState:
    """Whether the model is loaded (mutable: the repository API flips it; one event
    loop owns it)."""

    loaded: bool = True


def repository_router(
    *, name: str, version: str, state: ModelState, started: Callable[[], bool]
) -> APIRouter:
    router = APIRouter(prefix="/v2/repository")

    @router.post("/index")
    async def index() -> list[dict[str, Any]]:
        entry: dict[str, Any] = {"name": name, "version": version}
        if not state.loaded:
            entry |= {"state": "UNAVAILABLE", "reason": "unloaded"}
        else:
            entry["state"] = "READY" if started() else "LOADING"
        return [entry]

    @router.post("/models/{model}/load")
    async def load(model: str, request: Request) -> Response:
        _check(model, name, "load")
        params = _parameters(await request.body())
        refused = sorted(k for k in params if k == "config" or k.startswith("file:"))
        if refused:
            raise ProtocolError(
                f"failed to load '{model}': this server has one built-in model and cannot load"
                f" it from {', '.join(refused)}"
            )
        state.loaded = True
        return JSONResponse({})

    @router.post("/models/{model}/unload")
    async def unload(model: str, request: Request) -> Response:
        _check(model, name, "unload")
        _parameters(await request.body())
        state.loaded = False
        return JSONResponse({})

    return router


def _check(model: str, name: str, verb: str) -> None:
    if model != name:
        raise ProtocolError(
            f"failed to {verb} '{model}': no such model in the repository (this server has '{name}')",
            status=404,
        )


def _parameters(body: bytes) -> dict[str, Any]:
    """The request's ``parameters`` (an empty body has none)."""
    if not body.strip():
        return {}
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"the request is not valid JSON: {exc}") from None
    params = doc.get("parameters") if isinstance(doc, dict) else None
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise ProtocolError("'parameters' must be a JSON object")
    return params


__all__ = ["ModelState", "repository_router"]
