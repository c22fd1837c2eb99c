"""An idle node's renewal and long-poll answered without FastAPI's router
(``routers/agents.AgentShortcut``) get the very answer the route gives.

Each request is sent twice to a running server: as an agent sends it (the shortcut
answers) and with a detail the shortcut leaves to the route (``Content-Type:
application/json; charset=utf-8`` for a renewal, ``timeout=2e1`` for a long-poll: the
same request to FastAPI). Status, content type and body must be equal, for every
caller: the node's own credential, another node's, an unknown one, none, a user, an
operator. Odd input the shortcut never answers (bad names, bodies, queries) is the
route's 422, and the latency histogram still names the route."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from gpufleet.server.routers.agents import _lease, _wait_query
from server.conftest import ADMIN_TOKEN, Server, make_team, make_user, ok, unique

ROUTED_JSON = "application/json; charset=utf-8"
"""A Content-Type FastAPI reads as JSON and the shortcut leaves to the route."""


def _join(srv: Server, node: str) -> str:
    with srv.client() as c:
        ok(c.put(f"/nodes/{node}", json={"pool": "default", "gpus": []}))
        return str(ok(c.post("/nodes/join-tokens", json={"node": node}), 201)["token"])


def _sync(srv: Server, node: str, token: str) -> str:
    body = {"gpus": [{"index": 0, "uuid": f"GPU-{node}-0", "model": "H100"}], "jobs": [], "logs": []}
    with srv.client(token) as c:
        return str(ok(c.post(f"/nodes/{node}/sync", json=body))["lease"])


def _answer(resp: httpx.Response) -> tuple[int, str, Any]:
    return resp.status_code, resp.headers.get("content-type", ""), resp.json()


def _renew(srv: Server, token: str | None, node: str, body: Any, *, routed: bool) -> tuple[int, str, Any]:
    headers = {"Content-Type": ROUTED_JSON if routed else "application/json"}
    with srv.client(token) as c:
        return _answer(c.post(f"/nodes/{node}/renew", content=json.dumps(body), headers=headers))


def _wait(srv: Server, token: str | None, node: str, seen: str, *, routed: bool) -> tuple[int, str, Any]:
    with srv.client(token) as c:
        params = {"seen": seen, "timeout": "0e0" if routed else "0"}
        return _answer(c.get(f"/nodes/{node}/wait", params=params))


def test_the_shortcut_answers_as_the_route_does(server: Server) -> None:
    node, other = unique("short"), unique("short")
    mine, theirs = _join(server, node), _join(server, other)
    lease = _sync(server, node, mine)
    _sync(server, other, theirs)
    user = make_user(server, team=make_team(server))
    callers = {
        "own credential": mine,
        "another node's credential": theirs,
        "unknown node credential": "gfn_" + "x" * 40,
        "no credential": None,
        "a user": user,
        "an operator": ADMIN_TOKEN,
        "not a bearer": "",
    }
    for label, token in callers.items():
        for body in ({"lease": lease}, {"lease": "not-the-lease"}):
            fast = _renew(server, token, node, body, routed=False)
            slow = _renew(server, token, node, body, routed=True)
            assert fast == slow, (label, body, fast, slow)
        fast = _wait(server, token, node, "old-version", routed=False)
        slow = _wait(server, token, node, "old-version", routed=True)
        assert fast == slow, (label, fast, slow)
    # the answers themselves, so equal answers are also the right ones
    assert _renew(server, mine, node, {"lease": "stale"}, routed=False)[::2] == (
        200,
        {"node": node, "renewed": False},
    )
    assert _renew(server, theirs, node, {"lease": lease}, routed=False)[0] == 403
    assert _renew(server, None, node, {"lease": lease}, routed=False)[:2] == (401, "application/problem+json")
    assert _renew(server, user, node, {"lease": lease}, routed=False)[0] == 403
    status, _, reply = _wait(server, mine, node, "old-version", routed=False)
    assert status == 200 and reply["node"] == node and reply["version"] != "old-version"
    assert _wait(server, theirs, node, "x", routed=False)[0] == 403


def test_odd_requests_go_to_the_route(server: Server) -> None:
    node = unique("short")
    token = _join(server, node)
    lease = _sync(server, node, token)
    with server.client(token) as c:
        for _ in range(2):  # two answered here, whatever ran before on this server
            assert c.post(f"/nodes/{node}/renew", json={"lease": lease}).status_code == 200
        for body in ({}, {"lease": ""}, {"lease": lease, "extra": 1}, {"lease": 7}, [lease]):
            resp = c.post(f"/nodes/{node}/renew", json=body)
            assert resp.status_code == 422, body
            assert resp.headers["content-type"] == "application/problem+json"
        raw = {"Content-Type": "application/json"}
        resp = c.post(f"/nodes/{node}/renew", content=b"\x00\xff", headers=raw)
        assert resp.status_code in (400, 422), resp.text
        resp = c.post(f"/nodes/{node}/renew", content=b"lease", headers={"Content-Type": "text/plain"})
        assert resp.status_code == 422
        for params in ({"timeout": "61"}, {"timeout": "nan"}, {"timeout": "-1"}, {"seen": "x" * 65}):
            resp = c.get(f"/nodes/{node}/wait", params=params)
            assert resp.status_code == 422, params
        # the route, not the shortcut, decides a repeated parameter (FastAPI: the last)
        resp = c.get(f"/nodes/{node}/wait", params=[("timeout", "99"), ("timeout", "0")])
        assert resp.status_code == 200, resp.text
        for bad in ("-bad", "x" * 64, "a%00b", f"{node}%0A", f"{node}%0a", f"{node}%20"):
            assert c.post(f"/nodes/{bad}/renew", json={"lease": lease}).status_code in (400, 422), bad
            assert c.get(f"/nodes/{bad}/wait", params={"timeout": "0"}).status_code in (400, 422), bad
    with server.client() as c:
        metrics = c.get(server.url + "/metrics").text
    renewals = [
        line
        for line in metrics.splitlines()
        if line.startswith("gpufleet_http_request_duration_seconds_count")
        and 'route="/v1/nodes/{name}/renew"' in line
        and 'status="200"' in line
    ]
    assert renewals and float(renewals[0].split()[-1]) >= 2, renewals


@pytest.mark.parametrize(
    ("body", "ctype", "lease"),
    [
        (b'{"lease":"abc"}', b"application/json", "abc"),
        (b'{"lease":"abc"}', b"application/json; charset=utf-8", None),
        (b'{"lease":"abc"}', None, None),
        (b"", b"application/json", None),
        (b'{"lease":""}', b"application/json", None),
        (b'{"lease":"abc","x":1}', b"application/json", None),
        (b'{"lease":' + b"[" * 5000 + b"]" * 5000 + b"}", b"application/json", None),
        (b"\xff", b"application/json", None),
    ],
)
def test_lease_table(body: bytes, ctype: bytes | None, lease: str | None) -> None:
    scope = {"headers": [(b"content-type", ctype)] if ctype else []}
    assert _lease(scope, body) == lease


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (b"", (None, 20.0)),
        (b"timeout=20.0&seen=1.2", ("1.2", 20.0)),
        (b"timeout=0", (None, 0.0)),
        (b"timeout=60", (None, 60.0)),
        (b"timeout=60.5", None),
        (b"timeout=21.734182349871234", (None, 21.734182349871234)),  # the agent's jittered timeout
        (b"timeout=1." + b"0" * 21, None),
        (b"timeout=2e1", None),
        (b"timeout=inf", None),
        (b"timeout=", None),
        (b"seen=a&seen=b", None),
        (b"seen=" + b"x" * 65, None),
        (b"other=1", (None, 20.0)),
    ],
)
def test_wait_query_table(query: bytes, expected: tuple[str | None, float] | None) -> None:
    assert _wait_query(query) == expected
