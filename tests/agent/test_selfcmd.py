"""A replica's ``gpufleet`` command is this node's gpufleet, runnable by the replica's
account (``agent/selfcmd.py``); a batch job's command is never touched."""

from __future__ import annotations

import dataclasses

import pytest

from gpufleet.agent import selfcmd
from gpufleet.agent.jobs import JobSpec
from gpufleet.modelserver.launch import Launch, gpufleet_command


def spec(*command: str, env: dict[str, str] | None = None) -> JobSpec:
    return JobSpec(job_id=1, attempt=1, gpus=(0,), command=command, env=env or {})


@pytest.mark.parametrize(
    "program",
    ["gpufleet", ".venv/bin/gpufleet", "/opt/gpufleet/.venv/bin/gpufleet"],
    ids=["bare", "relative-venv", "absolute"],
)
@pytest.mark.parametrize("other", [True, False], ids=["as-another-account", "as-itself"])
def test_a_gpufleet_command_becomes_this_installations(program: str, other: bool) -> None:
    got = selfcmd.resolve(spec(program, "model-server", "--model", "mlp"), as_other_account=other)
    want = gpufleet_command(("model-server", "--model", "mlp"), as_other_account=other)
    if want.runnable:
        assert list(got.command) == want.command
        assert got.command[-4:] == ("gpufleet", "model-server", "--model", "mlp")
        assert got.env.get("PYTHONPATH") == want.env.get("PYTHONPATH")
    else:  # this machine has no interpreter the account can run: the reason, not a crash loop
        assert got.command[:2] == ("/bin/sh", "-c") and "cannot run this node's gpufleet" in got.command[-1]


def test_the_replicas_own_pythonpath_comes_after_gpufleets() -> None:
    got = selfcmd.resolve(
        spec("gpufleet", "model-server", env={"PYTHONPATH": "/mine"}), as_other_account=True
    )
    want = gpufleet_command(("model-server",), as_other_account=True)
    if want.runnable and "PYTHONPATH" in want.env:
        assert got.env["PYTHONPATH"] == want.env["PYTHONPATH"] + ":/mine"
    else:
        assert got.env["PYTHONPATH"] == "/mine"


@pytest.mark.parametrize(
    "command",
    [("python3", "serve.py"), ("/usr/bin/gpufleet-like",), ("sh", "-c", "gpufleet model-server"), ()],
    ids=["other-program", "similar-name", "gpufleet-inside-a-shell", "empty"],
)
def test_other_commands_are_left_alone(command: tuple[str, ...]) -> None:
    s = spec(*command)
    assert selfcmd.resolve(s, as_other_account=True) == s


def test_unrunnable_says_why_and_the_fix() -> None:
    """Where no interpreter the account can run exists: exit 126 with the reason."""

    def nothing_runnable(args: tuple[str, ...], *, as_other_account: bool) -> Launch:
        return Launch(command=["x"], runnable=False, why="no python3.11 it can run")

    got = selfcmd.resolve(spec("gpufleet", "model-server"), as_other_account=True, launcher=nothing_runnable)
    assert got.command[:3] == ("/bin/sh", "-c", 'echo "$1" >&2; exit 126')
    assert "no python3.11 it can run" in got.command[-1] and "/opt" in got.command[-1]
    assert dataclasses.replace(got, command=()) == dataclasses.replace(spec("gpufleet"), command=())
