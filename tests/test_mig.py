"""Table-driven tests of the MIG profile table and its layout placement (gpufleet.mig)."""

from __future__ import annotations

import re
from types import MappingProxyType

import pytest

from gpufleet.mig import (
    A100_40GB,
    A100_80GB,
    H100_80GB,
    H100_94GB,
    H200,
    MODELS,
    NVML_GPU_INSTANCE_PROFILE_1_SLICE,
    NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1,
    NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2,
    NVML_GPU_INSTANCE_PROFILE_2_SLICE,
    NVML_GPU_INSTANCE_PROFILE_3_SLICE,
    NVML_GPU_INSTANCE_PROFILE_4_SLICE,
    NVML_GPU_INSTANCE_PROFILE_7_SLICE,
    GpuModel,
    LayoutError,
    Placement,
    Profile,
    free_starts,
    model_for,
    parse_layout,
    place_layout,
    slice_share,
    smallest_fitting,
)

GIB = 1024
ALL_PROFILES = [pytest.param(m, p, id=f"{m.name}:{p.name}") for m in MODELS for p in m.profiles.values()]
BY_NAME = {m.name: m for m in MODELS}


def _most_apart(p: Profile) -> int:
    """Instances of ``p`` whose placements can all be used at once, counted from the starts."""
    ends: list[int] = []
    for s in sorted(p.starts):
        if not ends or s >= ends[-1]:
            ends.append(s + p.size)
    return len(ends)


