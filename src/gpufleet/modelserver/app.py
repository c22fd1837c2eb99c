"""The ASGI app: KServe v2 endpoints for the MLP, OpenAI-compatible ones for the toy
text generator, and the ``X-Gpufleet-Replica`` header on every reply.

Readiness is a clock: the model counts as loaded ``load_delay_s`` after ``create_app``
(the server starts right after), so readiness probes and "not ready yet" handling can
be tested without a real model load. Until then ``/v2/health/ready``, the model's
``ready`` and ``infer`` (and the OpenAI generation endpoints) answer 503; liveness is
200 from the start.

Infer requests go through the model's :class:`~gpufleet.modelserver.batcher.Batcher`
(one execution at a time, batched when ``batching`` says so) and are counted in
:class:`~gpufleet.modelserver.stats.ModelStats`: Triton's ``/v2/models/{m}/stats`` and
Prometheus ``/metrics``.
"""

from __future__ import annotations

import asyncio
import gzip
import os
import re
import time
import zlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpufleet import __version__
from gpufleet.modelserver.accesslog import AccessLog
from gpufleet.modelserver.batcher import Batcher, BatchPolicy
from gpufleet.modelserver.engine import EnginePolicy, TextEngine
from gpufleet.modelserver.kserve import (
    HEADER_LENGTH,
    InferRequest,
    ProtocolError,
    Tensor,
    encode_infer_response,
    parse_header_length,
    parse_infer_request,
)
from gpufleet.modelserver.model import (
    HIDDEN,
    INPUT_NAME,
    INPUTS,
    MLP,
    OUTPUT_NAME,
    OUTPUTS,
    ModelInputError,
    SimulatedDevice,
    check_inputs,
    model_config,
)
from gpufleet.modelserver.openai_api import OpenAIError, TextModel, openai_router
from gpufleet.modelserver.repository import ModelState, repository_router
from gpufleet.modelserver.stats import ModelStats

REPLICA_HEADER = "X-Gpufleet-Replica"
EXTENSIONS = [
    "binary_tensor_data",
    "model_configuration",
    "model_repository",
    "statistics",
    "openai_compatible",
]
LAUNCH_OVERHEAD_US = 2000.0
"""The default simulated fixed cost of a forward call (``--launch-overhead-us``): about
what a GPU kernel launch, copies and sync cost a small model."""


