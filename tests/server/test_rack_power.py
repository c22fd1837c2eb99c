"""Issue 34, rack power budgets, on a running server: a budget that powers 2 of 3 one-GPU
jobs in a rack sends the third to another rack, or keeps it waiting with the reason
(``Power: rack R at 2.5/2.8 kW, job adds 0.6 kW``) until the budget is raised; admins only
(403 for an operator, nothing changed); bad values are 422 problem+json that change
nothing; ``/metrics`` and ``gpufleet admin rack`` show each rack's draw against its budget.

Figures (``scheduler/powermodel.py``): a 4-GPU "H100" node draws 1000 W besides its GPUs,
70 W a GPU idle, 700 W busy: its rack idles at 1.28 kW and each one-GPU job adds 0.63 kW.
A 4 kW feed with 30 % headroom (cap 2.8 kW) powers two (2.54 kW), not three (3.17 kW).

Measured power (the node's syncs carry it; the API process flushes it into the node row
for the scheduling pass, ``store/gpupower.py``): once the two jobs have run 60 s, their
GPUs count at what they read (150 W), which leaves room for the third; a node whose
readings are over two minutes old counts at board power again; readings that do not move
past the dead band are not written again. "60 s" and "two minutes" pass by moving the
rows' times back (the server runs on the system clock).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
from sqlalchemy import text

from server.conftest import Server, gpufleet, make_pool, make_team, make_user, ok, unique, wait_for


def _until(what: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = what()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def _node(srv: Server, *, pool: str, rack: str, name: str | None = None) -> str:
    name = name or unique("pw")
    spec = {
        "pool": pool,
        "rack": rack,
        "gpus": [{"index": i, "model": "H100", "uuid": f"GPU-{name}-{i}"} for i in range(4)],
    }
    with srv.client() as c:
        ok(c.put(f"/nodes/{name}", json=spec))
        ok(c.post(f"/nodes/{name}/sync", json={"jobs": []}))  # live
    return name


def _submit(srv: Server, pool: str, team: str, n: int) -> list[int]:
    with srv.client() as c:
        return [
            ok(
                c.post("/jobs", json={"command": ["sleep", "600"], "gpus": 1, "pool": pool, "team": team}),
                201,
            )["id"]
            for _ in range(n)
        ]


def _rack(srv: Server, rack: str) -> dict[str, Any]:
    with srv.client() as c:
        (got,) = [r for r in ok(c.get("/racks"))["items"] if r["rack"] == rack]
    return got  # type: ignore[no-any-return]


def _job(srv: Server, job_id: int) -> dict[str, Any]:
    with srv.client() as c:
        return ok(c.get(f"/jobs/{job_id}"))  # type: ignore[no-any-return]


def test_the_third_job_waits_for_power_until_the_budget_is_raised(server: Server) -> None:
    pool, team, rack = make_pool(server), make_team(server), unique("rack")
    node = _node(server, pool=pool, rack=rack)
    with server.client() as c:
        got = ok(c.put(f"/racks/{rack}", json={"power_kw": 4, "headroom": 0.3}))
    assert (got["power_kw"], got["cap_kw"], got["draw_kw"]) == (4, 2.8, 1.28)
    jobs = _submit(server, pool, team, 3)
    placed = [wait_for(server, j, "SCHEDULED") for j in jobs[:2]]
    assert {a["node"] for p in placed for a in p["allocation"]} == {node}
    want = f"Power: rack {rack} at 2.5/2.8 kW, job adds 0.6 kW"
    assert _until(lambda: _job(server, jobs[2])["wait_reason"] == want), _job(server, jobs[2])
    assert _job(server, jobs[2])["state"] == "PENDING"
    shown = _rack(server, rack)
    assert (shown["busy_gpus"], shown["draw_kw"]) == (2, 2.54)
    series = (
        f'gpufleet_rack_power_watts{{rack="{rack}"}} 2540.0',
        f'gpufleet_rack_power_budget_watts{{rack="{rack}"}} 4000.0',
        f'gpufleet_rack_power_cap_watts{{rack="{rack}"}} 2800.0',
    )

    def scraped() -> bool:
        with server.client() as c:
            text = c.get(server.url + "/metrics").text
        return all(x in text for x in series)

    assert _until(scraped)  # (the fleet view behind /metrics is cached for a moment)
    with server.client() as c:  # more feed: the third starts
        ok(c.put(f"/racks/{rack}", json={"power_kw": 5, "headroom": 0.3}))
    wait_for(server, jobs[2], "SCHEDULED")
    with server.client() as c:
        for j in jobs:
            ok(c.post(f"/jobs/{j}/cancel"))
        ok(c.delete(f"/racks/{rack}"))
        assert c.delete(f"/racks/{rack}").status_code == 404


def test_the_third_job_goes_to_another_rack(server: Server) -> None:
    pool, team = make_pool(server), make_team(server)
    tight, other = unique("rack"), unique("rack")
    base = unique("pw")  # the tight rack's node first: best fit would fill it with all three
    node = _node(server, pool=pool, rack=tight, name=f"{base}a")
    spare = _node(server, pool=pool, rack=other, name=f"{base}b")
    with server.client() as c:
        ok(c.put(f"/racks/{tight}", json={"power_kw": 4, "headroom": 0.3}))
    jobs = _submit(server, pool, team, 3)
    nodes = [wait_for(server, j, "SCHEDULED")["allocation"][0]["node"] for j in jobs]
    assert sorted(nodes) == [node, node, spare]
    assert _rack(server, tight)["draw_kw"] <= 2.8
    with server.client() as c:
        for j in jobs:
            ok(c.post(f"/jobs/{j}/cancel"))
        ok(c.delete(f"/racks/{tight}"))


def _problem(resp: httpx.Response, status: int) -> None:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")


def test_only_admins_set_budgets_and_bad_values_change_nothing(server: Server) -> None:
    rack = unique("rack")
    operator = make_user(server, role="operator", team=make_team(server))
    with server.client() as c:
        ok(c.put(f"/racks/{rack}", json={"power_kw": 40, "headroom": 0.3}))
    with server.client(operator) as c:
        _problem(c.put(f"/racks/{rack}", json={"power_kw": 400}), 403)
        _problem(c.delete(f"/racks/{rack}"), 403)
        _problem(c.put("/power-figures", json={"kind": "model", "name": "H100", "board_w": 1}), 403)
        assert [r for r in ok(c.get("/racks"))["items"] if r["rack"] == rack]  # reading is for all
    bad = [
        {"power_kw": 0},
        {"power_kw": -5},
        {"power_kw": "forty"},
        {"power_kw": 40, "headroom": 1.0},
        {"power_kw": 40, "headroom": -0.1},
        {"power_kw": 1e9},
        {"power_kw": 40, "extra": 1},
    ]
    with server.client() as c:
        for body in bad:
            _problem(c.put(f"/racks/{rack}", json=body), 422)
        _problem(c.put("/racks/bad%20name", json={"power_kw": 40}), 422)
        for fig in (
            {"kind": "model", "name": "H100"},  # no figure
            {"kind": "model", "name": "H100", "base_w": 100},  # a node's figure
            {"kind": "gpu", "name": "H100", "board_w": 700},
            {"kind": "node", "name": "n1", "board_w": 0},
        ):
            _problem(c.put("/power-figures", json=fig), 422)
        assert ok(c.get("/power-figures"))["items"] == []
    got = _rack(server, rack)
    assert (got["power_kw"], got["headroom"], got["updated_by"]) == (40, 0.3, "admin")
    with server.client() as c:
        ok(c.delete(f"/racks/{rack}"))


def test_cli_sets_lists_and_unsets(server: Server) -> None:
    rack = unique("rack")
    env = server.env()
    done = gpufleet("admin", "rack", "set", rack, "--power-kw", "40", "--headroom", "30%", env=env)
    assert done.returncode == 0, done.stderr
    assert f"rack {rack}: 0.0/28.0 kW (feed 40 kW, 30% headroom)" in done.stdout
    listed = gpufleet("admin", "rack", "list", env=env)
    (line,) = [ln for ln in listed.stdout.splitlines() if ln.startswith(rack)]
    assert line.split()[4:] == ["0.0", "28.0", "40", "30%"]
    bad = gpufleet("admin", "rack", "set", rack, "--power-kw", "40", "--headroom", "130%", env=env)
    assert bad.returncode != 0 and "headroom" in bad.stderr
    done = gpufleet("admin", "rack", "figure", "--model", "NVIDIA H100 PCIe", "--board-watts", "350", env=env)
    assert done.returncode == 0, done.stderr
    assert "NVIDIA H100 PCIe" in gpufleet("admin", "rack", "figures", env=env).stdout
    assert (
        gpufleet("admin", "rack", "figure", "--model", "NVIDIA H100 PCIe", "--unset", env=env).returncode == 0
    )
    assert gpufleet("admin", "rack", "unset", rack, env=env).returncode == 0
    with server.client() as c:  # a rack of no node and no budget is no longer listed
        assert rack not in [r["rack"] for r in ok(c.get("/racks"))["items"]]


def _sync(srv: Server, node: str, *, jobs: list[dict[str, Any]], watts: dict[int, Any]) -> dict[str, Any]:
    telemetry = [{"index": i, "power_w": w} for i, w in watts.items()]
    with srv.client() as c:
        return ok(c.post(f"/nodes/{node}/sync", json={"jobs": jobs, "telemetry": telemetry}))  # type: ignore[no-any-return]


def _stored(srv: Server, node: str) -> tuple[dict[str, float] | None, float | None]:
    """The node row's readings and their time, as the scheduling pass reads them."""
    with srv.engine.connect() as c:
        power, at = c.execute(
            text("SELECT gpu_power, gpu_power_at FROM nodes WHERE name = :n"), {"n": node}
        ).one()
    return (json.loads(power) if isinstance(power, str) else power), at


