"""The model the server serves: a two-layer MLP whose weights come from a seed.

Why a real computation and not an echo: a client (or a test) can compute the same
numbers in-process from the same seed and check every reply, and a replica with another
seed or version gives other numbers. No weights are downloaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gpufleet.modelserver.kserve import Tensor

INPUT_NAME = "INPUT0"
OUTPUT_NAME = "OUTPUT0"
FEATURES = 16
HIDDEN = 32
CLASSES = 4
MAX_BATCH = 1024
"""The largest batch one request may carry (``max_batch_size`` in the model config)."""


@dataclass(frozen=True, kw_only=True)
class TensorSpec:
    """An input or output as metadata shows it; -1 is the batch dimension."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def as_metadata(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


INPUTS = (TensorSpec(name=INPUT_NAME, datatype="FP32", shape=(-1, FEATURES)),)
OUTPUTS = (TensorSpec(name=OUTPUT_NAME, datatype="FP32", shape=(-1, CLASSES)),)


class ModelInputError(ValueError):
    """Inputs the model cannot take (name, datatype or shape); the server answers 400."""


@dataclass(frozen=True, kw_only=True, eq=False)
class MLP:
    """``softmax(relu(x @ w1 + b1) @ w2 + b2)`` in float32, row by row."""

    w1: NDArray[np.float32]
    b1: NDArray[np.float32]
    w2: NDArray[np.float32]
    b2: NDArray[np.float32]

    @classmethod
    def from_seed(cls, seed: int) -> MLP:
        """The same seed gives the same weights on every machine (numpy's PCG64)."""
        rng = np.random.default_rng(seed)
        return cls(
            w1=rng.normal(0.0, 1.0 / np.sqrt(FEATURES), (FEATURES, HIDDEN)).astype(np.float32),
            b1=rng.normal(0.0, 0.1, HIDDEN).astype(np.float32),
            w2=rng.normal(0.0, 1.0 / np.sqrt(HIDDEN), (HIDDEN, CLASSES)).astype(np.float32),
            b2=rng.normal(0.0, 0.1, CLASSES).astype(np.float32),
        )

    def forward(self, x: NDArray[Any]) -> NDArray[np.float32]:
        """Class probabilities for each row of ``x`` (shape [batch, FEATURES])."""
        hidden = np.maximum(np.asarray(x, dtype=np.float32) @ self.w1 + self.b1, np.float32(0))
        logits = hidden @ self.w2 + self.b2
        shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs: NDArray[np.float32] = (shifted / shifted.sum(axis=1, keepdims=True)).astype(np.float32)
        return probs

    def infer(self, inputs: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """The outputs for checked ``inputs`` (by name); raises ModelInputError."""
        check_inputs(inputs)
        probs = self.forward(inputs[INPUT_NAME].array)
        return {OUTPUT_NAME: Tensor(name=OUTPUT_NAME, datatype="FP32", array=probs)}


def check_inputs(inputs: Mapping[str, Tensor]) -> None:
    """Raise ModelInputError unless ``inputs`` are exactly what INPUTS declares."""
    expected = {spec.name for spec in INPUTS}
    unknown = sorted(set(inputs) - expected)
    if unknown:
        raise ModelInputError(f"unexpected input {unknown[0]!r}: the model's inputs are {sorted(expected)}")
    missing = sorted(expected - set(inputs))
    if missing:
        raise ModelInputError(f"missing input {missing[0]!r}")
    for spec in INPUTS:
        tensor = inputs[spec.name]
        if tensor.datatype != spec.datatype:
            raise ModelInputError(
                f"input {spec.name!r}: datatype {tensor.datatype}, the model expects {spec.datatype}"
            )
        shape = tensor.array.shape
        fits = len(shape) == len(spec.shape) and all(
            want == -1 or got == want for got, want in zip(shape, spec.shape, strict=True)
        )
        if not fits:
            raise ModelInputError(
                f"input {spec.name!r}: shape {list(shape)}, the model expects {list(spec.shape)}"
            )
        if shape[0] > MAX_BATCH:
            raise ModelInputError(f"input {spec.name!r}: batch {shape[0]} exceeds max_batch_size {MAX_BATCH}")


def model_config(name: str) -> dict[str, Any]:
    """A minimal Triton model configuration (``GET /v2/models/{name}/config``): dims
    leave out the batch dimension, as Triton's do when ``max_batch_size`` > 0."""

    def entry(spec: TensorSpec) -> dict[str, Any]:
        return {"name": spec.name, "data_type": f"TYPE_{spec.datatype}", "dims": list(spec.shape[1:])}

    return {
        "name": name,
        "platform": "",
        "backend": "gpufleet-numpy",
        "max_batch_size": MAX_BATCH,
        "input": [entry(spec) for spec in INPUTS],
        "output": [entry(spec) for spec in OUTPUTS],
        "version_policy": {"latest": {"num_versions": 1}},
        "instance_group": [{"kind": "KIND_CPU", "count": 1}],
    }


__all__ = [
    "CLASSES",
    "FEATURES",
    "HIDDEN",
    "INPUTS",
    "INPUT_NAME",
    "MAX_BATCH",
    "MLP",
    "OUTPUTS",
    "OUTPUT_NAME",
    "ModelInputError",
    "TensorSpec",
    "check_inputs",
    "model_config",
]
