"""Prices, usage and budgets through the real server (HTTP) and the ``gpufleet`` CLI."""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path

import pytest

from server.conftest import (
    Server,
    every,
    gpufleet,
    make_node,
    make_pool,
    make_team,
    make_user,
    ok,
    wait_for,
)

PRICES = {
    "timezone": "Europe/Berlin",
    "base": {"H100": 2.5, "*": 1.0},
    "windows": [{"start": "22:00", "end": "08:00", "multiplier": 0.5}],
    "weekend": 0.6,
}


def test_prices_are_validated_and_admin_only(server: Server) -> None:
    with server.client() as admin:
        ok(admin.put("/prices", json=PRICES))
        before = ok(admin.get("/prices"))
        for bad, says in (
            ({**PRICES, "timezone": "Nowhere/Land"}, "price schedule:"),
            ({**PRICES, "weekend": -1}, "weekend"),
            ({**PRICES, "windows": [{"start": "7", "end": "8", "multiplier": 1}]}, "windows.0.start"),
            ({**PRICES, "typo": 1}, "typo"),
        ):
            r = admin.put("/prices", json=bad)
            assert r.status_code == 422, r.text
            assert r.headers["content-type"].startswith("application/problem+json")
            assert says in r.json()["detail"]
        r = admin.put("/prices", content=b"[1, 2]", headers={"content-type": "application/json"})
        assert r.status_code == 422
        assert ok(admin.get("/prices"))["set_at"] == before["set_at"]  # nothing changed
    team = make_team(server)
    token = make_user(server, team=team)
    with server.client(token) as user:
        assert user.put("/prices", json=PRICES).status_code == 403
        h100 = next(p for p in ok(user.get("/prices"))["prices"] if p["gpu_type"] == "H100")
        assert h100["base"] == 2.5 and h100["price"] in (2.5, 1.25, 1.5, 0.75)
        assert h100["next_cheaper_at"] is not None or h100["price"] == 0.75


def test_team_budgets_and_spend_are_shown_to_members_and_operators_only(server: Server) -> None:
    mine, other = make_team(server), make_team(server)
    token = make_user(server, team=mine)
    with server.client() as admin:
        for team in (mine, other):
            ok(admin.put(f"/teams/{team}/budget", json={"soft": 100, "hard": 200}))
        assert ok(admin.get(f"/teams/{other}"))["budget_hard"] == 200
    with server.client(token) as user:
        teams = {t["name"]: t for t in every(user, "/teams")}
        assert (teams[mine]["budget_soft"], teams[mine]["month_cost"]) == (100, 0)
        hidden = (teams[other]["budget_soft"], teams[other]["budget_hard"], teams[other]["month_cost"])
        assert hidden == (None, None, None)
        assert teams[other]["quota_gpus"] is None or isinstance(teams[other]["quota_gpus"], int)
        one = ok(user.get(f"/teams/{other}"))
        assert (one["budget_hard"], one["month_cost"]) == (None, None)


def test_job_cost_usage_and_budget_over_http(server: Server) -> None:
    pool, team = make_pool(server), make_team(server)
    make_node(server, pool=pool, gpus=4, model="H100")
    token = make_user(server, team=team)
    with server.client() as admin:
        ok(admin.put("/prices", json=PRICES))
        t = ok(admin.put(f"/teams/{team}/budget", json={"soft": 0, "hard": None}))
        assert (t["budget_soft"], t["budget_hard"], t["month_cost"]) == (0, None, 0)
        r = admin.put(f"/teams/{team}/budget", json={"soft": 10, "hard": 5})
        assert r.status_code == 422 and "above hard" in r.json()["detail"]
    with server.client(token) as user:
        assert user.put(f"/teams/{team}/budget", json={"hard": 1}).status_code == 403
        job = ok(user.post("/jobs", json={"command": ["x"], "gpus": 2, "pool": pool, "team": team}), 201)
        assert job["warnings"] and f"team {team} has spent" in job["warnings"][0]
        assert (job["cost"], job["energy_kwh"], job["reservation"]) == (0, 0, None)
        wait_for(server, job["id"], "SCHEDULED", token=token)
        time.sleep(0.5)
        ok(user.post(f"/jobs/{job['id']}/cancel"))
        done = ok(user.get(f"/jobs/{job['id']}"))
        assert done["cost"] > 0
        mine = ok(user.get("/usage", params={"by": "team"}))
        assert [r["key"] for r in mine["rows"]] == [team]  # only its own team
        assert mine["total"]["cost"] == pytest.approx(done["cost"], abs=2e-6)
        bad = user.get("/usage", params={"month": "2026-99"})
        assert bad.status_code == 422 and bad.headers["content-type"].startswith("application/problem+json")
        assert user.get("/usage", params={"by": "planet"}).status_code == 422
    with server.client() as admin:
        everyone = ok(admin.get("/usage", params={"by": "user"}))
        assert everyone["total"]["cost"] >= done["cost"] - 1e-6
        assert team in {r["key"] for r in ok(admin.get("/usage", params={"by": "team"}))["rows"]}


