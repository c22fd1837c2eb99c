"""Every loader against a tiny file of good and bad rows: the exact jobs it keeps and the
exact lines it reports. Files are written into ``tmp_path`` from the tables below."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpufleet.sim.loaders import LOADERS, load_trace, write_gpufleet_csv
from gpufleet.sim.loaders.sacct import gpu_request, slurm_duration
from gpufleet.sim.synth import synthesize
from gpufleet.sim.trace import TraceError, TraceJob

REPO_ROOT = Path(__file__).resolve().parents[1]
PHILLY_CSV = REPO_ROOT.parent / "shared" / "traces" / "philly" / "philly-2017-09-18_2017-10-31.csv"


_BASE_JOB = TraceJob(job_id="", user="u", team="t", submit_s=0.0, duration_s=60.0, gpus=1)


def job(job_id: str, **fields: Any) -> TraceJob:
    """A TraceJob with neutral defaults, overridden by ``fields``."""
    return dataclasses.replace(_BASE_JOB, job_id=job_id, **fields)


@dataclass(frozen=True, kw_only=True)
class LoaderCase:
    fmt: str
    files: dict[str, str]
    jobs: list[TraceJob]
    problems: list[tuple[int, str]] = field(default_factory=list)
    main: str = "trace"


GPUFLEET_HEADER = "job_id,user,team,submit_s,duration_s,gpus,gpus_per_node,time_limit_s,priority,gpu_type"
HELIOS_HEADER = "job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue"
SACCT_HEADER = (
    "JobID|User|Account|Partition|Submit|Start|End|Elapsed|Timelimit|AllocTRES|ReqTRES|NNodes|State|Priority"
)
T0 = "2024-01-02T03:04:00"
PHILLY_JSON_FIRST = (
    '  {"jobid": "app_1", "user": "u1", "vc": "vc1", "status": "Pass",\n'
    '   "submitted_time": "2017-10-01 00:00:00",\n'
    '   "attempts": [{"start_time": "2017-10-01 00:01:00", "end_time": "2017-10-01 00:02:00",\n'
    '                 "detail": []},\n'
    '                {"start_time": "2017-10-01 00:05:00", "end_time": "2017-10-01 01:05:00",\n'
    '                 "detail": [{"ip": "m1", "gpus": ["g0", "g1"]},\n'
    '                            {"ip": "m2", "gpus": ["g0", "g1"]}]}]},\n'
)


def _philly_json_job(job_id: str, submitted: str | None, start: str | None, gpus: int) -> str:
    sub = "null" if submitted is None else f'"{submitted}"'
    begin = "null" if start is None else f'"{start}"'
    attempt = (
        f'{{"start_time": {begin}, "end_time": "2017-10-01 00:30:00", '
        f'"detail": [{{"ip": "m3", "gpus": {[f"g{i}" for i in range(gpus)]!r}}}]}}'.replace("'", '"')
    )
    head = f'"jobid": "{job_id}", "user": "u2", "vc": "vc2", "submitted_time": {sub}'
    return f'  {{{head}, "attempts": [{attempt}]}}'


CASES = {
    "gpufleet": LoaderCase(
        fmt="gpufleet",
        files={
            "trace": "\n".join(
                [
                    GPUFLEET_HEADER,
                    "j1,alice,vision,100,3600,8,8,7200,1,A100",
                    "j2,bob,nlp,50,60.5,1,0,,0,",
                    "j3,bob,nlp,abc,60,1,0,,0,",
                    "j4,bob,nlp,10,0,1,0,,0,",
                    "j5,bob,nlp,10,60,-2,0,,0,",
                    "j6,bob,nlp,10,60,6,4,,0,",
                    "j7,bob,nlp,10,60",
                    "",
                    "j1,carol,nlp,10,60,1,0,,0,",
                    "j8,,nlp,10,60,1,0,,0,",
                    "j9,dan,nlp,10,60,0,0,,0,",
                ]
            )
            + "\n"
        },
        jobs=[
            job("j2", user="bob", team="nlp", submit_s=0.0, duration_s=60.5),
            job(
                "j1",
                user="alice",
                team="vision",
                submit_s=50.0,
                duration_s=3600.0,
                gpus=8,
                gpus_per_node=8,
                time_limit_s=7200.0,
                priority=1,
                gpu_type="A100",
            ),
        ],
        problems=[
            (4, "submit_s is not a number"),
            (5, "non-positive duration"),
            (6, "negative GPU count"),
            (7, "gpus_per_node 4 does not divide gpus 6"),
            (8, "expected 10 fields"),
            (10, "duplicate job_id 'j1' (first on line 2)"),
            (11, "missing user"),
            (12, "no GPUs requested"),
        ],
    ),
    "philly-csv": LoaderCase(
        fmt="philly",
        files={
            "trace": "timestamp,duration,num_gpus,gpu_time,cluster\n"
            "2017-10-01 00:00:10,120.0,4,480.0,6214e9\n"
            "2017-10-01 00:00:00,60.0,1,60.0,b436b2\n"
            "2017-13-01 00:00:00,60.0,1,60.0,b436b2\n"
            "2017-10-01 00:00:00,0.0,1,0.0,b436b2\n"
            "2017-10-01 00:00:00,60.0,-1,60.0,b436b2\n"
            "2017-10-01 00:00:00,60.0,1\n"
            "2017-10-01 00:00:00,60.0,2,120.0,\n"
        },
        jobs=[
            job("philly-3", user="vc-b436b2", team="b436b2", submit_s=0.0, duration_s=60.0),
            job("philly-2", user="vc-6214e9", team="6214e9", submit_s=10.0, duration_s=120.0, gpus=4),
        ],
        problems=[
            (4, "timestamp is not a timestamp"),
            (5, "non-positive duration"),
            (6, "negative GPU count"),
            (7, "expected 5 fields"),
            (8, "missing cluster"),
        ],
    ),
    "philly-json": LoaderCase(
        fmt="philly",
        files={
            "trace": "\n[\n"
            + PHILLY_JSON_FIRST
            + '  {"jobid": "app_2", "user": "u2", "vc": "vc2", "submitted_time": "2017-10-01 00:00:00", '
            '"attempts": []},\n'
            + _philly_json_job("app_3", "2017-10-01 00:00:00", None, 1)
            + ",\n"
            + _philly_json_job("app_4", "2017-09-30 23:59:00", "2017-10-01 00:00:00", 1)
            + ",\n"
            + _philly_json_job("app_5", "None", "2017-10-01 00:00:00", 1)
            + ",\n"
            + _philly_json_job("app_6", "2017-10-01 00:00:00", "2017-10-01 00:00:00", 0)
            + ",\n"
            + '  "not a job"\n]\n'
        },
        jobs=[
            job("app_4", user="u2", team="vc2", submit_s=0.0, duration_s=1800.0),
            job("app_1", user="u1", team="vc1", submit_s=60.0, duration_s=3600.0, gpus=4),
        ],
        problems=[
            (10, "job app_2 has no attempts"),
            (11, "missing start_time"),
            (13, "missing submitted_time"),
            (14, "no GPUs requested"),
            (15, "not a JSON object"),
        ],
    ),
    "helios": LoaderCase(
        fmt="helios",
        files={
            "trace": HELIOS_HEADER + "\n"
            "h1,u1,vcA,16,32,2,COMPLETED,2020-04-01 00:00:30,2020-04-01 00:01:00,2020-04-01 00:02:40,100,30\n"
            "h2,u2,vcB,0,4,1,COMPLETED,2020-04-01 00:00:00,,,100,0\n"
            "h3,u2,vcB,3,4,2,FAILED,2020-04-01 00:00:00,,,50,0\n"
            "h4,u3,,1,4,1,COMPLETED,2020-04-01 00:00:10,,,10,0\n"
            "h5,u3,vcB,1,4,1,COMPLETED,not-a-date,,,10,0\n"
            "h6,u3,vcB,1,4,1,CANCELLED,2020-04-01 00:00:00,,,0,0\n"
            "h7,u1,vcA,1\n"
        },
        jobs=[
            job("h3", user="u2", team="vcB", submit_s=0.0, duration_s=50.0, gpus=3),
            job("h4", user="u3", team="u3", submit_s=10.0, duration_s=10.0),
            job("h1", user="u1", team="vcA", submit_s=30.0, duration_s=100.0, gpus=16, gpus_per_node=8),
        ],
        problems=[
            (3, "no GPUs requested"),
            (6, "submit_time is not a timestamp"),
            (7, "non-positive duration"),
            (8, "expected 12 fields"),
        ],
    ),
    "helios-reordered-no-vc": LoaderCase(
        fmt="helios",
        files={
            "trace": "submit_time,duration,job_id,gpu_num,user,node_num,extra\n"
            "2020-04-01 00:00:00,5,a,8,u1,4,x\n"
            "2020-04-01 00:00:01,5.5,b,1,u2,,y\n"
            "2020-04-01 00:00:01,5,c,1.5,u2,1,y\n"
        },
        jobs=[
            job("a", user="u1", team="u1", submit_s=0.0, duration_s=5.0, gpus=8, gpus_per_node=2),
            job("b", user="u2", team="u2", submit_s=1.0, duration_s=5.5),
        ],
        problems=[(4, "gpu_num is not a whole number")],
    ),
    "alibaba": LoaderCase(
        fmt="alibaba",
        files={
            "trace": "j1,worker,2,Terminated,1000,1600,600,29.0,100,V100\n"
            "j1,ps,1,Terminated,990,1500,600,29,,\n"
            "j2,worker,1.0,Failed,2000,2100,600,29,50,MISC\n"
            "j3,worker,1,Terminated,3000,,600,29,100,T4\n"
            "j3,worker,1,Terminated,3000,3100,600,29,100,T4\n"
            "j4,worker,1,Running,4000,4100,600,29,,\n"
            "j5,worker,x,Terminated,4000,4100,600,29,100,T4\n"
            "j6,worker,1,Terminated,5000,5000,600,29,100,P100\n"
            "j7,worker,2,Terminated,1000,1100,600,29,200,T4\n"
            "j7,evaluator,1,Terminated,1000,1050,600,29,100,P100\n"
            "j8,worker,1,Terminated,900,960\n"
        },
        jobs=[
            job(
                "j1", user="unknown", team="unknown", submit_s=0.0, duration_s=610.0, gpus=2, gpu_type="V100"
            ),
            job("j7", user="unknown", team="unknown", submit_s=10.0, duration_s=100.0, gpus=5),
            job("j2", user="unknown", team="unknown", submit_s=1010.0, duration_s=100.0),
        ],
        problems=[
            (4, "missing end_time; job j3 skipped"),
            (6, "no GPUs requested"),
            (7, "inst_num is not a number"),
            (8, "non-positive duration"),
            (11, "expected 10 fields, got 6; job j8 skipped"),
        ],
    ),
    "alibaba-header-and-job-table": LoaderCase(
        fmt="alibaba",
        main="pai_task_table.csv",
        files={
            "pai_task_table.csv": "job_name,task_name,inst_num,status,start_time,end_time,"
            "plan_cpu,plan_mem,plan_gpu,gpu_type\n"
            "j1,worker,1,Terminated,100,200,600,29,100,V100\n"
            "j2,worker,1,Terminated,150,250,600,29,100,\n",
            "pai_job_table.csv": "j1,inst1,alice,Terminated,100,200\nbroken\n",
        },
        jobs=[
            job("j1", user="alice", team="alice", submit_s=0.0, duration_s=100.0, gpu_type="V100"),
            job("j2", user="unknown", team="unknown", submit_s=50.0, duration_s=100.0),
        ],
        problems=[(2, "pai_job_table.csv: expected job_name and user")],
    ),
    "sacct": LoaderCase(
        fmt="sacct",
        files={
            "trace": SACCT_HEADER + "\n"
            f"100|alice|vision|gpu|2024-01-02T03:04:05|{T0}|{T0}|01:00:00|1-00:00:00|"
            "billing=16,cpu=16,gres/gpu=16,gres/gpu:a100=16,mem=128G,node=2|cpu=16,gres/gpu=16|2|COMPLETED|1000\n"
            f"100.batch|||gpu|{T0}|{T0}|{T0}|01:00:00||gres/gpu=8||1|COMPLETED|\n"
            f"101|bob||gpu|{T0}|{T0}|{T0}|10:00|UNLIMITED||billing=1,cpu=1,gres/gpu=1,node=1|1|COMPLETED|\n"
            f"102|carol|nlp|gpu|{T0}|Unknown|Unknown|00:00:00|01:00:00||gres/gpu=4|1|PENDING|5\n"
            f"103|carol|nlp|gpu|{T0}|None|{T0}|00:00:00|01:00:00||gres/gpu=4|1|CANCELLED by 1001|5\n"
            f"104|carol|nlp|cpu|{T0}|{T0}|{T0}|00:30:00|02:00:00|cpu=4,mem=8G,node=1|cpu=4|1|COMPLETED|5\n"
            f"105|dan|nlp|gpu|2024-01-02T25:10:00|{T0}|{T0}|00:30:00|02:00:00||gres/gpu=1|1|COMPLETED|5\n"
            f"106|dan|nlp|gpu|2024-01-02T03:14:00|{T0}|{T0}|1-02:00:00|2-00:00:00|gres/gpu:v100=2||1|TIMEOUT|5\n"
            f"107|dan|nlp|gpu|{T0}|{T0}|{T0}|xx|02:00:00||gres/gpu=1|1|COMPLETED|5\n"
            "108|too|few\n"
        },
        jobs=[
            job("101", user="bob", team="bob", submit_s=0.0, duration_s=600.0),
            job(
                "100",
                user="alice",
                team="vision",
                submit_s=5.0,
                duration_s=3600.0,
                gpus=16,
                gpus_per_node=8,
                time_limit_s=86400.0,
                priority=1000,
                gpu_type="a100",
            ),
            job(
                "106",
                user="dan",
                team="nlp",
                submit_s=600.0,
                duration_s=93600.0,
                gpus=2,
                time_limit_s=172800.0,
                priority=5,
                gpu_type="v100",
            ),
        ],
        problems=[
            (5, "job 102 is PENDING"),
            (6, "job 103 never started (CANCELLED by 1001)"),
            (7, "no GPUs requested"),
            (8, "Submit is not a timestamp"),
            (10, "Elapsed is not a Slurm duration"),
            (11, "expected 14 fields"),
        ],
    ),
    "sacct-gres-start-end": LoaderCase(
        fmt="sacct",
        files={
            "trace": "JobID|User|Submit|Start|End|AllocGRES|NNodes\n"
            "200|eve|2024-03-01T00:00:00|2024-03-01T00:01:00|2024-03-01T00:31:00|gpu:a100:4(IDX:0-3)|1\n"
            "201|eve|2024-03-01T00:00:10|2024-03-01T00:02:00|2024-03-01T00:12:00|gpu:8|2\n"
            "202|eve|2024-03-01T00:00:10|2024-03-01T00:02:00|2024-03-01T00:01:00|gpu:1|1\n"
        },
        jobs=[
            job("200", user="eve", team="eve", submit_s=0.0, duration_s=1800.0, gpus=4, gpu_type="a100"),
            job("201", user="eve", team="eve", submit_s=10.0, duration_s=600.0, gpus=8, gpus_per_node=4),
        ],
        problems=[(4, "non-positive duration")],
    ),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_loader_keeps_good_rows_and_reports_bad_ones(tmp_path: Path, case: LoaderCase) -> None:
    for name, content in case.files.items():
        (tmp_path / name).write_text(content, encoding="utf-8")

    loaded = load_trace(tmp_path / case.main, case.fmt)

    assert loaded.jobs == case.jobs
    assert [problem.line for problem in loaded.problems] == [line for line, _ in case.problems]
    for problem, (_, fragment) in zip(loaded.problems, case.problems, strict=True):
        assert fragment in problem.message, str(problem)
    assert loaded.source == str(tmp_path / case.main)


def test_registry_names_every_format() -> None:
    from gpufleet.cli.sim_cmds import FORMATS

    assert set(LOADERS) == {"gpufleet", "philly", "helios", "alibaba", "sacct", "openb"}
    assert set(FORMATS) == set(LOADERS)  # `gpufleet simulate --format` takes every one


ERROR_CASES = {
    "unknown-format": ("csv", "a,b\n", "unknown trace format 'csv'"),
    "missing-file": ("gpufleet", None, "trace file not found"),
    "gpufleet-wrong-header": ("gpufleet", "job_id,user\nj1,u\n", "header must be exactly"),
    "gpufleet-empty": ("gpufleet", "", "empty file"),
    "philly-no-columns": ("philly", "time,gpus\n", "Philly CSV header lacks column(s) timestamp"),
    "philly-bad-json": ("philly", '[{"jobid": 1}\n{"jobid": 2}]', "invalid JSON"),
    "helios-no-duration": ("helios", "job_id,user,gpu_num,submit_time\n", "lacks column(s) duration"),
    "sacct-no-times": ("sacct", "JobID|Submit|AllocTRES\n1|x|y\n", "needs Elapsed or Start and End"),
    "not-utf8": ("helios", b"\xff\xfe\x00bad".decode("latin-1"), "cannot read trace file"),
}


@pytest.mark.parametrize(("fmt", "content", "message"), list(ERROR_CASES.values()), ids=list(ERROR_CASES))
def test_unreadable_files_raise_trace_error(
    tmp_path: Path, fmt: str, content: str | None, message: str
) -> None:
    path = tmp_path / "trace"
    if content is not None:
        path.write_text(content, encoding="latin-1")

    with pytest.raises(TraceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_trace(path, fmt)


ROUND_TRIP = {
    "hand-made": [
        job("a", submit_s=0.0, duration_s=0.1 + 0.2, gpus=16, gpus_per_node=8, time_limit_s=1e-3 + 7200.0),
        job("b", user="x,y", team='quote"d', submit_s=12.5, priority=-3, gpu_type="H100"),
    ],
    "synthetic": synthesize(jobs=300, seed=7),
}


@pytest.mark.parametrize("jobs", list(ROUND_TRIP.values()), ids=list(ROUND_TRIP))
def test_gpufleet_csv_round_trip_is_exact(tmp_path: Path, jobs: list[TraceJob]) -> None:
    path = tmp_path / "trace.csv"
    write_gpufleet_csv(path, jobs)

    loaded = load_trace(path, "gpufleet")

    origin = min(job.submit_s for job in jobs)
    assert loaded.problems == []
    assert loaded.jobs == [dataclasses.replace(job, submit_s=job.submit_s - origin) for job in jobs]


def test_real_philly_trace_loads_every_job() -> None:
    if not PHILLY_CSV.is_file():
        pytest.skip(f"shared Philly trace not found at {PHILLY_CSV}")

    loaded = load_trace(PHILLY_CSV, "philly")

    assert (len(loaded.jobs), loaded.problems) == (52_829, [])
    assert loaded.jobs[0].submit_s == 0.0
    assert all(a.submit_s <= b.submit_s for a, b in zip(loaded.jobs, loaded.jobs[1:], strict=False))


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("00:00:59", 59.0), ("10:00", 600.0), ("1-02:00:00", 93600.0), ("2-03", 183600.0), ("45", 2700.0)],
    ids=["hh:mm:ss", "mm:ss", "d-hh:mm:ss", "d-hh", "minutes"],
)
def test_slurm_duration(value: str, seconds: float) -> None:
    assert slurm_duration(value, "Elapsed") == seconds


@pytest.mark.parametrize(
    ("row", "want"),
    [
        ({"AllocTRES": "cpu=8,gres/gpu=4,gres/gpu:h100=4"}, (4, "h100")),
        ({"AllocTRES": "gres/gpu:a100=2,gres/gpu:v100=2"}, (4, None)),
        ({"AllocTRES": "cpu=8", "ReqTRES": "gres/gpu=2"}, (2, None)),
        ({"ReqGRES": "gpu:t4:3(IDX:0-2)"}, (3, "t4")),
        ({"AllocGRES": "gpu:2"}, (2, None)),
        ({"AllocTRES": "cpu=8,gres/gpumem=80G"}, (0, None)),
    ],
    ids=["typed-and-total", "two-models", "req-fallback", "gres-typed", "gres-untyped", "no-gpu"],
)
def test_gpu_request(row: dict[str, str], want: tuple[int, str | None]) -> None:
    assert gpu_request(row) == want
