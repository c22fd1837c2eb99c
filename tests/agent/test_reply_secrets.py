"""A sync reply the agent cannot read is reported without the values in it: a reply
carries jobs' ``env`` (secrets), and pydantic's error text quotes the offending input.
(This asserts on the log line too: what reaches a log is the property under test.)"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from gpufleet.agent import AgentConfig, SimSpec, SimulatedProbe, make_agent

SECRET = "hunter2-in-a-job-env"


class Replies:
    """A transport double that answers every sync with ``reply``."""

    def __init__(self, reply: dict[str, Any]) -> None:
        self.reply = reply

    def sync(self, node: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.reply

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    "reply",
    [
        {"node": "n1", "jobs": SECRET},
        {"node": "n1", "jobs": [{"job_id": 1, "env": {"API_KEY": [SECRET]}}]},
    ],
    ids=["jobs-not-a-list", "env-not-strings"],
)
def test_bad_reply_is_reported_without_its_values(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, reply: dict[str, Any]
) -> None:
    agent = make_agent(
        config=AgentConfig(node="n1", work_dir=tmp_path),
        probe=SimulatedProbe(node="n1", spec=SimSpec(gpus=1)),
        transport=Replies(reply),
    )
    with caplog.at_level(logging.WARNING):
        assert agent.sync_once() is False
    assert agent.stats.last_error is not None and "schema errors" in agent.stats.last_error
    assert SECRET not in agent.stats.last_error
    assert "bad sync reply" in caplog.text and SECRET not in caplog.text
