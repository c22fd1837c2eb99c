"""The OpenAI-compatible endpoints: ``/v1/models``, ``/v1/completions`` and
``/v1/chat/completions``, plain JSON or ``stream: true`` (Server-Sent Events, each
chunk ``data: {json}``, the last ``data: [DONE]``).

Errors have OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, which
the ``openai`` client turns into its exceptions. The reply's ``model`` and
``system_fingerprint`` are ``NAME:VERSION`` (a request may name ``NAME`` or
``NAME:VERSION``), so a caller sees which version answered during a rolling update.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError

from gpufleet.modelserver.textgen import ChatRequest, CompletionRequest, Generation, count_tokens, generate

_R = TypeVar("_R", bound=BaseModel)


class OpenAIError(Exception):
    """Answered as OpenAI's error JSON with ``status``."""

    def __init__(
        self, message: str, *, status: int = 400, type: str = "invalid_request_error", code: str | None = None
    ) -> None:
        super().__init__(message)
        self.message, self.status, self.type, self.code = message, status, type, code

    def response(self) -> JSONResponse:
        error = {"message": self.message, "type": self.type, "param": None, "code": self.code}
        return JSONResponse({"error": error}, status_code=self.status)


@dataclass(frozen=True, kw_only=True)
class TextModel:
    """What the endpoints serve: ``ready`` says whether the model has loaded."""

    name: str
    version: str
    seed: int
    token_delay_s: float
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
        req = _parse(CompletionRequest, await request.body())
        served.check(req.model)
        if not req.prompts:
            raise OpenAIError("prompt: must not be an empty list")
        seed = served.seed if req.seed is None else req.seed
        gens = [
            generate(model=served.name, seed=seed, prompt=p, choice=i, max_tokens=req.limit, stops=req.stops)
            for p in req.prompts
            for i in range(req.n)
        ]
        prompts = [p for p in req.prompts for _ in range(req.n)]
        usage = _usage(req.prompts, gens)
        head = _head(served, "cmpl", "text_completion")
        if req.stream:

            def piece(i: int, text: str, finish: str | None) -> dict[str, Any]:
                return {"index": i, "text": text, "logprobs": None, "finish_reason": finish}

            echo = [piece(i, p, None) for i, p in enumerate(prompts)] if req.echo else []
            chunks = _chunks(head, gens, echo, piece, usage if req.include_usage else None)
            return _sse(chunks, served.token_delay_s)
        await asyncio.sleep(served.token_delay_s * max(len(g.tokens) for g in gens))
        choices = [
            {
                "index": i,
                "text": (prompts[i] if req.echo else "") + g.text,
                "logprobs": None,
                "finish_reason": g.finish_reason,
            }
            for i, g in enumerate(gens)
        ]
        return JSONResponse({**head, "choices": choices, "usage": usage})

    @router.post("/chat/completions")
    async def chat_completions(request: Request) -> Response:
        req = _parse(ChatRequest, await request.body())
        served.check(req.model)
        seed = served.seed if req.seed is None else req.seed
        gens = [
            generate(
                model=served.name,
                seed=seed,
                prompt=req.prompt,
                choice=i,
                max_tokens=req.limit,
                stops=req.stops,
            )
            for i in range(req.n)
        ]
        usage = _usage((req.prompt,), gens)
        head = _head(served, "chatcmpl", "chat.completion")
        if req.stream:

            def piece(i: int, text: str, finish: str | None) -> dict[str, Any]:
                delta = {"content": text} if finish is None else {}
                return {"index": i, "delta": delta, "logprobs": None, "finish_reason": finish}

            roles = [
                {
                    "index": i,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
                for i in range(len(gens))
            ]
            chunk_head = {**head, "object": "chat.completion.chunk"}
            chunks = _chunks(chunk_head, gens, roles, piece, usage if req.include_usage else None)
            return _sse(chunks, served.token_delay_s)
        await asyncio.sleep(served.token_delay_s * max(len(g.tokens) for g in gens))
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": g.text},
                "logprobs": None,
                "finish_reason": g.finish_reason,
            }
            for i, g in enumerate(gens)
        ]
        return JSONResponse({**head, "choices": choices, "usage": usage})

    return router


def _parse(schema: type[_R], body: bytes) -> _R:
    try:
        return schema.model_validate_json(body)
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


def _chunks(
    head: dict[str, Any],
    gens: list[Generation],
    first: list[dict[str, Any]],
    piece: Piece,
    usage: dict[str, int] | None,
) -> Iterator[dict[str, Any] | None]:
    """The stream's chunks; None marks where one token's time passes. Choices advance
    together, one token each per step, then each says its finish_reason."""
    for choice in first:
        yield {**head, "choices": [choice]}
    for step in range(max(len(g.tokens) for g in gens)):
        yield None
        for i, g in enumerate(gens):
            if step < len(g.tokens):
                yield {**head, "choices": [piece(i, g.tokens[step], None)]}
    for i, g in enumerate(gens):
        yield {**head, "choices": [piece(i, "", g.finish_reason)]}
    if usage is not None:
        yield {**head, "choices": [], "usage": usage}


def _sse(chunks: Iterator[dict[str, Any] | None], delay_s: float) -> StreamingResponse:
    async def events() -> AsyncIterator[bytes]:
        for chunk in chunks:
            if chunk is None:
                if delay_s > 0:
                    await asyncio.sleep(delay_s)
                continue
            yield b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


__all__ = ["OpenAIError", "TextModel", "openai_router"]
