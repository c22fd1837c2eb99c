"""The OpenAI-compatible endpoints: ``/v1/models``, ``/v1/completions`` and
``/v1/chat/completions``, plain JSON or ``stream: true`` (Server-Sent Events, each
chunk ``data: {json}``, the last ``data: [DONE]``).

Errors have OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, which
the ``openai`` client turns into its exceptions. The reply's ``model`` and
``system_fingerprint`` are ``NAME:VERSION`` (a request may name ``NAME`` or
``NAME:VERSION``), so a caller sees which version answered during a rolling update.

Options the toy cannot honour are refused with a 400 that names them
(``unsupported_options``), never silently ignored: a client that asks for tools or a
JSON schema and gets free text would fail far from the cause. ``logprobs`` is honoured,
streamed or not (``textgen``: the toy's true, uniform, log probabilities); ``n`` is
honoured; sampling knobs (``temperature``, ``top_p``, penalties, ``user``) are
accepted and have no effect on a deterministic generator. ``/v1/embeddings`` answers
deterministic vectors (``embeddings``).

Generation runs in the model's ``engine.TextEngine`` (continuous batching by default,
``--batching static`` for the baseline): a request's choices join the running batch,
a stream sends each step's tokens as they come, each choice's ``finish_reason`` when it
ends, then ``usage`` (when asked) and ``[DONE]``. A client that disconnects (streaming or
not) takes its sequences out of the batch. A full queue is a 503 with ``Retry-After``
(``code: "queue_full"``), as an overloaded vLLM or TGI answers.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from gpufleet.modelserver.embeddings import EmbeddingRequest, embedding_data
from gpufleet.modelserver.engine import EngineFull, Group, TextEngine
from gpufleet.modelserver.textgen import (
    ChatRequest,
    CompletionRequest,
    Decoder,
    Generation,
    chat_logprobs,
    completion_logprobs,
    count_tokens,
)

_R = TypeVar("_R", bound=BaseModel)


class OpenAIError(Exception):
    """Answered as OpenAI's error JSON with ``status``."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str = "invalid_request_error",
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.status, self.type, self.code = message, status, type, code
        self.param: str | None = None
        self.headers = headers

    def response(self) -> JSONResponse:
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return JSONResponse({"error": error}, status_code=self.status, headers=self.headers)


@dataclass(frozen=True, kw_only=True)
class TextModel:
    """What the endpoints serve: ``ready`` says whether the model has loaded; ``engine``
    decodes."""

    name: str
    version: str
    seed: int
    engine: TextEngine
    ready: Callable[[], bool]
    created: int

    @property
    def tag(self) -> str:
        return f"{self.name}:{self.version}"

    def check(self, model: str) -> None:
        if not self.ready():
            raise OpenAIError(f"model '{self.name}' is loading", status=503, type="server_error")
        if model not in (self.name, self.tag):
            raise OpenAIError(
                f"The model '{model}' does not exist (this server has '{self.name}')",
                status=404,
                code="model_not_found",
            )

    def submit(self, seed: int, prompts: list[str], req: CompletionRequest | ChatRequest) -> Group:
        """Queue every choice of every prompt (choice ``i`` of prompt ``p`` is index
        ``p * n + i``); 503 when the queue is full."""
        decoders = [
            Decoder(model=self.name, seed=seed, prompt=p, choice=i, max_tokens=req.limit, stops=req.stops)
            for p in prompts
            for i in range(req.n)
        ]
        try:
            return self.engine.submit(decoders)
        except EngineFull as exc:
            raise OpenAIError(
                str(exc),
                status=503,
                type="server_error",
                code="queue_full",
                headers={"Retry-After": str(exc.retry_after_s)},
            ) from None
        except ValueError as exc:
            err = OpenAIError(f"n: {exc}", code="invalid_parameter")
            err.param = "n"
            raise err from None


