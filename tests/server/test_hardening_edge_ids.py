"""Numbers no id column can hold, in every route's path and query and in the body
fields that name objects, answer 404 or 422 on both backends, never 500 (issue 29,
finding 12: PostgreSQL's ``integer`` ids; ``api.base.Id``, ``problems.ObjectId``,
``pages.id_cursor``). The routes come from the server's own OpenAPI document, so a
route added later is in the table."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from server.conftest import Server

BIG = [
    pytest.param(2**31, id="2^31"),
    pytest.param(2**63, id="2^63"),
    pytest.param(2**64, id="2^64"),
    pytest.param(-(2**31) - 1, id="-2^31-1"),
]
SKIPPED = ("/logs", "/revoke", "/wait")
"""A job's logs may follow (stay open); revoking and long-polls have their own tests."""
ID_QUERIES = ("cursor", "after", "offset", "array")
"""Query parameters that are ids or positions (``limit`` is bounded, and a page of 2^31
would cost a whole rate-limit bucket)."""
BODIES = [
    pytest.param("POST", "/jobs", {"command": ["true"], "reservation": 2**31}, id="submit-reservation"),
    pytest.param("POST", "/jobs/cancel", {"ids": [2**31]}, id="cancel-ids"),
    pytest.param("POST", "/jobs/cancel", {"array": 2**63}, id="cancel-array"),
    pytest.param("POST", "/jobs", {"command": ["true"], "dependency": f"afterok:{2**31}"}, id="dependency"),
]


def _calls(spec: dict[str, Any], big: int) -> list[tuple[str, str, dict[str, str]]]:
    """(method, path, query) for every operation with an integer path parameter or an
    id-like query parameter, each set to ``big``."""
    calls = []
    for template, ops in spec["paths"].items():
        if any(s in template for s in SKIPPED):
            continue
        for method, op in ops.items():
            path, query, numeric = template, {}, False
            for prm in op.get("parameters", []):
                schema = prm.get("schema", {})
                kinds = {schema.get("type"), *(a.get("type") for a in schema.get("anyOf", []))}
                if prm["in"] == "path":
                    numeric |= "integer" in kinds
                    path = path.replace("{" + prm["name"] + "}", str(big) if "integer" in kinds else "x")
                elif prm["in"] == "query" and prm["name"] in ID_QUERIES:
                    query[prm["name"]] = str(big)
                    numeric = True
            if numeric and method != "delete":
                calls.append((method.upper(), path, query))
    return calls


@pytest.mark.parametrize("big", BIG)
def test_no_route_answers_500_for_an_id_out_of_range(server: Server, big: int) -> None:
    spec = httpx.get(server.url + "/openapi.json", timeout=30).json()
    calls = _calls(spec, big)
    assert len(calls) >= 10  # the table is the API's
    got = {}
    with server.client() as c:
        for method, path, query in calls:
            body: dict[str, Any] | None = {} if method in ("POST", "PUT", "PATCH") else None
            got[f"{method} {path} {query}"] = c.request(
                method, path.removeprefix("/v1"), params=query, json=body
            )
    fives = {k: (r.status_code, r.text[:200]) for k, r in got.items() if r.status_code >= 500}
    assert not fives  # 200: a cursor after every row is an empty page
    assert {r.status_code for r in got.values()} <= {200, 400, 404, 409, 422}, {
        k: r.status_code for k, r in got.items()
    }


@pytest.mark.parametrize(("method", "path", "body"), BODIES)
def test_an_id_out_of_range_in_a_body_is_a_4xx(server: Server, method: str, path: str, body: Any) -> None:
    with server.client() as c:
        resp = c.request(method, path, json=body)
    assert resp.status_code in (404, 422), resp.text
    assert resp.headers["content-type"] == "application/problem+json"


@pytest.mark.parametrize("cursor", ["2147483648", "9223372036854775808", "99999999999999999999999"])
@pytest.mark.parametrize("route", ["/tokens", "/audit", "/node-credentials"])
def test_a_cursor_out_of_range_is_a_4xx(server: Server, route: str, cursor: str) -> None:
    with server.client() as c:
        resp = c.get(route, params={"cursor": cursor})
    assert resp.status_code in (400, 404, 422), resp.text
