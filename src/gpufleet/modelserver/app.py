"""The ASGI app: KServe v2 endpoints for the MLP, OpenAI-compatible ones for the toy
text generator, and the ``X-Gpufleet-Replica`` header on every reply.

Readiness is a clock: the model counts as loaded ``load_delay_s`` after ``create_app``
(the server starts right after), so readiness probes and "not ready yet" handling can
be tested without a real model load. Until then ``/v2/health/ready``, the model's
``ready`` and ``infer`` (and the OpenAI generation endpoints) answer 503; liveness is
200 from the start.
"""

from __future__ import annotations

import gzip
import os
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpufleet import __version__
from gpufleet.modelserver.kserve import (
    HEADER_LENGTH,
    InferRequest,
    ProtocolError,
    Tensor,
    encode_infer_response,
    parse_header_length,
    parse_infer_request,
)
from gpufleet.modelserver.model import INPUTS, MLP, OUTPUTS, ModelInputError, model_config
from gpufleet.modelserver.openai_api import OpenAIError, TextModel, openai_router

REPLICA_HEADER = "X-Gpufleet-Replica"
EXTENSIONS = ["binary_tensor_data", "model_configuration", "model_repository", "openai_compatible"]


@dataclass(frozen=True, kw_only=True, eq=False)
class ServedModel:
    """The one model this server holds; ready once ``clock()`` reaches ``ready_at``."""

    name: str
    version: str
    mlp: MLP
    ready_at: float
    clock: Callable[[], float] = time.monotonic

    def ready(self) -> bool:
        return self.clock() >= self.ready_at

    def lookup(self, name: str, version: str | None) -> None:
        """Raise 404 unless ``name`` (and ``version``, when given) is this model."""
        if name != self.name:
            raise ProtocolError(f"Request for unknown model: '{name}' is not found", status=404)
        if version not in (None, "", self.version):
            raise ProtocolError(
                f"Request for unknown model: '{name}' version {version} is not found"
                f" (this server has version {self.version})",
                status=404,
            )

    def metadata(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "versions": [self.version],
            "platform": "gpufleet-numpy",
            "inputs": [spec.as_metadata() for spec in INPUTS],
            "outputs": [spec.as_metadata() for spec in OUTPUTS],
        }


def create_app(
    *,
    model_name: str = "mlp",
    version: str = "1",
    seed: int = 0,
    load_delay_s: float = 0.0,
    token_delay_ms: float = 0.0,
    replica: str | None = None,
) -> FastAPI:
    """The server's app. ``replica`` (default: ``$GPUFLEET_JOB_ID``, else ``local``) is
    the ``X-Gpufleet-Replica`` header value."""
    served = ServedModel(
        name=model_name,
        version=version,
        mlp=MLP.from_seed(seed),
        ready_at=time.monotonic() + max(0.0, load_delay_s),
    )
    text = TextModel(
        name=model_name,
        version=version,
        seed=seed,
        token_delay_s=max(0.0, token_delay_ms) / 1000.0,
        ready=served.ready,
        created=int(time.time()),
    )
    app = FastAPI(title="gpufleet model-server", version=__version__, docs_url=None, redoc_url=None)
    app.include_router(kserve_router(served))
    app.include_router(openai_router(text))

    @app.exception_handler(ProtocolError)
    async def protocol_error(request: Request, exc: ProtocolError) -> Response:
        return JSONResponse({"error": exc.message}, status_code=exc.status)

    @app.exception_handler(OpenAIError)
    async def openai_error(request: Request, exc: OpenAIError) -> Response:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if request.url.path.startswith("/v1/"):
            return OpenAIError(str(exc.detail), status=exc.status_code).response()
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    app.add_middleware(ReplicaHeader, replica=replica or os.environ.get("GPUFLEET_JOB_ID") or "local")
    return app


