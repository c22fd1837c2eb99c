"""Tables for the gateway's pure parts of issue 30, finding 7: which requests go to every
replica, how their answers combine (Triton statistics summed, repository calls all or
nothing), and the error shape of each protocol."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpufleet.gateway.errors import error_body, guess_protocol
from gpufleet.gateway.fanout import Answer, combine, fanout_kind, sum_model_stats


@pytest.mark.parametrize(
    ("method", "rest", "want"),
    [
        ("GET", b"/v2/models/stats", "stats"),
        ("GET", b"/v2/models/mlp/stats", "stats"),
        ("GET", b"/v2/models/mlp/versions/3/stats?x=1", "stats"),
        ("POST", b"/v2/models/mlp/stats", None),
        ("POST", b"/v2/repository/models/mlp/load", "repository"),
        ("POST", b"/v2/repository/models/mlp/unload", "repository"),
        ("POST", b"/v2/repository/index", None),
        ("GET", b"/v2/models/mlp", None),
        ("POST", b"/v2/models/mlp/infer", None),
    ],
)
def test_fanout_kind(method: str, rest: bytes, want: str | None) -> None:
    assert fanout_kind(method, rest) == want


def _entry(count: int, ns: int, last: int, sizes: dict[int, int]) -> dict[str, Any]:
    d = {"count": count, "ns": ns}
    return {
        "name": "mlp",
        "version": "1",
        "last_inference": last,
        "inference_count": count,
        "execution_count": count,
        "inference_stats": {"success": d, "queue": d},
        "batch_stats": [{"batch_size": b, "compute_infer": {"count": c, "ns": c}} for b, c in sizes.items()],
    }


def test_statistics_are_summed_per_model_and_batch_size() -> None:
    got = sum_model_stats([[_entry(3, 30, 5, {1: 3})], [_entry(4, 40, 9, {1: 2, 4: 1})]])
    assert len(got) == 1
    e = got[0]
    assert (e["inference_count"], e["execution_count"], e["last_inference"]) == (7, 7, 9)
    assert e["inference_stats"]["success"] == {"count": 7, "ns": 70}
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in e["batch_stats"]] == [(1, 5), (4, 1)]


def _a(replica: str, status: int, body: Any = None, error: str = "") -> Answer:
    return Answer(
        replica=replica, status=status, body=json.dumps(body).encode() if body else b"", error=error
    )


@pytest.mark.parametrize(
    ("kind", "answers", "status", "names"),
    [
        ("repository", [_a("1", 200, {}), _a("2", 200, {})], 200, "1,2"),
        ("repository", [_a("1", 200, {}), _a("2", 404, {"error": "no such model"})], 404, "2"),
        ("repository", [_a("1", 200, {}), _a("2", 0, error="refused")], 502, "2"),
        ("repository", [], 503, ""),
        ("stats", [_a("1", 200, {"model_stats": []}), _a("2", 0, error="refused")], 200, "1"),
        ("stats", [_a("1", 400, {"error": "unknown model"})], 400, "1"),
    ],
    ids=["all-ok", "one-404", "one-unreachable", "no-replica", "stats-of-those-that-answered", "stats-none"],
)
def test_combine(kind: str, answers: list[Answer], status: int, names: str) -> None:
    got = combine(kind, answers)
    assert (got.status, got.replicas) == (status, names)
    if status != 200:
        assert "error" in json.loads(got.body)


@pytest.mark.parametrize(
    ("protocol", "ctype", "keys"),
    [
        ("kserve-v2", b"application/json", {"error"}),
        ("openai", b"application/json", {"error"}),
        ("http", b"application/problem+json", {"type", "title", "status", "detail"}),
    ],
)
def test_error_shapes(protocol: str, ctype: bytes, keys: set[str]) -> None:
    got_type, body = error_body(protocol, 401, "Unauthorized", "a token is required")
    doc = json.loads(body)
    assert got_type == ctype and set(doc) == keys
    if protocol == "openai":
        assert doc["error"] == {
            "message": "a token is required",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }


@pytest.mark.parametrize(
    ("rest", "want"),
    [
        (b"/v2/models/m/infer", "kserve-v2"),
        (b"/v2", "kserve-v2"),
        (b"/v1/chat/completions", "openai"),
        (b"/x", "http"),
    ],
)
def test_guess_protocol(rest: bytes, want: str) -> None:
    assert guess_protocol(rest) == want
