"""Strict ``#SBATCH`` scripts (issue 18): a corpus of real-world-shaped batch scripts,
each read as ``gpufleet submit`` reads it, with what it asks for and every directive
gpufleet would refuse (line, words); the same words for a flag on the command line; the
environment ``--export`` sends; whole nodes for ``--exclusive``; Slurm's time forms."""

from __future__ import annotations

import datetime as dt
import math
import re
from pathlib import Path
from typing import Any

import pytest

from gpufleet.cli import batch, sbatch
from gpufleet.cli.localtime import parse_slurm_time
from gpufleet.cli.slurmflags import OPTIONS, SHORT, UNLIMITED, SbatchOptions, total_gpus

NOW = dt.datetime(2026, 3, 10, 12, 0).timestamp()  # local time, as the CLI reads it

DDP = """#!/bin/bash
#SBATCH --job-name=llama-ddp
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=12
#SBATCH --mem=0
#SBATCH --time=2-00:00:00
#SBATCH --partition=a100
#SBATCH --output=logs/%x-%j.out
#SBATCH --signal=B:USR1@300
#SBATCH --requeue
export MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1)
srun torchrun --nnodes=$SLURM_NNODES train.py
"""
DDP_MEM = DDP.replace("#SBATCH --mem=0\n", "#SBATCH --mem=480G\n")
SWEEP = """#!/bin/bash
#SBATCH -J sweep
#SBATCH -a 0-99%10
#SBATCH -G 1
#SBATCH -t 90
#SBATCH -o sweep_%A_%a.out
#SBATCH -e sweep_%A_%a.err
python sweep.py --trial $SLURM_ARRAY_TASK_ID
"""
PREP = """#!/usr/bin/env bash
# tokenise the corpus, one shard per task
#SBATCH --job-name=prep
#SBATCH --partition=cpu
#SBATCH --array=0-15
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=16
#SBATCH --mem-per-cpu=2G
#SBATCH --time=04:00:00
#SBATCH --export=NONE

python tokenize.py --shard "$SLURM_ARRAY_TASK_ID"
"""
MAIL = """#!/bin/bash
#SBATCH --job-name=finetune
#SBATCH --gres=gpu:a100:2
#SBATCH --mail-type=BEGIN,END,FAIL
#SBATCH --mail-user=alice@example.org
#SBATCH --comment="paper run"
#SBATCH --time=12:00:00
#SBATCH --account=vision
python finetune.py
"""
PIPELINE = """#!/bin/bash
#SBATCH -J train
#SBATCH -d afterok:1177:1178
#SBATCH --kill-on-invalid-dep=yes
#SBATCH --gres=gpu:4
#SBATCH --mem-per-gpu=40G
#SBATCH --begin=now+1hour
#SBATCH --chdir=/scratch/alice/run
#SBATCH --max-price=1.5
python train.py
"""
UNSUPPORTED = """#!/bin/bash
#SBATCH --job-name=legacy
#SBATCH --switches=1
#SBATCH --licenses=matlab:1
#SBATCH -w gpu-node-07
#SBATCH --qos=high
#SBATCH --gres=gpu:1
matlab -batch run
"""
BAD_VALUES = """#!/bin/bash
#SBATCH --time=forever
#SBATCH --gres=gpu:two:x
#SBATCH --nodes=x
#SBATCH --mem=lots
#SBATCH --array=5-1
#SBATCH --signal=R:USR1
echo never
"""
EXCLUSIVE = """#!/bin/bash
#SBATCH -N 2
#SBATCH --exclusive
#SBATCH -p h100
srun ./bench
"""
SHORT_FORMS = """#!/bin/bash
#SBATCH -N2 -n16 -c4 -t1:30:00 -Jshort -pbig -o out.%j
#SBATCH -D work -i input.txt -A ml
./run
"""
UNLIMITED_TIME = """#!/bin/bash
#SBATCH --time=UNLIMITED
#SBATCH --nice=50
#SBATCH --open-mode=append
#SBATCH --parsable
./serve
"""
HELD_AND_WAIT = """#!/bin/bash
#SBATCH --hold
#SBATCH --wait
#SBATCH --open-mode=truncate
#SBATCH --output=out.%q
./x
"""
CPU_GPU = """#!/bin/bash
#SBATCH --cpus-per-gpu=8
#SBATCH --gpus-per-task=1
#SBATCH --ntasks-per-socket=2
#SBATCH --gres=gpu:1,mps:50
./x
"""
AFTER_COMMAND = """#!/bin/bash
#SBATCH --gres=gpu:2
module load cuda
#SBATCH --switches=1
python x.py
"""
CONSTRAINT = """#!/bin/bash
#SBATCH --constraint=h100
#SBATCH --gpus=8
#SBATCH --deadline=2026-03-11T12:00
#SBATCH --dependency=singleton
./x
"""
CONSTRAINT_EXPR = """#!/bin/bash
#SBATCH --constraint="a100&ib"
./x
"""

