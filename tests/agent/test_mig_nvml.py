"""MIG through the probes: NvmlProbe's enumeration and ``apply_mig_layout`` against the
pynvml-shaped fake, and the simulated probe's layouts."""

from __future__ import annotations

import pytest

from agent.fake_nvml import NO_PERMISSION, FakeGpu, FakeNvml, mig_gpu
from gpufleet.agent import NvmlProbe, SimSpec, SimulatedProbe
from gpufleet.agent.probe import MigError, MigInstance

A100 = "NVIDIA A100-SXM4-40GB"


def a100s(n: int = 2, *, mig: int = 1) -> list[FakeGpu]:
    return [
        FakeGpu(
            name=A100,
            uuid=f"GPU-{i}".encode(),
            bus_id=f"00000000:{0x18 + i:02X}:00.0",
            total_mb=40_960,
            mig=mig,
        )
        for i in range(n)
    ]


def shape(instances: tuple[MigInstance, ...]) -> list[tuple[str, int, int]]:
    return [(m.profile, m.start, m.size) for m in instances]


# -- inventory ------------------------------------------------------------------------------------


def test_inventory_lists_mig_devices_with_profiles_placements_and_memory() -> None:
    gpus = a100s()
    gpus[0].gis = mig_gpu("A100-40GB", [("3g.20gb", 4), ("2g.10gb", 0), ("1g.5gb", 2)])
    gpus[1].mig = 0
    inv = NvmlProbe(nvml=FakeNvml(gpus)).inventory()
    g0 = inv.gpus[0]
    assert g0.mig_enabled is True
    assert shape(g0.mig_instances) == [("2g.10gb", 0, 2), ("1g.5gb", 2, 1), ("3g.20gb", 4, 4)]
    assert [m.uuid for m in g0.mig_instances] == ["MIG-0-2-old", "MIG-0-3-old", "MIG-0-1-old"]
    assert [(m.gpu_instance_id, m.compute_instance_id) for m in g0.mig_instances] == [(2, 0), (3, 0), (1, 0)]
    assert [m.memory_mb for m in g0.mig_instances] == [10_240 - 256, 5_120 - 256, 20_480 - 256]
    assert inv.gpus[1].mig_enabled is False and inv.gpus[1].mig_instances == ()


def test_profile_the_table_lacks_is_named_from_the_mig_device() -> None:
    gpus = a100s(1)
    gpus[0].gis = mig_gpu("A100-40GB", [("1g.5gb", 0)])
    gpus[0].gis[0].profile_id, gpus[0].gis[0].name = 33, "1g.5gb-nome"  # an ID no table index has
    (m,) = NvmlProbe(nvml=FakeNvml(gpus)).inventory().gpus[0].mig_instances
    assert (m.profile, m.start) == ("1g.5gb-nome", 0)


@pytest.mark.parametrize("what", ["mig_devices", "gpu_instance_info"], ids=["device-count", "gi-info"])
def test_unsupported_mig_calls_give_no_instances(what: str) -> None:
    gpus = a100s(1)
    gpus[0].gis = mig_gpu("A100-40GB", [("7g.40gb", 0)])
    gpus[0].unsupported = {what}
    g = NvmlProbe(nvml=FakeNvml(gpus)).inventory().gpus[0]
    assert g.mig_enabled is True and g.mig_instances == () and g.memory_mb == 40_960


# -- apply ----------------------------------------------------------------------------------------


def test_apply_destroys_the_old_instances_then_creates_at_the_placements() -> None:
    gpus = a100s()
    gpus[0].gis = mig_gpu("A100-40GB", [("3g.20gb", 0), ("3g.20gb", 4)])
    lib = FakeNvml(gpus)
    got = NvmlProbe(nvml=lib).apply_mig_layout(0, ["1g.5gb", "3g.20gb", "2g.10gb"])
    assert shape(got) == [("3g.20gb", 0, 4), ("2g.10gb", 4, 2), ("1g.5gb", 6, 1)]
    assert all(m.uuid.startswith("MIG-") and "old" not in m.uuid for m in got)
    kinds = [e[0] for e in lib.log]
    assert kinds == [
        "destroy_ci",
        "destroy_gi",
        "destroy_ci",
        "destroy_gi",
        "create_gi",
        "create_gi",
        "create_gi",
    ]
    assert [e[1:] for e in lib.log if e[0] == "create_gi"] == [
        ("3g.20gb", "0"),
        ("2g.10gb", "4"),
        ("1g.5gb", "6"),
    ]
    assert all(len(gi.cis) == 1 for gi in gpus[0].gis)
    assert gpus[1].gis == []


