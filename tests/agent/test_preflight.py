"""The agent's preflight (issue 34): the checks as a table on samples, on the simulated
probe with injected faults and on the NVML translation layer (``fake_nvml``); the agent
sends the findings with its next sync until one is answered; and on a running server
a fatal finding cordons the node with the reason, a clean preflight uncordons nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.fake_nvml import FakeGpu, FakeNvml
from gpufleet.agent import AgentConfig, HttpTransport, NvmlProbe, SimSpec, SimulatedProbe, make_agent
from gpufleet.agent.preflight import Finding, PreflightLimits, check_gpu, preflight, report
from gpufleet.agent.probe import GpuSample, ProbeError
from gpufleet.api.nodes import Preflight
from gpufleet.clock import FakeClock
from jobaccounts import passable, run_as
from server.conftest import ADMIN_TOKEN, Server, make_pool, ok, unique

OK: dict[str, Any] = dict(
    index=0, temperature_c=40.0, utilization_pct=0.0, throttle_reasons=("gpu_idle",), ecc_dbe=0,
    pcie_gen=1, pcie_width=16, pcie_max_gen=5, pcie_max_width=16, ecc_enabled=True, ecc_pending=True,
)  # fmt: skip


def sample(**kw: Any) -> GpuSample:
    return GpuSample(**{**OK, **kw})


GPU_CASES = [
    ("healthy_idle_gen1", sample(), []),
    ("lost", sample(lost=True), [("gpu_lost", "fatal")]),
    ("hot", sample(temperature_c=85.0), [("temperature", "fatal")]),
    ("warm", sample(temperature_c=84.0), []),
    ("dbe", sample(ecc_dbe=1), [("ecc_dbe", "fatal")]),
    ("xid_79", sample(xid_events=(79, 13)), [("xid", "fatal")]),
    ("harmless_xid", sample(xid_events=(13,)), []),
    ("ecc_off", sample(ecc_enabled=False, ecc_pending=False), [("ecc_mode", "fatal")]),
    ("ecc_turning_on", sample(ecc_enabled=False, ecc_pending=True),
     [("ecc_mode", "fatal"), ("ecc_pending", "warning")]),
    ("ecc_unsupported", sample(ecc_enabled=None, ecc_pending=None), []),
    ("x8", sample(pcie_width=8), [("pcie", "fatal")]),
    ("gen3_under_load", sample(pcie_gen=3, utilization_pct=95.0, throttle_reasons=()), [("pcie", "fatal")]),
    ("gen5_under_load", sample(pcie_gen=5, utilization_pct=95.0, throttle_reasons=()), []),
    ("links_down", sample(nvlink_down=(3,)), [("nvlink", "fatal")]),
]  # fmt: skip


@pytest.mark.parametrize(("s", "want"), [c[1:] for c in GPU_CASES], ids=[c[0] for c in GPU_CASES])
def test_check_gpu(s: GpuSample, want: list[tuple[str, str]]) -> None:
    found = check_gpu(s, PreflightLimits())
    assert [(f.check, f.severity) for f in found] == want
    assert all(f.reason.startswith("GPU 0: ") and f.gpu == 0 for f in found)


def test_ecc_off_allowed() -> None:
    assert check_gpu(sample(ecc_enabled=False, ecc_pending=False), PreflightLimits(require_ecc=False)) == []


def sim(**faults: Any) -> SimulatedProbe:
    probe = SimulatedProbe(node="n1", spec=SimSpec(gpus=4), clock=FakeClock(), seed=1)
    for name, arg in faults.items():
        getattr(probe, name)(*arg) if isinstance(arg, tuple) else getattr(probe, name)(arg)
    return probe


SIM_CASES = [
    ("clean", {}, []),
    ("downtrained", {"downtrain": 2}, [("pcie", 2, "GPU 2: PCIe link downtrained: x8 of x16")]),
    ("nvlink", {"nvlink_fail": (1, (0, 4))}, [("nvlink", 1, "GPU 1: NVLink links 0,4 down")]),
    ("ecc_off", {"ecc_disable": 3}, [("ecc_mode", 3, "GPU 3: ECC disabled (supported by this GPU)")]),
    ("overheat", {"overheat": 0}, [("temperature", 0, "GPU 0: 97 C, limit 85 C")]),
]  # fmt: skip


@pytest.mark.parametrize(("faults", "want"), [c[1:] for c in SIM_CASES], ids=[c[0] for c in SIM_CASES])
def test_preflight_on_the_simulated_probe(faults: dict[str, Any], want: list[tuple[str, int, str]]) -> None:
    assert [(f.check, f.gpu, f.reason) for f in preflight(sim(**faults))] == want


def test_expected_driver_after_an_upgrade() -> None:
    (f,) = preflight(sim(), PreflightLimits(expect_driver="560.28.03"))
    assert (f.check, f.severity, f.reason) == ("driver", "fatal", "driver 550.54.15-sim, expected 560.28.03")
    assert preflight(sim(), PreflightLimits(expect_driver="550.54.15-sim")) == []


def test_a_probe_that_cannot_read_is_fatal() -> None:
    class Broken(SimulatedProbe):
        def sample(self) -> tuple[GpuSample, ...]:
            raise ProbeError("NVML: cannot initialise")

    (f,) = preflight(Broken(node="n1"))
    assert (f.check, f.severity) == ("nvml", "fatal") and "cannot initialise" in f.reason


def test_nvml_reports_links_ecc_and_max_pcie() -> None:
    gpus = [FakeGpu(uuid=f"GPU-{i}".encode(), bus_id=f"00000000:{0x18 + i:02X}:00.0") for i in range(3)]
    for g in gpus:
        g.links = ["switch"] * 4
    gpus[0].pcie, gpus[0].pcie_max = (4, 8), (5, 16)
    gpus[1].links_down = {2}
    gpus[2].ecc = (0, 1)
    probe = NvmlProbe(nvml=FakeNvml(gpus))
    s = probe.sample()
    assert (s[0].pcie_gen, s[0].pcie_width, s[0].pcie_max_gen, s[0].pcie_max_width) == (4, 8, 5, 16)
    assert [x.nvlink_down for x in s] == [(), (2,), ()]
    assert [(x.ecc_enabled, x.ecc_pending) for x in s] == [(True, True), (True, True), (False, True)]
    found = {(f.check, f.gpu) for f in preflight(probe)}
    # GPU 0's generation (4 of 5) counts only under load: the fake is at 42 %, busy
    assert found == {("pcie", 0), ("nvlink", 1), ("ecc_mode", 2), ("ecc_pending", 2)}


def test_nvml_without_ecc_or_nvlink_reports_none() -> None:
    gpus = [FakeGpu(unsupported={"ecc_mode", "nvlink"})]
    s = NvmlProbe(nvml=FakeNvml(gpus)).sample()[0]
    assert (s.ecc_enabled, s.ecc_pending, s.nvlink_down) == (None, None, ())


def test_report_is_what_the_server_takes() -> None:
    findings = [Finding(check="pcie", severity="fatal", reason="GPU 1: x" * 100, gpu=1)]
    body = report(findings, at=12.5)
    parsed = Preflight.model_validate(body)
    assert parsed.findings[0].gpu == 1 and len(parsed.findings[0].reason) == 256


class Recorder:
    """A transport that answers every sync with nothing to run (and keeps the bodies)."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def sync(self, node: str, body: dict[str, Any]) -> dict[str, Any]:
        self.bodies.append(body)
        return {"node": node, "jobs": []}

    def close(self) -> None:
        pass


