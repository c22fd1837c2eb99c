"""The openb loader (Alibaba cluster-trace-gpu-v2023 pod lists) against a hand-made sample
of the published layout, and the ``gpu_milli`` column of gpufleet's own CSV: the exact
jobs kept, the exact lines reported."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from gpufleet.sim.loaders import LOADERS, load_trace, write_gpufleet_csv
from gpufleet.sim.loaders.openb import COLUMNS, QOS_PRIORITY, load_openb
from gpufleet.sim.trace import WHOLE_GPU, TraceError, TraceJob, gpu_share_problem

SAMPLE = Path(__file__).resolve().parent / "data" / "openb_pod_list_sample.csv"
HEADER = ",".join(COLUMNS)
GPUFLEET_HEADER = "job_id,user,team,submit_s,duration_s,gpus,gpus_per_node,time_limit_s,priority,gpu_type"


def pod(number: int, **fields: Any) -> TraceJob:
    """An openb job with the loader's fixed owner, overridden by ``fields``."""
    base = TraceJob(
        job_id=f"openb-pod-{number:04d}", user="openb", team="openb", submit_s=0.0, duration_s=60.0, gpus=1
    )
    return dataclasses.replace(base, **fields)


SAMPLE_JOBS = [
    pod(0, submit_s=0.0, duration_s=3600.0, priority=3),
    pod(1, submit_s=20.0, duration_s=1190.0, priority=3, gpu_milli=460),
    pod(2, submit_s=50.0, duration_s=600.0, gpu_type="T4", gpu_milli=50),
    pod(3, submit_s=60.0, duration_s=1990.0, priority=1, gpu_milli=100),
    pod(4, submit_s=100.0, duration_s=5000.0, priority=2, gpu_type="P100", gpu_milli=250),
    pod(5, submit_s=110.0, duration_s=7200.0, gpus=2, priority=3, gpu_type="A10"),
    pod(6, submit_s=120.0, duration_s=1200.0, gpus=4, gpu_type="G2"),
    pod(7, submit_s=130.0, duration_s=86400.0, gpus=8, priority=3, gpu_type="G3"),
    pod(9, submit_s=150.0, duration_s=600.0, priority=3, gpu_milli=500),
    pod(25, submit_s=320.0, duration_s=595.0, gpu_type="T4", gpu_milli=200),
    pod(26, submit_s=330.0, duration_s=3590.0, priority=2, gpu_type="V100M32"),
    pod(27, submit_s=350.0, duration_s=590.0, gpu_milli=100),
]
SAMPLE_PROBLEMS = [
    (10, "no GPUs requested"),
    (12, "Pending pod was never scheduled"),
    (13, "no deletion_time"),
    (14, "gpu_milli 500 (a fraction of one GPU) needs gpus 1, got 2"),
    (15, "gpu_milli 1500 is outside 1..1000"),
    (16, "gpu_milli 0 is outside 1..1000"),
    (17, "gpu_milli is not a number"),
    (18, "creation_time is not a whole number"),
    (19, "non-positive duration: -30"),
    (20, "non-positive duration: 0"),
    (21, "duplicate job_id 'openb-pod-0001' (first on line 3)"),
    (22, "missing name"),
    (23, "expected 11 fields, got 7"),
    (24, "unknown qos 'Premium'"),
    (25, "missing qos"),
    (26, "scheduled_time 380 is before creation_time 390"),
    (27, "missing num_gpu"),
    (28, "no GPUs requested"),
    (33, "negative GPU count: -1"),
]


def assert_problems(got: list[Any], want: list[tuple[int, str]]) -> None:
    assert [problem.line for problem in got] == [line for line, _ in want]
    for problem, (_, fragment) in zip(got, want, strict=True):
        assert fragment in problem.message, str(problem)


def test_sample_keeps_good_pods_and_reports_bad_ones_by_line() -> None:
    loaded = load_trace(SAMPLE, "openb")

    assert loaded.jobs == SAMPLE_JOBS
    assert_problems(loaded.problems, SAMPLE_PROBLEMS)
    assert loaded.source == str(SAMPLE)


def test_registry_has_openb() -> None:
    assert LOADERS["openb"] is load_openb