@dataclass(frozen=True, kw_only=True, eq=False)
class ServedModel:
    """The one model this server holds; ready once ``clock()`` reaches ``ready_at``,
    while loaded (``repository``: unload and load)."""

    name: str
    version: str
    mlp: MLP
    batcher: Batcher
    stats: ModelStats
    ready_at: float
    clock: Callable[[], float] = time.monotonic
    state: ModelState = field(default_factory=ModelState)

    def started(self) -> bool:
        """The server's readiness (``/v2/health/ready``): the simulated load is over."""
        return self.clock() >= self.ready_at

    def ready(self) -> bool:
        """The model's: started, and not unloaded."""
        return self.state.loaded and self.clock() >= self.ready_at

    def unavailable(self) -> Response | None:
        """The answer to an infer while the model cannot run: 503 while it loads,
        Triton's 400 once unloaded; None when it is ready."""
        if not self.state.loaded:
            detail = f"Request for unknown model: '{self.name}' has no available versions (unloaded)"
            return JSONResponse({"error": detail}, status_code=400)
        if not self.started():
            return JSONResponse({"error": f"model '{self.name}' is loading"}, status_code=503)
        return None

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
    generation: EnginePolicy | None = None,
    replica: str | None = None,
    hidden: int = HIDDEN,
    launch_overhead_us: float = LAUNCH_OVERHEAD_US,
    batching: BatchPolicy | None = None,
    access_log: bool = False,
) -> FastAPI:
    """The server's app. ``replica`` (default: ``$GPUFLEET_JOB_ID``, else ``local``) is
    the ``X-Gpufleet-Replica`` header value; ``batching`` (infer) defaults to off;
    ``generation`` is the text engine's batching and step cost (default: continuous,
    ``token_delay_ms`` a step and nothing more per sequence; when given,
    ``token_delay_ms`` is not used); ``access_log``: one line per request
    (``accesslog``)."""
    mlp = MLP.from_seed(seed, hidden=hidden)
    stats = ModelStats(name=model_name, version=version)
    served = ServedModel(
        name=model_name,
        version=version,
        mlp=mlp,
        batcher=Batcher(
            forward=SimulatedDevice(mlp=mlp, launch_overhead_s=max(0.0, launch_overhead_us) / 1e6),
            policy=batching or BatchPolicy(),
            on_execution=stats.executed,
            name=model_name,
        ),
        stats=stats,
        ready_at=time.monotonic() + max(0.0, load_delay_s),
    )
    text = TextModel(
        name=model_name,
        version=version,
        seed=seed,
        engine=TextEngine(
            generation or EnginePolicy(step_s=max(0.0, token_delay_ms) / 1000.0), on_step=stats.decoded
        ),
        ready=served.ready,
        created=int(time.time()),
    )
    stats.metrics.sequences_running.set_function(lambda: len(text.engine.running))
    stats.metrics.sequences_waiting.set_function(lambda: len(text.engine.waiting))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await served.batcher.close()
        await text.engine.close()

    app = FastAPI(
        title="gpufleet model-server", version=__version__, docs_url=None, redoc_url=None, lifespan=lifespan
    )
    app.include_router(kserve_router(served))
    app.include_router(
        repository_router(name=model_name, version=version, state=served.state, started=served.started)
    )
    app.include_router(openai_router(text))

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(stats.metrics.registry), media_type=CONTENT_TYPE_LATEST)

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

    app.add_middleware(InferShortcut, served=served)
    app.add_middleware(ReplicaHeader, replica=replica or os.environ.get("GPUFLEET_JOB_ID") or "local")
    if access_log:
        app.add_middleware(AccessLog)
    return app


def kserve_router(served: ServedModel) -> APIRouter:
    """The KServe v2 routes tritonclient calls, each with and without ``/versions/{v}``."""
    router = APIRouter(prefix="/v2")

    def not_ready() -> Response:
        return JSONResponse({"error": f"model '{served.name}' is loading"}, status_code=503)

    # infer first: Starlette tries the routes in order, and infer is the hot one (though
    # ``InferShortcut`` serves it before FastAPI's routing; this route is the same code)
    @router.post("/models/{name}/infer")
    @router.post("/models/{name}/versions/{version}/infer")
    async def infer(request: Request) -> Response:
        params = request.path_params
        return await handle_infer(served, request, params["name"], params.get("version"))

    @router.get("/health/live")
    async def live() -> Response:
        return Response(status_code=200)

    @router.get("/health/ready")
    async def ready() -> Response:
        return Response(status_code=200) if served.started() else not_ready()

    @router.get("")
    async def server_metadata() -> dict[str, Any]:
        return {"name": "gpufleet-model-server", "version": __version__, "extensions": EXTENSIONS}

    @router.get("/models/stats")  # before /models/{name}, which would take "stats" as a name
    async def all_stats() -> dict[str, Any]:
        return {"model_stats": [served.stats.as_triton()]}

    @router.get("/models/{name}/stats")
    @router.get("/models/{name}/versions/{version}/stats")
    async def model_stats(name: str, version: str | None = None) -> dict[str, Any]:
        served.lookup(name, version)
        return {"model_stats": [served.stats.as_triton()]}

    @router.get("/models/{name}")
    @router.get("/models/{name}/versions/{version}")
    async def model_metadata(name: str, version: str | None = None) -> dict[str, Any]:
        served.lookup(name, version)
        return served.metadata()

    @router.get("/models/{name}/config")
    @router.get("/models/{name}/versions/{version}/config")
    async def config(name: str, version: str | None = None) -> dict[str, Any]:
        served.lookup(name, version)
        policy = served.batcher.policy
        return model_config(
            served.name, max_batch=policy.max_batch_size, dynamic_batching=policy.as_triton_config()
        )

    @router.get("/models/{name}/ready")
    @router.get("/models/{name}/versions/{version}/ready")
    async def model_ready(name: str, version: str | None = None) -> Response:
        served.lookup(name, version)
        return Response(status_code=200) if served.ready() else served.unavailable() or not_ready()

    return router


