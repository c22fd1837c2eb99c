"""The agent's model convergence (``agent/replicamodels.py``, issue 30): which repository
calls a wish needs (a table), and passes against the real model server's app (its
``/v2/repository`` routes, in-process through Starlette's test client), with a counted
transport so "not called again" is checked, not assumed."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from starlette.testclient import TestClient

from gpufleet.agent.replicamodels import RECHECK_S, RETRY_S, ModelConverger, calls, clean
from gpufleet.modelserver.app import create_app

KEY = (7, 1)
PORT = 8000


@pytest.mark.parametrize(
    ("wants", "index", "want"),
    [
        ({"m": True}, {"m": "READY"}, []),
        ({"m": True}, {"m": "LOADING"}, []),
        ({"m": True}, {"m": "UNAVAILABLE"}, [("m", "load")]),
        ({"m": True}, {}, [("m", "load")]),
        ({"m": False}, {"m": "READY"}, [("m", "unload")]),
        ({"m": False}, {"m": "LOADING"}, [("m", "unload")]),
        ({"m": False}, {"m": "UNAVAILABLE"}, []),
        ({"m": False}, {}, []),
        ({"b": True, "a": False}, {"a": "READY", "b": "UNAVAILABLE"}, [("a", "unload"), ("b", "load")]),
        ({}, {"m": "READY"}, []),
    ],
    ids=[
        "loaded-ready",
        "loaded-loading",
        "loaded-unavailable",
        "loaded-absent",
        "unloaded-ready",
        "unloaded-loading",
        "unloaded-unavailable",
        "unloaded-absent",
        "two-in-name-order",
        "no-wish-no-call",
    ],
)
def test_calls(wants: dict[str, bool], index: dict[str, str], want: list[tuple[str, str]]) -> None:
    assert calls(wants, index) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("plain", "plain"),
        ("two\nlines\x00and\u202eflip", "two lines and flip"),
        ("x" * 900, "x" * 500),
    ],
    ids=["plain", "controls", "cut"],
)
def test_clean(text: str, want: str) -> None:
    assert clean(text) == want


class Counted:
    """The model server's app behind a sync client whose requests are counted by path."""

    def __init__(self, **app_kw: object) -> None:
        self.paths: list[str] = []
        self.client = TestClient(create_app(model_name="mlp", **app_kw))  # type: ignore[arg-type]
        self.client.event_hooks["request"].append(lambda r: self.paths.append(r.url.path))

    def calls(self, verb: str) -> int:
        return sum(1 for p in self.paths if p.endswith(f"/{verb}"))


@pytest.fixture
def server() -> Iterator[Counted]:
    got = Counted()
    with got.client:
        yield got


def test_unload_then_load_converges_and_reports(server: Counted) -> None:
    conv = ModelConverger(timeout_s=2.0)
    conv.want({KEY: {"mlp": False}})
    assert conv.gates(KEY) and conv.seen(KEY) is None
    assert conv.converge(KEY, PORT, server.client, now=0.0)
    assert not conv.gates(KEY)
    assert conv.seen(KEY) == [
        {"name": "mlp", "state": "UNAVAILABLE", "reason": "unloaded", "wanted": "unloaded"}
    ]
    assert server.client.post("/v2/repository/index").json()[0]["state"] == "UNAVAILABLE"
    asked = server.paths.count("/v2/repository/index")
    assert not conv.converge(KEY, PORT, server.client, now=1.0)  # converged: not asked again yet
    assert server.paths.count("/v2/repository/index") == asked
    assert not conv.converge(KEY, PORT, server.client, now=1.0 + RECHECK_S)  # read again: no call
    assert server.paths.count("/v2/repository/index") == asked + 1
    assert server.calls("unload") == 1
    conv.want({KEY: {"mlp": True}})
    assert not conv.gates(KEY)  # a running replica is not taken out by a new wish
    conv.converge(KEY, PORT, server.client, now=2.0)
    assert conv.seen(KEY) == [{"name": "mlp", "state": "READY", "reason": "", "wanted": "loaded"}]
    assert server.client.get("/v2/models/mlp/ready").status_code == 200


def test_an_unknown_model_fails_with_the_replicas_reason_and_is_retried_only_later(server: Counted) -> None:
    conv = ModelConverger(timeout_s=2.0)
    conv.want({KEY: {"nope": True, "mlp": True}})
    conv.converge(KEY, PORT, server.client, now=0.0)
    seen = {m["name"]: m for m in conv.seen(KEY) or []}
    assert seen["mlp"]["state"] == "READY"
    assert seen["nope"]["state"] == "FAILED"
    assert "HTTP 404" in seen["nope"]["reason"] and "no such model" in seen["nope"]["reason"]
    assert not conv.gates(KEY)  # refused, but the replica serves what it has
    conv.converge(KEY, PORT, server.client, now=RETRY_S / 2)
    assert server.calls("load") == 1
    assert {m["name"]: m["state"] for m in conv.seen(KEY) or []}["nope"] == "FAILED"
    conv.converge(KEY, PORT, server.client, now=RETRY_S + 1)
    assert server.calls("load") == 2
    conv.want({KEY: {"nope": False, "mlp": True}})  # a changed wish: at once, and absent is unloaded
    conv.converge(KEY, PORT, server.client, now=RETRY_S + 2)
    assert {m["name"]: m["state"] for m in conv.seen(KEY) or []}["nope"] == "UNAVAILABLE"
    assert server.calls("load") == 2


def test_a_server_without_the_repository_api_is_unknown_not_a_failure_loop() -> None:
    def app(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, text="<html>\nnot here\n</html>")

    with httpx.Client(transport=httpx.MockTransport(app)) as client:
        conv = ModelConverger(timeout_s=1.0)
        conv.want({KEY: {"m": True}})
        conv.converge(KEY, PORT, client)
        (got,) = conv.seen(KEY) or []
        assert got["state"] == "UNKNOWN"
        assert got["reason"] == "repository index: HTTP 404: <html> not here </html>"
        assert not conv.gates(KEY)


def test_an_unreachable_replica_and_forgotten_replicas() -> None:
    conv = ModelConverger(timeout_s=0.5)
    conv.want({KEY: {"m": True}, (8, 1): {}})
    assert not conv.gates((8, 1))  # no wishes: never gated
    with httpx.Client() as client:
        conv.converge(KEY, 1, client)  # nothing listens on port 1
    (got,) = conv.seen(KEY) or []
    assert got["state"] == "UNKNOWN" and got["reason"].startswith("repository index: ConnectError")
    conv.want({})
    assert conv.seen(KEY) is None and not conv.gates(KEY)