CORPUS: list[tuple[str, str, dict[str, Any], list[tuple[int, bool, str]]]] = [
    (
        "pytorch-ddp-mem-0",
        DDP,
        {
            "name": "llama-ddp",
            "nodes": 4,
            "gpus_per_node": 8,
            "ntasks_per_node": 8,
            "cpus_per_task": 12,
            "time_limit_s": 172800.0,
            "pool": "a100",
            "output": "logs/%x-%j.out",
            "signal": "B:USR1@300",
            "requeue": True,
            "mem": 0,  # all of each node's memory (the server resolves it)
        },
        [],
    ),
    (
        "pytorch-ddp",
        DDP_MEM,
        {
            "name": "llama-ddp",
            "nodes": 4,
            "gpus_per_node": 8,
            "ntasks_per_node": 8,
            "cpus_per_task": 12,
            "mem": 480 * 1024,
            "time_limit_s": 172800.0,
            "pool": "a100",
            "output": "logs/%x-%j.out",
            "signal": "B:USR1@300",
            "requeue": True,
        },
        [],
    ),
    (
        "array-sweep",
        SWEEP,
        {
            "name": "sweep",
            "array": "0-99%10",
            "gpus": 1,
            "time_limit_s": 5400.0,
            "output": "sweep_%A_%a.out",
            "error": "sweep_%A_%a.err",
        },
        [],
    ),
    (
        "cpu-preprocessing",
        PREP,
        {
            "name": "prep",
            "pool": "cpu",
            "array": "0-15",
            "ntasks": 1,
            "cpus_per_task": 16,
            "mem_per_cpu": 2048,
            "time_limit_s": 14400.0,
            "export": "NONE",
        },
        [],
    ),
    (
        "mail-and-account",
        MAIL,
        {
            "name": "finetune",
            "gpus_per_node": 2,
            "gpu_type": "a100",
            "time_limit_s": 43200.0,
            "account": "vision",
        },
        [],
    ),
    (
        "dependent-training",
        PIPELINE,
        {
            "name": "train",
            "dependency": "afterok:1177:1178",
            "kill_on_invalid_dep": True,
            "gpus_per_node": 4,
            "mem_per_gpu": 40960,
            "begin": NOW + 3600,
            "chdir": "/scratch/alice/run",
            "max_price": 1.5,
        },
        [],
    ),
    (
        "unsupported-directives",
        UNSUPPORTED,
        {"name": "legacy", "gpus_per_node": 1, "qos": "high", "licenses": (("matlab", 1),)},
        [
            (3, True, "#SBATCH --switches=1: gpufleet cannot honour this"),
            (
                5,
                True,
                "#SBATCH -w gpu-node-07: gpufleet cannot honour this (no job is pinned to named nodes)",
            ),
        ],
    ),
    (
        "bad-values",
        BAD_VALUES,
        {},
        [
            (2, False, "--time=forever: cannot read duration 'forever'"),
            (3, False, "--gres=gpu:two:x: expected gpu[:TYPE]:N"),
            (4, False, "--nodes=x: expected N or MIN-MAX nodes"),
            (5, False, "--mem=lots: expected a size such as 16G"),
            (6, False, "--array=5-1: range 5-1 goes down"),
            (7, False, "--signal=R:USR1: R: (reservation) is not supported"),
        ],
    ),
    ("exclusive", EXCLUSIVE, {"nodes": 2, "exclusive": True, "pool": "h100"}, []),
    (
        "short-forms",
        SHORT_FORMS,
        {
            "nodes": 2,
            "ntasks": 16,
            "cpus_per_task": 4,
            "time_limit_s": 5400.0,
            "name": "short",
            "pool": "big",
            "output": "out.%j",
            "chdir": "work",
            "input": "input.txt",
            "account": "ml",
        },
        [],
    ),
    ("unlimited-nice-harmless", UNLIMITED_TIME, {"time_limit_s": UNLIMITED, "nice": 50}, []),
    (
        "hold-wait-append",
        HELD_AND_WAIT,
        {"hold": True},
        [
            (3, True, "--wait: gpufleet cannot honour this (sbatch returns once the job is in)"),
            (4, True, "--open-mode=truncate: gpufleet cannot honour this (the agent appends"),
            (5, True, "--output=out.%q: gpufleet cannot honour this (%q is not a file name pattern here"),
        ],
    ),
    (
        "per-gpu-and-socket",
        CPU_GPU,
        {"gpus_per_task": 1},
        [
            (
                2,
                True,
                "--cpus-per-gpu=8: gpufleet cannot honour this (CPUs are counted per task here); use -c",
            ),
            (4, True, "--ntasks-per-socket=2: gpufleet cannot honour this"),
            (5, True, "--gres=gpu:1,mps:50: gpufleet cannot honour this (mps is not a generic resource here"),
        ],
    ),
    ("stops-at-first-command", AFTER_COMMAND, {"gpus_per_node": 2}, []),
    (
        "constraint-model-deadline-singleton",
        CONSTRAINT,
        {
            "constraint": "h100",  # a GPU model is a node feature
            "gpus": 8,
            "deadline": dt.datetime(2026, 3, 11, 12, 0).timestamp(),
            "dependency": "singleton",
        },
        [],
    ),
    (
        "constraint-expression",
        CONSTRAINT_EXPR,
        {"constraint": "a100&ib"},  # node features (issue 31)
        [],
    ),
]


