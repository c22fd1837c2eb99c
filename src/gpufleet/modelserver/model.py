"""The model the server serves: a two-layer MLP whose weights come from a seed.

Why a real computation and not an echo: a client (or a test) can compute the same
numbers in-process from the same seed and check every reply, and a replica with another
seed or version gives other numbers. No weights are downloaded.

What is simulated: on this CPU a forward call of the default MLP costs microseconds, a
row more or less makes no difference, and batching would show nothing. On a GPU each
call pays a fixed cost (kernel launches, the copy in and out, the sync), a millisecond
or more, while the arithmetic of one row more is almost free: that is why servers batch.
:class:`SimulatedDevice` adds that fixed cost as a sleep after the real computation (the
thread waits, the GIL is released, as a CPU thread waiting on a GPU sync would); the
numbers still come from the real MLP. ``hidden`` makes the arithmetic itself heavier.
"""

from __future__ import annotations

import time
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
"""The hidden layer's default width (``--hidden``)."""
CLASSES = 4
MAX_BATCH = 64
"""The default ``max_batch_size`` (``--max-batch-size``): the most rows one request may
carry, and one execution may run when requests are batched."""


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
    """``softmax(relu(x @ w1 + b1) @ w2 + b2)`` in float32, row by row.

    Row by row to the bit: a row's output is the same whatever batch it runs in, so a
    reply stays checkable in-process when the server batches it with other requests.
    The products are ``einsum`` loops, not ``@``: BLAS picks its kernel by the matrix's
    shape, and a row's result then differs in the last bits from one batch size to
    another."""

    w1: NDArray[np.float32]
    b1: NDArray[np.float32]
    w2: NDArray[np.float32]
    b2: NDArray[np.float32]

    @classmethod
    def from_seed(cls, seed: int, *, hidden: int = HIDDEN) -> MLP:
        """The same seed (and ``hidden``) gives the same weights on every machine
        (numpy's PCG64)."""
        if hidden < 1:
            raise ValueError(f"hidden must be at least 1, got {hidden}")
        rng = np.random.default_rng(seed)
        return cls(
            w1=rng.normal(0.0, 1.0 / np.sqrt(FEATURES), (FEATURES, hidden)).astype(np.float32),
            b1=rng.normal(0.0, 0.1, hidden).astype(np.float32),
            w2=rng.normal(0.0, 1.0 / np.sqrt(hidden), (hidden, CLASSES)).astype(np.float32),
            b2=rng.normal(0.0, 0.1, CLASSES).astype(np.float32),
        )

    def forward(self, x: NDArray[Any]) -> NDArray[np.float32]:
        """Class probabilities for each row of ``x`` (shape [batch, FEATURES])."""
        rows = np.asarray(x, dtype=np.float32)
        hidden = np.maximum(np.einsum("ij,jk->ik", rows, self.w1) + self.b1, np.float32(0))
        logits = np.einsum("ij,jk->ik", hidden, self.w2) + self.b2
        shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs: NDArray[np.float32] = (shifted / shifted.sum(axis=1, keepdims=True)).astype(np.float32)
        return probs

    def infer(self, inputs: Mapping[str, Tensor], *, max_batch: int = MAX_BATCH) -> dict[str, Tensor]:
        """The outputs for checked ``inputs`` (by name); raises ModelInputError."""
        check_inputs(inputs, max_batch=max_batch)
        probs = self.forward(inputs[INPUT_NAME].array)
        return {OUTPUT_NAME: Tensor(name=OUTPUT_NAME, datatype="FP32", array=probs)}


@dataclass(frozen=True, kw_only=True, eq=False)
class SimulatedDevice:
    """``mlp.forward``, then a wait of ``launch_overhead_s``: a GPU's fixed cost per
    call (launch, copies, sync), which batching spreads over the batch's rows. The
    output is the MLP's, to the bit; only the time is simulated."""

    mlp: MLP
    launch_overhead_s: float = 0.002

    def __call__(self, x: NDArray[Any]) -> NDArray[np.float32]:
        probs = self.mlp.forward(x)
        if self.launch_overhead_s > 0:
            time.sleep(self.launch_overhead_s)
        return probs


def check_inputs(inputs: Mapping[str, Tensor], *, max_batch: int = MAX_BATCH) -> None:
    """Raise ModelInputError unless ``inputs`` are exactly what INPUTS declares, with
    at most ``max_batch`` rows."""
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
        if shape[0] > max_batch:
            raise ModelInputError(f"input {spec.name!r}: batch {shape[0]} exceeds max_batch_size {max_batch}")


def model_config(
    name: str,
    *,
    max_batch: int = MAX_BATCH,
    dynamic_batching: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A minimal Triton model configuration (``GET /v2/models/{name}/config``): dims
    leave out the batch dimension, as Triton's do when ``max_batch_size`` > 0;
    ``dynamic_batching`` is there when batching is on, as in Triton's."""

    def entry(spec: TensorSpec) -> dict[str, Any]:
        return {"name": spec.name, "data_type": f"TYPE_{spec.datatype}", "dims": list(spec.shape[1:])}

    config: dict[str, Any] = {
        "name": name,
        "platform": "",
        "backend": "gpufleet-numpy",
        "max_batch_size": max_batch,
        "input": [entry(spec) for spec in INPUTS],
        "output": [entry(spec) for spec in OUTPUTS],
        "version_policy": {"latest": {"num_versions": 1}},
        "instance_group": [{"kind": "KIND_CPU", "count": 1}],
    }
    if dynamic_batching is not None:
        config["dynamic_batching"] = dict(dynamic_batching)
    return config


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
    "SimulatedDevice",
    "TensorSpec",
    "check_inputs",
    "model_config",
]
