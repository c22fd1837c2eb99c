"""GPU probes: the simulated one (load, faults, health) and the NVML translation layer
against a pynvml-shaped fake (``fake_nvml``) passed in."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agent.fake_nvml import LIBRARY_NOT_FOUND, FakeGpu, FakeNvml
from gpufleet.agent import (
    GpuSample,
    HealthTracker,
    NvmlProbe,
    ProbeError,
    SimSpec,
    SimulatedProbe,
    gpu_health,
)
from gpufleet.agent.probe import nvlink_domains
from gpufleet.clock import FakeClock


def sim(gpus: int = 4) -> tuple[SimulatedProbe, FakeClock]:
    clock = FakeClock()
    return SimulatedProbe(node="n1", spec=SimSpec(gpus=gpus), clock=clock, seed=1), clock


def test_simulated_inventory_is_an_hgx_board() -> None:
    probe, _ = sim(8)
    inv = probe.inventory()
    assert [g.index for g in inv.gpus] == list(range(8))
    assert {g.model for g in inv.gpus} == {"H100-80GB"}
    assert inv.gpus[3].nvlink_peers == (0, 1, 2, 4, 5, 6, 7)
    assert len({g.uuid for g in inv.gpus}) == 8 and inv.cuda_version == "12.4"


def test_simulated_telemetry_follows_the_load() -> None:
    probe, clock = sim()
    idle = probe.sample()
    probe.set_load({1: 1.0})
    clock.advance(120)  # six thermal time constants: steady state
    busy = {s.index: s for s in probe.sample()}
    assert idle[1].utilization_pct == 0 and "gpu_idle" in idle[1].throttle_reasons
    assert busy[1].utilization_pct is not None and busy[1].utilization_pct >= 95
    assert busy[1].power_w is not None and busy[1].power_w > 600
    assert busy[1].temperature_c is not None and busy[1].temperature_c > 75
    assert busy[1].memory_used_mb and busy[0].memory_used_mb == 0
    assert busy[0].temperature_c is not None and busy[0].temperature_c < 40
    probe.set_load({})
    clock.advance(120)
    assert probe.sample()[1].temperature_c == pytest.approx(32, abs=1)


FAULTS: list[tuple[str, Callable[[SimulatedProbe], None], str]] = [
    ("overheat", lambda p: p.overheat(2), "overheat"),
    ("xid-79", lambda p: p.xid(2, 79), "xid 79"),
    ("ecc-double-bit", lambda p: p.ecc_double_bit(2), "ecc double-bit"),
    ("gpu-lost", lambda p: p.lose(2), "gpu lost"),
]


@pytest.mark.parametrize(("inject", "reason"), [(f, r) for _, f, r in FAULTS], ids=[i for i, _, _ in FAULTS])
def test_injected_faults_make_the_gpu_unhealthy(
    inject: Callable[[SimulatedProbe], None], reason: str
) -> None:
    probe, _ = sim()
    tracker = HealthTracker()
    assert all(v.healthy for v in tracker.update(probe.sample()).values())
    inject(probe)
    verdicts = tracker.update(probe.sample())
    assert not verdicts[2].healthy and any(r.startswith(reason) for r in verdicts[2].reasons)
    assert all(verdicts[i].healthy for i in (0, 1, 3))


@pytest.mark.parametrize(
    ("inject", "sticky"),
    [(lambda p: p.overheat(0), False), (lambda p: p.xid(0, 48), True)],
    ids=["overheat-clears-when-cool", "xid-stays-until-restart"],
)
def test_which_faults_stick(inject: Callable[[SimulatedProbe], None], sticky: bool) -> None:
    probe, clock = sim()
    tracker = HealthTracker()
    inject(probe)
    assert not tracker.update(probe.sample())[0].healthy
    probe.clear(0)
    clock.advance(300)
    assert tracker.update(probe.sample())[0].healthy is (not sticky)


@pytest.mark.parametrize(
    ("sample", "healthy"),
    [
        (GpuSample(index=0, temperature_c=70.0), True),
        (GpuSample(index=0, temperature_c=91.0), False),
        (GpuSample(index=0, xid_events=(13,)), True),  # an application fault, not the GPU's
        (GpuSample(index=0, xid_events=(13, 95)), False),
        (GpuSample(index=0, ecc_sbe=12, ecc_dbe=0), True),
        (GpuSample(index=0, ecc_dbe=1), False),
        (GpuSample(index=0, lost=True), False),
    ],
    ids=["normal", "hot", "xid-13", "xid-95", "sbe-only", "dbe", "lost"],
)
def test_gpu_health(sample: GpuSample, healthy: bool) -> None:
    assert gpu_health(sample).healthy is healthy


@pytest.mark.parametrize(
    ("peers", "want"),
    [
        ({0: [], 1: [], 2: []}, {0: 0, 1: 1, 2: 2}),
        ({0: [1], 1: [0], 2: [3], 3: [2]}, {0: 0, 1: 0, 2: 1, 3: 1}),
        ({0: [1, 2, 3], 1: [0], 2: [0], 3: [0]}, {0: 0, 1: 0, 2: 0, 3: 0}),
    ],
    ids=["no-nvlink", "pairs", "star"],
)
def test_nvlink_domains(peers: dict[int, list[int]], want: dict[int, int]) -> None:
    assert nvlink_domains(peers) == want


# -- NVML translation ---------------------------------------------------------------------------


def board(n: int = 4, **kw: object) -> list[FakeGpu]:
    return [FakeGpu(uuid=f"GPU-{i}".encode(), bus_id=f"00000000:{0x18 + i:02X}:00.0", **kw) for i in range(n)]  # type: ignore[arg-type]


def test_nvml_inventory_translates_fields() -> None:
    gpus = board(2)
    gpus[0].mig = 1
    inv = NvmlProbe(nvml=FakeNvml(gpus)).inventory()
    assert inv.driver_version == "550.54.15" and inv.cuda_version == "12.4"
    g0 = inv.gpus[0]
    assert (g0.uuid, g0.model, g0.memory_mb) == ("GPU-0", "NVIDIA H100 80GB HBM3", 81_559)
    assert (g0.pcie_gen, g0.pcie_width, g0.mig_enabled) == (5, 16, True)
    assert inv.gpus[1].mig_enabled is False


@pytest.mark.parametrize(
    ("links", "peers", "domains"),
    [
        ({}, [(), (), (), ()], [0, 1, 2, 3]),
        ({0: [1], 1: [0], 2: [3], 3: [2]}, [(1,), (0,), (3,), (2,)], [0, 0, 1, 1]),
        ({i: ["switch"] * 2 for i in range(4)}, [(1, 2, 3), (0, 2, 3), (0, 1, 3), (0, 1, 2)], [0, 0, 0, 0]),
    ],
    ids=["pcie-only", "nvlink-pairs", "nvswitch"],
)
def test_nvml_nvlink_topology(
    links: dict[int, list[object]], peers: list[tuple[int, ...]], domains: list[int]
) -> None:
    gpus = board(4)
    for i, remote in links.items():
        gpus[i].links = [r if r == "switch" else gpus[r].bus_id for r in remote]  # type: ignore[index]
    inv = NvmlProbe(nvml=FakeNvml(gpus)).inventory()
    assert [g.nvlink_peers for g in inv.gpus] == peers
    assert [g.nvlink_domain for g in inv.gpus] == domains


def test_nvml_sample_translates_units_and_throttle_reasons() -> None:
    gpus = board(1, throttle=0x40 | 0x4, sbe=3, dbe=0, replay=7)
    s = NvmlProbe(nvml=FakeNvml(gpus)).sample()[0]
    assert (s.utilization_pct, s.memory_used_mb, s.temperature_c, s.power_w) == (42.0, 1024, 55.0, 312.0)
    assert (s.sm_clock_mhz, s.mem_clock_mhz, s.ecc_sbe, s.ecc_dbe, s.pcie_replay) == (1980, 2619, 3, 0, 7)
    assert set(s.throttle_reasons) == {"sw_power_cap", "hw_thermal_slowdown"}


def test_nvml_unsupported_fields_are_none() -> None:
    gpus = board(1, unsupported={"ecc", "power", "replay", "mig", "pcie"})
    probe = NvmlProbe(nvml=FakeNvml(gpus))
    s = probe.sample()[0]
    assert (s.ecc_sbe, s.ecc_dbe, s.power_w, s.pcie_replay) == (None, None, None, None)
    assert s.utilization_pct == 42.0
    g = probe.inventory().gpus[0]
    assert (g.mig_enabled, g.pcie_gen) == (None, None)


@pytest.mark.parametrize(
    ("sbe_pages", "dbe_pages", "want"),
    [(0, 0, 0), (3, 0, 3), (0, 2, 2), (40, 25, 65)],
    ids=["none", "single-bit-only", "double-bit-only", "both-causes"],
)
def test_nvml_retired_pages_count_both_causes(sbe_pages: int, dbe_pages: int, want: int) -> None:
    s = NvmlProbe(nvml=FakeNvml(board(1, retired_sbe=sbe_pages, retired_dbe=dbe_pages))).sample()[0]
    assert s.retired_pages == want


class PynvmlErrors(FakeNvml):
    """The fake raising pynvml's own exception classes (a subclass per return code)."""

    def __init__(self, gpus: list[FakeGpu]) -> None:
        super().__init__(gpus)
        pynvml = pytest.importorskip("pynvml")
        self.NVMLError = pynvml.NVMLError
        self.NVMLError_NotSupported = pynvml.NVMLError_NotSupported