def _flushed(
    srv: Server,
    node: str,
    watts: dict[int, Any],
    want: dict[str, float],
    jobs: list[dict[str, Any]] | None = None,
) -> float:
    """Sync ``watts`` (as an agent does, every ~0.2 s) until the row holds ``want``; its time."""

    def seen() -> float | None:
        _sync(srv, node, jobs=jobs or [], watts=watts)
        power, at = _stored(srv, node)
        return at if power == want else None

    at = _until(seen)
    assert at is not None, _stored(srv, node)
    return float(at)


def _age(srv: Server, sql: str, **params: Any) -> None:
    with srv.engine.begin() as c:
        c.execute(text(sql), params)


def test_measured_power_lets_the_third_job_start_and_a_silent_node_falls_back(server: Server) -> None:
    pool, team, rack = make_pool(server), make_team(server), unique("rack")
    node = _node(server, pool=pool, rack=rack)
    with server.client() as c:
        ok(c.put(f"/racks/{rack}", json={"power_kw": 4, "headroom": 0.3}))
    jobs = _submit(server, pool, team, 3)
    for j in jobs[:2]:
        wait_for(server, j, "SCHEDULED")
    want = f"Power: rack {rack} at 2.5/2.8 kW, job adds 0.6 kW"
    assert _until(lambda: _job(server, jobs[2])["wait_reason"] == want), _job(server, jobs[2])
    desired = _sync(server, node, jobs=[], watts={})["jobs"]
    running = [{"job_id": d["job_id"], "state": "running", "attempt": d["attempt"]} for d in desired]
    busy = {g for d in desired for g in d["gpus"]}
    watts = {i: 150.0 if i in busy else 60.0 for i in range(4)}
    _flushed(server, node, watts, {str(i): w for i, w in watts.items()}, running)
    for j in jobs[:2]:
        wait_for(server, j, "RUNNING")
    # Idle GPUs count as read at once (2 x 60 W), busy ones at board power until their
    # jobs have run 60 s: 1000 + 120 + 1400 W, and the third would add 630 W.
    assert _until(lambda: _rack(server, rack)["draw_kw"] == 2.52), _rack(server, rack)
    time.sleep(2)  # passes run every second: none starts it yet
    assert _job(server, jobs[2])["state"] == "PENDING"
    _age(server, "UPDATE jobs SET started_at = started_at - 61 WHERE id IN (:a, :b)", a=jobs[0], b=jobs[1])
    # 1000 + 2 x 60 + 2 x 150 = 1420 W: the third fits (+630 W); once it is placed it counts
    # at board power (its GPU read 60 W idle): 1000 + 60 + 300 + 700 = 2060 W.
    placed = wait_for(server, jobs[2], "SCHEDULED")
    assert placed["allocation"][0]["node"] == node
    assert _until(lambda: _rack(server, rack)["draw_kw"] == 2.06), _rack(server, rack)
    # The node stops reporting: readings two minutes old count no more, board power again
    # (1000 + 3 x 700 + 70 W, over the cap: what runs keeps running, nothing new starts).
    _age(server, "UPDATE nodes SET gpu_power_at = gpu_power_at - 121 WHERE name = :n", n=node)
    assert _until(lambda: _rack(server, rack)["draw_kw"] == 3.17), _rack(server, rack)
    (fourth,) = _submit(server, pool, team, 1)
    want = f"Power: rack {rack} at 3.2/2.8 kW, job adds 0.6 kW"
    assert _until(lambda: _job(server, fourth)["wait_reason"] == want), _job(server, fourth)
    with server.client() as c:
        for j in [*jobs, fourth]:
            ok(c.post(f"/jobs/{j}/cancel"))
        ok(c.delete(f"/racks/{rack}"))


