"""The KServe v2 (Open Inference Protocol) infer body, with Triton's binary tensor data
extension, as pure functions: bytes in, tensors out, and back.

Why an extension at all: ``tritonclient`` sends and asks for binary data by default. A
request whose header ``Inference-Header-Content-Length: N`` is present holds N bytes of
JSON, then the raw little-endian bytes of each input whose ``parameters`` carry
``binary_data_size``, in input order. A response does the same for every output asked
with ``parameters.binary_data`` (or, where an output does not say, when the request's
``parameters.binary_data_output`` is true). BYTES elements are each a 4-byte
little-endian length and the bytes. Shared-memory parameters are refused: this server
has no shared memory.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

HEADER_LENGTH = "Inference-Header-Content-Length"

DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}
"""Protocol datatype -> the numpy dtype of its wire bytes (BF16 has none in numpy)."""


class ProtocolError(ValueError):
    """A request the protocol cannot accept; ``status`` is the HTTP status to answer."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass(frozen=True, kw_only=True, eq=False)
class Tensor:
    """A named tensor; ``array`` has the shape, and the dtype of ``datatype``."""

    name: str
    datatype: str
    array: NDArray[Any]


@dataclass(frozen=True, kw_only=True)
class RequestedOutput:
    """``binary`` is None when the output does not say: the request's default applies."""

    name: str
    binary: bool | None


@dataclass(frozen=True, kw_only=True)
class InferRequest:
    """``outputs`` is None when the request names none: every output is returned, in
    binary when ``binary_output`` (what tritonclient asks in that case)."""

    id: str | None
    inputs: tuple[Tensor, ...]
    outputs: tuple[RequestedOutput, ...] | None
    binary_output: bool


