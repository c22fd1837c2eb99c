"""Rate limits, failed-authentication throttling, per-user caps and lanes, over HTTP
against real servers started with small limits (``ratelimit.py``, ``lanes.py``,
``services/caps.py``). Paging of the list endpoints is ``test_paging.py``."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from server.conftest import (
    ADMIN_TOKEN,
    Server,
    make_node,
    make_pool,
    make_team,
    make_user,
    ok,
    scratch_postgres,
    start_server,
    stop_server,
    unique,
)
from server.playnode import gpu_list, post_sync, register

RATES = ("--rate-user", "5/0.5", "--rate-operator", "8/0.5", "--rate-admin", "off", "--auth-failures", "3/1m")
CAPS = ("--max-pending-jobs", "3", "--max-reservations", "2", "--max-tokens", "3")
LIMITS = (*RATES, *CAPS, "--trusted-proxy", "127.0.0.1")  # the tests speak for other addresses
LANES = ("--user-lane", "1", "--rate-user", "off", "--max-pending-jobs", "0")
PROBLEM = "application/problem+json"
_hosts = itertools.count(1)


@contextlib.contextmanager
def _server(
    backend: str, label: str, tmp: pytest.TempPathFactory, extra: tuple[str, ...]
) -> Iterator[Server]:
    with contextlib.ExitStack() as stack:
        if backend == "sqlite":
            url = f"sqlite:///{tmp.mktemp(label) / 'gpufleet.db'}"
        else:
            url = stack.enter_context(scratch_postgres(label))
        srv = start_server(url, extra=extra)
        try:
            yield srv
        finally:
            stop_server(srv)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def limited(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with _server(request.param, "limits", tmp_path_factory, LIMITS) as srv:
        yield srv


@pytest.fixture(scope="module")
def team(limited: Server) -> str:
    return make_team(limited)


def call(c: httpx.Client, method: str, path: str, **kw: Any) -> httpx.Response:
    """A request that waits out 429s as ``Retry-After`` says (as the CLI does)."""
    while True:
        resp = c.request(method, path, **kw)
        if resp.status_code != 429:
            return resp
        time.sleep(float(resp.headers["Retry-After"]))


def assert_too_many(resp: httpx.Response, *words: str) -> dict[str, Any]:
    assert resp.status_code == 429, resp.text
    assert resp.headers["content-type"].startswith(PROBLEM)
    assert int(resp.headers["Retry-After"]) >= 1
    body: dict[str, Any] = resp.json()
    assert (body["status"], body["title"]) == (429, "Too Many Requests")
    for w in words:
        assert w in body["detail"], body
    return body


# -- the per-user bucket ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("role", "burst"),
    [
        pytest.param("user", 5, id="user-30-10-by-default-5-here"),
        pytest.param("operator", 8, id="operator-has-its-own-rate"),
        pytest.param("admin", None, id="admin-rate-off"),
    ],
)
def test_bucket_answers_429_with_retry_after(
    limited: Server, team: str, role: str, burst: int | None
) -> None:
    token = ADMIN_TOKEN if role == "admin" else make_user(limited, role=role, team=team)
    with limited.client(token) as c:
        got = [c.get("/users/me") for _ in range((burst or 20) + 1)]
    if burst is None:
        assert {r.status_code for r in got} == {200}
        return
    assert [r.status_code for r in got] == [200] * burst + [429]
    body = assert_too_many(got[-1], "rate limit", f"may make {burst} requests at once", "0.5 a second")
    assert body["instance"] == "/v1/users/me"
    time.sleep(float(got[-1].headers["Retry-After"]))
    with limited.client(token) as c:
        assert c.get("/users/me").status_code == 200


@pytest.mark.parametrize(
    ("paths", "want"),
    [
        pytest.param(["/jobs?limit=300", "/jobs?limit=300"], [200, 429], id="a-page-of-300-costs-3"),
        pytest.param(["/jobs?limit=300", "/users/me", "/users/me"], [200, 200, 200], id="then-1-each"),
        pytest.param(["/jobs?limit=1000", "/users/me"], [200, 429], id="a-cost-above-burst-takes-all"),
        pytest.param(["/jobs?limit=100"] * 6, [200] * 5 + [429], id="a-page-of-100-costs-1"),
    ],
)
def test_list_pages_cost_by_their_limit(
    limited: Server, team: str, paths: list[str], want: list[int]
) -> None:
    token = make_user(limited, team=team)
    with limited.client(token) as c:
        got = [c.get(p) for p in paths]
    assert [r.status_code for r in got] == want
    if 429 in want and "limit=300" in paths[-1]:
        assert_too_many(got[-1], "costs 3")


def test_node_credentials_and_syncs_are_in_no_user_bucket(limited: Server, team: str) -> None:
    pool = make_pool(limited)
    node, cred = register(limited, pool=pool, gpus=2)
    body = {"gpus": gpu_list(2, node=node), "jobs": []}
    assert {post_sync(limited, node, body, token=cred).status_code for _ in range(12)} == {200}
    operator = make_user(limited, role="operator", team=team)
    other = unique("pn")
    with limited.client() as c:
        ok(c.put(f"/nodes/{other}", json={"pool": pool, "gpus": gpu_list(2, node=other)}))
    body = {"gpus": gpu_list(2, node=other), "jobs": []}
    assert {post_sync(limited, other, body, token=operator).status_code for _ in range(12)} == {200}
    with limited.client(operator) as c:  # its bucket (8) is untouched by the 12 syncs
        assert [c.get("/users/me").status_code for _ in range(8)] == [200] * 8


# -- failed authentication, per address ---------------------------------------------------------

# (address, credential, status): "bad" is a made-up token, "fresh" a valid token never
# used before (the server has not cached it), "known" the admin's (cached just before).
AUTH_STEPS = [
    pytest.param(
        "/v1/users/me",
        [("A", "bad", 401), ("A", "bad", 401), ("A", "bad", 401), ("A", "bad", 429)],
        id="n-failures-then-429",
    ),
    pytest.param(
        "/v1/users/me",
        [("A", "bad", 401)] * 3 + [("A", "fresh", 200), ("A", "bad", 429), ("A", "known", 200)],
        id="bad-tokens-wait-valid-ones-pass",
    ),
    pytest.param(
        "/v1/users/me", [("A", "bad", 401)] * 3 + [("B", "bad", 401), ("B", "fresh", 200)], id="per-address"
    ),
    pytest.param(
        "/v1/users/me", [("A", "none", 401)] * 3 + [("A", "bad", 429)], id="a-missing-token-is-a-failure"
    ),
    pytest.param(
        "/v1/nodes/x/sync",
        [("A", "gfn_made_up", 401)] * 3 + [("A", "gfn_made_up", 429)],
        id="node-credentials",
    ),
    pytest.param("/metrics", [("A", "bad", 401)] * 3 + [("A", "bad", 429)], id="metrics-too"),
]


@pytest.mark.parametrize(("path", "steps"), AUTH_STEPS)
def test_failed_authentication_is_throttled_per_address(
    limited: Server, team: str, path: str, steps: list[tuple[str, str, int]]
) -> None:
    addresses = {a: f"198.51.100.{next(_hosts)}" for a in "AB"}  # new ones for each case
    fresh = make_user(limited, team=team)
    method = "POST" if path.endswith("/sync") else "GET"
    got = []
    for address, credential, _ in steps:
        headers = {"X-Forwarded-For": addresses[address]}  # the server trusts loopback (--trusted-proxy)
        if credential == "known":
            with limited.client() as c:
                ok(c.get("/users/me"))  # cache the admin's token (from loopback)
        token = {"bad": "gf_" + unique("nope"), "fresh": fresh, "known": ADMIN_TOKEN, "none": None}.get(
            credential, credential
        )
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        with httpx.Client(base_url=limited.url, timeout=30) as c:
            got.append(c.request(method, path, headers=headers, json={} if method == "POST" else None))
    assert [r.status_code for r in got] == [want for _, _, want in steps]
    for r in got:
        if r.status_code == 429:
            assert_too_many(r, "too many failed authentications from 198.51.")


# -- caps ---------------------------------------------------------------------------------------


def _jobs(srv: Server, token: str, n: int, pool: str, team: str) -> list[httpx.Response]:
    pool = make_pool(srv)  # no nodes: the jobs stay PENDING
    with srv.client(token) as c:
        return [
            call(c, "POST", "/jobs", json={"command": ["true"], "pool": pool, "team": team}) for _ in range(n)
        ]


def _reservations(srv: Server, token: str, n: int, pool: str, team: str) -> list[httpx.Response]:
    start = time.time() + 30 * 86400
    with srv.client(token) as c:
        return [
            call(
                c,
                "POST",
                "/reservations",
                json={"pool": pool, "gpus": 1, "start": start + i * 7200, "duration_s": 3600},
            )
            for i in range(n)
        ]


def _tokens(srv: Server, token: str, n: int, pool: str, team: str) -> list[httpx.Response]:
    with srv.client(token) as c:
        return [call(c, "POST", "/tokens", json={"name": f"t{i}"}) for i in range(n)]


CAP_CASES = [
    pytest.param(
        _jobs, 3, "pending-jobs cap: ", "has 3 pending or held jobs and the cap is 3", id="pending-jobs"
    ),
    pytest.param(
        _reservations,
        2,
        "reservation cap: ",
        "has 2 booked or active reservations and the cap is 2",
        id="reservations",
    ),
    # the initial token counts: 1 + 2 made here = 3
    pytest.param(_tokens, 2, "token cap: ", "has 3 live API tokens and the cap is 3", id="tokens"),
]


@pytest.mark.parametrize(("make", "room", "prefix", "says"), CAP_CASES)
def test_caps_refuse_with_a_clear_403(
    limited: Server,
    team: str,
    make: Callable[[Server, str, int, str, str], list[httpx.Response]],
    room: int,
    prefix: str,
    says: str,
) -> None:
    pool = make_pool(limited)
    make_node(limited, pool=pool, gpus=8)
    user = make_user(limited, team=team)
    made = make(limited, user, room + 1, pool, team)
    assert [r.status_code for r in made] == [201] * room + [403]
    problem = made[-1].json()
    assert made[-1].headers["content-type"].startswith(PROBLEM)
    assert problem["detail"].startswith(prefix) and says in problem["detail"], problem
    admin = make(limited, ADMIN_TOKEN, room + 2, pool, team)  # operators and admins are exempt
    assert {r.status_code for r in admin} == {201}


@pytest.mark.parametrize(
    ("undo", "redo"),
    [
        pytest.param(lambda r: ("POST", f"/jobs/{r['id']}/cancel"), _jobs, id="cancel-a-job"),
        pytest.param(
            lambda r: ("DELETE", f"/reservations/{r[0]['id']}"), _reservations, id="cancel-a-reservation"
        ),
        pytest.param(lambda r: ("DELETE", f"/tokens/{r['id']}"), _tokens, id="revoke-a-token"),
    ],
)
def test_caps_make_room_when_one_goes(
    limited: Server,
    team: str,
    undo: Callable[[Any], tuple[str, str]],
    redo: Callable[[Server, str, int, str, str], list[httpx.Response]],
) -> None:
    pool = make_pool(limited)
    make_node(limited, pool=pool, gpus=8)
    user = make_user(limited, team=team)
    made = redo(limited, user, 4, pool, team)
    assert made[-1].status_code == 403
    with limited.client(user) as c:
        ok(call(c, *undo(made[0].json())))
    assert [r.status_code for r in redo(limited, user, 2, pool, team)] == [201, 403]


def test_admin_making_a_token_for_a_user_counts_against_the_user(limited: Server, team: str) -> None:
    user = make_user(limited, team=team)
    with limited.client(user) as c:
        name = ok(c.get("/users/me"))["name"]
    with limited.client() as c:
        got = [c.post("/tokens", json={"name": "x", "user": name}).status_code for _ in range(3)]
    assert got == [201, 201, 403]


def test_a_repeat_booking_counts_every_window(limited: Server, team: str) -> None:
    pool = make_pool(limited)
    make_node(limited, pool=pool, gpus=8)
    user = make_user(limited, team=team)
    start = time.time() + 60 * 86400
    spec = {"pool": pool, "gpus": 1, "start": start, "duration_s": 3600, "repeat": "daily", "count": 3}
    with limited.client(user) as c:
        resp = call(c, "POST", "/reservations", json=spec)
    assert resp.status_code == 403
    assert (
        "has 0 booked or active reservations and the cap is 2 a user (3 more windows asked)"
        in resp.json()["detail"]
    )


# -- lanes --------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def one_seat(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server whose user lane has one seat (and no user rate limit, no job cap)."""
    with _server(request.param, "lanes", tmp_path_factory, LANES) as srv:
        yield srv


