"""Per-MIG-instance telemetry: NvmlProbe reads each MIG device's memory (the pynvml-shaped
fake), the simulated probe makes it follow the GPU's load, and the sync's telemetry takes
it, or nothing from an older agent. No utilisation per instance: NVML has none."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from agent.fake_nvml import FakeGpu, FakeNvml, mig_gpu
from gpufleet.agent import NvmlProbe, SimSpec, SimulatedProbe
from gpufleet.agent.probe import MigSample
from gpufleet.api.nodes import GpuTelemetry
from gpufleet.clock import FakeClock

H100 = "NVIDIA H100 80GB HBM3"


def _three_instances(g: FakeGpu) -> None:
    g.gis = mig_gpu("H100-80GB", [("3g.40gb", 4), ("2g.20gb", 0), ("1g.10gb", 2)])
    for gi, used in zip(g.gis, (30_000, 512, 0), strict=True):
        gi.used_mb = used


def _mig_off(g: FakeGpu) -> None:
    g.mig = 0


def _no_mig_memory(g: FakeGpu) -> None:
    _three_instances(g)
    g.unsupported.add("mig_devices")


@pytest.mark.parametrize(
    ("arrange", "want"),
    [
        (
            _three_instances,
            # by GPU instance id (mig_gpu numbers them in layout order); memory in MiB
            [(1, 30_000, 40_960 - 256), (2, 512, 20_480 - 256), (3, 0, 10_240 - 256)],
        ),
        (_mig_off, []),
        (_no_mig_memory, []),  # the driver cannot list MIG devices: none, the GPU's sample stands
    ],
    ids=["three-instances", "mig-off", "mig-devices-unsupported"],
)
def test_nvml_samples_each_mig_instances_memory(
    arrange: Callable[[FakeGpu], None], want: list[object]
) -> None:
    g = FakeGpu(name=H100, mig=1)
    arrange(g)
    (s,) = NvmlProbe(nvml=FakeNvml([g])).sample()
    assert not s.lost and s.utilization_pct == 42  # the GPU's own readings are untouched
    got = [(m.gpu_instance_id, m.memory_used_mb, m.memory_total_mb) for m in s.mig_instances]
    assert got == want


def test_simulated_instances_follow_their_gpus_load() -> None:
    probe = SimulatedProbe(
        node="n1", spec=SimSpec(gpus=2), clock=FakeClock(), mig={0: ["3g.40gb", "1g.10gb"], 1: []}
    )
    totals = [81_559 * 4 // 8, 81_559 * 1 // 8]  # memory slices of 8
    idle0, idle1 = probe.sample()
    got = [(m.gpu_instance_id, m.memory_used_mb, m.memory_total_mb) for m in idle0.mig_instances]
    assert got == [(1, 0, totals[0]), (2, 0, totals[1])]
    assert idle1.mig_instances == ()  # MIG mode on, no instances
    probe.set_load({0: 1.0})
    busy, _ = probe.sample()
    used = busy.memory_used_mb
    assert used is not None and used > 0
    # each instance uses the share of its memory that the GPU's memory is in use
    busy_got = [(m.memory_used_mb, m.memory_total_mb) for m in busy.mig_instances]
    assert busy_got == [(t * used // 81_559, t) for t in totals]


def test_sync_telemetry_takes_instances_and_older_agents_without() -> None:
    row = {"index": 0, "utilization_pct": None, "memory_used_mb": 30_512}
    old = GpuTelemetry.model_validate(row)
    assert old.mig_instances == []
    sample = MigSample(gpu_instance_id=1, memory_used_mb=30_000, memory_total_mb=40_704)
    new = GpuTelemetry.model_validate(row | {"mig_instances": [dataclasses.asdict(sample)]})
    assert new.mig_instances[0].model_dump() == dataclasses.asdict(sample)
