"""The gateway in front of real ``gpufleet model-server`` replicas, both real processes
(``gpufleet gateway --endpoints-file``), driven by clients nobody here wrote
(``tritonclient.http``, ``openai``) and by raw bursts (issue 30, findings 6 and 7):

* bursts separated by idle gaps longer than the replicas' keep-alive: no request fails,
  no replica is ejected (the race of a request written onto a connection the replica
  is closing is answered by a resend on a fresh connection);
* overload: 503s with ``Retry-After`` from the gateway, no 502, no ejection;
* errors in each protocol's shape, as its client reads them; Triton statistics summed
  over the replicas; ``load_model``/``unload_model`` applied to every replica;
* OpenAI: embeddings, logprobs, options the toy cannot honour refused by name.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from server.conftest import free_port

TOKEN = "gf_svc_replicas_test_token_0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DIGEST = hashlib.sha256(TOKEN.encode()).hexdigest()
ROW = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}
INFER = json.dumps({"inputs": [ROW]}).encode()


def _spawn(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "gpufleet", *args],
            env={**os.environ, **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=out,
        )


def _wait(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"{url} never came up: {log.read_text()}"
        time.sleep(0.05)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@dataclass(frozen=True, kw_only=True)
class Fleet:
    gateway: str
    """http://127.0.0.1:PORT"""
    replicas: dict[str, str]
    """replica id -> its URL"""
    logs: Path

    def metric(self, start: str) -> float:
        total = 0.0
        for line in httpx.get(self.gateway + "/metrics", timeout=5).text.splitlines():
            if line.startswith(start):
                total += float(line.rsplit(" ", 1)[1])
        return total


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Two model servers with a 1 s keep-alive (shorter than the gateway's pool: the race
    of finding 6 happens on every idle gap), one slow one (50 ms a call) and a gateway
    over them: services ``mlp`` (kserve-v2), ``llm`` (openai), ``plain`` (http) on the
    two fast replicas, ``slow`` (kserve-v2) on the slow one."""
    tmp = tmp_path_factory.mktemp("gwreplicas")
    procs: list[subprocess.Popen[bytes]] = []
    urls: dict[str, str] = {}
    try:
        for rid, extra in (("r1", []), ("r2", []), ("slow", ["--launch-overhead-us", "50000"])):
            port = free_port()
            log = tmp / f"{rid}.log"
            args = ["model-server", "--port", str(port), "--seed", "7", "--keep-alive", "1s", *extra]
            procs.append(_spawn(args, log, {"GPUFLEET_JOB_ID": rid}))
            urls[rid] = f"http://127.0.0.1:{port}"
            _wait(urls[rid] + "/v2/health/ready", procs[-1], log)

        def svc(name: str, protocol: str, ids: tuple[str, ...]) -> dict[str, object]:
            eps = [{"id": i, "url": urls[i]} for i in ids]
            return {"name": name, "protocol": protocol, "tokens": [DIGEST], "endpoints": eps}

        feed = tmp / "feed.json"
        services = [
            svc("mlp", "kserve-v2", ("r1", "r2")),
            svc("llm", "openai", ("r1", "r2")),
            svc("plain", "http", ("r1", "r2")),
            svc("slow", "kserve-v2", ("slow",)),
        ]
        feed.write_text(json.dumps({"at": 1.0, "services": services}))
        port = free_port()
        log = tmp / "gateway.log"
        args = ["gateway", "--endpoints-file", str(feed), "--port", str(port), "--metrics-public"]
        procs.append(_spawn([*args, "--max-in-flight-per-replica", "4"], log))
        gw = f"http://127.0.0.1:{port}"
        _wait(gw + "/readyz", procs[-1], log)
        yield Fleet(gateway=gw, replicas={k: v for k, v in urls.items() if k != "slow"}, logs=tmp)
    finally:
        for p in procs:
            _stop(p)


# --- finding 6: never fail a request that could have been delivered ---------------------


async def _bursts(url: str, gaps: list[float], size: int) -> Counter[str]:
    """``size`` concurrent infers (at most 4 at once per replica: the gateway's cap here
    is 4, so 8 in flight over two replicas), then an idle gap, for each gap."""
    got: Counter[str] = Counter()
    limits = httpx.Limits(max_connections=8, keepalive_expiry=30)
    async with httpx.AsyncClient(base_url=url, timeout=20, limits=limits) as client:
        gate = asyncio.Semaphore(8)

        async def one() -> None:
            async with gate:
                try:
                    r = await client.post("/s/mlp/v2/models/mlp/infer", content=INFER, headers=AUTH)
                    got[str(r.status_code)] += 1
                except httpx.HTTPError as exc:
                    got[type(exc).__name__] += 1

        for gap in gaps:
            await asyncio.gather(*(one() for _ in range(size)))
            await asyncio.sleep(gap)
    return got


def test_bursts_after_idle_gaps_longer_than_the_keep_alive_all_succeed(fleet: Fleet) -> None:
    retries = fleet.metric("gpufleet_gateway_retries_total")
    # around and past the replicas' 1 s keep-alive: connections close as requests go out
    gaps = [0.95, 1.0, 1.05, 1.1, 1.2, 1.5, 1.0, 1.05]
    got = asyncio.run(_bursts(fleet.gateway, gaps, 40))
    assert got == Counter({"200": 40 * len(gaps)})
    assert fleet.metric("gpufleet_gateway_ejections_total") == 0
    assert fleet.metric("gpufleet_gateway_retries_total") >= retries


def test_the_model_servers_keep_alive_outlasts_the_gateways_pool() -> None:
    from gpufleet.cli.model_cmds import KEEP_ALIVE
    from gpufleet.gateway.app import UPSTREAM_KEEPALIVE_S, GatewayConfig
    from gpufleet.timefmt import parse_duration

    assert GatewayConfig().upstream_keepalive_s == UPSTREAM_KEEPALIVE_S
    assert parse_duration(KEEP_ALIVE) >= UPSTREAM_KEEPALIVE_S + 30  # nginx's 75 s against 30 s


async def _flood(url: str, n: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=httpx.Limits(max_connections=n)) as c:
        return list(
            await asyncio.gather(
                *(c.post("/s/slow/v2/models/mlp/infer", content=INFER, headers=AUTH) for _ in range(n))
            )
        )


def test_overload_is_a_503_with_retry_after_and_ejects_no_one(fleet: Fleet) -> None:
    replies = asyncio.run(_flood(fleet.gateway, 40))
    codes = Counter(r.status_code for r in replies)
    assert set(codes) == {200, 503} and codes[200] >= 4, codes
    for r in replies:
        if r.status_code == 503:
            assert r.headers["retry-after"] == "1"
            assert "overloaded" in r.json()["error"]  # KServe's shape: this is a kserve-v2 service
    assert fleet.metric('gpufleet_gateway_overloaded_total{service="slow"}') == codes[503]
    assert fleet.metric("gpufleet_gateway_ejections_total") == 0
    # and the replica serves the next request at once
    r = httpx.post(fleet.gateway + "/s/slow/v2/models/mlp/infer", content=INFER, headers=AUTH, timeout=10)
    assert r.status_code == 200


# --- finding 7: errors in the protocol's shape, stats, repository ------------------------


def _triton(fleet: Fleet, service: str = "mlp") -> triton.InferenceServerClient:
    return triton.InferenceServerClient(fleet.gateway.removeprefix("http://") + f"/s/{service}")


@pytest.mark.parametrize(
    ("service", "path", "headers", "status", "want"),
    [
        ("mlp", "/v2/models/mlp/infer", {}, 401, {"error": str}),
        ("nowhere", "/v2/models/mlp/infer", AUTH, 404, {"error": str}),
        ("llm", "/v1/chat/completions", {"Authorization": "Bearer bad"}, 401, {"error": dict}),
        ("nowhere", "/v1/models", AUTH, 404, {"error": dict}),
        ("plain", "/v2/models/mlp/infer", {}, 401, {"type": str, "title": str, "status": int}),
    ],
    ids=["kserve-401", "kserve-404-unknown-service", "openai-401", "openai-404", "http-problem"],
)
def test_the_gateways_errors_have_the_protocols_shape(
    fleet: Fleet, service: str, path: str, headers: dict[str, str], status: int, want: dict[str, type]
) -> None:
    r = httpx.post(f"{fleet.gateway}/s/{service}{path}", json={}, headers=headers, timeout=5)
    assert r.status_code == status
    body = r.json()
    assert {k: type(body.get(k)) for k in want} == want, body
    if want.get("error") is dict:
        assert set(body["error"]) == {"message", "type", "param", "code"}
    else:
        ctype = "application/problem+json" if "title" in want else "application/json"
        assert r.headers["content-type"] == ctype


def test_tritonclient_reads_the_gateways_errors(fleet: Fleet) -> None:
    with _triton(fleet) as client:
        with pytest.raises(InferenceServerException) as bad:
            client.get_model_metadata("mlp", headers={"Authorization": "Bearer wrong"})
        assert "service token" in str(bad.value) and "decoding" not in str(bad.value)
        assert client.get_model_metadata("mlp", headers=AUTH)["name"] == "mlp"


def _direct_count(url: str) -> int:
    doc = httpx.get(url + "/v2/models/mlp/stats", timeout=5).json()
    return int(doc["model_stats"][0]["inference_count"])


def test_triton_statistics_are_summed_over_the_replicas(fleet: Fleet) -> None:
    x = np.full((2, 16), 0.25, dtype=np.float32)
    with _triton(fleet) as client:
        for _ in range(6):
            inp = triton.InferInput("INPUT0", [2, 16], "FP32")
            inp.set_data_from_numpy(x)
            client.infer("mlp", [inp], headers=AUTH)
        counts = []
        for _ in range(4):  # consecutive reads never go backwards (they did, replica to replica)
            stats = client.get_inference_statistics("mlp", headers=AUTH)["model_stats"]
            counts.append(stats[0]["inference_count"])
        every = client.get_inference_statistics(headers=AUTH)["model_stats"]
    direct = sum(_direct_count(u) for u in fleet.replicas.values())
    assert counts == [direct] * 4 and every[0]["inference_count"] == direct
    assert all(_direct_count(u) < direct for u in fleet.replicas.values())  # both served some
    assert len(stats) == 1 and stats[0]["execution_count"] >= 6


def test_load_and_unload_reach_every_replica(fleet: Fleet) -> None:
    with _triton(fleet) as client:
        assert client.get_server_metadata(headers=AUTH)["extensions"].count("model_repository") == 1
        client.unload_model("mlp", headers=AUTH)
        for url in fleet.replicas.values():
            assert httpx.get(url + "/v2/models/mlp/ready", timeout=5).status_code != 200
            index = httpx.post(url + "/v2/repository/index", timeout=5).json()
            assert index[0]["state"] == "UNAVAILABLE"
        assert not client.is_model_ready("mlp", headers=AUTH)
        assert client.is_server_ready(headers=AUTH)  # the replicas stay in their service
        with pytest.raises(InferenceServerException, match="no available versions"):
            inp = triton.InferInput("INPUT0", [1, 16], "FP32")
            inp.set_data_from_numpy(np.zeros((1, 16), dtype=np.float32))
            client.infer("mlp", [inp], headers=AUTH)
        client.load_model("mlp", headers=AUTH)
        for url in fleet.replicas.values():
            assert httpx.get(url + "/v2/models/mlp/ready", timeout=5).status_code == 200
        assert client.is_model_ready("mlp", headers=AUTH)
        with pytest.raises(InferenceServerException, match="no such model"):
            client.load_model("other", headers=AUTH)
        with pytest.raises(InferenceServerException, match="cannot load"):
            client.load_model("mlp", headers=AUTH, config=json.dumps({"max_batch_size": 1}))


# --- finding 7: OpenAI -----------------------------------------------------------------


def _openai(fleet: Fleet, key: str = TOKEN) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{fleet.gateway}/s/llm/v1", api_key=key, max_retries=0)


def test_openai_reads_the_gateways_errors(fleet: Fleet) -> None:
    with pytest.raises(openai.AuthenticationError) as bad:
        _openai(fleet, "wrong").models.list()
    assert bad.value.code == "invalid_api_key" and "service token" in bad.value.message


def test_openai_embeddings(fleet: Fleet) -> None:
    client = _openai(fleet)
    first = client.embeddings.create(model="mlp", input=["a GPU", "a node"])  # base64 by default
    again = client.embeddings.create(model="mlp", input="a GPU", encoding_format="float")
    assert [d.index for d in first.data] == [0, 1] and len(first.data[0].embedding) == 64
    assert np.allclose(first.data[0].embedding, again.data[0].embedding, atol=1e-6)
    assert not np.allclose(first.data[0].embedding, first.data[1].embedding)
    assert abs(np.linalg.norm(first.data[1].embedding) - 1) < 1e-5
    short = client.embeddings.create(model="mlp", input="x", dimensions=8)
    assert len(short.data[0].embedding) == 8 and first.usage.prompt_tokens == 4


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
        ({"tool_choice": "required"}, "tool_choice"),
    ],
    ids=["tools", "response_format", "logit_bias", "tool_choice"],
)
def test_openai_options_the_toy_cannot_honour_are_refused_by_name(
    fleet: Fleet, options: dict[str, Any], named: str
) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        _openai(fleet).chat.completions.create(
            model="mlp",
            messages=[{"role": "user", "content": "hi"}],
            **options,
        )
    assert bad.value.code == "unsupported_parameter" and named in bad.value.message


def test_openai_logprobs_are_honoured(fleet: Fleet) -> None:
    client = _openai(fleet)
    chat = client.chat.completions.create(
        model="mlp", messages=[{"role": "user", "content": "hi"}], max_tokens=5, logprobs=True, top_logprobs=3
    )
    assert chat.choices[0].logprobs is not None
    content = chat.choices[0].logprobs.content
    assert content is not None and "".join(t.token for t in content) == chat.choices[0].message.content
    assert all(len(t.top_logprobs) == 3 and t.logprob < 0 for t in content)
    streamed = client.chat.completions.create(
        model="mlp",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=5,
        logprobs=True,
        top_logprobs=3,
        stream=True,
    )
    tokens = [
        t
        for c in streamed
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.content or []
    ]
    assert [t.token for t in tokens] == [t.token for t in content]
    legacy = client.completions.create(model="mlp", prompt="hi", max_tokens=4, logprobs=2, n=2)
    assert [len(c.logprobs.tokens or []) if c.logprobs else 0 for c in legacy.choices] == [4, 4]