def given(o: SbatchOptions) -> dict[str, Any]:
    return {
        k: getattr(o, k)
        for k in SbatchOptions.__slots__
        if getattr(o, k) is not None and k not in ("problems", "origins", "gpu_type_by")
    }


@pytest.mark.parametrize(("text", "want", "problems"), [c[1:] for c in CORPUS], ids=[c[0] for c in CORPUS])
def test_corpus(text: str, want: dict[str, Any], problems: list[tuple[int, bool, str]]) -> None:
    got = sbatch.parse_script(text, source="job.sh", now=NOW)
    assert given(got) == want
    assert len(got.problems) == len(problems), [str(p) for p in got.problems]
    for p, (line, refused, words) in zip(got.problems, problems, strict=True):
        assert str(p).startswith(f"job.sh line {line}: "), str(p)
        assert words in str(p) and p.refused is refused, str(p)
        if refused:
            assert "; " in str(p).split("gpufleet cannot honour this (", 1)[1], "says what to do"


@pytest.mark.parametrize(
    ("directive", "flags"),
    [
        ("#SBATCH --time=forever", {"time_limit": "forever"}),
        ("#SBATCH --mem=lots", {"mem": "lots"}),
        ("#SBATCH --gpus=two", {"gpus": "two"}),
        ("#SBATCH --array=x", {"array": "x"}),
        ("#SBATCH --nodes=x", {"nodes": "x"}),
        ("#SBATCH --cpus-per-task=0", {"cpus_per_task": "0"}),
        ("#SBATCH --begin=someday", {"begin": "someday"}),
        ("#SBATCH --kill-on-invalid-dep=maybe", {"kill_on_invalid_dep": "maybe"}),
        ("#SBATCH --constraint=a|", {"constraint": "a|"}),
    ],
)
def test_a_bad_value_reads_the_same_in_a_script_and_on_the_command_line(
    directive: str, flags: dict[str, str]
) -> None:
    script = sbatch.parse_script(f"#!/bin/bash\n{directive}\n", source="job.sh", now=NOW)
    cli = batch.from_flags(SbatchOptions(), flags, now=NOW)
    (s,), (c,) = script.problems, cli.problems
    assert str(s).startswith("job.sh line 2: ") and c.where == ""
    assert str(s).removeprefix("job.sh line 2: ").removeprefix("#SBATCH ") == str(c)


def test_the_command_line_wins_and_replaces_a_directives_problem() -> None:
    script = sbatch.parse_script("#!/bin/bash\n#SBATCH --time=forever\n#SBATCH -J a\n", source="j", now=NOW)
    opts = batch.from_flags(script, {"time_limit": "10", "name": "b", "requeue": False}, now=NOW)
    assert (opts.time_limit_s, opts.name, opts.requeue, opts.problems) == (600.0, "b", False, ())
    assert ("time", "--time=10") in opts.origins


def test_every_short_option_names_a_listed_option() -> None:
    assert set(SHORT.values()) <= set(OPTIONS)
    assert all(o.why.count("; ") >= 1 for o in OPTIONS.values() if o.kind == "refused")


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        (None, {"PATH": "/bin", "LANG": "C", "BASH_FUNC_module%%": "() { x; }"}),
        ("ALL", {"PATH": "/bin", "LANG": "C", "BASH_FUNC_module%%": "() { x; }"}),
        ("NONE", {}),
        ("NIL", {}),
        ("PATH,EXTRA=1", {"PATH": "/bin", "EXTRA": "1"}),
        ("ALL,EXTRA=a=b", {"PATH": "/bin", "LANG": "C", "BASH_FUNC_module%%": "() { x; }", "EXTRA": "a=b"}),
        ("HF_TOKEN,GPUFLEET_TOKEN,MISSING", {"HF_TOKEN": "hf_x"}),
    ],
    ids=["default", "all", "none", "nil", "named", "all-and-set", "named-secret"],
)
def test_export_sends_the_environment_less_secrets_session_and_identity(
    spec: str | None, want: dict[str, str]
) -> None:
    environ = {
        "PATH": "/bin",
        "LANG": "C",
        "BASH_FUNC_module%%": "() { x; }",
        "GPUFLEET_TOKEN": "gf_secret",
        "GPUFLEET_URL": "http://x",
        "HF_TOKEN": "hf_x",
        "AWS_SECRET_ACCESS_KEY": "s",
        "DB_PASSWORD": "p",
        "SSH_AUTH_SOCK": "/tmp/ssh",
        "HOME": "/home/alice",
        "USER": "alice",
        "PWD": "/home/alice/x",
        "SLURM_JOB_ID": "5",
        "DISPLAY": ":0",
    }
    env, warnings = batch.export_env(spec, environ)
    assert (env, warnings) == (want, [])