@pytest.mark.parametrize("lib", [FakeNvml, PynvmlErrors], ids=["fake-errors", "pynvml-errors"])
def test_nvml_retired_pages_unsupported_is_none(lib: Callable[[list[FakeGpu]], FakeNvml]) -> None:
    gpus = board(2, retired_dbe=70)
    gpus[0].unsupported = {"retired_pages"}  # row remapping (A100, H100): no page retirement
    samples = NvmlProbe(nvml=lib(gpus)).sample()
    assert samples[0].retired_pages is None and samples[0].temperature_c == 55.0 and not samples[0].lost
    assert samples[1].retired_pages == 70


def test_nvml_without_retired_pages_function_is_none() -> None:
    class OldNvml(FakeNvml):
        nvmlDeviceGetRetiredPages = None  # type: ignore[assignment]  # bindings predating the call

    assert NvmlProbe(nvml=OldNvml(board(1))).sample()[0].retired_pages is None


def test_nvml_xid_events_are_drained_per_gpu_without_blocking() -> None:
    lib = FakeNvml(board(2))
    probe = NvmlProbe(nvml=lib)
    lib.xids = [(1, 79), (1, 48), (0, 13)]
    first = {s.index: s.xid_events for s in probe.sample()}
    assert first == {0: (13,), 1: (79, 48)}
    assert all(s.xid_events == () for s in probe.sample())