def _one_pod(tmp_path: Path, **cells: str) -> TraceJob:
    """Load a file of one otherwise plain pod with ``cells`` changed; its only job."""
    plain = ("p", "1000", "2048", "1", "1000", "", "BE", "Succeeded", "10", "70", "10")
    row = dict(zip(COLUMNS, plain, strict=True))
    path = tmp_path / "openb_pod_list_one.csv"
    path.write_text(HEADER + "\n" + ",".join({**row, **cells}.values()) + "\n", encoding="utf-8")
    loaded = load_openb(path)
    assert loaded.problems == []
    (only,) = loaded.jobs
    return only


@pytest.mark.parametrize(
    ("cells", "want"),
    [
        ({"gpu_spec": ""}, None),
        ({"gpu_spec": "P100"}, "P100"),
        ({"gpu_spec": " V100M16 "}, "V100M16"),
        ({"gpu_spec": "V100M16|V100M32"}, None),
        ({"gpu_spec": "A10|"}, "A10"),
    ],
    ids=["empty", "one", "padded", "two", "trailing-bar"],
)
def test_gpu_spec_names_a_type_only_when_it_names_one_model(
    tmp_path: Path, cells: dict[str, str], want: str | None
) -> None:
    assert _one_pod(tmp_path, **cells).gpu_type == want


@pytest.mark.parametrize(
    ("qos", "want"),
    [("LS", 3), ("Guaranteed", 2), ("Burstable", 1), ("BE", 0), ("be", 0)],
    ids=["ls", "guaranteed", "burstable", "be", "lower-case"],
)
def test_qos_maps_to_priority(tmp_path: Path, qos: str, want: int) -> None:
    assert _one_pod(tmp_path, qos=qos).priority == want
    assert QOS_PRIORITY[qos.lower()] == want


@pytest.mark.parametrize(
    ("cells", "gpus", "milli"),
    [
        ({"gpu_milli": "50"}, 1, 50),
        ({"gpu_milli": "999"}, 1, 999),
        ({"num_gpu": "8", "gpu_milli": "1000"}, 8, 1000),
        ({"num_gpu": "2.0", "gpu_milli": "1000.0"}, 2, 1000),
    ],
    ids=["tenth", "almost-whole", "eight-whole", "float-counts"],
)
def test_gpu_share_is_kept(tmp_path: Path, cells: dict[str, str], gpus: int, milli: int) -> None:
    loaded = _one_pod(tmp_path, **cells)
    assert (loaded.gpus, loaded.gpu_milli) == (gpus, milli)


@pytest.mark.parametrize(
    ("cells", "duration"),
    [
        ({"creation_time": "10", "scheduled_time": "40", "deletion_time": "100"}, 60.0),
        ({"creation_time": "10", "scheduled_time": "", "deletion_time": "100"}, 90.0),
    ],
    ids=["scheduled", "never-scheduled-but-ran"],
)
def test_duration_runs_from_scheduling_else_creation(
    tmp_path: Path, cells: dict[str, str], duration: float
) -> None:
    assert _one_pod(tmp_path, **cells).duration_s == duration


