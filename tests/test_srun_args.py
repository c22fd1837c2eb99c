"""``srun``'s arguments as Slurm reads them (``gpufleet.slurm.srun``): ``-K`` takes a value
only attached, the command starts at the first word that is no option or option value,
and ``--export`` decides what of srun's environment reaches the tasks."""

from __future__ import annotations

import pytest

from gpufleet.slurm.srun import export_env, kill_flag, parser


@pytest.mark.parametrize(
    ("argv", "kill", "command", "ntasks"),
    [
        (["-K", "python", "x.py"], True, ["python", "x.py"], None),
        (["-n", "4", "-K1", "cmd", "-K0"], True, ["cmd", "-K0"], 4),
        (["--kill-on-bad-exit=0", "-l", "cmd"], False, ["cmd"], None),
        (["-N2", "--ntasks-per-node", "2", "bash", "-c", "x"], False, ["bash", "-c", "x"], None),
        (["--mpi=pmix", "--cpu-bind=cores", "python", "-u", "t.py", "--lr", "3"], False,
         ["python", "-u", "t.py", "--lr", "3"], None),
    ],
    ids=["K-before-command", "K1-attached", "long-form-0", "value-then-command", "ignored-options"],
)  # fmt: skip
def test_arguments(argv: list[str], kill: bool, command: list[str], ntasks: int | None) -> None:
    p = parser()
    rest, said = kill_flag(argv, p)
    args = p.parse_args(rest)
    assert (said if said is not None else args.kill_on_bad_exit) is kill
    assert args.command == command and args.ntasks == ntasks


ENV = {"A": "1", "B": "2", "SLURM_JOB_ID": "7", "GPUFLEET_TOKEN": "secret", "_": "/usr/bin/srun"}


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        (None, {"A": "1", "B": "2", "SLURM_JOB_ID": "7"}),
        ("ALL", {"A": "1", "B": "2", "SLURM_JOB_ID": "7"}),
        ("NONE", {}),
        ("A,C=3", {"A": "1", "C": "3", "SLURM_JOB_ID": "7"}),
        ("ALL,B=9", {"A": "1", "B": "9", "SLURM_JOB_ID": "7"}),
    ],
    ids=["default-all", "all", "none", "named", "all-and-set"],
)
def test_export(spec: str | None, want: dict[str, str]) -> None:
    assert export_env(spec, ENV) == want
