"""What the ``gpufleet`` commands say to a new user (issue 20, "CLI words"): the words
are checked as a user reads them, through the CLI against the real server; what the
words are made from (the placement text of a job event, the clipping of a command, the
shared defaults) is checked in process."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

from gpufleet.cli import app
from gpufleet.cli.jobview import clip, command_lines
from gpufleet.demo import DemoOptions
from gpufleet.placefmt import Placed, gpu_ranges, parse_placed, placed_reason
from gpufleet.server.config import ServerConfig
from gpufleet.server.defaults import NODE_TIMEOUT_S, REQUEUE_AFTER_S
from gpufleet.sim.config import NODES_PER_LEAF, FleetSpec
from server.conftest import Server, gpufleet, make_node, make_pool, make_team, ok, unique, wait_for
from server.playnode import register, sync


@pytest.fixture(scope="module")
def setup(server: Server) -> dict[str, str]:
    if not server.db_url.startswith("sqlite"):
        pytest.skip("the CLI is a client of the API: its tests run once, on SQLite")
    pool = make_pool(server)
    return {"team": make_team(server), "pool": pool, "node": make_node(server, pool=pool, gpus=4)}


def table(text: str) -> list[dict[str, str]]:
    """Rows of a ``_table`` printout keyed by header; headers are apart by 2+ spaces, a
    header may hold one (``BOOKED BY``)."""
    lines = [line for line in text.splitlines() if line.strip()]
    heads = [(m.group(), m.start()) for m in re.finditer(r"\S+(?: \S+)*", lines[0])]
    bounds = [*(s for _, s in heads[1:]), None]
    return [
        {h: line[s:e].strip() for (h, s), e in zip(heads, bounds, strict=True)}
        for line in lines[1:]
        if line[:1] != " " and not line.startswith(("schedule", "usage"))
    ]


# -- 1. reservations: whom it is for, who booked it ------------------------------------------


def test_reservation_made_by_an_admin_for_a_team_shows_both(server: Server, setup: dict[str, str]) -> None:
    env = server.env()
    name = unique("resv")
    made = gpufleet(
        "reserve", "--gpus", "1", "--start", "+3h", "--duration", "1h", "--team", setup["team"],
        "--pool", setup["pool"], "--name", name, env=env,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert " 1 GPU " in made.stdout and f"for team {setup['team']}" in made.stdout
    listed = gpufleet("reservations", env=env)
    assert listed.returncode == 0, listed.stderr
    row = next(r for r in table(listed.stdout) if r["NAME"] == name)
    assert (row["TEAM"], row["USERS"], row["BOOKED BY"]) == (setup["team"], "-", "admin")


# -- 2. usage: the period in the pricing time zone, named -------------------------------------


def test_usage_period_is_in_the_pricing_time_zone(server: Server, setup: dict[str, str]) -> None:
    with server.client() as admin:
        ok(admin.put("/prices", json={"timezone": "America/New_York", "base": {"*": 1.0}}))
    # March 2026 in New York: EST at its start, EDT at its end; the caller's TZ is not it.
    got = gpufleet("usage", "--month", "2026-03", env={**server.env(), "TZ": "Asia/Tokyo"})
    assert got.returncode == 0, got.stderr
    head = got.stdout.splitlines()[0]
    assert head == (
        "usage by team, 2026-03-01 00:00 to 2026-04-01 00:00 America/New_York (the pricing time zone)"
    )


# -- 3. prices: the fleet's models, the hint's words, the Slurm path ---------------------------


PRICES = {"timezone": "UTC", "base": {"H100": 2.0, "B300X": 9.0, "*": 1.0}}


def test_price_lists_the_fleets_models_and_marks_the_others(server: Server, setup: dict[str, str]) -> None:
    env = server.env()
    with server.client() as admin:
        ok(admin.put("/prices", json=PRICES))
    shown = gpufleet("price", env=env)
    assert shown.returncode == 0, shown.stderr
    assert "H100" in {r["GPU TYPE"] for r in table(shown.stdout)}
    assert "B300X" not in shown.stdout and "--all lists them" in shown.stdout
    every = gpufleet("price", "--all", env=env)
    assert "B300X (not in fleet)" in {r["GPU TYPE"] for r in table(every.stdout)}
    assert "its hours and weekdays are UTC time" in shown.stdout
    missing = gpufleet("price", "--gpu-type", "B300X", env=env)
    assert missing.returncode == 1 and "the fleet has no B300X GPU" in missing.stderr


def test_sbatch_gres_gets_a_price_hint_and_the_scripts_name(
    server: Server, setup: dict[str, str], tmp_path: Path
) -> None:
    env = server.env()
    with server.client() as admin:
        ok(admin.put("/prices", json=PRICES))
    script = tmp_path / "train.sh"
    body = [f"echo step {i}" for i in range(14)]
    long_line = "python train.py " + " ".join(f"--option-{i}=value" for i in range(20))
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH --gres=gpu:h100:1\n"  # a lower-case type, as Slurm sites write it
        f"#SBATCH -p {setup['pool']}\n" + long_line + "\n" + "\n".join(body) + "\n"
    )
    sub = gpufleet("submit", "--parsable", "--team", setup["team"], str(script), env=env)
    assert sub.returncode == 0, sub.stderr
    assert "H100 costs 2/GPU-hour now (1 GPU: 2/h)" in sub.stderr
    job = wait_for(server, int(sub.stdout), "SCHEDULED")
    assert (job["name"], job["gpus"], job["gpu_type"]) == ("train.sh", 1, "h100")
    show = gpufleet("jobs", "show", sub.stdout.strip(), env=env).stdout
    assert "name: train.sh" in show
    assert "command: bash train.sh  (batch script, 18 lines)" in show
    assert "\n                  #SBATCH --gres=gpu:h100:1\n" in show  # under the value column
    assert "... 8 more lines (--json shows the whole script)" in show
    cut = next(line for line in show.splitlines() if line.strip().startswith("python train.py"))
    kept = cut.split(" ... (")[0].strip()
    assert long_line.startswith(kept + " ") and kept.split()[-1] in long_line.split()  # whole words
    gpufleet("cancel", sub.stdout.strip(), env=env)


# -- 4. jobs show: where an ended job ran -----------------------------------------------------


def test_jobs_show_says_where_an_ended_job_ran(server: Server, setup: dict[str, str]) -> None:
    env = server.env()
    pool = make_pool(server)
    node, token = register(server, pool=pool, gpus=2)
    args = ("--gpus", "2", "--pool", pool, "--team", setup["team"])
    ran = int(gpufleet("submit", *args, "--", "true", env=env).stdout)
    job = wait_for(server, ran, "SCHEDULED")
    attempt = round(job["scheduled_at"] * 1000)
    sync(server, node, {"jobs": [{"job_id": ran, "state": "running", "attempt": attempt}]}, token=token)
    wait_for(server, ran, "RUNNING")
    done = {"job_id": ran, "state": "exited", "attempt": attempt, "exit_code": 0}
    sync(server, node, {"jobs": [done]}, token=token)
    assert wait_for(server, ran, "COMPLETED")["allocation"] == []
    show = gpufleet("jobs", "show", str(ran), env=env).stdout
    assert re.search(rf"^ +ran on: {node}:0-1$", show, re.M), show
    cancelled = int(gpufleet("submit", *args, "--", "true", env=env).stdout)
    wait_for(server, cancelled, "SCHEDULED")
    assert gpufleet("cancel", str(cancelled), env=env).returncode == 0
    assert re.search(
        rf"^ +placed on: {node}:0-1$", gpufleet("jobs", "show", str(cancelled), env=env).stdout, re.M
    )


PLACED = [
    ("gpus", [("n1", (0, 1, 2, 3)), ("n-2.x", (0, 2, 3))], "fifo", "placed on n1[0-3] n-2.x[0,2-3] (fifo)"),
    ("cpu", [("n1", ())], "cpu", "placed on n1 (cpu)"),
]  # fmt: skip


@pytest.mark.parametrize(("where", "how", "text"), [p[1:] for p in PLACED], ids=[p[0] for p in PLACED])
def test_placed_reason_round_trips(where: list[tuple[str, tuple[int, ...]]], how: str, text: str) -> None:
    assert placed_reason(where, how=how) == text
    assert parse_placed(text) == Placed(nodes=tuple(where))


READ = [
    ("older-list", "placed on n1[0, 1] n2[7] (fifo)", Placed(nodes=(("n1", (0, 1)), ("n2", (7,))))),
    ("cut-in-a-list", "placed on n1[0-7] n2[0-3,5", Placed(nodes=(("n1", tuple(range(8))),), complete=False)),
    ("cut-in-a-name", "placed on n1[0-7] node-00", Placed(nodes=(("n1", tuple(range(8))),), complete=False)),
    ("another-reason", "cancelled by admin", None),
]  # fmt: skip


@pytest.mark.parametrize(("text", "want"), [r[1:] for r in READ], ids=[r[0] for r in READ])
def test_parse_placed(text: str, want: Placed | None) -> None:
    assert parse_placed(text) == want


def test_gpu_ranges() -> None:
    assert gpu_ranges([7, 0, 1, 2, 5]) == "0-2,5,7"


CLIPS = [
    ("short", "a b c", 10, "a b c"),
    ("at-a-space", "alpha beta gamma", 11, "alpha beta ... (6 more characters)"),
    ("one-long-word", "x" * 30 + " tail", 10, "x" * 30 + " ... (5 more characters)"),
    ("only-one-word", "y" * 30, 10, "y" * 30),
]


@pytest.mark.parametrize(("text", "most", "want"), [c[1:] for c in CLIPS], ids=[c[0] for c in CLIPS])
def test_clip_never_cuts_a_word(text: str, most: int, want: str) -> None:
    assert clip(text, most) == want


def test_a_plain_command_is_quoted_not_taken_for_a_script() -> None:
    assert command_lines(["python", "train.py", "--name", "a b"]) == ("python train.py --name 'a b'", [])


# -- 5. help and errors ------------------------------------------------------------------------


FLAGS = [
    ("queue", ("queue",), "--all"),
    ("reservations", ("reservations",), "--all"),
    ("drain", ("node", "drain"), "--wait"),
    ("usage", ("usage",), "--csv"),
    ("simulate", ("simulate",), "--sample"),
]


@pytest.mark.parametrize(("cmd", "flag"), [f[1:] for f in FLAGS], ids=[f[0] for f in FLAGS])
def test_flags_show_no_value_type(cmd: tuple[str, ...], flag: str) -> None:
    out = gpufleet(*cmd, "--help", env={"COLUMNS": "160"}).stdout
    line = next(line for line in out.splitlines() if re.search(rf"{flag}(?![\w-])", line))
    assert "<bool>" not in line, line


def test_help_texts_say_what_the_commands_do() -> None:
    submit = gpufleet("submit", "--help", env={"COLUMNS": "200"}).stdout
    assert "Print JSON instead of its id." in submit and "instead of a table" not in submit
    node = gpufleet("node", "--help", env={"COLUMNS": "200"}).stdout
    assert all(word in node for word in ("cordon", "drain", "rollout", "credentials"))


def _param(command: str, name: str) -> typer.core.TyperOption:
    cmd = typer.main.get_command(app)
    assert isinstance(cmd, typer.core.TyperGroup)
    sub = cmd.commands[command]
    return next(p for p in sub.params if p.name == name)  # type: ignore[return-value]


def test_demo_and_simulate_build_the_same_leaves() -> None:
    assert _param("demo", "nodes_per_leaf").default == NODES_PER_LEAF
    assert _param("simulate", "nodes_per_leaf").default == NODES_PER_LEAF
    assert DemoOptions().nodes_per_leaf == FleetSpec().nodes_per_leaf == NODES_PER_LEAF


def test_requeue_defaults_come_from_the_servers_constants() -> None:
    config = ServerConfig(database_url="sqlite://")
    assert (config.node_timeout_s, config.requeue_after_s) == (NODE_TIMEOUT_S, REQUEUE_AFTER_S)
    assert _param("server", "requeue_after").default == f"{REQUEUE_AFTER_S:g}s"
    assert _param("server", "node_timeout").default == f"{NODE_TIMEOUT_S:g}s"
    told = _param("simulate", "requeue_after").help or ""
    assert f"{NODE_TIMEOUT_S:g}s + {REQUEUE_AFTER_S:g}s" in told


def test_negative_gpus_name_the_real_bound(server: Server, setup: dict[str, str]) -> None:
    res = gpufleet("submit", "--gpus", "-1", "--team", setup["team"], "--", "true", env=server.env())
    assert res.returncode == 2
    assert "a GPU count is 0 or more" in res.stderr and "equal to 0" not in res.stderr
    with server.client() as c:
        r = c.post("/jobs", json={"command": ["true"], "gpus": -1, "team": setup["team"]})
    assert r.status_code == 422 and r.headers["content-type"].startswith("application/problem+json")
    assert "0 (none) or more" in r.json()["detail"]


def test_unknown_gpu_type_names_the_models_there_are(server: Server, setup: dict[str, str]) -> None:
    env = server.env()
    model = unique("GX")
    submit = ("submit", "--gpu-type", model, "--pool", setup["pool"], "--team", setup["team"], "--", "true")
    res = gpufleet(*submit, env=env)
    assert res.returncode == 2
    assert f"no schedulable {model} GPUs in pool {setup['pool']} (its GPU models: H100)" in res.stderr
    other = make_pool(server)
    make_node(server, pool=other, gpus=2, model=model)
    res = gpufleet(*submit, env=env)
    assert res.returncode == 2 and f"; pools with {model} GPUs: {other}" in res.stderr, res.stderr


def test_jobs_show_has_cost_and_energy() -> None:
    from gpufleet.api.jobs import JobDetail
    from gpufleet.cli.jobview import show_lines

    base = {"id": 1, "name": "n", "user": "u", "team": "t", "pool": "p", "state": "COMPLETED", "gpus": 2,
            "gpus_per_node": 0, "nodes": 0, "gpu_type": None, "priority": 0, "time_limit_s": None,
            "command": ["true"], "image": None, "requeue": True, "submit_time": 0.0, "scheduled_at": 1.0,
            "started_at": 1.0, "ended_at": 2.0, "exit_code": 0, "attained_service_s": 1.0,
            "queue_position": None, "estimated_start": None, "wait_reason": None, "allocation": [],
            "env": {}, "output": None, "error": None, "events": []}  # fmt: skip
    lines = show_lines(JobDetail.model_validate({**base, "cost": 12.345, "energy_kwh": 0.5}), now=3.0)
    assert any(re.fullmatch(r" *cost: 12\.35", x) for x in lines), lines
    assert any(re.fullmatch(r" *energy: 0\.500 kWh", x) for x in lines), lines
