"""``gpufleet node mig`` without a server: a garbled layout and both or neither of
``--layout``/``--whole`` end with exit 2 and say why, before any request (the configured
server does not exist: a request would fail differently); a good one is one PUT (a fake
client stands in) and one line, or the node with ``--json``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufleet.cli import app


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("GPUFLEET_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("GPUFLEET_TOKEN", "no-server-here")
    return CliRunner()


@pytest.mark.parametrize(
    ("layout", "words"),
    [
        ("2g.20gb,banana", "'banana'"),
        ("2g.20gb,,3g.40gb", "empty item 2"),
        ("   ", "empty MIG layout"),
    ],
)
def test_a_garbled_layout_is_exit_2(runner: CliRunner, layout: str, words: str) -> None:
    done = runner.invoke(app, ["node", "mig", "n1", "--gpu", "3", "--layout", layout])
    assert done.exit_code == 2, done.output
    assert words in done.output and "gpufleet: error:" in done.output


@pytest.mark.parametrize("extra", [["--layout", "3g.40gb", "--whole"], []], ids=["both", "neither"])
def test_exactly_one_of_layout_and_whole(runner: CliRunner, extra: list[str]) -> None:
    done = runner.invoke(app, ["node", "mig", "n1", "--gpu", "3", *extra])
    assert done.exit_code == 2, done.output
    assert "give either --layout PROFILES or --whole" in done.output


def test_the_gpu_is_required(runner: CliRunner) -> None:
    done = runner.invoke(app, ["node", "mig", "n1", "--whole"])
    assert done.exit_code == 2


class FakeClient:
    """Stands in for ``GpufleetClient``: records the request, answers a node."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    def request(self, method: str, path: str, **kw: Any) -> Any:
        self.calls.append((method, path, kw.get("json")))
        return {"name": "n1", "gpus": [{"index": 3, "mig_pending": kw["json"]["layout"] or []}]}


@pytest.mark.parametrize(
    ("extra", "body", "line"),
    [
        (
            ["--layout", "2G.20GB, 2g.20gb,3g.40gb"],
            {"layout": ["2g.20gb", "2g.20gb", "3g.40gb"], "whole": False},
            "node n1 GPU 3: MIG layout 2g.20gb,2g.20gb,3g.40gb asked; "
            "the GPU is cordoned until its agent applies it",
        ),
        (
            ["--whole"],
            {"layout": None, "whole": True},
            "node n1 GPU 3: whole GPU asked; the GPU is cordoned until its agent applies it",
        ),
    ],
    ids=["layout", "whole"],
)
def test_the_request_and_the_line(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch, extra: list[str], body: dict[str, Any], line: str
) -> None:
    from gpufleet.cli import node_cmds

    fake = FakeClient()

    @contextmanager
    def client() -> Iterator[FakeClient]:
        yield fake

    monkeypatch.setattr(node_cmds, "client", client)
    done = runner.invoke(app, ["node", "mig", "n1", "--gpu", "3", *extra])
    assert done.exit_code == 0, done.output
    assert fake.calls == [("PUT", "/nodes/n1/gpus/3/mig", body)]
    assert done.output.strip() == line
    done = runner.invoke(app, ["node", "mig", "n1", "--gpu", "3", *extra, "--json"])
    assert done.exit_code == 0 and json.loads(done.output)["name"] == "n1"


def test_the_gpu_lines_show_slices_pending_and_error() -> None:
    from gpufleet.api.nodes import GpuOut
    from gpufleet.cli.node_cmds import _mig_text

    base: dict[str, Any] = {
        "uuid": "GPU-x",
        "model": "H100",
        "memory_mb": 81_559,
        "nvlink_domain": 0,
        "healthy": True,
        "job_id": None,
    }
    slices = [
        {
            "uuid": f"MIG-{n}",
            "profile": p,
            "gpu_instance_id": n,
            "compute_instance_id": 0,
            "start": s,
            "size": z,
            "memory_mb": 1,
        }
        for n, (p, s, z) in enumerate([("2g.20gb", 0, 2), ("2g.20gb", 2, 2), ("3g.40gb", 4, 4)])
    ]
    plain = GpuOut.model_validate({**base, "index": 0})
    sliced = GpuOut.model_validate({**base, "index": 3, "mig_enabled": True, "mig_instances": slices})
    asked = GpuOut.model_validate(
        {**base, "index": 3, "mig_enabled": True, "mig_pending": [], "mig_error": "in use"}
    )
    assert _mig_text(plain) == ""
    assert _mig_text(sliced) == " mig=[2g.20gb,2g.20gb,3g.40gb]"
    assert _mig_text(asked) == " mig=[] mig-pending=whole mig-error='in use'"


@pytest.mark.parametrize(
    ("mig", "words"),
    [
        (["5=7g.80gb"], "expected GPU=PROFILES with GPU 0..1"),
        (["x"], "expected GPU=PROFILES"),
        (["0=9g.1gb"], "is not a MIG profile"),
        (["0=4g.40gb,4g.40gb"], "4g.40gb x2 does not fit"),
    ],
)
def test_agent_simulated_mig_layouts_are_checked_before_it_starts(
    runner: CliRunner, tmp_path: Any, mig: list[str], words: str
) -> None:
    argv = ["agent", "--server", "http://127.0.0.1:9", "--token", "t", "--simulate-gpus", "2"]
    argv += ["--work-dir", str(tmp_path)]
    for m in mig:
        argv += ["--simulate-mig", m]
    done = runner.invoke(app, argv)
    assert done.exit_code == 2, done.output
    assert words in done.output


def test_agent_simulated_mig_needs_simulated_gpus(runner: CliRunner, tmp_path: Any) -> None:
    argv = ["agent", "--server", "http://127.0.0.1:9", "--token", "t", "--simulate-mig", "0=7g.80gb"]
    done = runner.invoke(app, [*argv, "--work-dir", str(tmp_path)])
    assert done.exit_code == 2 and "--simulate-mig needs --simulate-gpus" in done.output, done.output
