"""Rolling driver upgrades that verify (issue 34), black-box: a real server, real
``gpufleet agent`` processes on simulated GPUs started with an upgrade hook (a root-owned
script here), the rollout driven through ``gpufleet upgrade``. A simulated node reports
the driver the upgrade expected once its hook succeeded, unless planted bad
(``--simulate-upgrade-to``: a wrong driver; ``--simulate-smoke-fail``: a GPU whose smoke
check fails)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from server.conftest import Server, gpufleet, make_pool, make_team, make_user, ok, unique

OLD, NEW = "535.104.05", "550.54.15"
Agents = Callable[..., list[str]]


def _hook(tmp_path: Path, body: str = 'echo "installing $1"; exit 0') -> Path:
    hook = tmp_path / "hooks" / "upgrade-driver"
    hook.parent.mkdir(exist_ok=True)
    hook.parent.chmod(0o755)
    hook.write_text(f"#!/bin/sh\n{body}\n")
    hook.chmod(0o755)
    return hook


ON_BOTH = "test_an_upgrade_rolls_through_verifies_and_puts_nodes_back"


@pytest.fixture
def agents(server: Server, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Agents]:
    """``agents(pool, n, extra={i: [flags]})``: n agents with the hook ``driver``, on
    driver ``OLD``; their names, once each has reported. On PostgreSQL only the whole
    upgrade runs (real agents' flows are the same on both databases)."""
    if not server.db_url.startswith("sqlite") and request.function.__name__ != ON_BOTH:
        pytest.skip("real agents' flows are the same on both databases: once, on SQLite")
    procs: list[subprocess.Popen[bytes]] = []
    hook = _hook(tmp_path)

    def start(pool: str, n: int, extra: dict[int, list[str]] | None = None) -> list[str]:
        prefix = unique("up")
        names = [f"{prefix}n{i}" for i in range(n)]
        env = server.env()
        for i, name in enumerate(names):
            assert gpufleet("node", "register", name, "--pool", pool, env=env).returncode == 0
            token = tmp_path / f"{name}.token"
            token.write_text(gpufleet("node", "join-token", "--node", name, env=env).stdout)
            token.chmod(0o600)
            args = ["agent", "--server", server.url, "--token-file", str(token), "--name", name]
            args += ["--simulate-gpus", "2", "--simulate-driver", OLD, "--sync-interval", "1s"]
            args += ["--work-dir", str(tmp_path / name), "--address", "127.0.0.1"]
            args += ["--upgrade-hook", f"driver={hook}", *(extra or {}).get(i, [])]
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "gpufleet", *args],
                    env={k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")},
                    stderr=subprocess.DEVNULL,
                )
            )
        with server.client() as c:
            until(lambda: all(ok(c.get(f"/nodes/{n}")).get("driver_version") == OLD for n in names), 30)
        return names

    yield start
    for p in procs:
        p.terminate()
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(10)


def until(pred: Callable[[], Any], timeout: float = 40) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def cli(server: Server, *args: str) -> str:
    done = gpufleet(*args, env=server.env())
    assert done.returncode == 0, done.stderr
    return done.stdout


def upgrade(server: Server, rollout: int) -> dict[str, Any]:
    with server.client() as c:
        return dict(ok(c.get(f"/upgrades/{rollout}")))


def start(server: Server, names: list[str], *flags: str) -> int:
    hostlist = f"{names[0][:-1]}[0-{len(names) - 1}]"
    out = cli(server, "upgrade", "start", "--nodes", hostlist, "--expect-driver", NEW, *flags, "--json")
    import json

    return int(json.loads(out)["id"])


def states(r: dict[str, Any]) -> dict[str, str]:
    return {m["node"]: m["state"] for m in r["nodes"]}


def test_an_upgrade_rolls_through_verifies_and_puts_nodes_back(server: Server, agents: Agents) -> None:
    pool = make_pool(server)
    names = agents(pool, 3)
    rid = start(server, names, "--command", "driver", "--max-unavailable", "2", "--drain-timeout", "5s")
    done = until(lambda: (r := upgrade(server, rid))["state"] == "done" and r)
    assert set(states(done).values()) == {"done"}
    assert {m["driver"] for m in done["nodes"]} == {NEW}
    with server.client() as c:
        for name in names:
            node = ok(c.get(f"/nodes/{name}"))
            assert (node["driver_version"], node["cordoned"]) == (NEW, False), node
            kinds = [e["kind"] for e in ok(c.get("/fleet/events", params={"node": name}))]
            steps = ["node_draining", "upgrade_upgrading", "upgrade_verifying", "upgrade_verified"]
            assert [k for k in kinds if k in steps] == steps, kinds
    assert "done" in cli(server, "upgrade", "status", str(rid))
    listed = cli(server, "upgrade", "status", str(rid), "--all")
    assert all(f"{name}  " in listed or f"{name} " in listed for name in names), listed
    assert not any(name in cli(server, "upgrade", "status", str(rid)) for name in names)  # done: counted only


