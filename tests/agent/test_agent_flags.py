"""``gpufleet agent``'s flags for a node that models a real machine (issue 31):
``--simulate-cpus``, ``--simulate-memory`` and ``--features``, read before anything starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.agent.simprobe import SimSpec, SimulatedProbe
from gpufleet.cli.agent_cmds import _features, _node_memory

LOCAL = ("--token", "gfn_test", "--name", "flags", "--work-dir")


@pytest.mark.parametrize(
    ("text", "mib"), [("2T", 2 * 1024 * 1024), ("1536G", 1536 * 1024), ("512000", 512000), (None, None)]
)
def test_simulated_memory_reads_as_sbatch_reads_mem(text: str | None, mib: int | None) -> None:
    assert _node_memory(text) == mib


def test_a_simulated_node_reports_the_cpus_and_memory_it_was_given() -> None:
    inv = SimulatedProbe(node="n", spec=SimSpec(gpus=8, cpus=224, node_memory_mb=2 * 1024 * 1024)).inventory()
    assert (inv.cpus, inv.memory_mb, len(inv.gpus)) == (224, 2 * 1024 * 1024, 8)


def test_features_are_words_and_a_bad_one_is_refused_before_the_agent_starts(tmp_path: Path) -> None:
    assert _features("ib, nvme,gpu80") == ("ib", "nvme", "gpu80") and _features("") == ()
    bad = [
        ["--simulate-gpus", "8", "--features", "ib,a b"],
        ["--simulate-gpus", "8", "--simulate-memory", "lots"],
        ["--simulate-cpus", "224"],  # without --simulate-gpus
    ]
    for args in bad:
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpufleet",
                "agent",
                "--server",
                "http://127.0.0.1:9",
                *LOCAL,
                str(tmp_path),
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 2, (args, res.stderr)
        assert "--features" in res.stderr or "--simulate-" in res.stderr, res.stderr
