"""``gpufleet model-server`` against real third-party clients (tritonclient.http and
openai), started as a subprocess on loopback, plus table tests of the binary tensor
codec held against tritonclient's own encoder and decoder, and of the dynamic batcher
in-process (its answers held against the unbatched model's)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from gpufleet.modelserver.batcher import Batcher, BatchPolicy, Execution, Result
from gpufleet.modelserver.kserve import (
    HEADER_LENGTH,
    ProtocolError,
    Tensor,
    decode_bytes,
    decode_json,
    encode_infer_response,
    parse_infer_request,
    tensor_bytes,
    tensor_json,
)
from gpufleet.modelserver.model import MLP, SimulatedDevice

SEED = 7
VERSION = "3"
REPLICA = "job-test-1"


@dataclass(frozen=True, kw_only=True)
class Server:
    port: int

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(*args: str) -> tuple[subprocess.Popen[bytes], Server]:
    """A model server on a free port, once it is live (not necessarily ready)."""
    port = free_port()
    env = {**os.environ, "GPUFLEET_JOB_ID": REPLICA}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufleet", "model-server", "--port", str(port), *args], env=env
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        assert proc.poll() is None, "model-server exited"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v2/health/live", timeout=1).status_code == 200:
                return proc, Server(port=port)
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("model-server did not come up")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    proc, srv = start("--seed", str(SEED), "--model-version", VERSION)
    yield srv
    stop(proc)


@pytest.fixture
def client(server: Server) -> Iterator[triton.InferenceServerClient]:
    with triton.InferenceServerClient(server.url) as c:
        yield c


@pytest.fixture
def oai(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{server.url}/v1", api_key="x", max_retries=0)


def batch(rows: int = 3) -> np.ndarray[Any, np.dtype[np.float32]]:
    return np.random.default_rng(1).normal(size=(rows, 16)).astype(np.float32)


# --- tritonclient.http --------------------------------------------------------------------


def test_health_and_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("mlp") and client.is_model_ready("mlp", VERSION)
    assert not client.is_model_ready("nope") and not client.is_model_ready("mlp", "99")
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
    meta = client.get_model_metadata("mlp")
    assert meta["versions"] == [VERSION]
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]}]
    assert meta["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 4]}]
    config = client.get_model_config("mlp", VERSION)
    assert config["max_batch_size"] > 0 and config["input"][0]["dims"] == [16]


@pytest.mark.parametrize(
    ("binary_in", "binary_out"),
    [(True, True), (False, False), (True, False), (False, True), (True, None)],
    ids=["binary-binary", "json-json", "binary-json", "json-binary", "binary-no-outputs-named"],
)
def test_infer_matches_the_model_in_process(
    client: triton.InferenceServerClient, binary_in: bool, binary_out: bool | None
) -> None:
    x = batch()
    inp = triton.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary_in)
    outputs = None if binary_out is None else [triton.InferRequestedOutput("OUTPUT0", binary_data=binary_out)]
    result = client.infer("mlp", [inp], outputs=outputs, request_id="r1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), MLP.from_seed(SEED).forward(x))
    reply = result.get_response()
    assert reply["model_version"] == VERSION and reply["id"] == "r1"
    assert ("parameters" in reply["outputs"][0]) == (binary_out is not False)


@pytest.mark.parametrize(
    ("name", "datatype", "shape", "model_version", "status", "message"),
    [
        ("X", "FP32", [2, 16], "", "400", "unexpected input 'X'"),
        ("INPUT0", "FP64", [2, 16], "", "400", "datatype FP64, the model expects FP32"),
        ("INPUT0", "FP32", [16, 2], "", "400", "shape [16, 2], the model expects [-1, 16]"),
        ("INPUT0", "FP32", [2, 16], "99", "404", "version 99 is not found"),
    ],
    ids=["wrong-name", "wrong-datatype", "wrong-shape", "wrong-version"],
)
def test_bad_requests_reach_the_client_as_the_servers_message(
    client: triton.InferenceServerClient,
    name: str,
    datatype: str,
    shape: list[int],
    model_version: str,
    status: str,
    message: str,
) -> None:
    inp = triton.InferInput(name, shape, datatype)
    inp.set_data_from_numpy(np.zeros(shape, dtype=np.float64 if datatype == "FP64" else np.float32))
    with pytest.raises(InferenceServerException) as caught:
        client.infer("mlp", [inp], model_version=model_version)
    assert caught.value.status() == status
    assert message in caught.value.message()


def test_every_reply_names_the_replica(server: Server) -> None:
    for path in ("/v2/health/live", "/v2/models/mlp", "/v2/models/nope", "/v1/models", "/nowhere"):
        assert httpx.get(f"http://{server.url}{path}").headers["x-gpufleet-replica"] == REPLICA


# --- openai ---------------------------------------------------------------------------------


def test_completion_streamed_is_the_same_text(oai: openai.OpenAI) -> None:
    done = oai.completions.create(model="mlp", prompt="hello fleet", max_tokens=12)
    assert done.model == f"mlp:{VERSION}" and done.system_fingerprint == f"mlp:{VERSION}"
    assert done.usage is not None and done.usage.completion_tokens == 12 and done.usage.prompt_tokens == 2
    assert done.choices[0].finish_reason == "length" and len(done.choices[0].text.split()) == 12
    stream = oai.completions.create(model="mlp", prompt="hello fleet", max_tokens=12, stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == done.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_streamed_is_the_same_text(oai: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "what runs where?"}]
    done = oai.chat.completions.create(model="mlp", messages=messages, max_tokens=5)
    stream = oai.chat.completions.create(
        model="mlp", messages=messages, max_tokens=5, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == done.choices[0].message.content and len(text.split()) == 5
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    assert chunks[0].model == f"mlp:{VERSION}"


def test_models_and_unknown_model(oai: openai.OpenAI) -> None:
    assert [m.id for m in oai.models.list()] == ["mlp"]
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        oai.completions.create(model="gpt-4", prompt="x")


# --- readiness ------------------------------------------------------------------------------


def test_ready_only_after_the_load_delay() -> None:
    proc, srv = start("--model", "m", "--load-delay", "2s")
    try:
        base = f"http://{srv.url}"
        ready = [httpx.get(base + p).status_code for p in ("/v2/health/ready", "/v2/models/m/ready")]
        assert ready == [503, 503]
        assert httpx.get(base + "/v2/health/live").status_code == 200
        deadline = time.monotonic() + 10
        while httpx.get(base + "/v2/health/ready").status_code != 200:
            assert time.monotonic() < deadline, "never became ready"
            time.sleep(0.05)
        assert httpx.get(base + "/v2/models/m/ready").status_code == 200
    finally:
        stop(proc)


# --- the binary tensor codec, no server -----------------------------------------------------


def _bytes_array(items: list[bytes], shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array.reshape(shape)


CODEC_CASES = [
    pytest.param("FP32", np.arange(6, dtype=np.float32).reshape(2, 3) / 3, id="FP32"),
    pytest.param("FP64", np.array([[1e-300, -2.5]]), id="FP64"),
    pytest.param("FP16", np.array([0.5, -1.0, 65504.0], dtype=np.float16), id="FP16"),
    pytest.param("INT32", np.array([[-(2**31), 2**31 - 1]], dtype=np.int32), id="INT32"),
    pytest.param("INT64", np.array([2**40], dtype=np.int64), id="INT64"),
    pytest.param("UINT8", np.array([0, 255], dtype=np.uint8), id="UINT8"),
    pytest.param("BOOL", np.array([[True, False]]), id="BOOL"),
    pytest.param("BYTES", _bytes_array([b"ab", b"", "é".encode()], (1, 3)), id="BYTES"),
    pytest.param("FP32", np.zeros((0, 16), dtype=np.float32), id="FP32-empty"),
]


@pytest.mark.parametrize(("datatype", "array"), CODEC_CASES)
def test_tensor_round_trips_binary_and_json(datatype: str, array: np.ndarray[Any, Any]) -> None:
    tensor = Tensor(name="T", datatype=datatype, array=array)
    from_bytes = decode_bytes(datatype, array.shape, tensor_bytes(tensor))
    from_json = decode_json(datatype, array.shape, tensor_json(tensor))
    np.testing.assert_array_equal(from_bytes, array)
    np.testing.assert_array_equal(from_json, array)


@pytest.mark.parametrize(("datatype", "array"), CODEC_CASES)
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_parse_reads_what_tritonclient_writes(
    datatype: str, array: np.ndarray[Any, Any], binary: bool
) -> None:
    first = triton.InferInput("A", list(array.shape), datatype).set_data_from_numpy(array, binary_data=binary)
    second = triton.InferInput("B", [2], "INT32").set_data_from_numpy(np.array([4, 5], dtype=np.int32))
    outputs = [triton.InferRequestedOutput("O", binary_data=False)]
    body, json_size = triton.InferenceServerClient.generate_request_body([first, second], outputs, "id9")
    req = parse_infer_request(body, header_length=json_size)
    assert [t.name for t in req.inputs] == ["A", "B"] and req.id == "id9"
    np.testing.assert_array_equal(req.inputs[0].array, array)
    np.testing.assert_array_equal(req.inputs[1].array, [4, 5])
    assert req.outputs is not None and req.outputs[0].binary is False


@pytest.mark.parametrize(("datatype", "array"), CODEC_CASES)
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_reads_what_encode_writes(
    datatype: str, array: np.ndarray[Any, Any], binary: bool
) -> None:
    tensor = Tensor(name="O", datatype=datatype, array=array)
    other = Tensor(name="P", datatype="INT32", array=np.array([7], dtype=np.int32))
    body, json_size = encode_infer_response(
        model_name="m", model_version="2", request_id=None, outputs=[(tensor, binary), (other, True)]
    )
    result = triton.InferenceServerClient.parse_response_body(body, header_length=json_size)
    # JSON carries BYTES as strings, and tritonclient returns them as str
    want = array if binary or datatype != "BYTES" else np.vectorize(bytes.decode, otypes=[object])(array)
    np.testing.assert_array_equal(result.as_numpy("O"), want)
    np.testing.assert_array_equal(result.as_numpy("P"), [7])
    assert result.get_response()["model_version"] == "2"


def _doc(inputs: str, rest: str = "") -> bytes:
    return ('{"inputs": [' + inputs + "]" + rest + "}").encode()


FP32_1x2 = b"\x00\x00\x80?\x00\x00\x00@"  # 1.0, 2.0
BIN_INPUT = '{"name": "A", "shape": [1, 2], "datatype": "FP32", "parameters": {"binary_data_size": 8}}'


@pytest.mark.parametrize(
    ("body", "header_length", "message"),
    [
        (b"not json", None, "not valid JSON"),
        (b"[]", None, "must be a JSON object"),
        (_doc(""), None, "non-empty 'inputs'"),
        (_doc(BIN_INPUT), 999, f"{HEADER_LENGTH} 999 exceeds"),
        (_doc(BIN_INPUT) + FP32_1x2[:4], len(_doc(BIN_INPUT)), "binary_data_size 8 exceeds"),
        (
            _doc(BIN_INPUT) + FP32_1x2 + b"x",
            len(_doc(BIN_INPUT)),
            "use 8 bytes of binary data, the request has 9",
        ),
        (
            _doc(BIN_INPUT.replace("[1, 2]", "[1, 3]")) + FP32_1x2,
            len(_doc(BIN_INPUT)),
            "needs 12 bytes, got 8",
        ),
        (_doc('{"name": "A", "shape": [1], "datatype": "BF16", "data": [1]}'), None, "unsupported datatype"),
        (_doc('{"name": "A", "shape": [2], "datatype": "FP32", "data": [1]}'), None, "shape [2] needs 2"),
        (_doc('{"name": "A", "shape": [1], "datatype": "FP32", "data": ["1"]}'), None, "must be numbers"),
        (_doc('{"name": "A", "shape": [1], "datatype": "FP32"}'), None, "neither 'data' nor"),
        (
            _doc(
                '{"name": "A", "shape": [1], "datatype": "FP32", "parameters": {"shared_memory_region": "r"}}'
            ),
            None,
            "shared memory is not supported",
        ),
        (
            _doc(
                '{"name": "A", "shape": [1], "datatype": "FP32", "data": [1]}',
                ', "outputs": [{"name": "O", "parameters": {"classification": 2}}]',
            ),
            None,
            "classification is not supported",
        ),
    ],
    ids=[
        "not-json",
        "not-object",
        "no-inputs",
        "header-past-body",
        "short-binary",
        "extra-binary",
        "size-mismatch",
        "bf16",
        "json-count",
        "json-strings",
        "no-data",
        "shared-memory",
        "classification",
    ],
)
def test_parse_refuses(body: bytes, header_length: int | None, message: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_infer_request(body, header_length=header_length)
    assert message in caught.value.message and caught.value.status == 400


def test_binary_outputs_by_default_when_none_are_named() -> None:
    head = _doc(BIN_INPUT, ', "parameters": {"binary_data_output": true}')
    req = parse_infer_request(head + FP32_1x2, header_length=len(head))
    assert req.outputs is None and req.binary_output is True and req.id is None
    np.testing.assert_array_equal(req.inputs[0].array, [[1.0, 2.0]])


# --- the model's rows are independent ------------------------------------------------------


@pytest.mark.parametrize("hidden", [32, 100, 1024], ids=["h32", "h100", "h1024"])
@pytest.mark.parametrize("cuts", [[1], [3, 4, 20], list(range(1, 40))], ids=["1+39", "uneven", "rows"])
def test_a_row_gives_the_same_bits_in_any_batch(hidden: int, cuts: list[int]) -> None:
    mlp = MLP.from_seed(SEED, hidden=hidden)
    x = batch(40)
    parts = np.split(x, cuts)
    np.testing.assert_array_equal(np.concatenate([mlp.forward(p) for p in parts]), mlp.forward(x))


# --- the dynamic batcher in-process ---------------------------------------------------------


def _run_batcher(policy: BatchPolicy, rows: list[int]) -> tuple[list[Result], list[Execution], float]:
    """Submit requests of ``rows`` rows, each its own numbers, at once; check each answer
    against the model run on its rows alone; (results in order, executions, seconds)."""
    mlp = MLP.from_seed(SEED)
    inputs = [batch(n) + i for i, n in enumerate(rows)]
    runs: list[Execution] = []

    async def go() -> tuple[list[Result], float]:
        device = SimulatedDevice(mlp=mlp, launch_overhead_s=0.001)
        batcher = Batcher(forward=device, policy=policy, on_execution=runs.append)
        t0 = time.perf_counter()
        try:
            results = await asyncio.gather(*(batcher.infer(x) for x in inputs))
        finally:
            await batcher.close()
        return list(results), time.perf_counter() - t0

    results, seconds = asyncio.run(go())
    for x, result in zip(inputs, results, strict=True):
        np.testing.assert_array_equal(result.output, mlp.forward(x))
    return results, runs, seconds


@pytest.mark.parametrize(
    ("policy", "rows", "want_batches"),
    [
        (BatchPolicy(), [1, 1, 1, 1], [1, 1, 1, 1]),
        (BatchPolicy(max_queue_delay_us=10_000_000, preferred_batch_sizes=(4,)), [1] * 8, [4, 4]),
        (BatchPolicy(max_queue_delay_us=50_000), [1, 2, 3, 4, 5], [15]),
        (BatchPolicy(max_queue_delay_us=10_000_000, max_batch_size=4), [3, 2, 2], [3, 4]),
        (
            BatchPolicy(max_queue_delay_us=10_000_000, preferred_batch_sizes=(2, 4)),
            [1, 1, 1, 1, 1, 1],
            [4, 2],
        ),
    ],
    ids=["off-one-by-one", "preferred-before-delay", "delay-then-all", "never-over-max", "largest-preferred"],
)
def test_batcher_forms_triton_batches(policy: BatchPolicy, rows: list[int], want_batches: list[int]) -> None:
    _, runs, seconds = _run_batcher(policy, rows)
    assert [r.rows for r in runs] == want_batches
    assert seconds < 5  # none of them waited out a 10 s delay


def test_batcher_waits_no_longer_than_the_delay() -> None:
    results, runs, _ = _run_batcher(BatchPolicy(max_queue_delay_us=100_000), [2])
    assert [r.rows for r in runs] == [2]
    assert 0.1 <= results[0].queue_ns / 1e9 < 0.2


# --- dynamic batching in the server ---------------------------------------------------------

DELAY_S = 0.2


@pytest.fixture(scope="module")
def batching() -> Iterator[Server]:
    us = str(int(DELAY_S * 1e6))
    proc, srv = start("--seed", str(SEED), "--max-queue-delay-us", us, "--preferred-batch-size", "16,32")
    yield srv
    stop(proc)


def _stats(server: Server) -> dict[str, Any]:
    with triton.InferenceServerClient(server.url) as c:
        got: dict[str, Any] = c.get_inference_statistics("mlp")
    assert [m["name"] for m in got["model_stats"]] == ["mlp"]
    return dict(got["model_stats"][0])


def test_concurrent_requests_run_batched_with_their_own_numbers(batching: Server) -> None:
    before = _stats(batching)
    rows = [1 + i % 3 for i in range(16)]
    ready = threading.Barrier(len(rows))

    def one(n: int) -> np.ndarray[Any, Any]:
        with triton.InferenceServerClient(batching.url) as c:
            inp = triton.InferInput("INPUT0", [n, 16], "FP32").set_data_from_numpy(batch(n) + n)
            ready.wait()
            return np.asarray(c.infer("mlp", [inp]).as_numpy("OUTPUT0"))

    with ThreadPoolExecutor(len(rows)) as pool:
        answers = list(pool.map(one, rows))
    mlp = MLP.from_seed(SEED)
    for n, got in zip(rows, answers, strict=True):
        np.testing.assert_array_equal(got, mlp.forward(batch(n) + n))
    after = _stats(batching)
    executions = after["execution_count"] - before["execution_count"]
    assert 1 <= executions < len(rows)
    assert after["inference_count"] - before["inference_count"] == sum(rows)
    success = after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    assert success == len(rows)
    assert max(b["batch_size"] for b in after["batch_stats"]) > 3


def test_a_lone_request_waits_out_the_delay_and_no_more(batching: Server) -> None:
    before = _stats(batching)["inference_stats"]["queue"]
    with triton.InferenceServerClient(batching.url) as c:
        inp = triton.InferInput("INPUT0", [1, 16], "FP32").set_data_from_numpy(batch(1))
        t0 = time.perf_counter()
        c.infer("mlp", [inp])
        seconds = time.perf_counter() - t0
    after = _stats(batching)["inference_stats"]["queue"]
    assert after["count"] - before["count"] == 1
    queued_s = (after["ns"] - before["ns"]) / 1e9
    assert DELAY_S <= queued_s < DELAY_S + 0.1 and seconds >= DELAY_S


def test_config_shows_the_batcher(batching: Server) -> None:
    with triton.InferenceServerClient(batching.url) as c:
        config = c.get_model_config("mlp")
    assert config["max_batch_size"] == 64
    assert config["dynamic_batching"] == {
        "preferred_batch_size": [16, 32],
        "max_queue_delay_microseconds": int(DELAY_S * 1e6),
    }


def test_metrics_count_requests_batches_and_busy_time(
    server: Server, client: triton.InferenceServerClient
) -> None:
    inp = triton.InferInput("INPUT0", [2, 16], "FP32").set_data_from_numpy(batch(2))
    client.infer("mlp", [inp])
    bad = triton.InferInput("INPUT0", [2, 15], "FP32").set_data_from_numpy(np.zeros((2, 15), np.float32))
    with pytest.raises(InferenceServerException):
        client.infer("mlp", [bad])
    text = httpx.get(f"http://{server.url}/metrics").text
    series = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if not line.startswith("#")
    }
    assert series['gpufleet_model_requests_total{code="200",model="mlp"}'] >= 1
    assert series['gpufleet_model_requests_total{code="400",model="mlp"}'] >= 1
    assert series['gpufleet_model_batch_size_bucket{le="2.0",model="mlp"}'] >= 1
    assert series['gpufleet_model_busy_seconds_total{model="mlp"}'] > 0
    assert series['gpufleet_model_inflight{model="mlp"}'] == 0
    for name in ("request_seconds", "queue_seconds"):
        assert series[f'gpufleet_model_{name}_count{{model="mlp"}}'] >= 1
    stats = client.get_inference_statistics("mlp", VERSION)["model_stats"][0]
    assert stats["inference_stats"]["fail"]["count"] >= 1 and stats["version"] == VERSION


# --- access log (issue 30, finding 9) ------------------------------------------------------


@pytest.mark.parametrize("on", [True, False], ids=["default", "no-access-log"])
def test_one_access_log_line_per_request_with_its_latency(tmp_path: Any, on: bool) -> None:
    port = free_port()
    log = tmp_path / "stderr.log"
    args = ["--port", str(port)] + ([] if on else ["--no-access-log"])
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "gpufleet", "model-server", *args], stderr=err)
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v2/health/live", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as c:
            c.get("/v2/models/mlp?x=1")
            c.get("/v2/models/nope")
            c.post("/v2/models/mlp/infer", json={"inputs": []})
    finally:
        stop(proc)
    lines = [line for line in log.read_text().splitlines() if '"' in line]
    if not on:
        assert lines == []
        return
    want = [("GET", "/v2/models/mlp", "200"), ("GET", "/v2/models/nope", "404")]
    want.append(("POST", "/v2/models/mlp/infer", "400"))
    got = []
    for line in lines[-3:]:
        head, request, tail = line.split('"')
        method, path = request.split(" ")
        status, ms = tail.split()
        assert ms.endswith("ms") and float(ms[:-2]) >= 0 and head.strip().endswith(tuple("0123456789"))
        got.append((method, path, status))
    assert got == want