def kserve_router(served: ServedModel) -> APIRouter:
    """The KServe v2 routes tritonclient calls, each with and without ``/versions/{v}``."""
    router = APIRouter(prefix="/v2")

    def not_ready() -> Response:
        return JSONResponse({"error": f"model '{served.name}' is loading"}, status_code=503)

    @router.get("/health/live")
    async def live() -> Response:
        return Response(status_code=200)

    @router.get("/health/ready")
    async def ready() -> Response:
        return Response(status_code=200) if served.ready() else not_ready()

    @router.get("")
    async def server_metadata() -> dict[str, Any]:
        return {"name": "gpufleet-model-server", "version": __version__, "extensions": EXTENSIONS}

    @router.post("/repository/index")
    async def repository_index() -> list[dict[str, Any]]:
        state = "READY" if served.ready() else "LOADING"
        return [{"name": served.name, "version": served.version, "state": state}]

    @router.get("/models/{name}")
    @router.get("/models/{name}/versions/{version}")
    async def model_metadata(name: str, version: str | None = None) -> dict[str, Any]:
        served.lookup(name, version)
        return served.metadata()

    @router.get("/models/{name}/config")
    @router.get("/models/{name}/versions/{version}/config")
    async def config(name: str, version: str | None = None) -> dict[str, Any]:
        served.lookup(name, version)
        return model_config(served.name)

    @router.get("/models/{name}/ready")
    @router.get("/models/{name}/versions/{version}/ready")
    async def model_ready(name: str, version: str | None = None) -> Response:
        served.lookup(name, version)
        return Response(status_code=200) if served.ready() else not_ready()

    @router.post("/models/{name}/infer")
    @router.post("/models/{name}/versions/{version}/infer")
    async def infer(request: Request, name: str, version: str | None = None) -> Response:
        served.lookup(name, version)
        if not served.ready():
            return not_ready()
        body = _decompress(await request.body(), request.headers.get("content-encoding"))
        req = parse_infer_request(body, header_length=parse_header_length(request.headers.get(HEADER_LENGTH)))
        return _infer_response(served, req)

    return router


def _infer_response(served: ServedModel, req: InferRequest) -> Response:
    inputs = {t.name: t for t in req.inputs}
    if len(inputs) != len(req.inputs):
        raise ProtocolError("an input name appears twice in the request")
    try:
        results = served.mlp.infer(inputs)
    except ModelInputError as exc:
        raise ProtocolError(f"model '{served.name}': {exc}") from None
    chosen: list[tuple[Tensor, bool]] = []
    if req.outputs is None:
        chosen = [(t, req.binary_output) for t in results.values()]
    for out in req.outputs or ():
        if out.name not in results:
            raise ProtocolError(
                f"unexpected inference output {out.name!r} for model '{served.name}'"
                f" (its outputs are {sorted(results)})"
            )
        chosen.append((results[out.name], req.binary_output if out.binary is None else out.binary))
    body, json_size = encode_infer_response(
        model_name=served.name, model_version=served.version, request_id=req.id, outputs=chosen
    )
    if json_size is None:
        return Response(body, media_type="application/json")
    return Response(body, media_type="application/octet-stream", headers={HEADER_LENGTH: str(json_size)})


def _decompress(body: bytes, encoding: str | None) -> bytes:
    """tritonclient may compress the request (``request_compression_algorithm``)."""
    try:
        if encoding == "gzip":
            return gzip.decompress(body)
        if encoding == "deflate":
            return zlib.decompress(body)
    except (OSError, zlib.error, EOFError) as exc:
        raise ProtocolError(f"cannot decompress the {encoding} request body: {exc}") from None
    if encoding not in (None, "identity"):
        raise ProtocolError(f"unsupported Content-Encoding {encoding!r}")
    return body


class ReplicaHeader:
    """Pure ASGI middleware (streams pass through untouched): adds ``X-Gpufleet-Replica``
    so a caller behind a load balancer sees which replica answered."""

    def __init__(self, app: ASGIApp, *, replica: str) -> None:
        self.app = app
        self.value = replica.encode("latin-1", errors="replace")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-gpufleet-replica", self.value)]
            await send(message)

        await self.app(scope, receive, send_tagged)


__all__ = ["REPLICA_HEADER", "ReplicaHeader", "ServedModel", "create_app", "kserve_router"]
