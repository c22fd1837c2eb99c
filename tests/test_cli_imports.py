"""The client commands stay a fast client: ``gpufleet queue`` (run as often as
``squeue``) and the other API commands import no server code, no SQLAlchemy, FastAPI,
uvicorn or Alembic, and no numpy (the server's modules are imported by ``server``, ``db``
and ``admin create-user --database-url`` only when they run; the simulator's by
``simulate``, ``trace`` and ``demo``).

``gpufleet --help`` imports no command module at all: the root names each command and
its help line itself (``gpufleet.cli.COMMANDS``) and imports a command's module only to
run it or show its own help. So each entry must name a module and function that exist,
and a help line that is the command's own: both are checked here.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import pytest
import typer

from gpufleet.cli import COMMANDS, app, load, quick

HEAVY = ("sqlalchemy", "fastapi", "uvicorn", "alembic", "starlette", "psycopg", "numpy", "matplotlib")
SERVER_OK = {"gpufleet.server", "gpufleet.server.defaults", "gpufleet.server.decide.health", "gpufleet.clock"}
"""Constants the ``server`` command's options show (the package itself imports nothing).
The request and reply models the client validates with are ``gpufleet.api``: plain
Pydantic, outside the server."""


def _gpufleet(*argv: str, importtime: bool = False) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "gpufleet", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def _imported(*argv: str) -> set[str]:
    lines = _gpufleet(*argv, importtime=True).stderr.splitlines()
    return {line.split("|")[-1].strip() for line in lines if line.startswith("import time:")}


@pytest.mark.parametrize(
    "argv", [["--help"], ["queue", "--help"], ["submit", "--help"], ["jobs", "show", "--help"]]
)
def test_client_commands_import_no_server_machinery(argv: list[str]) -> None:
    modules = _imported(*argv)
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    server = sorted(m for m in modules if m.startswith("gpufleet.server") and m not in SERVER_OK)
    sim = sorted(m for m in modules if m.startswith("gpufleet.sim") or m.startswith("gpufleet.scheduler"))
    assert not heavy and not server and not sim, (heavy[:10], server, sim)


def test_help_imports_no_command_module() -> None:
    modules = _imported("--help")
    commands = sorted(m for m in modules if m.startswith("gpufleet.cli.") and m.endswith("_cmds"))
    client = sorted(m for m in modules if m.split(".")[0] in ("httpx", "pydantic", "yaml"))
    client += sorted(m for m in modules if m == "gpufleet.client" or m.startswith("gpufleet.api"))
    assert not commands and not client, (commands, client[:10])


def test_root_lists_every_command_lazily() -> None:
    root = typer.main.get_command(app)
    assert isinstance(root, typer.core.TyperGroup)
    assert list(root.commands) == list(COMMANDS)
    assert "queue" in root.commands and "nosuch" not in root.commands


@pytest.mark.parametrize("name", list(COMMANDS))
def test_help_line_is_the_commands_own(name: str) -> None:
    """The line ``gpufleet --help`` shows without importing the command is the one the
    command would show: the first paragraph of its help, lines joined (Typer's markdown
    mode joins them too), and nothing else that changes the listing."""
    command = load(name)
    assert command.name == name
    first = inspect.cleandoc(command.help or "").split("\n\n")[0].replace("\n", " ").strip()
    assert COMMANDS[name].help == first
    assert command.short_help is None and command.hidden == COMMANDS[name].hidden and not command.deprecated
    assert not getattr(command, "rich_help_panel", None)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_shows_its_help(name: str) -> None:
    """In a process of its own, as a user runs it: each entry's module imports, and its
    command (or group) answers ``--help``."""
    out = _gpufleet(name, "--help").stdout
    assert f" gpufleet {name} [OPTIONS]" in out, out[:500]


@pytest.mark.parametrize(
    "argv",
    [
        *(["server"], ["agent"], ["demo"], ["gateway"], ["model-server"], ["loadgen"], ["run"], ["simulate"]),
        *(["logs", "1"], ["service", "logs"], ["node", "rollout"], ["trace", "stats"], ["admin"], ["db"]),
    ],
)
def test_long_running_commands_end_normally(argv: list[str]) -> None:
    """Only quick client commands skip the collector and the interpreter's teardown:
    a server, an agent, ``run`` or ``logs`` (which may follow for hours) never do."""
    assert not quick(argv)


@pytest.mark.parametrize(
    "argv", [[], ["--help"], ["--version"], ["queue"], ["submit", "x.sh"], ["jobs", "show"]]
)
def test_quick_commands(argv: list[str]) -> None:
    assert quick(argv)


def test_quick_exit_keeps_the_exit_code_and_the_message() -> None:
    """A quick command that fails (no server there) still says why and exits non-zero:
    its output is flushed before os._exit."""
    done = subprocess.run(
        [sys.executable, "-m", "gpufleet", "queue"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "GPUFLEET_URL": "http://127.0.0.1:9", "GPUFLEET_TOKEN": "x"},
        check=False,
    )
    assert done.returncode != 0 and "cannot reach server" in done.stderr, done.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["squeue", "-h"],
        ["sinfo"],
        ["scontrol", "show", "job", "1"],
        ["scontrol", "update", "JobId=1", "TimeLimit=5"],
        ["scancel", "1"],
    ],
    ids=lambda argv: "-".join(argv[:2]),
)
def test_in_job_commands_import_no_cli_nor_models(argv: list[str]) -> None:
    """The Slurm commands a job calls (issue 31) read the server's JSON as it comes: no
    Typer, click or Rich (the CLI's), no pydantic (the API's models), no server code. Run
    against a server that is not there: everything up to the request is imported, and the
    error is Slurm's line, exit 1."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gpufleet.slurm", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "GPUFLEET_URL": "http://127.0.0.1:9", "GPUFLEET_TOKEN": "x"},
        check=False,
    )
    assert done.returncode == 1 and f"{argv[0]}: error: cannot reach server" in done.stderr, done.stderr[
        -2000:
    ]
    lines = done.stderr.splitlines()
    modules = {line.split("|")[-1].strip() for line in lines if line.startswith("import time:")}
    slow = ("typer", "click", "rich", "pydantic", *HEAVY)
    heavy = sorted(m for m in modules if m.split(".")[0] in slow)
    ours = sorted(
        m
        for m in modules
        if m == "gpufleet.cli" or m.startswith(("gpufleet.cli.", "gpufleet.api", "gpufleet.server"))
    )
    assert "gpufleet.client" in modules and not heavy and not ours, (heavy[:10], ours)


def test_slurm_install_and_its_help_import_no_server_machinery() -> None:
    modules = _imported("slurm", "install", "--help")
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert not heavy and not any(m.startswith("gpufleet.server.") for m in modules), heavy[:10]