def parse_header_length(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        length = int(value)
    except ValueError:
        raise ProtocolError(f"{HEADER_LENGTH} must be an integer, got {value!r}") from None
    if length < 0:
        raise ProtocolError(f"{HEADER_LENGTH} must not be negative, got {length}")
    return length


def parse_infer_request(body: bytes, *, header_length: int | None) -> InferRequest:
    """The request in ``body``: all JSON when ``header_length`` is None, else that many
    bytes of JSON followed by the binary inputs."""
    if header_length is not None and header_length > len(body):
        raise ProtocolError(f"{HEADER_LENGTH} {header_length} exceeds the body's {len(body)} bytes")
    head, binary = (body, b"") if header_length is None else (body[:header_length], body[header_length:])
    try:
        doc = json.loads(head)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"the request is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ProtocolError("the request must be a JSON object")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise ProtocolError("the request must have a non-empty 'inputs' list")
    inputs: list[Tensor] = []
    offset = 0
    for raw in raw_inputs:
        tensor, used = _parse_input(raw, binary, offset)
        inputs.append(tensor)
        offset += used
    if offset != len(binary):
        raise ProtocolError(f"the inputs use {offset} bytes of binary data, the request has {len(binary)}")
    params = _object(doc.get("parameters"), "parameters")
    raw_outputs = doc.get("outputs")
    outputs = None if raw_outputs is None else tuple(_parse_output(o) for o in _list(raw_outputs, "outputs"))
    request_id = doc.get("id")
    return InferRequest(
        id=None if request_id is None else str(request_id),
        inputs=tuple(inputs),
        outputs=outputs,
        binary_output=params.get("binary_data_output") is True,
    )


def encode_infer_response(
    *,
    model_name: str,
    model_version: str,
    request_id: str | None,
    outputs: Sequence[tuple[Tensor, bool]],
) -> tuple[bytes, int | None]:
    """The response body and, when any output is binary, its JSON length (the value of
    ``Inference-Header-Content-Length``; the body is then JSON followed by raw bytes)."""
    docs: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for tensor, binary in outputs:
        doc: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.array.shape),
        }
        if binary:
            blob = tensor_bytes(tensor)
            doc["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            doc["data"] = tensor_json(tensor)
        docs.append(doc)
    reply: dict[str, Any] = {"model_name": model_name, "model_version": model_version, "outputs": docs}
    if request_id is not None:
        reply["id"] = request_id
    head = json.dumps(reply, separators=(",", ":")).encode()
    if not blobs:
        return head, None
    return head + b"".join(blobs), len(head)


def tensor_bytes(tensor: Tensor) -> bytes:
    """The tensor's binary-extension bytes: C order, little-endian."""
    if tensor.datatype == "BYTES":
        parts = []
        for item in tensor.array.ravel():
            data = item if isinstance(item, bytes) else str(item).encode()
            parts += [struct.pack("<I", len(data)), data]
        return b"".join(parts)
    return np.ascontiguousarray(tensor.array, dtype=DTYPES[tensor.datatype]).tobytes()


def tensor_json(tensor: Tensor) -> list[Any]:
    """The tensor's JSON ``data``: flat, row-major, as the protocol allows."""
    if tensor.datatype == "BYTES":
        return [x.decode(errors="replace") if isinstance(x, bytes) else str(x) for x in tensor.array.ravel()]
    return list(tensor.array.ravel().tolist())


def decode_bytes(datatype: str, shape: Sequence[int], data: bytes) -> NDArray[Any]:
    """An array from binary-extension bytes (raises ProtocolError on a size mismatch)."""
    dtype = _dtype(datatype)
    count = math.prod(shape)
    if datatype == "BYTES":
        items: list[bytes] = []
        pos = 0
        while pos < len(data):
            if pos + 4 > len(data):
                raise ProtocolError("BYTES data ends inside an element's length")
            (size,) = struct.unpack_from("<I", data, pos)
            if pos + 4 + size > len(data):
                raise ProtocolError("BYTES data ends inside an element")
            items.append(data[pos + 4 : pos + 4 + size])
            pos += 4 + size
        if len(items) != count:
            raise ProtocolError(f"BYTES data has {len(items)} elements, shape {list(shape)} needs {count}")
        array = np.empty(count, dtype=object)
        array[:] = items
        return array.reshape(shape)
    if len(data) != count * dtype.itemsize:
        raise ProtocolError(
            f"{datatype} shape {list(shape)} needs {count * dtype.itemsize} bytes, got {len(data)}"
        )
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def decode_json(datatype: str, shape: Sequence[int], data: Any) -> NDArray[Any]:
    """An array from JSON ``data`` (flat or nested lists)."""
    dtype = _dtype(datatype)
    if datatype == "BYTES":
        flat = _flatten(data)
        if not all(isinstance(x, str) for x in flat):
            raise ProtocolError("BYTES data must be strings")
        array = np.empty(len(flat), dtype=object)
        array[:] = [x.encode() for x in flat]
    else:
        flat = _flatten(data)
        if not all(isinstance(x, int | float) for x in flat):
            raise ProtocolError(f"{datatype} data must be numbers")
        try:
            array = np.asarray(flat, dtype=dtype)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ProtocolError(f"{datatype} data is not valid: {exc}") from None
    count = math.prod(shape)
    if array.size != count:
        raise ProtocolError(f"data has {array.size} elements, shape {list(shape)} needs {count}")
    return array.reshape(shape)


def _parse_input(raw: Any, binary: bytes, offset: int) -> tuple[Tensor, int]:
    """One input tensor and the number of binary bytes it took from ``offset``."""
    raw = _object(raw, "an input")
    name, datatype, shape = raw.get("name"), raw.get("datatype"), raw.get("shape")
    if not isinstance(name, str) or not isinstance(datatype, str):
        raise ProtocolError("each input needs a string 'name' and 'datatype'")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ProtocolError(f"input '{name}': 'shape' must be a list of non-negative integers")
    params = _object(raw.get("parameters"), f"input '{name}' parameters")
    if any(key.startswith("shared_memory") for key in params):
        raise ProtocolError(f"input '{name}': shared memory is not supported by this server")
    size = params.get("binary_data_size")
    try:
        if size is None:
            if "data" not in raw:
                raise ProtocolError(f"input '{name}' has neither 'data' nor 'binary_data_size'")
            return Tensor(name=name, datatype=datatype, array=decode_json(datatype, shape, raw["data"])), 0
        if not isinstance(size, int) or size < 0 or offset + size > len(binary):
            raise ProtocolError(f"input '{name}': binary_data_size {size} exceeds the binary data sent")
        array = decode_bytes(datatype, shape, binary[offset : offset + size])
    except ProtocolError as exc:
        if exc.message.startswith("input '"):
            raise
        raise ProtocolError(f"input '{name}': {exc.message}") from None
    return Tensor(name=name, datatype=datatype, array=array), size


def _parse_output(raw: Any) -> RequestedOutput:
    raw = _object(raw, "an output")
    name = raw.get("name")
    if not isinstance(name, str):
        raise ProtocolError("each requested output needs a string 'name'")
    params = _object(raw.get("parameters"), f"output '{name}' parameters")
    if params.get("classification"):
        raise ProtocolError(f"output '{name}': classification is not supported by this server")
    if any(key.startswith("shared_memory") for key in params):
        raise ProtocolError(f"output '{name}': shared memory is not supported by this server")
    binary = params.get("binary_data")
    return RequestedOutput(name=name, binary=None if binary is None else binary is True)


def _dtype(datatype: str) -> np.dtype[Any]:
    try:
        return DTYPES[datatype]
    except KeyError:
        raise ProtocolError(f"unsupported datatype {datatype!r}") from None


def _flatten(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    out: list[Any] = []
    for item in data:
        out.extend(_flatten(item) if isinstance(item, list) else [item])
    return out


def _object(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ProtocolError(f"{what} must be a JSON object")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise ProtocolError(f"'{what}' must be a list")
    return value


__all__ = [
    "DTYPES",
    "HEADER_LENGTH",
    "InferRequest",
    "ProtocolError",
    "RequestedOutput",
    "Tensor",
    "decode_bytes",
    "decode_json",
    "encode_infer_response",
    "parse_header_length",
    "parse_infer_request",
    "tensor_bytes",
    "tensor_json",
]