@pytest.mark.parametrize(
    ("planted", "why"),
    [
        (["--simulate-smoke-fail", "1"], "GPU 1 failed the smoke check"),
        (["--simulate-upgrade-to", "550.54.14"], f"driver 550.54.14 after the upgrade, expected {NEW}"),
    ],
    ids=["smoke-fails", "wrong-driver"],
)
def test_a_bad_node_pauses_the_rollout_at_its_batch(
    server: Server, agents: Agents, planted: list[str], why: str
) -> None:
    pool = make_pool(server)
    names = agents(pool, 5, extra={2: planted})  # batches of 2: [0 1] [2 3] [4]
    rid = start(server, names, "--command", "driver", "--max-unavailable", "2", "--drain-timeout", "5s")
    with aborted_after(server, rid):
        paused = until(lambda: (r := upgrade(server, rid))["state"] == "paused" and r)
        assert names[2] in paused["pause_reason"] and why in paused["pause_reason"]
        moving = ("draining", "upgrading", "verifying")
        settled = until(lambda: not set(states(r := upgrade(server, rid)).values()) & set(moving) and r, 20)
        got = states(settled)
        assert [got[n] for n in names] == ["done", "done", "failed", "done", "waiting"]
        bad = next(m for m in settled["nodes"] if m["node"] == names[2])
        assert why in bad["reason"]
        with server.client() as c:
            assert ok(c.get(f"/nodes/{names[2]}"))["cordoned"] is True
            assert ok(c.get(f"/nodes/{names[4]}"))["cordoned"] is False
            alerts = ok(c.get("/fleet/events", params={"node": names[2], "alerts": True}))
            assert any(e["kind"] == "upgrade_failed" and why in e["reason"] for e in alerts)
        time.sleep(1.5)  # paused: nothing new drains
        assert states(upgrade(server, rid)) == got
        assert "aborted" in cli(server, "upgrade", "abort", str(rid))
    after = upgrade(server, rid)
    assert after["state"] == "aborted" and states(after) == got
    with server.client() as c:
        assert ok(c.get(f"/nodes/{names[2]}"))["cordoned"] is True  # its driver is in doubt


@contextlib.contextmanager
def aborted_after(server: Server, rid: int) -> Iterator[None]:
    """The upgrade is aborted at the end whatever happens (a failed test leaves no open
    upgrade to refuse the next one)."""
    try:
        yield
    finally:
        with server.client() as c:
            c.post(f"/upgrades/{rid}/abort")


def test_by_hand_uncordon_presses_on_and_a_failed_node_is_retried(server: Server, agents: Agents) -> None:
    """No hook: the drained node waits for the operator; ``node uncordon`` verifies it
    (still the old driver: failed, paused); ``resume --skip`` leaves it out and the
    upgrade finishes with the others."""
    pool = make_pool(server)
    names = agents(pool, 2)
    rid = start(server, names, "--max-unavailable", "1", "--drain-timeout", "5s")
    with aborted_after(server, rid):
        by_hand(server, names, rid)


def by_hand(server: Server, names: list[str], rid: int) -> None:
    waiting = until(lambda: (r := upgrade(server, rid))["nodes"][0]["state"] == "upgrading" and r)
    assert "by hand" in waiting["nodes"][0]["reason"]
    cli(server, "node", "uncordon", names[0])
    paused = until(lambda: (r := upgrade(server, rid))["state"] == "paused" and r)
    assert f"driver {OLD} after the upgrade" in paused["pause_reason"]
    with server.client() as c:
        assert ok(c.get(f"/nodes/{names[0]}"))["cordoned"] is True
    cli(server, "upgrade", "resume", str(rid), "--skip", names[0])
    second = until(lambda: (r := upgrade(server, rid))["nodes"][1]["state"] == "upgrading" and r)
    assert states(second)[names[0]] == "skipped"
    cli(server, "upgrade", "abort", str(rid))


def test_a_hook_the_node_lacks_fails_that_node(server: Server, agents: Agents) -> None:
    pool = make_pool(server)
    names = agents(pool, 1)
    rid = start(server, names, "--command", "rm-rf", "--drain-timeout", "5s")
    with aborted_after(server, rid):
        paused = until(lambda: (r := upgrade(server, rid))["state"] == "paused" and r)
        assert "no upgrade hook named rm-rf" in paused["pause_reason"], paused


def test_upgrades_are_for_operators_and_bad_input_is_refused(server: Server) -> None:
    team = make_team(server)
    user = make_user(server, team=team)
    pool = make_pool(server)
    name = unique("upn")
    assert gpufleet("node", "register", name, "--pool", pool, env=server.env()).returncode == 0
    body = {"nodes": [name], "expect_driver": NEW}
    with server.client(user) as c:
        assert c.post("/upgrades", json=body).status_code == 403
        assert c.get("/upgrades/current").status_code == 403
        assert c.post("/upgrades/1/abort").status_code == 403
    with server.client() as c:
        for bad in (
            {**body, "expect_driver": "-rf"},
            {**body, "expect_driver": "550; reboot"},
            {**body, "hook": "../../bin/sh"},
            {**body, "nodes": []},
        ):
            assert c.post("/upgrades", json=bad).status_code == 422, bad
        assert c.post("/upgrades", json={**body, "nodes": ["no-such-node"]}).status_code == 404
        assert c.post("/upgrades", json={**body, "drain_timeout": "forever"}).status_code == 422
        assert c.get("/upgrades/999999").status_code == 404


def test_the_agent_refuses_a_hook_it_cannot_trust(server: Server, tmp_path: Path) -> None:
    hook = _hook(tmp_path)
    hook.chmod(0o775)  # group-writable
    base = ["agent", "--server", server.url, "--token", "x", "--simulate-gpus", "1"]
    base += ["--work-dir", str(tmp_path / "w")]
    done = gpufleet(*base, "--upgrade-hook", f"driver={hook}")
    assert done.returncode != 0 and "writable by group or others" in done.stderr, done.stderr
    done = gpufleet(*base, "--upgrade-hook", "driver=relative/hook")
    assert done.returncode != 0 and "absolute path" in done.stderr, done.stderr
