"""Issue 34, failure diagnosis on the fleet page's API, black-box on a running server
(SQLite and PostgreSQL): a failed job's diagnosis is in its node's history
(``GET /v1/nodes/{name}/history``: ``failures``), the node's tile data says it is suspect
and why (``GET /v1/fleet/snapshot``: ``suspect``) and, once enough users' jobs failed the
same way, that the diagnosis cordoned it; a job name or output line with markup comes
back as the same characters (data, never rewritten or rendered); a user sees others'
job names, owners and output lines as blanks; a node nobody suspects carries no
``suspect`` key at all (the page polls the snapshot).

The node has no agent: the test's admin token syncs for it, as its agent would (the
job's state and its closed log), which is all the diagnosis reads."""

from __future__ import annotations

import time
from typing import Any

from server.conftest import Server, make_node, make_pool, make_team, make_user, ok, wait_for

XID79 = "NVRM: Xid (PCI:0000:44:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
MARKUP = "<script>window.__pwned=1</script><img src=x onerror=alert(1)>"


def fail_on(server: Server, node: str, pool: str, *, token: str, team: str, name: str, output: str) -> int:
    """A job of ``token``'s user placed on ``node`` that exits 1 after printing ``output``."""
    with server.client(token) as c:
        spec = {"command": ["true"], "pool": pool, "team": team, "gpus": 1, "name": name}
        job = int(ok(c.post("/jobs", json=spec), 201)["id"])
    wait_for(server, job, "SCHEDULED")
    data = output + "\n"
    with server.client() as c:
        desired = ok(c.post(f"/nodes/{node}/sync", json={}))["jobs"]
        attempt = next(j["attempt"] for j in desired if j["job_id"] == job)
        seen = {"job_id": job, "attempt": attempt}
        ok(c.post(f"/nodes/{node}/sync", json={"jobs": [seen | {"state": "running"}]}))
        log = seen | {"offset": 0, "end": len(data.encode()), "data": data, "last": True}
        ok(
            c.post(
                f"/nodes/{node}/sync",
                json={"jobs": [seen | {"state": "exited", "exit_code": 1}], "logs": [log]},
            )
        )
    wait_for(server, job, "FAILED")
    return job


def history(server: Server, node: str, token: str | None = None) -> dict[str, Any]:
    with server.client(token) if token else server.client() as c:
        return dict(ok(c.get(f"/nodes/{node}/history")))


def read(server: Server, node: str, job: int) -> dict[str, Any]:
    """The node's failure entry for ``job`` once the diagnosis loop has read its output."""
    deadline = time.monotonic() + 20
    while True:
        got = [f for f in history(server, node)["failures"] if f["job_id"] == job]
        if got and not got[0]["pending"]:
            return dict(got[0])
        assert time.monotonic() < deadline, f"job {job} never diagnosed: {got}"
        time.sleep(0.2)


def tile(server: Server, node: str, token: str | None = None) -> dict[str, Any]:
    """The node's snapshot entry (a node made within the view's cache second may take one)."""
    deadline = time.monotonic() + 5
    with server.client(token) if token else server.client() as c:
        while not (got := [n for n in ok(c.get("/fleet/snapshot"))["nodes"] if n["name"] == node]):
            assert time.monotonic() < deadline, f"{node} not in the snapshot"
            time.sleep(0.2)
    return dict(got[0])


def settled_tile(server: Server, node: str, want: Any) -> dict[str, Any]:
    """The node's snapshot entry once ``want(entry)`` (the view is cached for a second)."""
    deadline = time.monotonic() + 10
    while not want(got := tile(server, node)):
        assert time.monotonic() < deadline, got
        time.sleep(0.2)
    return got


