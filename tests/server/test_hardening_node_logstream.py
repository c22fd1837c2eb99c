"""Issue 29, findings 2 and 8, the server's half: the rest of an ended attempt's log is
taken after its exit (and only from its node, only while it is open), ``logs -f`` ends
once it is closed, a stream stops growing at the server's cap with one marker row, and
the logs of jobs that ended long ago are deleted. Played through the sync endpoint."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from server.conftest import Server, make_pool, make_team, ok, start_server, stop_server, wait_for
from server.playnode import log_text, placed, register, submit, sync

MIB = 1024 * 1024


def _running(server: Server, team: str) -> tuple[str, str, int, int]:
    pool = make_pool(server)
    node, token = register(server, pool=pool, gpus=1)
    job, attempt = placed(server, submit(server, gpus=1, pool=pool, team=team)["id"])
    sync(server, node, {"jobs": [{"job_id": job["id"], "state": "running", "attempt": attempt}]}, token=token)
    return node, token, int(job["id"]), attempt


def _chunk(jid: int, attempt: int, offset: int, data: str, **flags: bool) -> dict[str, object]:
    return {
        "job_id": jid,
        "attempt": attempt,
        "offset": offset,
        "end": offset + len(data),
        "data": data,
        **flags,
    }


def _follow_ends(server: Server, jid: int, timeout: float = 3) -> str | None:
    """The whole log if ``logs -f`` ends within ``timeout``, else None."""
    with server.client() as c:
        try:
            return c.get(f"/jobs/{jid}/logs", params={"follow": "true"}, timeout=timeout).text
        except httpx.TimeoutException:
            return None


def test_the_rest_of_an_ended_attempts_log_is_taken_until_closed(server: Server) -> None:
    team = make_team(server)
    node, token, jid, attempt = _running(server, team)
    exited = {"job_id": jid, "state": "exited", "exit_code": 0, "attempt": attempt}
    first = _chunk(jid, attempt, 0, "one\n", more=True)
    reply = sync(server, node, {"jobs": [exited], "logs": [first]}, token=token)
    assert reply["jobs"] == [] and reply["log_acks"][0]["end"] == 4
    wait_for(server, jid, "COMPLETED")  # at once, with its log still open
    assert _follow_ends(server, jid, timeout=1.5) is None  # open: -f waits for the rest
    other, other_token = register(server, pool=make_pool(server), gpus=1)
    stray = sync(server, other, {"logs": [_chunk(jid, attempt, 0, "forged\n")]}, token=other_token)
    assert stray["log_acks"] == []  # another node cannot write into it
    rest = sync(server, node, {"logs": [_chunk(jid, attempt, 4, "two\n", more=True)]}, token=token)
    assert rest["log_acks"] == [{"job_id": jid, "attempt": attempt, "end": 8}]
    close = sync(server, node, {"logs": [_chunk(jid, attempt, 8, "three\n", last=True)]}, token=token)
    assert close["log_acks"][0]["end"] == 14
    assert _follow_ends(server, jid) == "one\ntwo\nthree\n"
    late = sync(server, node, {"logs": [_chunk(jid, attempt, 14, "late\n")]}, token=token)
    assert late["log_acks"] == [] and log_text(server, jid) == "one\ntwo\nthree\n"


def test_a_stream_past_the_servers_cap_keeps_one_marker_row(server: Server) -> None:
    team = make_team(server)
    node, token, jid, attempt = _running(server, team)
    cap = 64 * MIB  # the default --job-log-max-mib
    chunks = [
        _chunk(jid, attempt, 0, "a" * 100),
        {"job_id": jid, "attempt": attempt, "offset": 100, "end": cap + 100, "data": "b\n"},  # crosses it
        _chunk(jid, attempt, cap + 100, "c" * 1000),
        _chunk(jid, attempt, cap + 1100, "d" * 1000),
    ]
    for c in chunks:
        reply = sync(server, node, {"logs": [c]}, token=token)
        assert reply["log_acks"] == [{"job_id": jid, "attempt": attempt, "end": c["end"]}]
    text = log_text(server, jid)
    assert text.startswith("a" * 100 + "b\n") and text.count("server's cap") == 1
    assert len(text) < 400 and "ccc" not in text and "ddd" not in text


def test_logs_of_jobs_ended_long_ago_are_deleted(tmp_path: Path) -> None:
    srv = start_server(f"sqlite:///{tmp_path / 'r.db'}", extra=("--log-days", "0.0001"))  # 8.6 s
    try:
        team = make_team(srv)
        node, token, jid, attempt = _running(srv, team)
        exited = {"job_id": jid, "state": "exited", "exit_code": 0, "attempt": attempt}
        sync(
            srv, node, {"jobs": [exited], "logs": [_chunk(jid, attempt, 0, "old\n", last=True)]}, token=token
        )
        wait_for(srv, jid, "COMPLETED")
        assert log_text(srv, jid) == "old\n"
        deadline = time.monotonic() + 20
        while log_text(srv, jid):
            assert time.monotonic() < deadline, "the ended job's log was never deleted"
            time.sleep(0.2)
        with srv.client() as c:
            assert ok(c.get(f"/jobs/{jid}"))["state"] == "COMPLETED"  # the job itself stays
    finally:
        stop_server(srv)
