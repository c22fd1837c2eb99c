"""The log chunks a sync carries (``agent/logship.py``): sized after encoding whatever
the bytes, capped per job with one marker, holes skipped, an ended job's log closed."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet.agent import AgentConfig, AgentTransportError, LocalJob, SimSpec, SimulatedProbe, make_agent
from gpufleet.agent.logship import LogLimits, cap_marker, chunks_of, encoded_size, pending, read_chunk


def job_with(tmp_path: Path, data: bytes, **kw: object) -> LocalJob:
    d = tmp_path / "1-1"
    d.mkdir(exist_ok=True)
    (d / "output.log").write_bytes(data)
    base = LocalJob(job_id=1, attempt=1, kind="process", gpus=(), dir=str(d), started_at=0.0)
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "data",
    [
        b"\0" * 300_000,
        b"\x01\x02" * 200_000,
        "é€😀".encode() * 50_000,
        bytes(range(256)) * 2000,
        b"a\n" * 200_000,
    ],
    ids=["nul", "control", "multibyte", "every-byte", "ascii-lines"],
)
def test_one_sync_of_chunks_stays_within_its_encoded_budget(tmp_path: Path, data: bytes) -> None:
    limits = LogLimits()
    job = job_with(tmp_path, data)
    chunks, cost = chunks_of(job, limits, limits.sync_bytes)
    assert chunks and len(json.dumps({"logs": chunks})) <= limits.sync_bytes
    assert cost <= limits.job_sync_bytes
    assert all(a["end"] == b["offset"] for a, b in itertools.pairwise(chunks))


def test_the_cap_skips_the_rest_with_one_marker_then_none(tmp_path: Path) -> None:
    limits = LogLimits(max_bytes=1000)
    job = job_with(tmp_path, b"x" * 999 + b"\n" + b"y" * 5000, log_acked=1000)
    (chunk,), _ = chunks_of(job, limits, limits.sync_bytes)
    assert (chunk["offset"], chunk["end"], chunk["data"]) == (1000, 6000, cap_marker(1000))
    with open(job.log_path, "ab") as f:
        f.write(b"z" * 100)
    later = dataclasses.replace(job, log_acked=6000, log_capped=True)
    (chunk,), _ = chunks_of(later, limits, limits.sync_bytes)
    assert (chunk["offset"], chunk["end"], chunk["data"]) == (6000, 6100, "")


def test_a_hole_is_skipped_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "log"
    with open(path, "wb") as f:
        f.write(b"before\n")
        os.ftruncate(f.fileno(), 10**12)
    first = read_chunk(path, 0, 65536)
    assert first is not None and first[1].startswith("before\n")
    at, reads = first[0], 1
    while at < 10**12:  # the block(s) the filesystem allocated read as NULs, then the hole
        got = read_chunk(path, at, 65536)
        assert got is not None and reads < 64
        at, reads = got[0], reads + 1
    assert "hole in the log" in got[1]


def test_an_ended_job_closes_its_log_and_says_more_until_then(tmp_path: Path) -> None:
    limits = LogLimits(job_sync_bytes=4096)
    job = job_with(tmp_path, b"line\n" * 2000, exit_code=0)
    chunks, _ = chunks_of(job, limits, limits.sync_bytes)
    assert chunks and all(c["more"] and not c.get("last") for c in chunks)
    done = dataclasses.replace(job, log_acked=job.log_size())
    (close,), _ = chunks_of(done, limits, limits.sync_bytes)
    assert close["offset"] == close["end"] == job.log_size() and close["last"] and "more" not in close
    assert pending(done) and not pending(dataclasses.replace(done, log_done=True))


def test_an_ended_job_gets_a_chunk_even_with_no_budget_left(tmp_path: Path) -> None:
    job = job_with(tmp_path, b"x" * 10_000, exit_code=1)
    chunks, _ = chunks_of(job, LogLimits(), 0)
    assert len(chunks) == 1 and encoded_size(chunks[0]["data"]) <= 1024


class Refusing:
    """A server that refuses the first body that carries logs as too large (413) and
    answers every other; it keeps what it was sent."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.refused = 0

    def sync(self, node: str, body: dict[str, Any]) -> dict[str, Any]:
        self.bodies.append(body)
        if body["logs"] and not self.refused:
            self.refused += 1
            raise AgentTransportError("body too large (413)", status=413)
        return {"node": node, "jobs": [], "log_acks": []}

    def close(self) -> None:
        pass


def test_a_body_refused_as_too_large_is_never_sent_again(tmp_path: Path) -> None:
    server = Refusing()
    config = AgentConfig(node="n1", work_dir=tmp_path / "w", address="127.0.0.1")
    agent = make_agent(config=config, probe=SimulatedProbe(node="n1", spec=SimSpec(gpus=1)), transport=server)
    job = job_with(tmp_path, b"\0" * 300_000, exit_code=0, ended_at=time.time())
    agent.jobs[job.key] = job
    for _ in range(3):
        agent.sync_once()
    first, second, third = server.bodies
    assert second["jobs"] == first["jobs"]  # the exit goes through at once, with 1 KiB of log
    assert len(json.dumps(second["logs"])) < 2048 < len(json.dumps(first["logs"]))
    assert third["logs"] and len(json.dumps(third)) < 0.6 * len(json.dumps(first))  # then smaller
