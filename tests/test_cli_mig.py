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
    """Stands in for ``GpufleetClient``: records the request, answers a node whose GPU 3
    has the layout pending; then, one answer at a time, ``later`` (GETs)."""

    def __init__(self, later: list[dict[str, Any]] | None = None) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.later = list(later or [])
        self.pending: dict[str, Any] = {}

    def request(self, method: str, path: str, **kw: Any) -> Any:
        self.calls.append((method, path, kw.get("json")))
        if method == "GET":
            return {"name": "n1", "gpus": [{"index": 3, **self.later.pop(0)}]} if self.later else self.pending
        self.pending = {"name": "n1", "gpus": [{"index": 3, "mig_pending": kw["json"]["layout"] or []}]}
        return self.pending


def _use(monkeypatch: pytest.MonkeyPatch, fake: FakeClient) -> None:
    from gpufleet.cli import node_cmds

    @contextmanager
    def client() -> Iterator[FakeClient]:
        yield fake

    monkeypatch.setattr(node_cmds, "client", client)
    monkeypatch.setattr(node_cmds, "WAIT_POLL_S", 0.01)


@pytest.mark.parametrize(
    ("extra", "body", "line"),
    [
        (
            ["--layout", "2G.20GB, 2g.20gb,3g.40gb"],
            {"layout": ["2g.20gb", "2g.20gb", "3g.40gb"], "whole": False},
            "node n1 GPU 3: MIG layout 2g.20gb,2g.20gb,3g.40gb asked, pending: the GPU takes no new "
            "job until its agent applies it (once no job holds it); jobs asking for its slices wait "
            "for it (--wait waits too)",
        ),
        (
            ["--whole"],
            {"layout": None, "whole": True},
            "node n1 GPU 3: whole GPU asked, pending: the GPU takes no new job until its agent "
            "applies it (once no job holds it); jobs asking for its slices wait for it (--wait waits too)",
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


GPU = {
    "uuid": "GPU-x",
    "model": "H100",
    "memory_mb": 81_559,
    "nvlink_domain": 0,
    "healthy": True,
    "job_id": None,
}


def _instances(*profiles: str) -> list[dict[str, Any]]:
    return [
        {
            "uuid": f"MIG-{n}",
            "profile": p,
            "gpu_instance_id": n,
            "compute_instance_id": 0,
            "start": n,
            "size": 1,
            "memory_mb": 1,
        }
        for n, p in enumerate(profiles)
    ]


@pytest.mark.parametrize(
    ("gpu", "asked", "want"),
    [
        ({"mig_pending": ["1g.10gb", "1g.10gb"]}, ["1g.10gb", "1g.10gb"], None),
        ({"mig_pending": ["7g.80gb"]}, ["1g.10gb", "1g.10gb"], "replaced"),
        (
            {"mig_enabled": True, "mig_instances": _instances("1g.10gb", "1g.10gb")},
            ["1g.10gb"] * 2,
            "applied",
        ),
        ({"mig_enabled": True, "mig_instances": _instances("7g.80gb")}, ["1g.10gb"] * 2, "replaced"),
        ({"mig_enabled": True, "mig_error": "no permission"}, ["1g.10gb"] * 2, "failed"),
        ({"mig_enabled": False}, [], "applied"),
        ({"mig_enabled": True, "mig_instances": []}, [], "replaced"),
        ({"mig_pending": []}, [], None),
    ],
    ids=[
        "pending",
        "other-pending",
        "applied",
        "other-applied",
        "failed",
        "whole",
        "still-mig",
        "whole-pending",
    ],
)
def test_where_a_layout_stands(gpu: dict[str, Any], asked: list[str], want: str | None) -> None:
    from gpufleet.cli.node_cmds import mig_state

    assert mig_state({"index": 3, **gpu}, asked) == want


def test_wait_returns_once_the_agent_applied_it(runner: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    layout = ["1g.10gb"] * 7
    applied = {**GPU, "mig_enabled": True, "mig_instances": _instances(*layout)}
    fake = FakeClient([{"mig_pending": layout}, {"mig_pending": layout}, applied])
    _use(monkeypatch, fake)
    done = runner.invoke(app, ["node", "mig", "n1", "--gpu", "3", "--layout", ",".join(layout), "--wait"])
    assert done.exit_code == 0, done.output
    assert [m for m, _, _ in fake.calls] == ["PUT", "GET", "GET", "GET"]
    assert done.output.strip() == (
        "node n1 GPU 3: MIG layout 1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb in effect "
        "mig=[1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb]"
    )


def test_wait_says_why_the_node_refused_it(runner: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    _use(monkeypatch, FakeClient([{**GPU, "mig_enabled": True, "mig_error": "no permission"}]))
    done = runner.invoke(app, ["node", "mig", "n1", "--gpu", "3", "--layout", "7g.80gb", "--wait"])
    assert done.exit_code == 1, done.output
    assert "MIG layout 7g.80gb failed on the node: no permission (the GPU stays cordoned)" in done.output


def test_wait_gives_up_after_its_timeout_and_says_so(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    _use(monkeypatch, FakeClient())  # pending for ever
    argv = ["node", "mig", "n1", "--gpu", "3", "--layout", "7g.80gb", "--wait", "--timeout", "1s"]
    done = runner.invoke(app, argv)
    assert done.exit_code == 1, done.output
    assert "MIG layout 7g.80gb still pending after 1s" in done.output and "stays asked" in done.output
    assert runner.invoke(app, [*argv[:-1], "0s"]).exit_code == 2  # a timeout must be > 0


class ShareClient:
    """A node that syncs (last_seen moves on) only from the third GET on."""

    def __init__(self, *, ready: bool = True) -> None:
        self.gets = 0
        self.ready = ready

    def request(self, method: str, path: str, **kw: Any) -> Any:
        if method == "GET":
            self.gets += 1
        seen = 100.0 + (1.0 if self.gets >= 3 and self.ready else 0.0)
        return {"name": "n1", "state": "Ready" if self.ready else "NotReady", "last_seen": seen, "gpus": []}


@pytest.mark.parametrize("ready", [True, False], ids=["synced", "node-away"])
def test_share_wait_waits_for_the_node_to_sync(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch, ready: bool
) -> None:
    from gpufleet.cli import node_cmds

    fake = ShareClient(ready=ready)

    @contextmanager
    def client() -> Iterator[ShareClient]:
        yield fake

    monkeypatch.setattr(node_cmds, "client", client)
    monkeypatch.setattr(node_cmds, "WAIT_POLL_S", 0.01)
    done = runner.invoke(app, ["node", "share", "n1", "--gpu", "3", "--wait", "--timeout", "1s"])
    if ready:
        assert done.exit_code == 0 and fake.gets == 3, done.output
        assert done.output.strip() == (
            "node n1 GPU 3: shared (GPU shares only, no whole-GPU jobs); its agent has synced since"
        )
    else:
        assert done.exit_code == 1 and "has not synced in 1s" in done.output, done.output
