"""``POST /v1/embeddings`` for the toy model: deterministic vectors, as the ``openai``
client's ``embeddings.create`` asks for them (it sends ``encoding_format: base64`` by
default: little-endian float32 bytes, base64).

A text's vector is a function of (model, seed, text) only: unit-length normal noise
from a hash of them, ``DIMENSIONS`` long unless the request says ``dimensions``. Equal
texts get equal vectors on every replica; the vectors mean nothing else (cosine
similarity of different texts is noise), which is what a test or a load generator
needs of a toy.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

DIMENSIONS = 64
MAX_DIMENSIONS = 4096
MAX_INPUTS = 2048


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    model: str
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1, le=MAX_DIMENSIONS)

    @property
    def texts(self) -> tuple[str, ...]:
        """Token-id inputs count as their ids' text, as the completions' prompts do."""
        if isinstance(self.input, str):
            return (self.input,)
        texts: list[str] = []
        for x in self.input:
            if isinstance(x, int):  # one input of token ids
                return (" ".join(map(str, self.input)),)
            texts.append(x if isinstance(x, str) else " ".join(map(str, x)))
        return tuple(texts)


def embed(*, model: str, seed: int, text: str, dimensions: int = DIMENSIONS) -> NDArray[np.float32]:
    """The text's unit vector."""
    key = hashlib.blake2b(f"{model}\0{seed}\0{text}".encode(), digest_size=8).digest()
    v = np.random.default_rng(int.from_bytes(key, "little")).standard_normal(dimensions)
    return (v / np.linalg.norm(v)).astype(np.float32)


def embedding_data(req: EmbeddingRequest, *, model: str, seed: int) -> list[dict[str, object]]:
    """The reply's ``data`` list, in the requested encoding."""
    dims = req.dimensions or DIMENSIONS
    out: list[dict[str, object]] = []
    for i, text in enumerate(req.texts):
        v = embed(model=model, seed=seed, text=text, dimensions=dims)
        value: object = (
            base64.b64encode(v.astype("<f4").tobytes()).decode()
            if req.encoding_format == "base64"
            else [float(x) for x in v]
        )
        out.append({"object": "embedding", "index": i, "embedding": value})
    return out


__all__ = ["DIMENSIONS", "EmbeddingRequest", "embed", "embedding_data"]