def test_apply_an_empty_layout_removes_every_instance() -> None:
    gpus = a100s(1)
    gpus[0].gis = mig_gpu("A100-40GB", [("1g.5gb", 0), ("1g.5gb", 1)])
    assert NvmlProbe(nvml=FakeNvml(gpus)).apply_mig_layout(0, []) == ()
    assert gpus[0].gis == []


def refuse(gpus: list[FakeGpu], layout: list[str], *, fail: dict[str, int] | None = None) -> str:
    before = [(gi.id, gi.start, [c.uuid for c in gi.cis]) for gi in gpus[0].gis]
    lib = FakeNvml(gpus)
    lib.fail = fail or {}
    with pytest.raises(MigError) as err:
        NvmlProbe(nvml=lib).apply_mig_layout(0, layout)
    if not fail:  # a refusal before any change leaves the GPU as it was
        assert [(gi.id, gi.start, [c.uuid for c in gi.cis]) for gi in gpus[0].gis] == before
    return str(err.value)


def test_refuses_when_mig_mode_is_off() -> None:
    msg = refuse(a100s(1, mig=0), ["7g.40gb"])
    assert msg == "MIG mode is off on GPU 0: enable it with nvidia-smi -i 0 -mig 1 (needs a GPU reset)"


def test_refuses_an_illegal_layout_with_the_table_reason() -> None:
    gpus = a100s(1)
    gpus[0].gis = mig_gpu("A100-40GB", [("7g.40gb", 0)])
    msg = refuse(gpus, ["4g.20gb", "4g.20gb"])
    assert msg.startswith("GPU 0: 4g.20gb x2 does not fit an A100-40GB")
    assert "unknown profile 2g.20gb for A100-40GB" in refuse(a100s(1), ["2g.20gb"])


def test_refuses_while_a_process_runs_on_a_mig_device() -> None:
    gpus = a100s(1)
    gpus[0].gis = mig_gpu("A100-40GB", [("3g.20gb", 0), ("3g.20gb", 4)])
    gpus[0].gis[1].cis[0].processes = [4242]
    msg = refuse(gpus, ["7g.40gb"])
    assert "in use" in msg and "MIG-0-2-old: pid 4242" in msg


def test_no_permission_says_it_needs_root() -> None:
    gpus = a100s(1)
    msg = refuse(gpus, ["7g.40gb"], fail={"nvmlDeviceCreateGpuInstanceWithPlacement": NO_PERMISSION})
    assert msg.startswith("GPU 0: cannot create GPU instance 7g.40gb at memory slice 0: no permission")
    assert "needs root" in msg


def test_insufficient_resources_names_what_was_created_before() -> None:
    gpus = a100s(1)
    lib = FakeNvml(gpus)
    probe = NvmlProbe(nvml=lib)
    probe.apply_mig_layout(0, ["3g.20gb"])
    # an instance appears behind our back between destroy and create: the second create fails
    real_create = lib.nvmlDeviceCreateGpuInstanceWithPlacement

    def create(h: int, pid: int, placement: object) -> int:
        ref = real_create(h, pid, placement)
        if len(gpus[0].gis) == 1:
            gpus[0].gis.extend(mig_gpu("A100-40GB", [("1g.5gb", 4)]))
            gpus[0].gis[-1].id = 9
        return ref

    lib.nvmlDeviceCreateGpuInstanceWithPlacement = create  # type: ignore[method-assign]
    with pytest.raises(MigError, match=r"insufficient resources.*created before it: 3g.20gb@0"):
        probe.apply_mig_layout(0, ["3g.20gb", "3g.20gb"])


# -- simulated ------------------------------------------------------------------------------------