def test_readings_are_written_when_they_move_and_not_otherwise(server: Server) -> None:
    node = _node(server, pool=make_pool(server), rack=unique("rack"))
    assert _stored(server, node) == (None, None)  # a sync without telemetry writes nothing
    at = _flushed(server, node, {i: 100.0 for i in range(4)}, {str(i): 100.0 for i in range(4)})
    # Within the dead band (10 W, or 5 % of what was written when that is more), for
    # longer than the flush's second: the row is left alone.
    for watts in ({0: 104.0, 1: 96.0, 2: 109.9, 3: 100.0}, {0: 91.0, 1: 100.0, 2: 100.0, 3: 108.0}) * 8:
        _sync(server, node, jobs=[], watts=watts)
        time.sleep(0.2)
    assert _stored(server, node) == ({str(i): 100.0 for i in range(4)}, at)
    moved = _flushed(
        server,
        node,
        {0: 100.0, 1: 400.0, 2: 100.0, 3: 100.0},
        {"0": 100.0, "1": 400.0, "2": 100.0, "3": 100.0},
    )
    assert moved > at
    # What is not a wattage is dropped (that GPU counts at board power); a GPU without a
    # reading is a change too.
    _flushed(server, node, {0: -5.0, 1: 1e9, 2: 300.0, 3: None}, {"2": 300.0})
