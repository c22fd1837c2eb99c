"""The client against the server's rate limits and pages, on httpx's mock transport: a
429 is waited out (``Retry-After``) within ``max_wait_s``; lists follow ``next_cursor``."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gpufleet.client import ClientError, GpufleetClient

ME = {"id": 1, "name": "alice", "role": "user", "teams": []}


def _too_many(after: str) -> httpx.Response:
    body = {"type": "about:blank", "title": "Too Many Requests", "status": 429, "detail": "rate limit: alice"}
    return httpx.Response(429, json=body, headers={"Retry-After": after})


def _client(answers: list[httpx.Response], seen: list[httpx.Request], max_wait_s: float) -> GpufleetClient:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answers.pop(0)

    return GpufleetClient(
        "http://gf.test", "gf_t", transport=httpx.MockTransport(handler), max_wait_s=max_wait_s
    )


@pytest.mark.parametrize(
    ("answers", "max_wait_s", "want", "calls"),
    [
        pytest.param([httpx.Response(200, json=ME)], 5.0, "alice", 1, id="no-limit"),
        pytest.param(
            [_too_many("0"), _too_many("0"), httpx.Response(200, json=ME)], 5.0, "alice", 3, id="waited-out"
        ),
        pytest.param([_too_many("30"), httpx.Response(200, json=ME)], 5.0, 429, 1, id="longer-than-max-wait"),
        pytest.param(
            [_too_many("soon"), httpx.Response(200, json=ME)], 5.0, 429, 1, id="no-usable-retry-after"
        ),
    ],
)
def test_429_is_retried_within_max_wait(
    answers: list[httpx.Response], max_wait_s: float, want: str | int, calls: int
) -> None:
    seen: list[httpx.Request] = []
    with _client(answers, seen, max_wait_s) as c:
        try:
            got: str | int = c.whoami().name
        except ClientError as exc:
            assert exc.message.startswith("too many requests") and "rate limit: alice" in exc.message
            got = exc.status or 0
    assert (got, len(seen)) == (want, calls)


def _team(name: str) -> dict[str, Any]:
    return {"name": name, "members": [], "quota_gpus": 0, "quota_limit": None}


def test_lists_follow_next_cursor() -> None:
    pages = [
        httpx.Response(200, json={"items": [_team("a"), _team("b")], "next_cursor": "b"}),
        httpx.Response(200, json={"items": [_team("c")], "next_cursor": None}),
    ]
    seen: list[httpx.Request] = []
    with _client(pages, seen, 5.0) as c:
        teams = c.teams()
    assert [t.name for t in teams] == ["a", "b", "c"]
    assert [dict(r.url.params) for r in seen] == [{"limit": "100"}, {"limit": "1000", "cursor": "b"}]
