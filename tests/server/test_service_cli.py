"""``gpufleet service ...`` as a subprocess against the real server (no agents: replicas
stay PENDING in a pool with no nodes, or are placed on a registered node)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from server.conftest import Server, gpufleet, make_node, make_pool, make_team, make_user, ok, unique

YAML_SPEC = """\
name: {name}
team: {team}
pool: {pool}
command: python serve.py --model "my model"
replicas: 2
protocol: openai
env:
  HF_HOME: /cache
"""


@pytest.fixture(scope="module")
def setup(server: Server) -> dict[str, str]:
    if not server.db_url.startswith("sqlite"):
        pytest.skip("the CLI is a client of the API: its tests run once, on SQLite")
    placed = make_pool(server)
    return {
        "team": make_team(server),
        "pool": make_pool(server),  # no node: replicas stay PENDING
        "placed": placed,
        "node": make_node(server, pool=placed, gpus=4),
    }


def sname() -> str:
    return unique("svc").lower().replace("_", "-").replace(".", "-")


def table(text: str) -> list[dict[str, str]]:
    """The rows of a table printout, keyed by header (a cell starts under its header)."""
    lines = [line for line in text.splitlines() if line.strip()]
    heads = [(m.group(), m.start()) for m in re.finditer(r"\S+", lines[0])]
    bounds = [*(s for _, s in heads[1:]), None]
    return [{h: line[s:e].strip() for (h, s), e in zip(heads, bounds, strict=True)} for line in lines[1:]]


def until(c: httpx.Client, name: str, check: Any, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        out = ok(c.get(f"/services/{name}"))
        if check(out) or time.monotonic() > deadline:
            assert check(out), out
            return out  # type: ignore[no-any-return]
        time.sleep(0.05)


def test_deploy_from_yaml_list_show_update_delete(
    server: Server, setup: dict[str, str], tmp_path: Path
) -> None:
    env = server.env()
    name = sname()
    path = tmp_path / "svc.yaml"
    path.write_text(YAML_SPEC.format(name=name, **setup))
    made = gpufleet("service", "deploy", str(path), "--replicas", "3", "--env", "MODE=fast", env=env)
    assert made.returncode == 0, made.stderr
    hint = f"through a gateway at $GATEWAY/s/{name}/ with a token: gpufleet service token {name}\n"
    assert made.stdout.endswith(hint)
    assert "generation: 1" in made.stdout and "env: HF_HOME, MODE (values: --json)" in made.stdout
    shown = json.loads(gpufleet("service", "show", name, "--json", env=env).stdout)
    spec = shown["spec"]
    assert spec["command"] == ["python", "serve.py", "--model", "my model"]  # split as a shell does
    assert (spec["replicas"], spec["protocol"], shown["team"]) == (3, "openai", setup["team"])
    assert spec["env"] == {"HF_HOME": "/cache", "MODE": "fast"}  # --env adds to the file's
    with server.client() as c:
        until(c, name, lambda o: len(o["replicas"]) == 3)
    listed = gpufleet("service", "list", env=env)
    row = next(r for r in table(listed.stdout) if r["NAME"] == name)
    assert (row["READY"], row["GEN"], row["PROTOCOL"], row["STATE"]) == ("0/3", "1", "openai", "active")
    assert name in {s["name"] for s in json.loads(gpufleet("service", "list", "--json", env=env).stdout)}
    text = gpufleet("service", "show", name, env=env).stdout
    assert "REPLICA  JOB" in text and "PENDING" in text and "\nevents:\n" in text and "deployed" in text

    rolled = gpufleet("service", "update", name, "--model-version", "v2", "--env", "ONLY=1", env=env)
    assert rolled.returncode == 0, rolled.stderr
    assert "generation 2: replicas roll one by one" in rolled.stdout
    scaled = gpufleet("service", "update", name, "--replicas", "1", "--json", env=env)
    out = json.loads(scaled.stdout)
    assert (out["generation"], out["spec"]["replicas"], out["spec"]["env"]) == (2, 1, {"ONLY": "1"})
    assert out["spec"]["model_version"] == "v2"
    nothing = gpufleet("service", "update", name, env=env)
    assert nothing.returncode == 2 and "nothing to change" in nothing.stderr
    auto = gpufleet(
        *("service", "update", name, "--min-replicas", "1", "--max-replicas", "4", "--metric", "inflight"),
        *("--target", "3", "--warm", "1", "--scale-down-cooldown", "2m", "--slo-p99-ms", "250"),
        env=env,
    )
    assert auto.returncode == 0, auto.stderr
    assert (
        "1..4 on inflight (target 3 in flight per replica; up every 30s at most, down after 120s)"
        in auto.stdout
    )
    assert "warm" in auto.stdout
    events = table(gpufleet("service", "events", name, "-n", "3", env=env).stdout)
    assert len(events) == 3 and {"TIME", "KIND", "BY", "WHAT"} <= set(events[0])

    gone = gpufleet("service", "delete", name, env=env)
    assert gone.returncode == 0, gone.stderr
    assert gone.stdout.startswith(f"service {name}: deleting (")


def test_deploy_from_flags_places_replicas_and_shows_their_logs(
    server: Server, setup: dict[str, str]
) -> None:
    env = server.env()
    name = sname()
    flags = (
        "--name",
        name,
        "--command",
        "serve --port 1",
        "--pool",
        setup["placed"],
        "--team",
        setup["team"],
    )
    made = gpufleet(
        "service", "deploy", *flags, "--protocol", "kserve-v2", "--readiness-timeout", "5m", env=env
    )
    assert made.returncode == 0, made.stderr
    with server.client() as c:
        out = until(c, name, lambda o: o["replicas"] and all(r["nodes"] for r in o["replicas"]))
    assert out["spec"]["readiness_timeout"] == 300 and out["spec"]["health_path"] is None
    job = out["replicas"][0]["job_id"]
    text = gpufleet("service", "show", name, env=env).stdout
    assert "readiness probe /v2/health/ready" in text
    assert any(r["JOB"] == str(job) and r["NODE"] == setup["node"] for r in table(text.split("\n\n")[1]))
    logs = gpufleet("service", "logs", name, env=env)
    assert logs.returncode == 0, logs.stderr
    assert f"replica 0 is job {job} (generation 1, " in logs.stderr
    assert logs.stdout == gpufleet("logs", str(job), env=env).stdout  # the same code path
    missing = gpufleet("service", "logs", name, "--replica", "7", env=env)
    assert missing.returncode == 1 and "no live replica 7 (its replicas: 0)" in missing.stderr
    gpufleet("service", "delete", name, env=env)


BAD = [
    pytest.param("x.yaml", "name: {name}\ncommand: [unclosed\n", (), "x.yaml: not valid YAML at line 3",
                 id="yaml"),
    pytest.param("x.json", '{{"name": ', ("--name", "{name}"), "x.json: not valid JSON", id="json"),
    pytest.param("x.yml", "name: {name}\ncommand: s\nreplicass: 2\n", (),
                 "the spec: replicass: no such field", id="typo"),
    pytest.param(None, None, ("--name", "{name}", "--command", "s", "--protocol", "grpc"),
                 "the spec: protocol: Input should be 'http', 'openai' or 'kserve-v2'", id="bad-option"),
    pytest.param(None, None, ("--name", "{name}", "--command", "s", "-e", "NOEQUALS"),
                 "--env 'NOEQUALS': write KEY=VALUE", id="bad-env"),
    pytest.param(None, None, ("--command", "s"), "a service needs a name: --name", id="no-name"),
]  # fmt: skip


@pytest.mark.parametrize(("file", "text", "args", "said"), BAD)
def test_bad_specs_are_one_clear_line_and_create_nothing(
    server: Server,
    setup: dict[str, str],
    tmp_path: Path,
    file: str | None,
    text: str | None,
    args: tuple[str, ...],
    said: str,
) -> None:
    name = sname()
    argv = ["service", "deploy", *(a.format(name=name) for a in args)]
    if file is not None:
        (tmp_path / file).write_text((text or "").format(name=name))
        argv.insert(2, str(tmp_path / file))
    got = gpufleet(*argv, "--pool", setup["pool"], "--team", setup["team"], env=server.env())
    assert got.returncode == 2, got
    assert got.stderr.startswith("gpufleet: error: ") and said in got.stderr, got.stderr
    assert len(got.stderr.splitlines()) == 1 and "Traceback" not in got.stderr
    with server.client() as c:
        assert c.get(f"/services/{name}").status_code == 404


def test_tokens_from_a_stdin_spec_and_another_users_service(server: Server, setup: dict[str, str]) -> None:
    env = server.env()
    name = sname()
    body = {"name": name, "command": ["serve"], "replicas": 0, "pool": setup["pool"], "team": setup["team"]}
    made = subprocess.run(
        [sys.executable, "-m", "gpufleet", "service", "deploy", "-", "--json"],
        input=json.dumps(body),
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **env},
    )
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["spec"]["replicas"] == 0

    created = gpufleet("service", "token", name, env=env)
    secret = created.stdout.strip()
    assert created.returncode == 0 and secret.startswith("gfs_"), created.stderr
    assert f'curl -H "Authorization: Bearer {secret}" $GATEWAY/s/{name}/...' in created.stderr
    tokens = json.loads(gpufleet("service", "token", name, "--list", "--json", env=env).stdout)
    assert [(t["hint"], t["token"], t["revoked_at"]) for t in tokens] == [(secret[:8], None, None)]
    revoked = gpufleet("service", "token", name, "--revoke", str(tokens[0]["id"]), env=env)
    assert revoked.stdout.strip() == f"token {tokens[0]['id']} ({secret[:8]}...) of service {name} revoked"
    listed = table(gpufleet("service", "token", name, "--list", env=env).stdout)
    assert [(r["ID"], r["STATE"].split()[0]) for r in listed] == [(str(tokens[0]["id"]), "revoked")]
    again = gpufleet("service", "deploy", "-", env=env)  # nothing on stdin: not a spec
    assert again.returncode == 2 and "a spec is a mapping" in again.stderr

    other = server.env(make_user(server, team=setup["team"]))
    for argv in (("show", name), ("token", name), ("delete", name), ("update", name, "--replicas", "1")):
        got = gpufleet("service", *argv, env=other)
        assert got.returncode == 1 and got.stderr == f"gpufleet: error: not found: no service {name}\n", argv
    assert table(gpufleet("service", "list", env=other).stdout) == []
    assert gpufleet("service", "delete", name, env=env).returncode == 0
