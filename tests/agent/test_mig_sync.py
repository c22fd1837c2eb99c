"""MIG layouts on the agent's side, without a server: the sync reports each GPU's MIG
mode and instances; a ``MigChange`` in a reply is applied once (not at every sync),
reported as a ``MigResult`` until the server stops asking, then forgotten; a GPU a job
holds waits; a refused layout, MIG mode off or a probe that cannot change MIG are
error results, and the agent goes on. Replies are built here and handed to
``Agent.apply``; every body the agent builds is checked against ``NodeSync``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from gpufleet import mig
from gpufleet.agent import Agent, AgentConfig, SimSpec, SimulatedProbe, make_agent
from gpufleet.agent.jobs import SIMULATE_ENV, JobSpec, launch_env
from gpufleet.agent.miglayouts import NO_MIG_PROBE
from gpufleet.agent.probe import GpuSample, MigInstance, NodeInventory
from gpufleet.api.nodes import NodeSync
from gpufleet.clock import FakeClock

LAYOUT = ["2g.20gb", "2g.20gb", "3g.40gb"]


class CountingProbe(SimulatedProbe):
    """A simulated probe that counts MIG applications and MIG mode switches; with
    ``modes=False`` it cannot switch MIG mode (as a driver that needs a reset for it)."""

    def __init__(self, *args: Any, modes: bool = False, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.applied: list[tuple[int, list[str]]] = []
        self.switched: list[tuple[int, bool]] = []
        self.__dict__["set_mig_mode"] = self._set_mig_mode if modes else None

    def apply_mig_layout(self, gpu_index: int, profiles: Sequence[str]) -> tuple[MigInstance, ...]:
        self.applied.append((gpu_index, list(profiles)))
        return super().apply_mig_layout(gpu_index, profiles)

    def _set_mig_mode(self, gpu_index: int, enabled: bool) -> None:
        self.switched.append((gpu_index, enabled))
        if enabled:
            self._mig.setdefault(gpu_index, ())
        else:
            self._mig.pop(gpu_index, None)


class NoMigProbe:
    """A probe with GPUs and no way to change MIG."""

    def __init__(self) -> None:
        self.inner = SimulatedProbe(node="n1", spec=SimSpec(gpus=2))

    def inventory(self) -> NodeInventory:
        return self.inner.inventory()

    def sample(self) -> tuple[GpuSample, ...]:
        return self.inner.sample()

    def close(self) -> None:
        pass


class Unused:
    def sync(self, node: str, body: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError("the tests call apply() themselves")

    def close(self) -> None:
        pass


def new_agent(tmp_path: Path, probe: Any, clock: FakeClock | None = None) -> Agent:
    return make_agent(
        config=AgentConfig(node="n1", work_dir=tmp_path / "n1"), probe=probe, transport=Unused(), clock=clock
    )


def sync(agent: Agent, mig: list[dict[str, Any]], jobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One round: the body sent, the reply applied, MIG work finished; the next body."""
    sent = agent.build_sync()
    NodeSync.model_validate(sent)
    agent.apply({"node": "n1", "jobs": jobs or [], "mig": mig}, sent=sent)
    assert agent.mig_settle(timeout_s=10)
    body = agent.build_sync()
    NodeSync.model_validate(body)
    return body


def gpu(body: dict[str, Any], index: int) -> dict[str, Any]:
    return next(g for g in body["gpus"] if g["index"] == index)


def desired(job_id: int, gpus: list[int]) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "attempt": 1,
        "name": "busy",
        "command": ["true"],
        "env": {SIMULATE_ENV: "1000"},
        "image": None,
        "gpus": gpus,
        "time_limit_s": None,
        "deadline": None,
        "user": "alice",
        "output": None,
        "error": None,
    }


def test_the_sync_reports_mig_mode_and_instances(tmp_path: Path) -> None:
    agent = new_agent(tmp_path, SimulatedProbe(node="n1", spec=SimSpec(gpus=3), mig={0: LAYOUT, 1: []}))
    body = agent.build_sync()
    NodeSync.model_validate(body)
    g0, g1, g2 = (gpu(body, i) for i in range(3))
    assert g0["mig_enabled"] is True and [m["profile"] for m in g0["mig_instances"]] == LAYOUT
    first = g0["mig_instances"][0]
    assert first["uuid"].startswith("MIG-") and first["size"] >= 1 and first["memory_mb"] > 0
    assert set(first) == {
        "uuid",
        "profile",
        "gpu_instance_id",
        "compute_instance_id",
        "start",
        "size",
        "memory_mb",
    }
    assert g1["mig_enabled"] is True and g1["mig_instances"] == []
    assert g2["mig_enabled"] is False and g2["mig_instances"] == []
    assert "mig_results" not in body


