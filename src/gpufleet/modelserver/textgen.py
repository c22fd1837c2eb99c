"""The toy text generator behind the OpenAI-compatible endpoints, and their request
schemas.

Why deterministic: a caller can ask the same prompt twice (or once streaming, once not)
and expect the same text, so tests compare replies instead of guessing. Token ``i`` of
a choice is a word picked by a hash of (model, seed, prompt, choice, i): no state, so
streaming emits exactly the tokens the non-streaming reply joins.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

WORDS = (
    "the",
    "a",
    "GPU",
    "node",
    "job",
    "queue",
    "fleet",
    "cluster",
    "tensor",
    "kernel",
    "batch",
    "model",
    "replica",
    "token",
    "stream",
    "shard",
    "memory",
    "cache",
    "scheduler",
    "plan",
    "lease",
    "quota",
    "team",
    "rack",
    "leaf",
    "spine",
    "link",
    "warm",
    "cold",
    "fast",
    "slow",
    "ready",
    "busy",
    "idle",
    "runs",
    "waits",
    "scales",
    "drains",
    "serves",
    "learns",
)
DEFAULT_MAX_TOKENS = 16
MAX_TOKENS_LIMIT = 4096


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    include_usage: bool = False


class _Request(BaseModel):
    """Fields OpenAI clients may send and the toy ignores (temperature, top_p, user...)
    are accepted and dropped."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    model: str
    max_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKENS_LIMIT)
    n: int = Field(default=1, ge=1, le=16)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = None

    @property
    def limit(self) -> int:
        return DEFAULT_MAX_TOKENS if self.max_tokens is None else self.max_tokens

    @property
    def stops(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return tuple(s for s in stops if s)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_Request):
    """``POST /v1/completions``: one prompt or a list (token-id prompts count as text)."""

    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=5)
    """The legacy shape: the chosen token's logprob and this many alternatives."""

    @property
    def prompts(self) -> tuple[str, ...]:
        if isinstance(self.prompt, str):
            return (self.prompt,)
        texts: list[str] = []
        for p in self.prompt:
            if isinstance(p, int):  # one prompt of token ids
                return (" ".join(map(str, self.prompt)),)
            texts.append(p if isinstance(p, str) else " ".join(map(str, p)))
        return tuple(texts)


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    type: str
    text: str = ""


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    role: str
    content: str | list[ContentPart] | None = None

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content if part.type == "text")
        return self.content or ""


class ChatRequest(_Request):
    """``POST /v1/chat/completions``; ``max_completion_tokens`` is the newer name."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=0, le=MAX_TOKENS_LIMIT)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    @property
    def prompt(self) -> str:
        return "".join(f"{m.role}: {m.text}\n" for m in self.messages) + "assistant:"

    @property
    def limit(self) -> int:
        for value in (self.max_completion_tokens, self.max_tokens):
            if value is not None:
                return value
        return DEFAULT_MAX_TOKENS


@dataclass(frozen=True, kw_only=True)
class Generation:
    """One choice's text: ``tokens`` as streamed, ``finish_reason`` "length" or "stop"."""

    tokens: tuple[str, ...]
    finish_reason: Literal["length", "stop"]

    @property
    def text(self) -> str:
        return "".join(self.tokens)


def count_tokens(text: str) -> int:
    """The toy tokenizer's count: whitespace-separated words."""
    return len(text.split())


def token_stream(*, model: str, seed: int, prompt: str, choice: int) -> Iterator[str]:
    """The endless token sequence of one choice: " word", " word", ..."""
    key = f"{model}\0{seed}\0{choice}\0{prompt}".encode()
    i = 0
    while True:
        digest = hashlib.blake2b(key + i.to_bytes(8, "little"), digest_size=8).digest()
        yield " " + WORDS[int.from_bytes(digest, "little") % len(WORDS)]
        i += 1