def test_cli_price_usage_and_budget(server: Server, tmp_path: Path) -> None:
    if not server.db_url.startswith("sqlite"):
        pytest.skip("the CLI is a client of the API: its tests run once, on SQLite")
    env = server.env()
    prices = tmp_path / "prices.toml"
    prices.write_text('timezone = "UTC"\n[base]\nH100 = 3.0\nB200 = 9.0\n"*" = 1.0\n')
    out = gpufleet("admin", "set-prices", str(prices), env=env)
    assert out.returncode == 0, out.stderr
    shown = gpufleet("price", "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    assert {p["gpu_type"]: p["price"] for p in json.loads(shown.stdout)["prices"]}["H100"] == 3.0
    table = gpufleet("price", "--gpu-type", "H100", env=env)
    assert table.stdout.splitlines()[0].split()[:2] == ["GPU", "TYPE"] and "3" in table.stdout
    pool = make_pool(server)
    make_node(server, pool=pool, gpus=4, model="H100")
    args = ("--gpus", "2", "--gpu-type", "H100", "--pool", pool, "--team", make_team(server))
    sub = gpufleet("submit", *args, "--", "true", env=env)
    assert sub.returncode == 0 and sub.stdout.strip().isdigit(), sub.stderr
    assert "H100 costs 3/GPU-hour now (2 GPUs: 6/h)" in sub.stderr  # the price at submit time
    assert gpufleet("cancel", sub.stdout.strip(), env=env).returncode == 0
    listed = {
        p["gpu_type"]: p["in_fleet"]
        for p in json.loads(gpufleet("price", "--json", env=env).stdout)["prices"]
    }
    assert listed["H100"] and not listed["B200"]  # priced, but no B200 is registered
    anymodel = gpufleet("submit", "--gpus", "1", "--pool", pool, "--team", args[-1], "--", "true", env=env)
    assert anymodel.returncode == 0 and "H100 costs 3" in anymodel.stderr, anymodel.stderr
    assert "B200" not in anymodel.stderr  # the hint names only models the job could get
    assert gpufleet("cancel", anymodel.stdout.strip(), env=env).returncode == 0
    bad = tmp_path / "bad.json"
    bad.write_text('{"base": {"H100": -1}}')
    refused = gpufleet("admin", "set-prices", str(bad), env=env)
    assert refused.returncode == 2 and "base.H100" in refused.stderr
    team = make_team(server)
    set_ = gpufleet("admin", "set-budget", team, "--soft", "100", "--hard", "200", env=env)
    assert set_.returncode == 0 and f"team {team}: soft 100.0, hard 200.0" in set_.stdout, set_.stderr
    assert team in gpufleet("admin", "teams", env=env).stdout
    rep = gpufleet("usage", "--by", "user", "--csv", env=env)
    assert rep.returncode == 0, rep.stderr
    rows = list(csv.DictReader(io.StringIO(rep.stdout)))
    assert rows[-1]["user"] == "total" and set(rows[0]) >= {
        "gpu_hours",
        "cost",
        "energy_kwh",
        "idle_gpu_hours",
    }
    assert gpufleet("usage", "--by", "planet", env=env).returncode == 2
    month = gpufleet("usage", "--month", "2026-12", "--json", env=env)
    assert month.returncode == 0 and json.loads(month.stdout)["by"] == "team"
    # leave the shared server with the plain schedule other tests expect
    ok_put = gpufleet("admin", "set-prices", str(_write(tmp_path / "p.json", PRICES)), env=env)
    assert ok_put.returncode == 0


def _write(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data))
    return path