async def handle_infer(served: ServedModel, request: Request, name: str, version: str | None) -> Response:
    """One ``POST /v2/models/{name}[/versions/{version}]/infer``: counted, timed, and
    answered 503 while the model loads. Raises ProtocolError for a bad request."""
    served.lookup(name, version)
    arrived_ns = time.perf_counter_ns()
    gauge = served.stats.metrics.inflight
    gauge.inc()
    code = 500
    try:
        response = served.unavailable() or await _infer_response(served, request, arrived_ns)
        code = response.status_code
        return response
    except ProtocolError as exc:
        code = exc.status
        raise
    except asyncio.CancelledError:
        code = 499  # the client went away (nginx's code for it)
        raise
    finally:
        gauge.dec()
        served.stats.answered(code=code, total_ns=time.perf_counter_ns() - arrived_ns)


_INFER_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?/infer$")


class InferShortcut:
    """Serves ``POST .../infer`` (every inference: the hot path) without FastAPI's routing
    and request handling, which cost about as much CPU as the rest of an inference
    (``bench/bench_batching.py``); everything else goes on to the app. Same code, same
    answers, same errors as the route."""

    def __init__(self, app: ASGIApp, *, served: ServedModel) -> None:
        self.app = app
        self.served = served

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            m = _INFER_PATH.match(scope["path"])
            if m is not None:
                try:
                    response = await handle_infer(self.served, Request(scope, receive), m[1], m[2])
                except ProtocolError as exc:
                    response = JSONResponse({"error": exc.message}, status_code=exc.status)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _infer_response(served: ServedModel, request: Request, arrived_ns: int) -> Response:
    """Parse, check, run in the model's batcher, encode; errors in the request are
    ProtocolError, a failed execution a 500."""
    body = _decompress(await request.body(), request.headers.get("content-encoding"))
    req = parse_infer_request(body, header_length=parse_header_length(request.headers.get(HEADER_LENGTH)))
    inputs = {t.name: t for t in req.inputs}
    if len(inputs) != len(req.inputs):
        raise ProtocolError("an input name appears twice in the request")
    known = sorted(spec.name for spec in OUTPUTS)
    for out in req.outputs or ():
        if out.name not in known:
            raise ProtocolError(
                f"unexpected inference output {out.name!r} for model '{served.name}'"
                f" (its outputs are {known})"
            )
    try:
        check_inputs(inputs, max_batch=served.batcher.policy.max_batch_size)
    except ModelInputError as exc:
        served.stats.failed(total_ns=time.perf_counter_ns() - arrived_ns)
        raise ProtocolError(f"model '{served.name}': {exc}") from None
    x = inputs[INPUT_NAME].array
    try:
        done = await served.batcher.infer(x)
    except Exception as exc:  # the model failed (or the server is stopping): not the caller's fault
        served.stats.failed(total_ns=time.perf_counter_ns() - arrived_ns)
        return JSONResponse({"error": f"model '{served.name}' failed: {exc}"}, status_code=500)
    results = {OUTPUT_NAME: Tensor(name=OUTPUT_NAME, datatype="FP32", array=done.output)}
    response = _encode(served, req, results)
    served.stats.succeeded(
        rows=len(x), total_ns=time.perf_counter_ns() - arrived_ns, queue_ns=done.queue_ns, run=done.execution
    )
    return response


def _encode(served: ServedModel, req: InferRequest, results: dict[str, Tensor]) -> Response:
    chosen: list[tuple[Tensor, bool]] = []
    if req.outputs is None:
        chosen = [(t, req.binary_output) for t in results.values()]
    for out in req.outputs or ():
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


__all__ = ["REPLICA_HEADER", "InferShortcut", "ReplicaHeader", "ServedModel", "create_app", "kserve_router"]
