"""``#SBATCH`` directive parsing, table-driven (tests/test_sbatch_strict.py: what is refused,
and a corpus of real-world scripts)."""

from __future__ import annotations

import pytest

from gpufleet.cli.sbatch import parse_script
from gpufleet.cli.slurmflags import SbatchOptions, total_gpus

NOW = 1_800_000_000.0

CASES: list[tuple[str, str, dict[str, object], int]] = [
    ("gres-count", "#SBATCH --gres=gpu:4", {"gpus_per_node": 4}, 4),
    ("gres-typed", "#SBATCH --gres=gpu:a100:2", {"gpus_per_node": 2, "gpu_type": "a100"}, 2),
    ("gres-space-form", "#SBATCH --gres gpu:3", {"gpus_per_node": 3}, 3),
    ("gres-times-nodes", "#SBATCH --gres=gpu:8\n#SBATCH -N 2", {"gpus_per_node": 8, "nodes": 2}, 16),
    ("gpus-total", "#SBATCH --gpus=6 --nodes=2", {"gpus": 6, "nodes": 2}, 6),
    ("gpus-typed", "#SBATCH --gpus=h100:4", {"gpus": 4, "gpu_type": "h100"}, 4),
    ("gpus-per-node", "#SBATCH --gpus-per-node=4\n#SBATCH --nodes 3", {"gpus_per_node": 4, "nodes": 3}, 12),
    ("short-N-glued", "#SBATCH -N2 --gres=gpu:1", {"nodes": 2, "gpus_per_node": 1}, 2),
    ("nodes-range", "#SBATCH --nodes=2-4", {"nodes": 2}, 0),
    ("time-minutes", "#SBATCH --time=90", {"time_limit_s": 5400.0}, 0),
    ("time-hms", "#SBATCH -t 1:00:00", {"time_limit_s": 3600.0}, 0),
    ("time-days", "#SBATCH --time=1-12", {"time_limit_s": 129600.0}, 0),
    ("names", "#SBATCH -J train --partition=big", {"name": "train", "pool": "big"}, 0),
    ("short-partition", "#SBATCH -p small", {"pool": "small"}, 0),
    ("io", "#SBATCH -o out.%j --error=err.%j", {"output": "out.%j", "error": "err.%j"}, 0),
    ("requeue", "#SBATCH --requeue", {"requeue": True}, 0),
    ("no-requeue", "#SBATCH --no-requeue", {"requeue": False}, 0),
    ("quoted-name", '#SBATCH --job-name="my job"', {"name": "my job"}, 0),
    ("trailing-comment", "#SBATCH --gres=gpu:2 # two GPUs", {"gpus_per_node": 2}, 2),
    ("stops-at-command", "#SBATCH --gres=gpu:1\necho hi\n#SBATCH --gres=gpu:8", {"gpus_per_node": 1}, 1),
    ("comments-between", "# setup\n\n#SBATCH -J x", {"name": "x"}, 0),
    ("nothing", "echo hi", {}, 0),  # Slurm: no GPU unless asked
    # issue 31: what real scripts use
    ("gpus-per-task", "#SBATCH --ntasks=4 --gpus-per-task=2", {"ntasks": 4, "gpus_per_task": 2}, 8),
    (
        "gpus-per-task-per-node",
        "#SBATCH -N 2 --tasks-per-node=4 --gpus-per-task=1",
        {"nodes": 2, "ntasks_per_node": 4, "gpus_per_task": 1},
        8,
    ),
    ("exclude-hostlist", "#SBATCH --exclude=gpu[01-02],gpu07", {"exclude": ("gpu01", "gpu02", "gpu07")}, 0),
    ("constraint-feature", "#SBATCH -C 'a100&ib'", {"constraint": "a100&ib"}, 0),
    ("constraint-matching-or", "#SBATCH --constraint=[rack1|rack2]", {"constraint": "[rack1|rack2]"}, 0),
    ("mem-all", "#SBATCH --mem=0", {"mem": 0}, 0),
    ("partition-list", "#SBATCH -p a100,h100", {"pool": "a100,h100"}, 0),
    ("licenses", "#SBATCH -L matlab:2,ansys", {"licenses": (("ansys", 1), ("matlab", 2))}, 0),
    ("qos", "#SBATCH --qos=high", {"qos": "high"}, 0),
    ("harmless", "#SBATCH --hint=nomultithread --overcommit --wait-all-nodes=1 --get-user-env", {}, 0),
]


@pytest.mark.parametrize(("text", "want", "gpus"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_directives(text: str, want: dict[str, object], gpus: int) -> None:
    got = parse_script("#!/bin/bash\n" + text + "\n", now=NOW)
    assert got.problems == ()
    fields = {
        k: v
        for k, v in vars_of(got).items()
        if v is not None and k not in ("problems", "origins", "gpu_type_by")
    }
    assert fields == want
    assert total_gpus(got) == gpus


PROBLEMS = [
    ("unknown-eq", "#SBATCH --switches=1", "--switches=1: gpufleet cannot honour this", True),
    ("unknown-space", "#SBATCH --nodelist foo", "--nodelist foo: gpufleet cannot honour this", True),
    ("remote-license", "#SBATCH -L fluent@flex", "remote licenses (NAME@SERVER) are not kept here", True),
    ("constraint-count", "#SBATCH -C a100*2", "feature counts (a*2) are not supported", True),
    ("bad-constraint", "#SBATCH -C 'a&'", "a feature is missing at the end", False),
    ("bad-exclude", "#SBATCH --exclude=gpu[01-", "--exclude=gpu[01-", False),
    ("non-gpu-gres", "#SBATCH --gres=mps:100", "mps is not a generic resource here", True),
    ("bad-time", "#SBATCH --time=soon", "--time=soon: cannot read duration", False),
    ("bad-nodes", "#SBATCH --nodes=many", "--nodes=many: expected N or MIN-MAX", False),
    ("missing-value", "#SBATCH --job-name", "--job-name needs a value", False),
    ("unknown-short", "#SBATCH -w node1", "#SBATCH -w node1: gpufleet cannot honour this", True),
]


@pytest.mark.parametrize(
    ("text", "needle", "refused"), [w[1:] for w in PROBLEMS], ids=[w[0] for w in PROBLEMS]
)
def test_unknown_or_bad_directives_are_problems_naming_the_line(
    text: str, needle: str, refused: bool
) -> None:
    """Formerly warnings; now each is a problem (issue 18: strict scripts) and the rest
    of the script is still read."""
    got = parse_script(text + "\n#SBATCH -J kept\n", source="job.sh", now=NOW)
    assert len(got.problems) == 1 and needle in str(got.problems[0]), got.problems
    assert str(got.problems[0]).startswith("job.sh line 1: ")
    assert got.problems[0].refused is refused
    assert got.name == "kept"


def vars_of(o: SbatchOptions) -> dict[str, object]:
    return {k: getattr(o, k) for k in SbatchOptions.__slots__}