def test_simulated_layouts_are_reported_with_stable_uuids() -> None:
    def probe() -> SimulatedProbe:
        return SimulatedProbe(
            node="n1", spec=SimSpec(gpus=2), mig={0: ["3g.40gb", "1g.10gb", "1g.10gb"], 1: []}
        )

    inv = probe().inventory()
    g0, g1 = inv.gpus
    assert shape(g0.mig_instances) == [("3g.40gb", 0, 4), ("1g.10gb", 4, 1), ("1g.10gb", 5, 1)]
    assert (
        all(m.uuid.startswith("MIG-") for m in g0.mig_instances)
        and len({m.uuid for m in g0.mig_instances}) == 3
    )
    assert [m.uuid for m in probe().inventory().gpus[0].mig_instances] == [m.uuid for m in g0.mig_instances]
    assert g0.mig_instances[0].memory_mb == 81_559 * 4 // 8
    assert (g0.mig_enabled, g1.mig_enabled, g1.mig_instances) == (True, True, ())
    plain = SimulatedProbe(node="n1", spec=SimSpec(gpus=1)).inventory().gpus[0]
    assert (plain.mig_enabled, plain.mig_instances) == (False, ())


@pytest.mark.parametrize(
    ("spec", "mig", "match"),
    [
        (SimSpec(gpus=1, model="RTX-4090"), {0: ["1g.10gb"]}, "not in the MIG table"),
        (SimSpec(gpus=1), {0: ["7g.80gb", "1g.10gb"]}, "compute slices"),
        (SimSpec(gpus=1), {3: ["7g.80gb"]}, "node has 1 GPUs"),
    ],
    ids=["unknown-model", "illegal-layout", "no-such-gpu"],
)
def test_simulated_bad_layouts_fail_at_construction(
    spec: SimSpec, mig: dict[int, list[str]], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        SimulatedProbe(node="n1", spec=spec, mig=mig)


def test_simulated_apply_replaces_and_refuses() -> None:
    probe = SimulatedProbe(node="n1", spec=SimSpec(gpus=2), mig={0: ["7g.80gb"]})
    got = probe.apply_mig_layout(0, ["2g.20gb", "2g.20gb"])
    assert shape(got) == [("2g.20gb", 0, 2), ("2g.20gb", 2, 2)]
    assert probe.inventory().gpus[0].mig_instances == got
    with pytest.raises(MigError, match="MIG mode is off on GPU 1: enable it with nvidia-smi -i 1 -mig 1"):
        probe.apply_mig_layout(1, ["7g.80gb"])
    with pytest.raises(MigError, match=r"4g\.40gb x2 does not fit"):
        probe.apply_mig_layout(0, ["4g.40gb", "4g.40gb"])
    probe.set_load({0: 0.5})
    with pytest.raises(MigError, match="in use"):
        probe.apply_mig_layout(0, ["7g.80gb"])
    assert probe.inventory().gpus[0].mig_instances == got


def test_mig_mode_off_takes_effect_or_says_a_reset_is_pending() -> None:
    gpus = a100s(1)
    lib = FakeNvml(gpus)
    lib.reset_needed = True
    with pytest.raises(MigError, match="pending a GPU reset: run nvidia-smi -i 0 -r"):
        NvmlProbe(nvml=lib).set_mig_mode(0, False)
    assert gpus[0].mig == 1
    lib.reset_needed = False
    NvmlProbe(nvml=lib).set_mig_mode(0, False)
    assert gpus[0].mig == 0
    with pytest.raises(MigError, match="no GPU 3"):
        NvmlProbe(nvml=lib).set_mig_mode(3, True)


def test_simulated_mig_mode_turns_a_gpu_whole_and_back() -> None:
    probe = SimulatedProbe(node="n1", spec=SimSpec(gpus=2), mig={1: ["7g.80gb"]})
    with pytest.raises(MigError, match="destroy its MIG instances"):
        probe.set_mig_mode(1, False)
    probe.apply_mig_layout(1, [])
    probe.set_mig_mode(1, False)
    g = probe.inventory().gpus[1]
    assert not g.mig_enabled and g.mig_instances == ()
    probe.set_mig_mode(1, True)
    assert probe.inventory().gpus[1].mig_enabled
    assert shape(probe.apply_mig_layout(1, ["3g.40gb", "3g.40gb"])) == [("3g.40gb", 0, 4), ("3g.40gb", 4, 4)]
