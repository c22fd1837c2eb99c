"""``#GPUFLEET`` directive lines (gpufleet's own options in a batch script)."""

from __future__ import annotations

import pytest

from gpufleet.cli.gpufleet_directives import parse

HEAD = "#!/bin/bash\n#SBATCH --gpus=2\n"


@pytest.mark.parametrize(
    ("body", "every", "problems"),
    [
        pytest.param("#GPUFLEET --checkpoint-every 30m\n", "30m", [], id="value-after-a-space"),
        pytest.param(
            "#GPUFLEET --checkpoint-every=1800  # half an hour\n", "1800", [], id="equals-and-comment"
        ),
        pytest.param(
            "#GPUFLEET --checkpoint-every 1h\n#SBATCH --time=2:00:00\n#GPUFLEET --checkpoint-every 2h\n",
            "2h",
            [],
            id="a-later-line-wins-between-sbatch-lines",
        ),
        pytest.param(
            "python train.py\n#GPUFLEET --checkpoint-every 30m\n", None, [], id="after-the-first-command"
        ),
        pytest.param(
            "# GPUFLEET --checkpoint-every 30m\n#GPUFLEETX --foo\n", None, [], id="only-the-exact-prefix"
        ),
        pytest.param(
            "#GPUFLEET --checkpoint-every abc\n",
            None,
            [
                "job.sh line 3: --checkpoint-every=abc: cannot read duration 'abc'"
                " (try 90s, 30m, 2h, 1d or D-HH:MM:SS)"
            ],
            id="bad-value",
        ),
        pytest.param(
            "#GPUFLEET --checkpoint-every 0\n",
            None,
            ["job.sh line 3: --checkpoint-every=0: between 1 second and 30 days"],
            id="zero",
        ),
        pytest.param(
            "#GPUFLEET --checkpoint-every\n",
            None,
            ["job.sh line 3: #GPUFLEET --checkpoint-every: needs a value"],
            id="no-value",
        ),
        pytest.param(
            "#GPUFLEET --checkpoint-evry 30m\n",
            None,
            [
                "job.sh line 3: #GPUFLEET --checkpoint-evry: an unknown option"
                " (gpufleet's are --checkpoint-every)",
                "job.sh line 3: #GPUFLEET 30m: not an option (gpufleet's are --checkpoint-every)",
            ],
            id="unknown-option",
        ),
    ],
)
def test_parse(body: str, every: str | None, problems: list[str]) -> None:
    got = parse(HEAD + body, source="job.sh")
    assert got.checkpoint_every == every
    assert [str(p) for p in got.problems] == problems
    assert all(not p.refused for p in got.problems)  # --ignore-unsupported passes none of them
