"""The commands a job or a script runs often read the server's JSON through the standard
library's ``http.client`` and import nothing more (issue 31's fast CLI): no pydantic or API
models (``sacct``/``history`` validated every job once), no httpx, no ``platformdirs`` or
``dataclasses`` (``client.config_file``). Checked with ``-X importtime`` against a real
server, and the commands' output is what they print without it."""

from __future__ import annotations

import pytest

from server.conftest import Server, gpufleet, make_pool, make_team
from server.playnode import submit

LIGHT_NOT = (
    "pydantic",
    "gpufleet.api",
    "platformdirs",
    "dataclasses",
    "httpx",
)


@pytest.mark.parametrize(
    ("argv", "allowed"),
    [
        # sacct is `gpufleet history` under Typer (slurm/_typer.py), which imports dataclasses
        pytest.param(["sacct", "-j", "{id}", "-X", "-P"], {"dataclasses"}, id="sacct"),
        pytest.param(["squeue", "-h"], set(), id="squeue"),
        # scontrol shows a batch script: slurm/batchscript.py's BatchScript is a dataclass
        pytest.param(["scontrol", "show", "job", "{id}"], {"dataclasses"}, id="scontrol"),
    ],
)
def test_a_slurm_command_imports_only_what_it_needs(
    server: Server, argv: list[str], allowed: set[str]
) -> None:
    if not server.db_url.startswith("sqlite"):
        pytest.skip("the CLI is a client of the API: its tests run once, on SQLite")
    job = submit(server, pool=make_pool(server), team=make_team(server), gpus=1, name="light")
    args = ["-X", "importtime", "-s", "-m", "gpufleet.slurm", *(a.format(id=job["id"]) for a in argv)]
    done = gpufleet(*args, env=server.env(), python_flags=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert str(job["id"]) in done.stdout
    lines = done.stderr.splitlines()
    modules = {line.split("|")[-1].strip() for line in lines if line.startswith("import time:")}
    heavy = sorted(m for m in modules - allowed if m.split(".")[0] in LIGHT_NOT or m.startswith(LIGHT_NOT))
    assert not heavy, heavy
