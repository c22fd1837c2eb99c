"""The agent's side of driver upgrades (``agent/upgrade.py``): which hook files it trusts,
how it runs one (its argument, a scrubbed environment, bounded output, a timeout), and
an order carried out once, across a restart, on a simulated node."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gpufleet.agent import SimSpec, SimulatedProbe
from gpufleet.agent.upgrade import OUTPUT_BYTES, HookError, Upgrades, check_hook, parse_hooks, run_hook
from gpufleet.api.upgrades import UpgradeOrder


def _script(path: Path, body: str, mode: int = 0o755) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o755)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(mode)
    return path


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        (0o775, "writable by group or others"),
        (0o757, "writable by group or others"),
        (0o644, "not executable"),
    ],
    ids=["group-writable", "world-writable", "not-executable"],
)
def test_a_hook_file_it_cannot_trust_is_refused(tmp_path: Path, mode: int, why: str) -> None:
    hook = _script(tmp_path / "h" / "hook", "exit 0", mode)
    with pytest.raises(HookError, match=why):
        check_hook(hook)


def test_hook_paths_and_owners(tmp_path: Path) -> None:
    good = _script(tmp_path / "h" / "hook", "exit 0")
    check_hook(good)  # owned by this (root or test) user, 0755: fine
    with pytest.raises(HookError, match="absolute path"):
        check_hook(Path("h/hook"))
    with pytest.raises(HookError, match="owned by uid"):
        check_hook(good, euid=12345) if os.geteuid() != 0 else _chown_and_check(good)
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    hook = open_dir / "hook"
    hook.write_text("#!/bin/sh\n")
    hook.chmod(0o755)
    open_dir.chmod(0o777)  # anyone may swap the file: not trusted
    with pytest.raises(HookError, match="may be changed by others"):
        check_hook(hook)
    link = tmp_path / "h" / "link"
    link.symlink_to(open_dir / "hook")  # a link is judged by what it points at
    with pytest.raises(HookError, match="may be changed by others"):
        check_hook(link)
    with pytest.raises(HookError, match="NAME=/path"):
        parse_hooks(["no-path"])
    with pytest.raises(HookError, match="given twice"):
        parse_hooks([f"a={good}", f"a={good}"])
    assert parse_hooks([f"driver={good}"]) == {"driver": good}


def _chown_and_check(path: Path) -> None:
    """As root: a hook owned by another account is refused."""
    os.chown(path, 12345, 12345)
    try:
        check_hook(path)
    finally:
        os.chown(path, 0, 0)


def test_a_hook_gets_its_argument_a_scrubbed_environment_and_bounded_output(tmp_path: Path) -> None:
    os.environ["GPUFLEET_SECRET_FOR_TEST"] = "s3cret"
    try:
        hook = _script(tmp_path / "h" / "hook", 'echo "arg=$1 n=$#"; env; pwd')
        run = run_hook(hook, "550.54.15")
    finally:
        del os.environ["GPUFLEET_SECRET_FOR_TEST"]
    assert run.error is None
    assert "arg=550.54.15 n=1" in run.output
    assert "s3cret" not in run.output and "GPUFLEET_EXPECT_DRIVER=550.54.15" in run.output
    names = {ln.split("=", 1)[0] for ln in run.output.splitlines() if "=" in ln and not ln.startswith("arg")}
    assert names <= {"PATH", "LANG", "GPUFLEET_EXPECT_DRIVER", "PWD", "SHLVL", "_", "OLDPWD"}, names
    assert run.output.rstrip().endswith("/")
    loud = _script(
        tmp_path / "h" / "loud", f"head -c {4 * OUTPUT_BYTES} /dev/zero | tr '\\0' x; echo END; exit 3"
    )
    run = run_hook(loud, "550.54.15")
    assert run.error == "exit code 3" and run.output.endswith("END\n") and len(run.output) <= 4096
    assert run_hook(loud, "-rf").error is not None  # never an option, never a path


def test_a_hook_past_its_timeout_is_killed_with_its_children(tmp_path: Path) -> None:
    marker = tmp_path / "survived"
    hook = _script(tmp_path / "h" / "slow", f"(sleep 3; touch {marker}) & sleep 30")
    t0 = time.monotonic()
    run = run_hook(hook, "550.54.15", timeout_s=0.5)
    assert run.error is not None and "timed out" in run.error
    assert time.monotonic() - t0 < 10
    time.sleep(3.5)
    assert not marker.exists()


def test_an_order_is_carried_out_once_and_not_again_after_a_restart(tmp_path: Path) -> None:
    count = tmp_path / "count"
    hook = _script(tmp_path / "h" / "hook", f"echo run >> {count}")
    probe = SimulatedProbe(node="n1", spec=SimSpec(gpus=2), driver="535.104.05", smoke_fails=[1])
    order = UpgradeOrder(rollout=1, attempt=1, hook="driver", expect_driver="550.54.15")

    def agent() -> Upgrades:
        return Upgrades(node="n1", work_dir=tmp_path / "w", probe=probe, hooks={"driver": hook})

    first = agent()
    assert first.step(order) and first.settle()
    done = first.report()
    assert done is not None and done["stage"] == "done" and done["driver_version"] == "550.54.15"
    assert [(g["index"], g["healthy"], g["smoke_ok"]) for g in done["gpus"]] == [
        (0, True, True),
        (1, True, False),
    ]
    assert not first.step(order)  # the same order again: nothing new
    again = agent()  # restarted (the hook may have rebooted the node): verifies, runs nothing
    assert again.step(order) and again.settle()
    assert count.read_text().count("run") == 1
    unknown = agent()
    assert unknown.step(UpgradeOrder(rollout=1, attempt=2, hook="other", expect_driver="550.54.15"))
    unknown.settle()
    said = unknown.report()
    assert said is not None and "no upgrade hook named other" in said["hook_error"]
    assert count.read_text().count("run") == 1
    first.step(None)
    assert first.report() is None