def test_columns_are_found_by_name(tmp_path: Path) -> None:
    path = tmp_path / "reordered.csv"
    path.write_text(
        "qos,name,num_gpu,gpu_milli,gpu_spec,pod_phase,creation_time,scheduled_time,deletion_time\n"
        "LS,b,1,300,T4,Running,5,6,66\n",
        encoding="utf-8",
    )

    loaded = load_openb(path)

    assert loaded.jobs == [
        TraceJob(
            job_id="b",
            user="openb",
            team="openb",
            submit_s=0.0,
            duration_s=60.0,
            gpus=1,
            priority=3,
            gpu_type="T4",
            gpu_milli=300,
        )
    ]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "empty file"),
        ("openb-pod-0000,12000,16384,1,1000,,LS,Running,100,3700,100\n", "lacks column"),
        ("name,num_gpu,creation_time\n", "lacks column(s) gpu_milli"),
    ],
    ids=["empty", "no-header", "missing-columns"],
)
def test_file_without_the_header_is_a_trace_error(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "openb.csv"
    path.write_text(content, encoding="utf-8")

    with pytest.raises(TraceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_trace(path, "openb")


@pytest.mark.parametrize(
    ("gpus", "milli", "want"),
    [
        (1, 1000, None),
        (8, 1000, None),
        (1, 1, None),
        (1, 0, "outside 1..1000"),
        (1, 1001, "outside 1..1000"),
        (2, 500, "needs gpus 1"),
    ],
    ids=["whole", "eight-whole", "smallest", "zero", "over", "fraction-of-two"],
)
def test_gpu_share_problem(gpus: int, milli: int, want: str | None) -> None:
    problem = gpu_share_problem(gpus, milli)
    assert problem == want if want is None else want in (problem or "")


def test_trace_job_asks_for_whole_gpus_by_default() -> None:
    assert pod(0).gpu_milli == WHOLE_GPU == 1000


def test_gpufleet_csv_round_trips_gpu_milli(tmp_path: Path) -> None:
    jobs = [
        pod(1, gpu_milli=250),
        pod(2, submit_s=5.0, gpus=4),
        pod(3, submit_s=9.0, gpu_milli=1, dependency="afterok:1"),
    ]
    path = tmp_path / "trace.csv"
    write_gpufleet_csv(path, jobs)

    assert path.read_text(encoding="utf-8").splitlines()[0] == GPUFLEET_HEADER + ",dependency,gpu_milli"
    loaded = load_trace(path, "gpufleet")
    assert (loaded.jobs, loaded.problems) == (jobs, [])


def test_gpufleet_csv_without_fractions_keeps_its_columns(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    write_gpufleet_csv(path, [pod(1), pod(2, gpus=2)])

    assert path.read_text(encoding="utf-8").splitlines()[0] == GPUFLEET_HEADER


def test_gpufleet_csv_sample_round_trips(tmp_path: Path) -> None:
    """The openb sample, written as gpufleet CSV and read back, is the same jobs."""
    jobs = load_openb(SAMPLE).jobs
    path = tmp_path / "trace.csv"
    write_gpufleet_csv(path, jobs)

    assert load_trace(path, "gpufleet").jobs == jobs


def test_gpufleet_csv_bad_gpu_milli_is_a_problem_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(
        "\n".join(
            [
                GPUFLEET_HEADER + ",gpu_milli",
                "a,u,t,0,60,1,0,,0,,500",
                "b,u,t,0,60,1,0,,0,,",
                "c,u,t,0,60,1,0,,0,,0",
                "d,u,t,0,60,1,0,,0,,1001",
                "e,u,t,0,60,2,0,,0,,500",
                "f,u,t,0,60,1,0,,0,,half",
                "g,u,t,0,60,0,0,,0,,500",
                "h,u,t,0,60,1,0,,0,",
            ]
        )
        + "\n",
        encoding="utf-8",
    )

    loaded = load_trace(path, "gpufleet")

    assert [(job.job_id, job.gpu_milli) for job in loaded.jobs] == [("a", 500), ("b", 1000)]
    assert_problems(
        loaded.problems,
        [
            (4, "gpu_milli 0 is outside 1..1000"),
            (5, "gpu_milli 1001 is outside 1..1000"),
            (6, "needs gpus 1, got 2"),
            (7, "gpu_milli is not a number"),
            (8, "no GPUs requested"),
            (9, "expected 11 fields, got 10"),
        ],
    )


@pytest.mark.parametrize(
    "header",
    [GPUFLEET_HEADER + ",gpu_milli,dependency", GPUFLEET_HEADER + ",dependency"],
    ids=["optional-columns-either-order", "dependency-only"],
)
def test_gpufleet_csv_accepts_optional_columns(tmp_path: Path, header: str) -> None:
    path = tmp_path / "trace.csv"
    extra = ",250,afterok:1" if header.endswith("gpu_milli,dependency") else ",afterok:1"
    path.write_text(f"{header}\nj,u,t,0,60,1,0,,0,{extra}\n", encoding="utf-8")

    (only,) = load_trace(path, "gpufleet").jobs

    assert only.dependency == "afterok:1"
    assert only.gpu_milli == (250 if "gpu_milli" in header else 1000)


@pytest.mark.parametrize(
    "header",
    [GPUFLEET_HEADER + ",gpu_milli,gpu_milli", GPUFLEET_HEADER + ",gpu_share"],
    ids=["twice", "unknown"],
)
def test_gpufleet_csv_rejects_other_extra_columns(tmp_path: Path, header: str) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(header + "\n", encoding="utf-8")

    with pytest.raises(TraceError, match="header must be exactly"):
        load_trace(path, "gpufleet")
