"""Every list endpoint pages (``pages.py``): ``{"items", "next_cursor"}``, ``?limit=`` and
``?cursor=``, as ``GET /v1/jobs`` does; and the CLI follows the pages to the end."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from server.conftest import (
    ADMIN_TOKEN,
    Server,
    every,
    gpufleet,
    make_node,
    make_pool,
    make_team,
    make_user,
    ok,
    unique,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Listing:
    """A list, what this test made in it, and how its items are keyed and ordered."""

    path: str
    made: set[Any]
    key: str = "name"
    order: str = "name"
    params: dict[str, str] = field(default_factory=dict)
    token: str = ADMIN_TOKEN
    whole: bool = False
    """True: the listing holds exactly what was made (a filter or a user's own view)."""


def _users(srv: Server) -> Listing:
    team = make_team(srv)
    names = {unique("pu") for _ in range(5)}
    with srv.client() as c:
        for n in names:
            ok(c.post("/users", json={"name": n, "role": "user", "teams": [team]}), 201)
    return Listing(path="/users", made=names)


def _teams(srv: Server) -> Listing:
    return Listing(path="/teams", made={make_team(srv) for _ in range(5)})


def _pools(srv: Server) -> Listing:
    return Listing(path="/pools", made={make_pool(srv) for _ in range(5)})


def _nodes(srv: Server) -> Listing:
    pool = make_pool(srv)
    made = {make_node(srv, pool=pool, gpus=1) for _ in range(5)}
    return Listing(path="/nodes", made=made, params={"pool": pool}, whole=True)


def _tokens(srv: Server) -> Listing:
    token = make_user(srv, team=make_team(srv))
    with srv.client(token) as c:
        made = {ok(c.post("/tokens", json={"name": f"t{i}"}), 201)["id"] for i in range(4)}
        made |= {t["id"] for t in ok(c.get("/tokens"))["items"] if t["name"] == "initial"}
    return Listing(path="/tokens", made=made, key="id", order="id", token=token, whole=True)


def _reservations(srv: Server) -> Listing:
    pool = make_pool(srv)
    make_node(srv, pool=pool, gpus=8)
    token = make_user(srv, team=make_team(srv))
    start = time.time() + 40 * 86400
    with srv.client(token) as c:  # booked out of start order: the list is by start
        made = {
            ok(
                c.post(
                    "/reservations",
                    json={"pool": pool, "gpus": 1, "start": start + h * 3600, "duration_s": 1800},
                ),
                201,
            )[0]["id"]
            for h in (3, 1, 4, 0, 2)
        }
    return Listing(path="/reservations", made=made, key="id", order="start", token=token, whole=True)


def _node_credentials(srv: Server) -> Listing:
    node = make_node(srv, pool=make_pool(srv), gpus=1)
    with srv.client() as c:  # join tokens by id (certificates, after them, need an agent's enrolment)
        made = {ok(c.post("/nodes/join-tokens", json={"node": node}), 201)["id"] for _ in range(5)}
    params = {"node": node}
    return Listing(path="/node-credentials", made=made, key="id", order="id", params=params, whole=True)


LISTINGS = [
    pytest.param(_users, id="users"),
    pytest.param(_teams, id="teams"),
    pytest.param(_pools, id="pools"),
    pytest.param(_nodes, id="nodes"),
    pytest.param(_tokens, id="tokens"),
    pytest.param(_reservations, id="reservations"),
    pytest.param(_node_credentials, id="node-credentials"),
]


@pytest.mark.parametrize("make", LISTINGS)
def test_list_pages_by_cursor(server: Server, make: Callable[[Server], Listing]) -> None:
    listing = make(server)
    pages: list[list[dict[str, Any]]] = []
    with server.client(listing.token) as c:
        cursor = None
        while True:
            params = {**listing.params, "limit": "2", **({"cursor": cursor} if cursor else {})}
            page = ok(c.get(listing.path, params=params))
            pages.append(page["items"])
            cursor = page["next_cursor"]
            if cursor is None:
                break
        everything = every(c, listing.path, **listing.params)
    walked = [item for page in pages for item in page]
    keys = [item[listing.key] for item in walked]
    assert all(len(p) == 2 for p in pages[:-1]) and 1 <= len(pages[-1]) <= 2
    assert walked == everything  # the same items, in the same order, a page at a time
    assert len(keys) == len(set(keys))
    assert [i[listing.order] for i in walked] == sorted(i[listing.order] for i in walked)
    if listing.whole:
        assert set(keys) == listing.made
    else:
        assert listing.made <= set(keys)


@pytest.mark.parametrize(
    ("path", "params"),
    [
        pytest.param("/tokens", {"cursor": "abc"}, id="tokens-cursor-not-an-id"),
        pytest.param("/node-credentials", {"cursor": "certificate:x"}, id="node-credentials-cursor"),
        pytest.param("/node-credentials", {"cursor": f"join-token:{2**63}"}, id="cursor-past-int64"),
        pytest.param("/reservations", {"cursor": "soon"}, id="reservations-cursor-not-start-id"),
        pytest.param("/users", {"limit": "0"}, id="limit-0"),
        pytest.param("/nodes", {"limit": "1001"}, id="limit-above-1000"),
        pytest.param("/teams", {"cursor": ""}, id="empty-cursor"),
    ],
)
def test_bad_page_parameters_are_422(server: Server, path: str, params: dict[str, str]) -> None:
    with server.client() as c:
        resp = c.get(path, params=params)
    assert resp.status_code == 422, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")


def test_a_user_sees_a_page_of_one_user(server: Server) -> None:
    token = make_user(server, team=make_team(server))
    with server.client(token) as c:
        page = ok(c.get("/users", params={"limit": 1}))
        me = ok(c.get("/users/me"))
    assert (page["items"], page["next_cursor"]) == ([me], None)


def test_cli_follows_pages(server: Server) -> None:
    if not server.db_url.startswith("sqlite"):
        pytest.skip("the CLI is a client of the API: its tests run once, on SQLite")
    made = {make_pool(server) for _ in range(105)}  # more than the client's first page (100)
    out = gpufleet("admin", "pools", "--json", env=server.env())
    assert out.returncode == 0, out.stderr
    listed = [p["name"] for p in json.loads(out.stdout)]
    assert made <= set(listed) and len(listed) == len(set(listed))