def openai_router(served: TextModel) -> APIRouter:
    router = APIRouter(prefix="/v1")

    def card() -> dict[str, Any]:
        return {"id": served.name, "object": "model", "created": served.created, "owned_by": "gpufleet"}

    @router.get("/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [card()]}

    @router.get("/models/{model_id}")
    async def get_model(model_id: str) -> dict[str, Any]:
        if model_id not in (served.name, served.tag):
            raise OpenAIError(f"The model '{model_id}' does not exist", status=404, code="model_not_found")
        return card()

    @router.post("/completions")
    async def completions(request: Request) -> Response:
        req = _parse(CompletionRequest, await request.body(), COMPLETION_ONLY)
        served.check(req.model)
        if not req.prompts:
            raise OpenAIError("prompt: must not be an empty list")
        seed = served.seed if req.seed is None else req.seed
        prompts = [p for p in req.prompts for _ in range(req.n)]
        group = served.submit(seed, list(req.prompts), req)
        head = _head(served, "cmpl", "text_completion")
        if req.stream:
            offsets = [len(p) if req.echo else 0 for p in prompts]

            def piece(i: int, text: str, finish: str | None) -> dict[str, Any]:
                lp = None
                if req.logprobs is not None and finish is None:
                    lp = completion_logprobs((text,), req.logprobs, offsets[i])
                    offsets[i] += len(text)
                return {"index": i, "text": text, "logprobs": lp, "finish_reason": finish}

            echo = [
                {"index": i, "text": p, "logprobs": None, "finish_reason": None}
                for i, p in enumerate(prompts)
            ]
            echo = echo if req.echo else []
            return _sse(served, group, head, echo, piece, req.prompts if req.include_usage else None)
        gens = await _finish(request, served, group)
        if gens is None:
            return _gone()
        choices = [
            {
                "index": i,
                "text": (prompts[i] if req.echo else "") + g.text,
                "logprobs": None
                if req.logprobs is None
                else completion_logprobs(g.tokens, req.logprobs, len(prompts[i]) if req.echo else 0),
                "finish_reason": g.finish_reason,
            }
            for i, g in enumerate(gens)
        ]
        return JSONResponse({**head, "choices": choices, "usage": _usage(req.prompts, gens)})

    @router.post("/chat/completions")
    async def chat_completions(request: Request) -> Response:
        req = _parse(ChatRequest, await request.body(), ())
        served.check(req.model)
        if req.top_logprobs and not req.logprobs:
            raise OpenAIError("top_logprobs: logprobs must be true to use it", code="invalid_parameter")
        seed = served.seed if req.seed is None else req.seed
        group = served.submit(seed, [req.prompt], req)
        head = _head(served, "chatcmpl", "chat.completion")
        if req.stream:

            def piece(i: int, text: str, finish: str | None) -> dict[str, Any]:
                delta = {"content": text} if finish is None else {}
                lp = (
                    chat_logprobs((text,), req.top_logprobs or 0) if req.logprobs and finish is None else None
                )
                return {"index": i, "delta": delta, "logprobs": lp, "finish_reason": finish}

            roles = [
                {
                    "index": i,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
                for i in range(req.n)
            ]
            chunk_head = {**head, "object": "chat.completion.chunk"}
            return _sse(served, group, chunk_head, roles, piece, (req.prompt,) if req.include_usage else None)
        gens = await _finish(request, served, group)
        if gens is None:
            return _gone()
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": g.text},
                "logprobs": chat_logprobs(g.tokens, req.top_logprobs or 0) if req.logprobs else None,
                "finish_reason": g.finish_reason,
            }
            for i, g in enumerate(gens)
        ]
        return JSONResponse({**head, "choices": choices, "usage": _usage((req.prompt,), gens)})

    @router.post("/embeddings")
    async def embeddings(request: Request) -> Response:
        req = _parse(EmbeddingRequest, await request.body(), ())
        served.check(req.model)
        if not req.texts or any(not t for t in req.texts):
            raise OpenAIError("input: must not be empty", code="invalid_parameter")
        data = embedding_data(req, model=served.name, seed=served.seed)
        tokens = sum(count_tokens(t) for t in req.texts)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return JSONResponse({"object": "list", "data": data, "model": served.tag, "usage": usage})

    return router


COMPLETION_ONLY = ("suffix", "best_of")
"""Options only ``/v1/completions`` has that the toy cannot honour (when set)."""