def test_agent_sends_findings_once_answered(tmp_path: Path) -> None:
    probe = sim(downtrain=1)
    transport = Recorder()
    agent = make_agent(config=AgentConfig(node="n1", work_dir=tmp_path), probe=probe, transport=transport)
    assert agent.sync_once() and agent.sync_once()
    first, second = transport.bodies
    assert [f["check"] for f in first["preflight"]["findings"]] == ["pcie"]
    assert "preflight" not in second  # delivered: not again
    probe.clear(1)
    assert agent.run_preflight() == [] and agent.preflight_report is None  # all passed: nothing to send


# -- on a running server ----------------------------------------------------------------------


def _node(server: Server, work: Path, probe_faults: dict[str, Any]) -> tuple[str, Any]:
    pool = make_pool(server)
    node = unique("pf")
    passable(work)
    with server.client() as c:
        ok(c.put(f"/nodes/{node}", json={"pool": pool, "gpus": []}))
    probe = SimulatedProbe(node=node, spec=SimSpec(gpus=2))
    for name, arg in probe_faults.items():
        getattr(probe, name)(arg)
    transport = HttpTransport(server.url, ADMIN_TOKEN)
    config = AgentConfig(node=node, work_dir=work / node, address="127.0.0.1", news_gap_s=0.0)
    return node, make_agent(config=config, probe=probe, transport=transport, run_as=run_as())


def test_server_cordons_a_node_whose_preflight_fails(server: Server, tmp_path: Path) -> None:
    node, agent = _node(server, tmp_path, {"downtrain": 1, "ecc_disable": 0})
    try:
        assert agent.sync_once()
        with server.client() as c:
            got = ok(c.get(f"/nodes/{node}"))
            assert got["cordoned"], got
            assert got["cordon_reason"] == (
                "preflight: GPU 0: ECC disabled (supported by this GPU); "
                "GPU 1: PCIe link downtrained: x8 of x16"
            )
            events = ok(c.get("/fleet/events", params={"node": node}))
        assert any(e["kind"] == "cordoned" and e["actor"] == "preflight" for e in events)
        # a clean preflight later (the link reseated) uncordons nothing: an operator does
        agent.probe.clear(0)
        agent.probe.clear(1)
        assert agent.run_preflight() == [] and agent.sync_once()
        with server.client() as c:
            assert ok(c.get(f"/nodes/{node}"))["cordoned"]
    finally:
        agent.close()


def test_server_leaves_a_clean_node_alone(server: Server, tmp_path: Path) -> None:
    node, agent = _node(server, tmp_path, {})
    try:
        assert agent.preflight_report is None and agent.sync_once()
        with server.client() as c:
            assert not ok(c.get(f"/nodes/{node}"))["cordoned"]
    finally:
        agent.close()
