"""``gpufleet submit --checkpoint-every`` and ``#GPUFLEET --checkpoint-every`` against a
running server: stored on the job; a bad value or an unknown ``#GPUFLEET`` option is a
usage error (exit 2) that submits nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from server.conftest import Server, gpufleet, make_pool, make_team, ok

SCRIPT = """#!/bin/bash
#SBATCH --gpus=1
#GPUFLEET --checkpoint-every 45m
#SBATCH --time=2:00:00
{extra}
python train.py
"""


@pytest.fixture(scope="module")
def world(server: Server) -> dict[str, str]:
    if not server.db_url.startswith("sqlite"):
        pytest.skip("the CLI is a client of the API: its tests run once, on SQLite")
    return {"team": make_team(server), "pool": make_pool(server)}


def jobs(server: Server) -> int:
    with server.client() as c:
        return len(ok(c.get("/jobs", params={"limit": 1000}))["items"])


def submit(server: Server, world: dict[str, str], *args: str) -> Any:
    return gpufleet("submit", "--hold", "--team", world["team"], "-p", world["pool"], *args, env=server.env())


def shown(server: Server, res: Any) -> dict[str, Any]:
    assert res.returncode == 0, res.stderr
    with server.client() as c:
        return ok(c.get(f"/jobs/{res.stdout.split()[-1]}"))  # type: ignore[no-any-return]


def test_the_flag_and_the_directive(server: Server, world: dict[str, str], tmp_path: Path) -> None:
    assert (
        shown(server, submit(server, world, "--checkpoint-every", "30m", "-G", "1", "--", "true"))[
            "checkpoint_s"
        ]
        == 1800.0
    )
    script = tmp_path / "train.sh"
    script.write_text(SCRIPT.format(extra=""))
    assert shown(server, submit(server, world, str(script)))["checkpoint_s"] == 2700.0
    # The command line wins over the script, as with #SBATCH.
    assert (
        shown(server, submit(server, world, "--checkpoint-every", "2h", str(script)))["checkpoint_s"]
        == 7200.0
    )


@pytest.mark.parametrize(
    ("args", "extra", "said"),
    [
        (("--checkpoint-every", "abc"), "", "--checkpoint-every=abc: cannot read duration 'abc'"),
        ((), "#GPUFLEET --checkpoint-every abc", "line 5: --checkpoint-every=abc"),
        ((), "#GPUFLEET --preempt-me-not", "line 5: #GPUFLEET --preempt-me-not: an unknown option"),
        (("--ignore-unsupported",), "#GPUFLEET --preempt-me-not", "an unknown option"),
    ],
    ids=["bad-flag", "bad-directive", "unknown-directive", "unknown-even-when-ignoring"],
)
def test_a_bad_value_or_option_is_a_usage_error(
    server: Server, world: dict[str, str], tmp_path: Path, args: tuple[str, ...], extra: str, said: str
) -> None:
    script = tmp_path / "train.sh"
    script.write_text(SCRIPT.format(extra=extra))
    before = jobs(server)
    res = submit(server, world, *args, str(script))
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert said in res.stderr
    assert jobs(server) == before
