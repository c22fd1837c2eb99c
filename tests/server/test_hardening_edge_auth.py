"""Failed logins never lock out a valid credential, and ``X-Forwarded-For`` is no way
around the throttle (issue 29, finding 4; ``lanes.Admission``, ``ratelimit.KnownDigests``,
``server.forwarding``). Run against real servers on both backends."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from server.conftest import Server, make_pool, ok, scratch_postgres, start_server, stop_server, unique
from server.playnode import gpu_list, post_sync, register

FAILURES = ("--auth-failures", "5/1m")


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def srv(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path_factory.mktemp('auth') / 'gpufleet.db'}"
        else:
            url = stack.enter_context(scratch_postgres("edgeauth"))
        server = start_server(url, extra=FAILURES)
        try:
            yield server
        finally:
            stop_server(server)


@contextlib.contextmanager
def flood(srv: Server, *, connections: int = 6) -> Iterator[list[int]]:
    """Made-up tokens from this (loopback) address on ``connections`` connections, until
    the block ends; the statuses they got."""
    statuses: list[int] = []
    done = threading.Event()

    def one() -> None:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            while not done.is_set():
                bad = {"Authorization": f"Bearer gf_{uuid.uuid4().hex}"}
                statuses.append(c.get("/v1/users/me", headers=bad).status_code)

    threads = [threading.Thread(target=one) for _ in range(connections)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 10
        while statuses.count(429) < connections and time.monotonic() < deadline:
            time.sleep(0.05)  # the address is throttled from here on
        yield statuses
    finally:
        done.set()
        for t in threads:
            t.join()


def test_valid_credentials_pass_a_bad_token_flood_from_their_address(srv: Server) -> None:
    """Credentials the server has not cached (new ones: as after their cache entry
    expired) from the flooding address: the agent's syncs and the admin's requests all
    succeed, while the flood is refused."""
    pool = make_pool(srv)
    with srv.client() as c:
        admin = ok(c.post("/tokens", json={"name": unique("t")}), 201)["token"]
    node = unique("edge")
    with srv.client() as c:
        ok(c.put(f"/nodes/{node}", json={"pool": pool, "gpus": gpu_list(2, node=node)}))
        cred = ok(c.post("/nodes/join-tokens", json={"node": node}), 201)["token"]
    got: list[tuple[str, int, float]] = []
    with flood(srv) as statuses:
        for _ in range(5):
            start = time.monotonic()
            sync = post_sync(srv, node, {"gpus": gpu_list(2, node=node), "jobs": []}, token=cred)
            got.append(("sync", sync.status_code, time.monotonic() - start))
            start = time.monotonic()
            with srv.client(admin) as c:
                got.append(("admin", c.get("/users/me").status_code, time.monotonic() - start))
            time.sleep(0.1)
    assert [(what, status) for what, status, _ in got] == [("sync", 200), ("admin", 200)] * 5, got
    assert max(took for _, _, took in got) < 1.0, got
    assert statuses.count(429) >= 6 and set(statuses) <= {401, 429}


def test_a_registered_agent_keeps_syncing_through_a_flood(srv: Server) -> None:
    node, cred = register(srv, pool=make_pool(srv))
    with flood(srv):
        codes = [
            post_sync(srv, node, {"gpus": gpu_list(2, node=node), "jobs": []}, token=cred).status_code
            for _ in range(5)
        ]
    assert codes == [200] * 5


def test_random_forwarded_for_does_not_bypass_the_throttle(srv: Server) -> None:
    """From loopback, with no ``--trusted-proxy``: the header names nobody. The address's
    bucket (5 a minute: one back every 12 s) is emptied first; then eight made-up tokens,
    each "from" another address, may win back at most the tokens that time refilled."""
    codes = []
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        for _ in range(10):  # empty the bucket of this address (earlier tests took some)
            bad = {"Authorization": f"Bearer gf_{uuid.uuid4().hex}"}
            if c.get("/v1/users/me", headers=bad).status_code == 429:
                break
        start = time.monotonic()
        for i in range(8):
            headers = {
                "Authorization": f"Bearer gf_{uuid.uuid4().hex}",
                "X-Forwarded-For": f"203.0.113.{i + 1}",
            }
            codes.append(c.get("/v1/users/me", headers=headers).status_code)
        refilled = 1 + int((time.monotonic() - start) / 12)
    assert set(codes) <= {401, 429}, codes
    assert codes.count(401) <= refilled, codes