def test_a_change_is_applied_once_reported_until_the_server_stops_asking(tmp_path: Path) -> None:
    probe = CountingProbe(node="n1", spec=SimSpec(gpus=2), mig={0: []})
    agent = new_agent(tmp_path, probe)
    change = [{"gpu": 0, "layout": LAYOUT}]
    body = sync(agent, change)
    assert probe.applied == [(0, LAYOUT)]
    assert body["mig_results"] == [{"gpu": 0, "layout": LAYOUT, "error": None}]
    assert [m["profile"] for m in gpu(body, 0)["mig_instances"]] == LAYOUT
    for _ in range(3):  # the server has not seen the result yet: asks again, nothing re-applied
        body = sync(agent, change)
    assert probe.applied == [(0, LAYOUT)]
    assert body["mig_results"] == [{"gpu": 0, "layout": LAYOUT, "error": None}]
    body = sync(agent, [])  # the server took the result
    assert "mig_results" not in body and probe.applied == [(0, LAYOUT)]
    assert [m["profile"] for m in gpu(body, 0)["mig_instances"]] == LAYOUT


def test_a_different_layout_for_the_gpu_is_applied(tmp_path: Path) -> None:
    probe = CountingProbe(node="n1", spec=SimSpec(gpus=1), mig={0: ["7g.80gb"]})
    agent = new_agent(tmp_path, probe)
    sync(agent, [{"gpu": 0, "layout": LAYOUT}])
    body = sync(agent, [{"gpu": 0, "layout": ["1g.10gb"] * 7}])
    assert probe.applied == [(0, LAYOUT), (0, ["1g.10gb"] * 7)]
    assert body["mig_results"] == [{"gpu": 0, "layout": ["1g.10gb"] * 7, "error": None}]
    assert len(gpu(body, 0)["mig_instances"]) == 7


def test_a_gpu_a_job_holds_waits_until_it_is_free(tmp_path: Path) -> None:
    clock = FakeClock()
    probe = CountingProbe(node="n1", spec=SimSpec(gpus=2), mig={1: []}, clock=clock)
    agent = new_agent(tmp_path, probe, clock)
    change = [{"gpu": 1, "layout": LAYOUT}]
    body = sync(agent, change, jobs=[desired(7, [1])])
    assert agent.running() and probe.applied == [] and "mig_results" not in body
    body = sync(agent, change, jobs=[desired(7, [1])])
    assert probe.applied == [] and "mig_results" not in body
    body = sync(agent, change)  # the job is no longer wanted: it is stopped this round
    assert probe.applied == []
    agent.tick()
    assert not agent.running()
    body = sync(agent, change)
    assert probe.applied == [(1, LAYOUT)]
    assert body["mig_results"] == [{"gpu": 1, "layout": LAYOUT, "error": None}]


def test_refused_layouts_are_error_results_and_the_rest_goes_on(tmp_path: Path) -> None:
    probe = CountingProbe(node="n1", spec=SimSpec(gpus=3), mig={0: [], 2: []})
    agent = new_agent(tmp_path, probe)
    changes = [
        {"gpu": 0, "layout": ["7g.80gb", "1g.10gb"]},  # does not fit
        {"gpu": 1, "layout": LAYOUT},  # MIG mode off
        {"gpu": 2, "layout": LAYOUT},
        {"gpu": 5, "layout": LAYOUT},  # no such GPU
    ]
    body = sync(agent, changes)
    results = {r["gpu"]: r for r in body["mig_results"]}
    assert results[0]["error"] and results[0]["layout"] == ["7g.80gb", "1g.10gb"]
    assert "MIG mode is off on GPU 1" in results[1]["error"]
    assert results[2]["error"] is None
    assert "no GPU 5" in results[5]["error"]
    assert [m["profile"] for m in gpu(body, 2)["mig_instances"]] == LAYOUT
    assert gpu(body, 0)["mig_instances"] == [] and gpu(body, 1)["mig_enabled"] is False
    sync(agent, changes)
    assert len(probe.applied) == 4  # failures are not retried while the server asks either