def unsupported_options(doc: dict[str, Any], extra: tuple[str, ...]) -> list[str]:
    """The options of a request the toy cannot honour, by name: set to anything but
    their no-op value (``tool_choice: "none"``, ``response_format: {"type": "text"}``,
    an empty ``logit_bias``, ``best_of: 1``... are fine)."""
    names = []
    for key in ("tools", "functions", "logit_bias", "prediction", "audio", *extra):
        if doc.get(key) not in (None, [], {}, "", 1 if key == "best_of" else None):
            names.append(key)
    if doc.get("tool_choice") not in (None, "none", "auto") or doc.get("function_call") not in (None, "none"):
        names.append("tool_choice" if "tool_choice" in doc else "function_call")
    fmt = doc.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        names.append("response_format")
    modalities = doc.get("modalities")
    if modalities is not None and modalities != ["text"]:
        names.append("modalities")
    return names


def _unsupported(names: list[str]) -> OpenAIError:
    err = OpenAIError(
        f"unsupported parameter(s) for this model: {', '.join(names)} (gpufleet's toy model generates"
        " plain text only; remove them)",
        code="unsupported_parameter",
    )
    err.param = names[0]
    return err


def _parse(schema: type[_R], body: bytes, extra: tuple[str, ...]) -> _R:
    """The request, once no option in it is one the toy cannot honour."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OpenAIError(f"body: not valid JSON: {exc}") from None
    if isinstance(doc, dict):
        names = unsupported_options(doc, extra)
        if names:
            raise _unsupported(names)
    try:
        return schema.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise OpenAIError(f"{where}: {first['msg']}") from None


def _head(served: TextModel, prefix: str, obj: str) -> dict[str, Any]:
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": obj,
        "created": int(time.time()),
        "model": served.tag,
        "system_fingerprint": served.tag,
    }


def _usage(prompts: tuple[str, ...], gens: list[Generation]) -> dict[str, int]:
    prompt_tokens = sum(count_tokens(p) for p in prompts)
    completion_tokens = sum(len(g.tokens) for g in gens)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


Piece = Callable[[int, str, "str | None"], dict[str, Any]]


def _gone() -> Response:
    """What a request whose client left is "answered" (never sent; nginx's code for it,
    as the access log shows it)."""
    return Response(status_code=499)


def _sse(
    served: TextModel,
    group: Group,
    head: dict[str, Any],
    first: list[dict[str, Any]],
    piece: Piece,
    usage_of: tuple[str, ...] | None,
) -> StreamingResponse:
    """The stream: ``first`` chunks (role, echo), then what each step adds (one chunk a
    choice's piece, one its ``finish_reason`` when it ends), usage of the prompts
    ``usage_of`` when asked, ``[DONE]``. The steps' chunks are written together, one
    write per step. However it ends (the client gone: Starlette cancels the stream), the
    request's sequences leave the batch."""

    async def events() -> AsyncIterator[bytes]:
        try:
            if first:
                yield b"".join(_event({**head, "choices": [choice]}) for choice in first)
            async for updates in group.updates():
                out = []
                for u in updates:
                    if u.piece is not None:
                        out.append(_event({**head, "choices": [piece(u.index, u.piece, None)]}))
                    if u.finish_reason is not None:
                        out.append(_event({**head, "choices": [piece(u.index, "", u.finish_reason)]}))
                yield b"".join(out)
            if usage_of is not None:
                yield _event({**head, "choices": [], "usage": _usage(usage_of, group.generations())})
        except RuntimeError as exc:  # the engine stopped (shutdown): say so in the stream
            yield _event(
                {"error": {"message": str(exc), "type": "server_error", "param": None, "code": None}}
            )
        finally:
            served.engine.cancel(group)
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


async def _finish(request: Request, served: TextModel, group: Group) -> list[Generation] | None:
    """A non-streamed request's generations once all have finished; None when its client
    disconnected first (its sequences then leave the batch: nobody would read them)."""
    if group.finished:
        return group.generations()
    done = asyncio.ensure_future(group.wait())
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((done, gone), return_when=asyncio.FIRST_COMPLETED)
        if not done.done():
            return None
        try:
            return done.result()
        except RuntimeError as exc:  # the engine stopped
            raise OpenAIError(str(exc), status=503, type="server_error") from None
    finally:
        gone.cancel()
        if not done.done():
            done.cancel()
            served.engine.cancel(group)


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone. The body has been read, so the server's next
    message is ``http.disconnect`` (when the client closes, or once the response is
    complete)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


__all__ = ["OpenAIError", "TextModel", "openai_router", "unsupported_options"]