def test_a_failed_jobs_diagnosis_is_in_its_nodes_history_as_data(server: Server) -> None:
    pool, team = make_pool(server), make_team(server)
    node = make_node(server, pool=pool, gpus=1)
    owner, other = make_user(server, team=team), make_user(server, team=team)
    assert "suspect" not in tile(server, node)  # nobody suspects it: the key is left out
    name = f"train {MARKUP}"
    line = f"{MARKUP} {XID79}"
    job = fail_on(server, node, pool, token=owner, team=team, name=name, output=f"step 1\n{line}\ndone")
    got = read(server, node, job)
    assert got["signature"] == "xid-79-fell-off-bus" and got["blame"] == "node"
    assert "fell off the bus" in got["diagnosis"] and "drain the node" in got["hint"]
    assert got["name"] == name  # the same characters: not escaped, not stripped, not rendered
    assert MARKUP in got["line"] and "GPU has fallen off the bus" in got["line"]
    assert len(got["line"]) <= 200 and got["user"]
    # its owner sees it all; another user sees the diagnosis, not the job's name, owner or output
    mine = next(f for f in history(server, node, owner)["failures"] if f["job_id"] == job)
    assert mine["name"] == name and MARKUP in mine["line"]
    theirs = next(f for f in history(server, node, other)["failures"] if f["job_id"] == job)
    assert (theirs["name"], theirs["user"], theirs["line"]) == ("", "", "")
    assert theirs["signature"] == "xid-79-fell-off-bus" and theirs["diagnosis"] == got["diagnosis"]
    # one user: the node is suspect, not cordoned, and its tile says why
    t = settled_tile(server, node, lambda n: "suspect" in n)
    s = t["suspect"]
    assert (s["signature"], s["users"], s["threshold"], s["cordoned"]) == ("xid-79-fell-off-bus", 1, 3, False)
    assert s["jobs"] == [job] and s["window_s"] == 86_400 and s["diagnosis"] == got["diagnosis"]
    assert t["cordoned"] is False


def test_a_job_that_blames_its_own_code_is_listed_but_makes_nobody_suspect(server: Server) -> None:
    pool, team = make_pool(server), make_team(server)
    node = make_node(server, pool=pool, gpus=1)
    token = make_user(server, team=team)
    oom = fail_on(
        server,
        node,
        pool,
        token=token,
        team=team,
        name="oom",
        output="torch.cuda.OutOfMemoryError: CUDA out of memory.",
    )
    plain = fail_on(server, node, pool, token=token, team=team, name="plain", output="Traceback: KeyError")
    assert read(server, node, oom)["signature"] == "cuda-oom"
    nothing = read(server, node, plain)
    assert (nothing["signature"], nothing["diagnosis"], nothing["line"]) == (None, "", "")
    assert [f["job_id"] for f in history(server, node)["failures"]] == [plain, oom]  # newest first
    time.sleep(1.1)  # past the view's cache
    assert "suspect" not in tile(server, node)


def test_three_users_cordon_the_node_and_its_tile_says_the_diagnosis_did(server: Server) -> None:
    pool, team = make_pool(server), make_team(server)
    node = make_node(server, pool=pool, gpus=1)
    users = [make_user(server, team=team) for _ in range(3)]
    jobs = [
        fail_on(server, node, pool, token=u, team=team, name=f"j{i}", output=XID79)
        for i, u in enumerate(users)
    ]
    for job in jobs:
        read(server, node, job)
    t = settled_tile(server, node, lambda n: n.get("suspect", {}).get("cordoned"))
    assert t["cordoned"] is True and "xid-79-fell-off-bus" in t["cordon_reason"]
    s = t["suspect"]
    assert (s["signature"], s["users"], s["jobs"]) == ("xid-79-fell-off-bus", 3, jobs)
    # a plain user's page shows the same marker (the cordon reason is everyone's already)
    assert tile(server, node, users[0])["suspect"] == s
    # an operator uncordons: spent evidence makes it suspect no more
    with server.client() as c:
        ok(c.post(f"/nodes/{node}/uncordon", json={}))
    settled_tile(server, node, lambda n: "suspect" not in n and not n["cordoned"])


def test_a_node_cordoned_by_hand_is_not_marked_as_the_diagnosis_did(server: Server) -> None:
    pool, team = make_pool(server), make_team(server)
    node = make_node(server, pool=pool, gpus=1)
    token = make_user(server, team=team)
    job = fail_on(server, node, pool, token=token, team=team, name="x", output=XID79)
    read(server, node, job)
    with server.client() as c:
        ok(c.post(f"/nodes/{node}/cordon", json={"reason": "bad fan"}))
    t = settled_tile(server, node, lambda n: n["cordoned"])
    assert t["suspect"]["cordoned"] is False and t["suspect"]["users"] == 1  # still suspect, cordoned by hand