def test_nvml_lost_gpu_is_a_sample_not_an_error() -> None:
    gpus = board(2)
    probe = NvmlProbe(nvml=FakeNvml(gpus))
    gpus[1].lost = True
    samples = probe.sample()
    assert samples[1].lost and not samples[0].lost
    assert not gpu_health(samples[1]).healthy
    assert [g.index for g in probe.inventory().gpus] == [0]


def test_nvml_init_failure_is_a_probe_error() -> None:
    with pytest.raises(ProbeError, match="initialise NVML"):
        NvmlProbe(nvml=FakeNvml([], init_error=LIBRARY_NOT_FOUND))


def test_real_nvml_without_a_driver_fails_clearly() -> None:
    try:
        probe = NvmlProbe()
    except ProbeError as exc:
        assert "NVML" in str(exc)
        assert isinstance(exc.__cause__, Exception)
    else:  # a machine with a GPU driver: the probe works
        probe.close()


def test_nvml_probe_reload_reads_the_new_driver() -> None:
    """After a driver upgrade without a reboot the agent reloads NVML (``NvmlProbe.reload``):
    the inventory then names the new driver and the devices it now sees, and the old
    library handle was shut down first."""
    from agent.fake_nvml import FakeGpu, FakeNvml
    from gpufleet.agent import NvmlProbe

    gpus = [FakeGpu(uuid=f"GPU-{i}".encode(), bus_id=f"00000000:{0x18 + i:02X}:00.0") for i in range(2)]
    lib = FakeNvml(gpus)
    probe = NvmlProbe(nvml=lib)
    assert probe.inventory().driver_version == "550.54.15" and lib.inits == 1
    lib.driver = "560.35.03"
    gpus.append(FakeGpu(uuid=b"GPU-2", bus_id="00000000:1A:00.0"))
    probe.reload()
    assert lib.inits == 2 and not lib.shut_down
    inv = probe.inventory()
    assert inv.driver_version == "560.35.03"
    assert [g.uuid for g in inv.gpus] == ["GPU-0", "GPU-1", "GPU-2"]
    assert len(probe.sample()) == 3
    probe.close()
    assert lib.shut_down