class Decoder:
    """One choice's generation, a token at a time: what ``generate`` runs to its end in
    one go and the batching engine (``engine``) runs one step per decoding step, so a
    batched reply is the unbatched one by construction.

    At most ``max_tokens`` tokens; the text ends before the first stop string, as
    OpenAI's does (the token that completed it is cut, and emitted when something of it
    is left). ``finish_reason`` is set by the step that ends the choice, so no step is
    spent after the last token (``max_tokens`` 0: finished before any step)."""

    __slots__ = ("_longest", "_stream", "finish_reason", "max_tokens", "stops", "text", "tokens")

    def __init__(
        self, *, model: str, seed: int, prompt: str, choice: int, max_tokens: int, stops: tuple[str, ...] = ()
    ) -> None:
        self._stream = token_stream(model=model, seed=seed, prompt=prompt, choice=choice)
        self.max_tokens = max_tokens
        self.stops = stops
        self._longest = max(map(len, stops), default=0)
        self.tokens: list[str] = []
        self.text = ""
        self.finish_reason: Literal["length", "stop"] | None = None if max_tokens > 0 else "length"

    def step(self) -> str | None:
        """Decode one token: the piece of text it adds (None: a stop string cut it away
        whole); sets ``finish_reason`` when it ends the choice. Not after the end."""
        if self.finish_reason is not None:
            raise RuntimeError("the choice has finished")
        token = next(self._stream)
        # a stop string that is found ends in this token (the text before had none), so
        # only the text's last characters need searching: a step costs the same at any length
        start = max(0, len(self.text) - self._longest + 1)
        cut = _first_stop(self.text[start:] + token, self.stops) if self.stops else None
        if cut is not None:
            cut += start
            self.finish_reason = "stop"
            if cut <= len(self.text):
                return None
            token = token[: cut - len(self.text)]
            self.tokens.append(token)
            return token
        self.tokens.append(token)
        self.text += token
        if len(self.tokens) == self.max_tokens:
            self.finish_reason = "length"
        return token

    def generation(self) -> Generation:
        """The finished choice."""
        if self.finish_reason is None:
            raise RuntimeError("the choice has not finished")
        return Generation(tokens=tuple(self.tokens), finish_reason=self.finish_reason)


def generate(
    *, model: str, seed: int, prompt: str, choice: int, max_tokens: int, stops: tuple[str, ...] = ()
) -> Generation:
    """The whole choice at once (the reference the batched engine is held against)."""
    decoder = Decoder(
        model=model, seed=seed, prompt=prompt, choice=choice, max_tokens=max_tokens, stops=stops
    )
    while decoder.finish_reason is None:
        decoder.step()
    return decoder.generation()


TOKEN_LOGPROB = -math.log(len(WORDS))
"""Every token's log probability: the toy picks each word with the same chance (a hash
modulo ``len(WORDS)``), so this is the true logprob of its sampler, not a made-up one."""


def alternatives(token: str, k: int) -> list[str]:
    """``k`` tokens as likely as ``token`` (itself first): the words after it in ``WORDS``."""
    word = token.strip()
    start = WORDS.index(word) if word in WORDS else 0
    return [" " + WORDS[(start + j) % len(WORDS)] for j in range(k)]


def completion_logprobs(tokens: tuple[str, ...], k: int, offset: int) -> dict[str, object]:
    """``/v1/completions``' ``logprobs`` object (``offset``: the text's start, after an echo)."""
    offsets, pos = [], offset
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    return {
        "tokens": list(tokens),
        "token_logprobs": [TOKEN_LOGPROB] * len(tokens),
        "top_logprobs": [dict.fromkeys(alternatives(t, k), TOKEN_LOGPROB) for t in tokens] if k else None,
        "text_offset": offsets,
    }


def chat_logprobs(tokens: tuple[str, ...], k: int) -> dict[str, object]:
    """``/v1/chat/completions``' ``logprobs`` object."""

    def entry(t: str) -> dict[str, object]:
        return {"token": t, "logprob": TOKEN_LOGPROB, "bytes": list(t.encode())}

    return {"content": [entry(t) | {"top_logprobs": [entry(a) for a in alternatives(t, k)]} for t in tokens]}


def _first_stop(text: str, stops: tuple[str, ...]) -> int | None:
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


__all__ = [
    "DEFAULT_MAX_TOKENS",
    "TOKEN_LOGPROB",
    "ChatMessage",
    "ChatRequest",
    "CompletionRequest",
    "Decoder",
    "Generation",
    "alternatives",
    "chat_logprobs",
    "completion_logprobs",
    "count_tokens",
    "generate",
    "token_stream",
]
