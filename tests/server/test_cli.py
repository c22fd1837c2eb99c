"""The ``gpufleet`` command as a subprocess against the real server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from server.conftest import (
    ADMIN_TOKEN,
    Server,
    free_port,
    gpufleet,
    make_node,
    make_pool,
    make_team,
    ok,
    wait_for,
)


@pytest.fixture(scope="module")
def setup(server: Server) -> dict[str, str]:
    if not server.db_url.startswith("sqlite"):
        pytest.skip("the CLI is a client of the API: its tests run once, on SQLite")
    team = make_team(server)
    pool = make_pool(server)
    return {"team": team, "pool": pool, "node": make_node(server, pool=pool, gpus=8)}


def test_submit_queue_show_cancel(server: Server, setup: dict[str, str]) -> None:
    env = server.env()
    sub = gpufleet(
        "submit",
        "--gpus",
        "2",
        "--time",
        "2h",
        "--name",
        "t1",
        "--team",
        setup["team"],
        "--pool",
        setup["pool"],
        "--",
        "python",
        "train.py",
        "--lr",
        "3e-4",
        env=env,
    )
    assert sub.returncode == 0, sub.stderr
    job_id = int(sub.stdout.strip())
    job = wait_for(server, job_id, "SCHEDULED")
    assert job["command"] == ["python", "train.py", "--lr", "3e-4"]
    assert job["time_limit_s"] == 7200 and job["gpus"] == 2
    q = gpufleet("queue", "--json", "--pool", setup["pool"], env=env)
    assert job_id in {j["id"] for j in json.loads(q.stdout)}
    table = gpufleet("queue", env=env).stdout
    assert table.splitlines()[0].split()[:4] == ["JOBID", "NAME", "USER", "STATE"]
    show = gpufleet("jobs", "show", str(job_id), env=env)
    assert "PENDING -> SCHEDULED" in show.stdout
    nodes = json.loads(gpufleet("nodes", "--json", "--pool", setup["pool"], env=env).stdout)
    assert nodes[0]["gpus_used"] >= 2
    assert gpufleet("cancel", str(job_id), env=env).returncode == 0
    assert wait_for(server, job_id, "CANCELLED")
    listed = json.loads(gpufleet("jobs", "list", "--state", "CANCELLED", "--json", env=env).stdout)
    assert job_id in {j["id"] for j in listed}


def test_submit_sbatch_script(server: Server, setup: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH --job-name=from-script\n"
        "#SBATCH --gres=gpu:2\n"
        f"#SBATCH -p {setup['pool']}\n"
        "#SBATCH --time=30\n"
        "#SBATCH --mem=16G\n"
        "srun python train.py\n"
    )
    sub = gpufleet(
        "submit", "--parsable", "--team", setup["team"], "--time", "45", str(script), env=server.env()
    )
    assert sub.returncode == 0, sub.stderr
    assert "warning" not in sub.stderr  # --mem is honoured since issue 18 (it was warned as unknown)
    job = wait_for(server, int(sub.stdout.strip()), "SCHEDULED")
    assert (job["name"], job["gpus"], job["time_limit_s"]) == ("from-script", 2, 45 * 60)
    assert job["mem_per_node_mb"] == 16 * 1024
    assert job["command"][:2] == ["bash", "-c"] and "srun python train.py" in job["command"][2]


def test_hold_release_via_cli(server: Server, setup: dict[str, str]) -> None:
    empty = make_pool(server)
    env = server.env()
    job_id = gpufleet(
        "submit", "--team", setup["team"], "--pool", empty, "--", "true", env=env
    ).stdout.strip()
    assert gpufleet("hold", job_id, env=env).stdout.startswith(f"held {job_id}")
    assert gpufleet("release", job_id, env=env).stdout.startswith(f"released {job_id}")


def test_admin_commands(server: Server, setup: dict[str, str]) -> None:
    env = server.env()
    team = "cli-team-" + str(free_port())
    assert gpufleet("admin", "create-team", team, env=env).returncode == 0
    made = gpufleet("admin", "create-user", "u" + team, "--team", team, "--role", "user", env=env)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    with server.client(token) as c:
        assert ok(c.get("/users/me"))["teams"] == [team]
    assert gpufleet("admin", "set-quota", team, "--gpus", "8", "--limit", "16", env=env).returncode == 0
    teams = json.loads(gpufleet("admin", "teams", "--json", env=env).stdout)
    assert {"name": team, "quota_gpus": 8, "quota_limit": 16}.items() <= next(
        t for t in teams if t["name"] == team
    ).items()


ERRORS = [
    ("unreachable", ["queue"], {"GPUFLEET_URL": "http://127.0.0.1:9"}, 1, "cannot reach server"),
    ("bad-token", ["queue"], {"GPUFLEET_TOKEN": "wrong"}, 1, "not authenticated"),
    ("forbidden", ["admin", "create-team", "x"], {"GPUFLEET_TOKEN": "USER"}, 1, "forbidden"),
    ("bad-input", ["submit", "--gpus", "-3", "--", "true"], {}, 2, "gpus"),
    ("bad-time", ["submit", "--time", "soon", "--", "true"], {}, 2, "--time"),
    ("missing-job", ["jobs", "show", "99999999"], {}, 1, "not found"),
]


@pytest.mark.parametrize(
    ("args", "env", "code", "needle"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS]
)
def test_cli_errors_are_one_line(
    server: Server, setup: dict[str, str], args: list[str], env: dict[str, str], code: int, needle: str
) -> None:
    full = server.env() | env
    if full["GPUFLEET_TOKEN"] == "USER":
        from server.conftest import make_user

        full["GPUFLEET_TOKEN"] = make_user(server, team=setup["team"])
    res = gpufleet(*args, env=full)
    assert res.returncode == code, res.stderr
    assert needle in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


def test_login_writes_private_config(server: Server, tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path), "HOME": str(tmp_path), "GPUFLEET_URL": "", "GPUFLEET_TOKEN": ""}
    res = gpufleet("login", server.url, "--token", ADMIN_TOKEN, env=env)
    assert res.returncode == 0, res.stderr
    cfg = next(tmp_path.rglob("config.json"))
    assert cfg.stat().st_mode & 0o777 == 0o600
    assert gpufleet("queue", "--json", env=env).returncode == 0


def _imports(done: object) -> set[str]:
    lines = getattr(done, "stderr", "").splitlines()
    return {line.split("|")[-1].strip() for line in lines if line.startswith("import time:")}


def test_submit_and_queue_read_json_without_pydantic(server: Server, setup: dict[str, str]) -> None:
    """The two commands users run most (bench/bench_cli.py) print the server's JSON as it
    is: neither imports pydantic nor the API's models, and what they print is whole
    (they end with os._exit once their output is flushed)."""
    env = server.env()
    argv = ("submit", "--team", setup["team"], "--pool", setup["pool"], "--name", "nopyd", "--", "true")
    sub = gpufleet("-X", "importtime", "-m", "gpufleet", *argv, env=env, python_flags=True)
    assert sub.returncode == 0, sub.stderr[-2000:]
    job_id = int(sub.stdout.strip())
    queue = gpufleet("-X", "importtime", "-m", "gpufleet", "queue", "--all", env=env, python_flags=True)
    assert queue.returncode == 0, queue.stderr[-2000:]
    for done in (sub, queue):
        heavy = sorted(m for m in _imports(done) if m.split(".")[0] in ("pydantic", "pydantic_core"))
        assert not heavy and "gpufleet.api.jobs" not in _imports(done), heavy[:5]
    mine = [line.split() for line in queue.stdout.splitlines() if line.split()[:1] == [str(job_id)]]
    assert mine and mine[0][1] == "nopyd", queue.stdout[-500:]
    as_json = gpufleet("queue", "--all", "--json", env=env)
    assert as_json.returncode == 0 and any(j["id"] == job_id for j in json.loads(as_json.stdout))