@pytest.mark.parametrize(
    ("model", "names"),
    [
        (A100_40GB, ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]),
        (A100_80GB, ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
        (H100_80GB, ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
        (H100_94GB, ["1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"]),
        (H200, ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"]),
    ],
    ids=lambda v: v.name if isinstance(v, GpuModel) else "",
)
def test_each_model_has_the_guides_profiles(model: GpuModel, names: list[str]) -> None:
    assert list(model.profiles) == names
    assert model.total_memory_slices == 8
    assert model.compute_slices == 7
    assert isinstance(model.profiles, MappingProxyType)


@pytest.mark.parametrize(("model", "p"), ALL_PROFILES)
def test_profiles_are_internally_consistent(model: GpuModel, p: Profile) -> None:
    m = re.fullmatch(r"(\d)g\.(\d+)gb(\+me)?", p.name)
    assert m is not None
    assert p.compute_slices == int(m[1])
    assert p.memory_mib == int(m[2]) * GIB == p.memory_gb * GIB
    assert p.media_extensions == (m[3] is not None)
    assert p.size == p.memory_slices
    assert p.starts == tuple(sorted(set(p.starts)))
    assert all(s >= 0 and s + p.size <= model.total_memory_slices for s in p.starts)
    assert abs(p.memory_slices / 8 * model.memory_mib - p.memory_mib) < GIB
    expected = 1 if p.media_extensions else min(_most_apart(p), model.compute_slices // p.compute_slices)
    assert p.max_instances == expected
    assert model.by_nvml_id(p.nvml_profile_id) is p


@pytest.mark.parametrize(("model", "p"), ALL_PROFILES)
def test_max_instances_fit_and_one_more_does_not(model: GpuModel, p: Profile) -> None:
    placed = place_layout(model, [p.name] * p.max_instances)
    assert [x.profile for x in placed] == [p.name] * p.max_instances
    with pytest.raises(LayoutError, match=re.escape(f"{p.name} x{p.max_instances + 1}")):
        place_layout(model, [p.name] * (p.max_instances + 1))


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
@pytest.mark.parametrize(
    ("compute", "memory", "me", "nvml_id", "starts", "most"),
    [
        (1, 1, False, NVML_GPU_INSTANCE_PROFILE_1_SLICE, (0, 1, 2, 3, 4, 5, 6), 7),
        (1, 1, True, NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, (0, 1, 2, 3, 4, 5, 6), 1),
        (1, 2, False, NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, (0, 2, 4, 6), 4),
        (2, 2, False, NVML_GPU_INSTANCE_PROFILE_2_SLICE, (0, 2, 4), 3),
        (3, 4, False, NVML_GPU_INSTANCE_PROFILE_3_SLICE, (0, 4), 2),
        (4, 4, False, NVML_GPU_INSTANCE_PROFILE_4_SLICE, (0,), 1),
        (7, 8, False, NVML_GPU_INSTANCE_PROFILE_7_SLICE, (0,), 1),
    ],
    ids=["1g", "1g+me", "1g-double", "2g", "3g", "4g", "7g"],
)
def test_profile_shapes_and_nvml_ids(
    model: GpuModel, compute: int, memory: int, me: bool, nvml_id: int, starts: tuple[int, ...], most: int
) -> None:
    p = model.by_nvml_id(nvml_id)
    assert p is not None
    assert (p.compute_slices, p.memory_slices, p.media_extensions) == (compute, memory, me)
    assert p.starts == starts
    assert p.max_instances == most


def test_nvml_ids_are_numbered_as_nvml_does() -> None:
    assert [
        NVML_GPU_INSTANCE_PROFILE_1_SLICE,
        NVML_GPU_INSTANCE_PROFILE_2_SLICE,
        NVML_GPU_INSTANCE_PROFILE_3_SLICE,
        NVML_GPU_INSTANCE_PROFILE_4_SLICE,
        NVML_GPU_INSTANCE_PROFILE_7_SLICE,
        NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1,
        NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2,
    ] == [0, 1, 2, 3, 4, 7, 9]
    assert H100_80GB.by_nvml_id(5) is None


@pytest.mark.parametrize(
    ("gpu_name", "expected"),
    [
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA A100-PCIE-40GB", "A100-40GB"),
        ("nvidia a100-sxm4-40gb", "A100-40GB"),
        ("A100-40GB", "A100-40GB"),
        ("a100 40gb", "A100-40GB"),
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB"),
        ("  NVIDIA   A100 80GB   PCIe ", "A100-80GB"),
        ("A100-80GB", "A100-80GB"),
        ("NVIDIA A100-SXM4-80GB MIG 3g.40gb", "A100-80GB"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("NVIDIA H100 PCIe", "H100-80GB"),
        ("NVIDIA H100", "H100-80GB"),
        ("H100", "H100-80GB"),
        ("h100-80gb", "H100-80GB"),
        ("H100 SXM5 80GB", "H100-80GB"),
        ("NVIDIA H100 NVL", "H100-94GB"),
        ("H100-94GB", "H100-94GB"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H200 NVL", "H200"),
        ("H200", "H200"),
        ("h200-141gb", "H200"),
        ("NVIDIA H200 MIG 1g.18gb", "H200"),
        ("A100", None),
        ("NVIDIA A100-PCIE", None),
        ("A100-64GB", None),
        ("H100 96GB", None),
        ("NVIDIA GH200 480GB", None),
        ("NVIDIA A100X", None),
        ("NVIDIA A800-SXM4-80GB", None),
        ("NVIDIA H800", None),
        ("Tesla T4", None),
        ("Tesla V100-SXM2-16GB", None),
        ("NVIDIA GeForce RTX 4090", None),
        ("", None),
    ],
)
def test_model_for(gpu_name: str, expected: str | None) -> None:
    m = model_for(gpu_name)
    assert (m.name if m else None) == expected


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_model_for_knows_every_alias(model: GpuModel) -> None:
    for alias in (model.name, *model.aliases):
        assert model_for(alias) is model
        assert model_for(alias.upper()) is model


@pytest.mark.parametrize(
    ("model", "layout", "expected"),
    [
        (H100_80GB, ["7g.80gb"], [("7g.80gb", 0, 8)]),
        (H100_80GB, ["3g.40gb", "4g.40gb"], [("4g.40gb", 0, 4), ("3g.40gb", 4, 4)]),
        (A100_40GB, ["4g.20gb", "3g.20gb"], [("4g.20gb", 0, 4), ("3g.20gb", 4, 4)]),
        (A100_80GB, ["3g.40gb", "3g.40gb"], [("3g.40gb", 0, 4), ("3g.40gb", 4, 4)]),
        (
            H100_80GB,
            ["1g.10gb", "2g.20gb", "2g.20gb", "2g.20gb"],
            [("2g.20gb", 0, 2), ("2g.20gb", 2, 2), ("2g.20gb", 4, 2), ("1g.10gb", 6, 1)],
        ),
        (A100_40GB, ["1g.5gb"] * 7, [("1g.5gb", s, 1) for s in range(7)]),
        (H200, ["1g.18gb"] * 7, [("1g.18gb", s, 1) for s in range(7)]),
        (
            H100_80GB,
            ["2g.20gb", "2g.20gb", "3g.40gb"],
            [("2g.20gb", 0, 2), ("2g.20gb", 2, 2), ("3g.40gb", 4, 4)],
        ),
        (
            H100_80GB,
            ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
            [("2g.20gb", 0, 2), ("1g.10gb", 2, 1), ("1g.10gb", 3, 1), ("3g.40gb", 4, 4)],
        ),
        (
            H100_80GB,
            ["4g.40gb", "2g.20gb", "1g.10gb"],
            [("4g.40gb", 0, 4), ("2g.20gb", 4, 2), ("1g.10gb", 6, 1)],
        ),
        (
            A100_80GB,
            ["3g.40gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb"],
            [("1g.10gb", 0, 1), ("1g.10gb", 1, 1), ("1g.10gb", 2, 1), ("1g.10gb", 3, 1), ("3g.40gb", 4, 4)],
        ),
        (
            H200,
            ["1g.35gb"] + ["1g.18gb"] * 6,
            [*[("1g.18gb", s, 1) for s in range(6)], ("1g.35gb", 6, 2)],
        ),
        (H200, ["1g.18gb+me", "3g.71gb"], [("3g.71gb", 0, 4), ("1g.18gb+me", 4, 1)]),
        (H100_94GB, [" 3G.47GB ", "4g.47gb"], [("4g.47gb", 0, 4), ("3g.47gb", 4, 4)]),
        (H100_80GB, [], []),
    ],
    ids=[
        "7g-alone",
        "4g+3g",
        "4g+3g-a100-40",
        "3g+3g",
        "2gx3+1g",
        "1gx7",
        "h200-1gx7",
        "2g,2g,3g",
        "3g,2g,1g,1g",
        "4g,2g,1g",
        "3g+1gx4-backtracks",
        "h200-1g.35gb+1gx6",
        "h200-me",
        "h100-94-case",
        "empty",
    ],
)
def test_legal_layouts_place(
    model: GpuModel, layout: list[str], expected: list[tuple[str, int, int]]
) -> None:
    assert place_layout(model, layout) == [Placement(*e) for e in expected]


@pytest.mark.parametrize(
    ("model", "layout", "words"),
    [
        (H100_80GB, ["1g.10gb"] * 8, "1g.10gb x8 does not fit an H100-80GB: at most 7"),
        (A100_40GB, ["1g.5gb"] * 8, "1g.5gb x8 does not fit an A100-40GB: at most 7"),
        (
            H100_80GB,
            ["4g.40gb", "4g.40gb"],
            "4g.40gb x2 does not fit an H100-80GB: at most 1 (memory slices 0-3)",
        ),
        (
            H100_80GB,
            ["3g.40gb"] * 3,
            "3g.40gb x3 does not fit an H100-80GB: at most 2 (memory slices 0-3 and 4-7)",
        ),
        (
            A100_80GB,
            ["2g.20gb"] * 4,
            "2g.20gb x4 does not fit an A100-80GB: at most 3 (memory slices 0-1, 2-3",
        ),
        (H200, ["1g.18gb+me"] * 2, "1g.18gb+me x2 does not fit an H200: at most 1"),
        (H100_80GB, ["7g.80gb", "1g.10gb"], "needs 8 compute slices, an H100-80GB has 7: 7g.80gb (7)"),
        (H100_80GB, ["4g.40gb", "2g.20gb", "2g.20gb"], "needs 8 compute slices, an H100-80GB has 7: 4g.40gb"),
        (
            A100_40GB,
            ["3g.20gb", "3g.20gb", "1g.5gb"],
            "needs 9 memory slices, an A100-40GB has 8: 3g.20gb (4)",
        ),
        (H100_80GB, ["5g.40gb"], "unknown profile 5g.40gb for H100-80GB; known: 1g.10gb, 1g.10gb+me"),
        (H100_80GB, ["1g.5gb"], "unknown profile 1g.5gb for H100-80GB (a profile of A100-40GB); known:"),
        (
            A100_40GB,
            ["1g.10gb", "3g.40gb"],
            "unknown profile 3g.40gb for A100-40GB (a profile of A100-80GB, H100",
        ),
        (H200, ["7g.80gb"], "unknown profile 7g.80gb for H200"),
    ],
    ids=[
        "1gx8",
        "a100-1gx8",
        "4g+4g",
        "3gx3",
        "2gx4",
        "two-me",
        "7g+1g",
        "4g+2g+2g",
        "memory-over",
        "unknown",
        "another-models",
        "80gb-profile-on-40gb",
        "h100-profile-on-h200",
    ],
)
def test_illegal_layouts_say_why(model: GpuModel, layout: list[str], words: str) -> None:
    with pytest.raises(LayoutError, match=re.escape(words)):
        place_layout(model, layout)


def test_layout_error_is_a_value_error() -> None:
    assert issubclass(LayoutError, ValueError)


def _toy(*profiles: Profile) -> GpuModel:
    return GpuModel(name="TOY", aliases=(), memory_mib=8 * GIB, profiles={p.name: p for p in profiles})


def _toy_profile(name: str, memory: int, starts: tuple[int, ...], most: int = 8) -> Profile:
    compute = int(name.split("g.")[0])
    return Profile(
        name=name,
        compute_slices=compute,
        memory_slices=memory,
        memory_mib=int(name.split(".")[1].removesuffix("gb")) * GIB,
        max_instances=most,
        starts=starts,
        nvml_profile_id=0,
    )


def test_placement_follows_the_table_not_special_cases() -> None:
    toy = _toy(_toy_profile("2g.2gb", 2, (0, 2, 6)), _toy_profile("1g.1gb", 1, (0, 1)))
    assert place_layout(toy, ["1g.1gb", "2g.2gb", "1g.1gb", "2g.2gb"]) == [
        Placement("1g.1gb", 0, 1),
        Placement("1g.1gb", 1, 1),
        Placement("2g.2gb", 2, 2),
        Placement("2g.2gb", 6, 2),
    ]
    with pytest.raises(LayoutError, match=r"on an TOY: 1g\.1gb finds none of its starts \(0, 1\) free"):
        place_layout(toy, ["1g.1gb"] * 3)
    wide = _toy(_toy_profile("1g.2gb", 2, (0, 1)))
    with pytest.raises(LayoutError, match=r"1g\.2gb finds none of its starts \(0, 1\) free"):
        place_layout(wide, ["1g.2gb", "1g.2gb"])


@pytest.mark.parametrize(
    ("model", "placed", "profile", "expected"),
    [
        (H100_80GB, [], "3g.40gb", [0, 4]),
        (H100_80GB, [], "1g.10gb", [0, 1, 2, 3, 4, 5, 6]),
        (H100_80GB, [("4g.40gb", 0, 4)], "3g.40gb", [4]),
        (H100_80GB, [("4g.40gb", 0, 4)], "2g.20gb", [4]),
        (H100_80GB, [("4g.40gb", 0, 4)], "1g.20gb", [4, 6]),
        (H100_80GB, [("4g.40gb", 0, 4)], "4g.40gb", []),
        (H100_80GB, [("3g.40gb", 4, 4)], "2g.20gb", [0, 2]),
        (H100_80GB, [("3g.40gb", 4, 4), ("2g.20gb", 0, 2)], "1g.10gb", [2, 3]),
        (H100_80GB, [("3g.40gb", 0, 4), ("3g.40gb", 4, 4)], "1g.10gb", []),
        (H100_80GB, [("7g.80gb", 0, 8)], "1g.10gb", []),
        (A100_40GB, [("1g.5gb", s, 1) for s in range(6)], "1g.5gb", [6]),
        (A100_40GB, [("1g.5gb", s, 1) for s in range(6)], "1g.10gb", [6]),
        (A100_40GB, [("1g.5gb+me", 6, 1)], "1g.5gb+me", []),
        (H200, [("2g.35gb", 0, 2), ("2g.35gb", 2, 2), ("2g.35gb", 4, 2)], "2g.35gb", []),
        (H200, [("2g.35gb", 0, 2), ("2g.35gb", 2, 2), ("2g.35gb", 4, 2)], "1g.35gb", [6]),
        (H200, [("3g.71gb", 0, 4), ("2g.35gb", 4, 2), ("1g.18gb", 6, 1)], "1g.18gb", []),
    ],
)
def test_free_starts(
    model: GpuModel, placed: list[tuple[str, int, int]], profile: str, expected: list[int]
) -> None:
    assert free_starts(model, [Placement(*p) for p in placed], profile) == expected


def test_free_starts_rejects_unknown_profiles() -> None:
    with pytest.raises(LayoutError, match=r"unknown profile 1g\.5gb for H100-80GB"):
        free_starts(H100_80GB, [], "1g.5gb")
    with pytest.raises(LayoutError, match=r"unknown profile 2g\.10gb for H200"):
        free_starts(H200, [Placement("2g.10gb", 0, 2)], "1g.18gb")


@pytest.mark.parametrize(
    ("model", "gb", "expected"),
    [
        ("A100-40GB", 5, "1g.5gb"),
        ("A100-40GB", 10, "1g.10gb"),
        ("A100-40GB", 21, "7g.40gb"),
        ("A100-40GB", 100, None),
        ("A100-80GB", 5, "1g.10gb"),
        ("A100-80GB", 10, "1g.10gb"),
        ("A100-80GB", 21, "3g.40gb"),
        ("A100-80GB", 100, None),
        ("H100-80GB", 5, "1g.10gb"),
        ("H100-80GB", 10, "1g.10gb"),
        ("H100-80GB", 15, "1g.20gb"),
        ("H100-80GB", 21, "3g.40gb"),
        ("H100-80GB", 41, "7g.80gb"),
        ("H100-80GB", 100, None),
        ("H100-94GB", 5, "1g.12gb"),
        ("H100-94GB", 21, "1g.24gb"),
        ("H100-94GB", 100, None),
        ("H200", 5, "1g.18gb"),
        ("H200", 10, "1g.18gb"),
        ("H200", 21, "1g.35gb"),
        ("H200", 36, "3g.71gb"),
        ("H200", 100, "7g.141gb"),
        ("H200", 142, None),
        ("H200", 0, "1g.18gb"),
    ],
)
def test_smallest_fitting(model: str, gb: int, expected: str | None) -> None:
    p = smallest_fitting(BY_NAME[model], gb * GIB)
    assert (p.name if p else None) == expected


def test_smallest_fitting_takes_mib_and_refuses_negative() -> None:
    assert smallest_fitting(A100_40GB, 5 * GIB + 1) is A100_40GB.profiles["1g.10gb"]
    with pytest.raises(ValueError, match="negative"):
        smallest_fitting(H100_80GB, -1)


@pytest.mark.parametrize(
    ("name", "share"),
    [("1g.10gb", 1 / 7), ("1g.20gb", 1 / 7), ("2g.20gb", 2 / 7), ("3g.40gb", 3 / 7), ("7g.80gb", 1.0)],
)
def test_slice_share(name: str, share: float) -> None:
    assert slice_share(H100_80GB.profiles[name]) == pytest.approx(share)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2g.20gb,2g.20gb,3g.40gb", ["2g.20gb", "2g.20gb", "3g.40gb"]),
        (" 2G.20GB , 3g.40gb ", ["2g.20gb", "3g.40gb"]),
        ("1g.10gb+me", ["1g.10gb+me"]),
        ("7g.141gb", ["7g.141gb"]),
    ],
)
def test_parse_layout(text: str, expected: list[str]) -> None:
    assert parse_layout(text) == expected


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "empty MIG layout"),
        ("   ", "empty MIG layout"),
        ("2g.20gb,,3g.40gb", "empty item 2"),
        ("2g.20gb,", "empty item 2"),
        ("3g", "item 1 of MIG layout '3g' is not a MIG profile: '3g'"),
        ("2g.20gb,3g.40", "item 2 of MIG layout"),
        ("2g 20gb", "is not a MIG profile"),
        ("9g.40gb", "is not a MIG profile"),
        ("1g.10gb+mee", "is not a MIG profile"),
        ("2x3g.40gb", "is not a MIG profile"),
    ],
)
def test_parse_layout_refuses(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        parse_layout(text)


def test_parsed_layout_places() -> None:
    layout = parse_layout("2g.20gb,2g.20gb,3g.40gb")
    placed = place_layout(H100_80GB, layout)
    assert [(p.profile, p.start) for p in placed] == [("2g.20gb", 0), ("2g.20gb", 2), ("3g.40gb", 4)]
    assert free_starts(H100_80GB, placed, "1g.10gb") == []
