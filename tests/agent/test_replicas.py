"""The agent's view of service replicas: busy time read off a model server's metrics page."""

from __future__ import annotations

import pytest

from gpufleet.agent.replicas import busy_seconds, free_port

PAGE = """# HELP gpufleet_model_busy_seconds_total Time the model spent computing.
# TYPE gpufleet_model_busy_seconds_total counter
gpufleet_model_busy_seconds_total{model="a"} 1.5
gpufleet_model_busy_seconds_total{model="b"} 2.0
gpufleet_model_inflight{model="a"} 3.0
"""


@pytest.mark.parametrize(
    ("text", "want"),
    [
        pytest.param(PAGE, 3.5, id="summed-over-models"),
        pytest.param("gpufleet_model_inflight 1\n", None, id="no-busy-metric"),
        pytest.param("not { a metrics page", None, id="garbage"),
        pytest.param("", None, id="empty"),
    ],
)
def test_busy_seconds(text: str, want: float | None) -> None:
    assert busy_seconds(text) == want


def test_free_port_is_a_port() -> None:
    assert 0 < free_port() < 65536