def test_export_leaves_behind_a_value_the_api_would_refuse() -> None:
    env, warnings = batch.export_env(None, {"BIG": "x" * (batch.MAX_ENV_VALUE + 1), "OK": "1"})
    assert env == {"OK": "1"} and warnings == [
        f"--export: BIG not sent (longer than {batch.MAX_ENV_VALUE} characters)"
    ]


@pytest.mark.parametrize(
    ("sizes", "shape", "want"),
    [
        ([8, 8], {"nodes": 2}, {"gpus": 16, "gpus_per_node": 8, "nodes": 2}),
        ([8], {}, {"gpus": 8, "gpus_per_node": 8, "nodes": 1}),
        ([8, 8], {"gpus": 16}, {"gpus_per_node": 8, "nodes": 2}),
        ([4, 8], {"gpus": 16, "gpus_per_node": 8, "nodes": 2}, {}),
        ([4, 8], {"nodes": 2}, "nodes of 4 and 8 GPUs"),
        ([8], {"gpus": 4, "gpus_per_node": 4}, "ask for gpus_per_node=8"),
        ([8], {"gpus": 12}, "ask for gpus_per_node=8"),
    ],
    ids=["two-nodes", "one", "total", "big-enough", "mixed", "half", "not-a-multiple"],
)
def test_exclusive_means_whole_nodes_or_is_refused(
    sizes: list[int], shape: dict[str, int], want: dict[str, int] | str
) -> None:
    """The server's part of --exclusive (``submitfit.whole_gpus``): the GPU shape that
    fills the pool's nodes (CPUs and memory: tests/server/test_slurm_defaults.py)."""
    from gpufleet.api.jobs import JobSubmit
    from gpufleet.server.problems import Failure
    from gpufleet.server.services.submitfit import whole_gpus

    got = whole_gpus(JobSubmit(command=["x"], **shape), sorted(set(sizes)), "p")
    if isinstance(want, dict):
        assert got == want
    else:
        assert isinstance(got, Failure) and want in got.detail


def test_total_gpus_counts_per_node_requests_times_nodes() -> None:
    assert total_gpus(SbatchOptions(gpus_per_node=8, nodes=4)) == 32
    assert total_gpus(SbatchOptions(gpus=3, gpus_per_node=8)) == 3
    assert math.isinf(UNLIMITED)


def at(*fields: int) -> float:
    return dt.datetime(*fields).timestamp()  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "future", "want"),
    [
        ("now+1hour", True, NOW + 3600),
        ("now-2days", False, NOW - 2 * 86400),
        ("now+30", True, NOW + 30),
        ("0311", True, at(2026, 3, 11)),
        ("03/09", True, at(2027, 3, 9)),  # passed this year: next year's, for --begin
        ("03/09", False, at(2026, 3, 9)),
        ("03.09.25", False, at(2025, 3, 9)),
        ("03/09/26-08:30", False, at(2026, 3, 9, 8, 30)),
        ("09:00", False, at(2026, 3, 10, 9)),  # sacct -S: this morning
        ("09:00", True, at(2026, 3, 11, 9)),  # sbatch --begin: tomorrow's
        ("midnight", False, at(2026, 3, 10)),
        ("2026-03-01T10:00", False, at(2026, 3, 1, 10)),
    ],
)
def test_slurm_time_forms_in_local_time(text: str, future: bool, want: float) -> None:
    assert parse_slurm_time(text, now=NOW, flag="-S", future=future) == want


@pytest.mark.parametrize("text", ["now+3fortnights", "13/45", "soon"])
def test_bad_slurm_times_name_the_flag(text: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(f'-S={text}: ')}"):
        parse_slurm_time(text, now=NOW, flag="-S", future=False)


def test_the_readme_lists_every_option() -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## Slurm users", 1)[1].split("\n## ", 1)[0]
    missing = [name for name in OPTIONS if f"--{name}" not in section]
    assert not missing, missing
