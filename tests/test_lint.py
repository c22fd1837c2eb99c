"""The code stays ruff- and mypy-clean (strict): checked here so CI proves it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["ruff", "check", "src", "tests", "bench"], id="ruff-check"),
        pytest.param(["ruff", "format", "--check", "src", "tests", "bench"], id="ruff-format"),
        pytest.param(["mypy"], id="mypy-strict"),
    ],
)
def test_clean(command: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