def test_an_unexpected_exception_is_an_error_result(tmp_path: Path) -> None:
    class Broken(CountingProbe):
        def apply_mig_layout(self, gpu_index: int, profiles: Sequence[str]) -> tuple[MigInstance, ...]:
            raise RuntimeError("driver went away")

    agent = new_agent(tmp_path, Broken(node="n1", spec=SimSpec(gpus=1), mig={0: []}))
    body = sync(agent, [{"gpu": 0, "layout": LAYOUT}])
    assert body["mig_results"] == [{"gpu": 0, "layout": LAYOUT, "error": "RuntimeError: driver went away"}]


def test_a_probe_without_mig_support_reports_it(tmp_path: Path) -> None:
    agent = new_agent(tmp_path, NoMigProbe())
    body = sync(agent, [{"gpu": 0, "layout": LAYOUT}, {"gpu": 1, "layout": []}])
    assert body["mig_results"] == [
        {"gpu": 0, "layout": LAYOUT, "error": NO_MIG_PROBE},
        {"gpu": 1, "layout": [], "error": NO_MIG_PROBE},
    ]


def test_whole_gpu_without_a_mode_switch_removes_instances_and_says_what_is_left(tmp_path: Path) -> None:
    probe = CountingProbe(node="n1", spec=SimSpec(gpus=2), mig={0: LAYOUT})
    agent = new_agent(tmp_path, probe)
    body = sync(agent, [{"gpu": 0, "layout": []}, {"gpu": 1, "layout": []}])
    results = {r["gpu"]: r["error"] for r in body["mig_results"]}
    assert results[0] is not None and "nvidia-smi -i 0 -mig 0" in results[0]
    assert results[1] is None  # MIG mode off: whole already
    assert probe.applied == [(0, [])]
    assert gpu(body, 0)["mig_instances"] == []


@pytest.mark.parametrize("start", [LAYOUT, None], ids=["mig-on", "mig-off"])
def test_a_probe_that_switches_mig_mode_does_so(tmp_path: Path, start: list[str] | None) -> None:
    probe = CountingProbe(node="n1", spec=SimSpec(gpus=1), mig={0: start} if start else None, modes=True)
    agent = new_agent(tmp_path, probe)
    if start:
        body = sync(agent, [{"gpu": 0, "layout": []}])
        assert probe.switched == [(0, False)] and gpu(body, 0)["mig_enabled"] is False
    else:
        body = sync(agent, [{"gpu": 0, "layout": LAYOUT}])
        assert probe.switched == [(0, True)] and gpu(body, 0)["mig_enabled"] is True
        assert [m["profile"] for m in gpu(body, 0)["mig_instances"]] == LAYOUT
    assert body["mig_results"][0]["error"] is None


def test_a_job_on_mig_slices_sees_their_uuids(tmp_path: Path) -> None:
    """The server hands a job slice indices (``mig.slice_index``); the agent names the
    slices' ``MIG-...`` UUIDs in ``CUDA_VISIBLE_DEVICES``, and a slice that is not on the
    GPU (the layout changed) keeps the job from starting."""
    probe = SimulatedProbe(node="n1", spec=SimSpec(gpus=2), mig={1: ["3g.40gb", "3g.40gb"]})
    agent = new_agent(tmp_path, probe)
    second = next(m for m in agent.inventory.gpus[1].mig_instances if m.start == 4)
    assert agent._devices([mig.slice_index(1, 4)]) == (second.uuid,)
    assert agent._devices([0]) == ()
    assert agent._devices([mig.slice_index(1, 2)]) is None
    spec = JobSpec(job_id=7, attempt=1, gpus=(mig.slice_index(1, 4),), devices=(second.uuid,))
    env = launch_env(spec, node="n1", checkpoint_dir="/c", hostfile="/h", base={})
    assert env["CUDA_VISIBLE_DEVICES"] == second.uuid == env["NVIDIA_VISIBLE_DEVICES"]
    sync(agent, [], jobs=[desired(7, [mig.slice_index(1, 4)]), desired(8, [mig.slice_index(1, 2)])])
    assert set(agent.jobs) == {(7, 1)}
    body = sync(agent, [{"gpu": 1, "layout": ["7g.80gb"]}], jobs=[desired(7, [mig.slice_index(1, 4)])])
    assert "mig_results" not in body  # the GPU holds a running slice job: the layout waits
    assert [m.profile for m in probe.inventory().gpus[1].mig_instances] == ["3g.40gb", "3g.40gb"]
