"""Where the gateway's endpoint lists come from: a small ``EndpointSource`` protocol,
the server's feed (``ServerSource``), a JSON file (``FileSource``) and a fake for tests
(``StaticSource``), and ``poll``, the one loop that reads a source every refresh.

Lists are read here, in the background, and never per request. A failed read keeps
the last good list (logged and counted by the caller's ``on_error``): a server that
blinks must not take every service down with it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gpufleet.failover import (
    CONNECT_TIMEOUT_S,
    PROXY_DOWN,
    Servers,
    failure_of,
    parse_urls,
    proxy_failure,
)
from gpufleet.gateway.balancer import Feed, parse_feed

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("gpufleet.gateway")

FEED_PATH = "/v1/gateway/endpoints"
REPORT_PATH = "/v1/gateway/report"


class FeedError(Exception):
    """A source could not give a feed this time (unreachable, refused, not a feed)."""


class EndpointSource(Protocol):
    """``load`` answers the current feed, or None when nothing changed since the last
    call; it raises FeedError on failure."""

    @property
    def name(self) -> str: ...

    async def load(self) -> Feed | None: ...

    async def aclose(self) -> None: ...


class ServerSource:
    """``GET {server}/v1/gateway/endpoints`` with the gateway's own token, over one
    keep-alive client. ``ca_file``: verify the server's certificate against this CA.

    ``server``: one URL, or several of one cluster (a sequence, or comma-separated). The
    feed is read from the server that answered last and moves to the next as
    ``failover.py`` says (a GET: after any failure that got no answer); the report goes
    to the same server, and to the next only if it never reached one (it needs no
    retry: the next, with the same cumulative counters, follows a refresh later). One
    log line per switch of server."""

    def __init__(
        self,
        server: str | Sequence[str],
        token: str,
        *,
        ca_file: str | os.PathLike[str] | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        self._servers = Servers(parse_urls(server))
        self._token = token
        self._ca_file = ca_file
        self._timeout_s = timeout_s
        self._client: httpx.AsyncClient | None = None

    @property
    def name(self) -> str:
        return self._servers.current + FEED_PATH

    async def load(self) -> Feed:
        resp = await self._send("GET", FEED_PATH, repeatable=True)
        if resp.status_code != 200:
            raise FeedError(f"{self.name}: HTTP {resp.status_code}: {resp.text[:200]}")
        try:
            return parse_feed(resp.json())
        except ValueError as exc:  # JSONDecodeError is one
            raise FeedError(f"{self.name}: {exc}") from exc

    async def report(self, body: dict[str, object]) -> None:
        """Send this gateway's counters (``POST /v1/gateway/report``); raises on failure."""
        if self._client is None:
            return
        resp = await self._send("POST", REPORT_PATH, repeatable=False, json=body)
        if resp.status_code >= 400:
            raise FeedError(f"report: HTTP {resp.status_code}: {resp.text[:200]}")

    async def _send(self, method: str, path: str, *, repeatable: bool, **kw: Any) -> httpx.Response:
        """The first answer from the servers in turn (``failover.Walk``), else FeedError."""
        import httpx

        client = self._http()
        walk = self._servers.walk(repeatable=repeatable)
        for url in walk:
            try:
                resp = await client.request(method, url + path, **kw)
            except httpx.HTTPError as exc:
                walk.failed(url, failure_of(exc))
                continue
            if resp.status_code in PROXY_DOWN and len(self._servers.urls) > 1:
                if walk.failed(url, proxy_failure(resp.status_code)):
                    continue
                raise FeedError(walk.message())
            switch = walk.answered(url)
            if switch is not None:
                log.warning("server %s failed (%s): now using %s", switch.old, switch.why, switch.new)
            return resp
        raise FeedError(walk.message())

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            import httpx

            verify: object = True
            if self._ca_file is not None:
                import ssl

                verify = ssl.create_default_context(cafile=os.fspath(self._ca_file))
            several = len(self._servers.urls) > 1
            connect = min(self._timeout_s, CONNECT_TIMEOUT_S) if several else self._timeout_s
            self._client = httpx.AsyncClient(
                headers={"Authorization": f"Bearer {self._token}"},
                verify=verify,  # type: ignore[arg-type]
                timeout=httpx.Timeout(self._timeout_s, connect=connect),
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


class FileSource:
    """The same JSON in a file, read again when its mtime (or size) changes."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = Path(path)
        self._seen: tuple[int, int] | None = None

    @property
    def name(self) -> str:
        return str(self._path)

    async def load(self) -> Feed | None:
        try:
            st = self._path.stat()
            if (st.st_mtime_ns, st.st_size) == self._seen:
                return None
            feed = parse_feed(json.loads(self._path.read_bytes()))
        except (OSError, ValueError) as exc:
            raise FeedError(f"{self._path}: {exc}") from exc
        self._seen = (st.st_mtime_ns, st.st_size)
        return feed

    async def aclose(self) -> None:
        return None


class StaticSource:
    """A feed held in memory (tests, an embedded gateway). ``set`` replaces it (from
    any thread); ``fail`` makes the next loads raise FeedError until the next ``set``."""

    def __init__(self, feed: Feed) -> None:
        self._feed = feed
        self._version = 1
        self._seen = 0
        self._error: str | None = None

    @property
    def name(self) -> str:
        return "static"

    def set(self, feed: Feed) -> None:
        self._feed, self._error = feed, None
        self._version += 1

    def fail(self, reason: str = "source down") -> None:
        self._error = reason

    async def load(self) -> Feed | None:
        if self._error is not None:
            raise FeedError(self._error)
        version = self._version
        if version == self._seen:
            return None
        self._seen = version
        return self._feed

    async def aclose(self) -> None:
        return None


async def load_once(
    source: EndpointSource, apply: Callable[[Feed], None], on_error: Callable[[str], None]
) -> None:
    """One read: a new feed is applied, a failure reported; neither raises."""
    try:
        feed = await source.load()
    except FeedError as exc:
        on_error(str(exc))
        return
    except Exception as exc:  # a bug in a source must not stop the loop
        log.exception("endpoint source %s failed", source.name)
        on_error(repr(exc))
        return
    if feed is not None:
        for reason in feed.skipped:
            log.warning("feed from %s: skipped %s", source.name, reason)
        apply(feed)


async def poll(
    source: EndpointSource,
    apply: Callable[[Feed], None],
    on_error: Callable[[str], None],
    *,
    refresh_s: float,
) -> None:
    """Read ``source`` every ``refresh_s`` until cancelled."""
    while True:
        await asyncio.sleep(refresh_s)
        await load_once(source, apply, on_error)


__all__ = ["EndpointSource", "FeedError", "FileSource", "ServerSource", "StaticSource", "load_once", "poll"]