def test_a_sync_is_answered_while_the_user_lane_is_full(one_seat: Server) -> None:
    team = make_team(one_seat)
    pool, empty = make_pool(one_seat), make_pool(one_seat)
    user = make_user(one_seat, team=team)
    spec = {"command": ["true"], "pool": empty, "team": team}
    with one_seat.client(user) as c:  # enough jobs that a page of 1,000 takes a while to build
        for _ in range(600):
            ok(c.post("/jobs", json=spec), 201)
    node, cred = register(one_seat, pool=pool, gpus=2)
    body = {"gpus": gpu_list(2, node=node), "jobs": []}
    stop = threading.Event()
    user_times: list[tuple[int, float, str]] = []

    def flood() -> None:
        with one_seat.client(user) as c:
            while not stop.is_set():
                t0 = time.perf_counter()
                r = c.get("/jobs", params={"limit": 1000})
                user_times.append((r.status_code, time.perf_counter() - t0, r.text[:300]))

    threads = [threading.Thread(target=flood) for _ in range(24)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)  # the lane fills: 1 seat, 16 queued, the rest refused
        syncs = []
        for _ in range(5):
            t0 = time.perf_counter()
            r = post_sync(one_seat, node, body, token=cred)
            syncs.append((r.status_code, time.perf_counter() - t0))
    finally:
        stop.set()
        for t in threads:
            t.join()
    refused = [text for status, _, text in user_times if status == 429]
    admitted = sorted(dt for status, dt, _ in user_times if status == 200)
    assert {s for s, _ in syncs} == {200}
    assert refused and all("user lane full" in text for text in refused), user_times[:3]
    assert admitted, user_times[:3]
    # A queued user request waits for up to 16 others; a sync waits for none of them.
    assert max(dt for _, dt in syncs) < admitted[len(admitted) // 2], (syncs, admitted[len(admitted) // 2])


def test_probes_are_not_admitted_through_lanes(one_seat: Server) -> None:
    with httpx.Client(base_url=one_seat.url, timeout=30) as c:
        got = [c.get(p).status_code for p in ("/v1/healthz", "/v1/readyz") for _ in range(3)]
    assert set(got) == {200}
