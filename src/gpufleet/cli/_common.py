"""What every client command needs: a client for the saved connection, its output
(JSON, or a plain table), and its errors.

Errors are one line on stderr, ``gpufleet: error: ...``: exit 2 for bad input (the
server's 400, 413 or 422, a bad option), 1 for everything else (unreachable server, 401,
403, 404, 409). A command raises what :func:`fail` returns, so that the checker sees the
function end there: ``raise fail("...", BAD_INPUT) from None``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    import httpx

    from gpufleet.client import ClientError, GpufleetClient

FAILED = 1
"""Exit code of a command that could not do its work."""
BAD_INPUT = 2
"""Exit code of a command given bad input: an option, an argument, or a request the
server refused as such. Click exits 2 for a usage error too."""
_BAD_INPUT_STATUSES = (400, 413, 422)


def fail(message: str, code: int = FAILED) -> typer.Exit:
    """Print ``gpufleet: error: MESSAGE`` on stderr; returns the exit to raise."""
    error(message)
    return typer.Exit(code)


def error(message: str) -> None:
    """An error that does not end the command (one of several jobs it acts on)."""
    typer.echo(f"gpufleet: error: {message}", err=True)


def warn(message: str) -> None:
    typer.echo(f"gpufleet: warning: {message}", err=True)


def exit_code(exc: ClientError) -> int:
    """:data:`BAD_INPUT` for a request the server refused as bad input, else :data:`FAILED`."""
    return BAD_INPUT if exc.status in _BAD_INPUT_STATUSES else FAILED


@contextmanager
def client() -> Iterator[GpufleetClient]:
    """The client for the saved connection (``gpufleet login``, or ``GPUFLEET_URL`` and
    ``GPUFLEET_TOKEN``); a :class:`ClientError` inside the block ends the command with
    its message and :func:`exit_code`."""
    from gpufleet.client import ClientError, GpufleetClient, load_connection
    from gpufleet.failover import parse_urls

    try:
        conn = load_connection()
        try:
            urls = parse_urls(conn.url)
        except ValueError as exc:
            raise ClientError(f"server URL: {exc}") from None
        # no httpx transport: the standard library's (gpufleet.litehttp), which loads a
        # trust store only for an https:// server and imports no httpx (~25-30 ms)
        with GpufleetClient(urls, conn.token, ca_file=conn.ca_file) as c:
            yield c
    except ClientError as exc:
        raise fail(exc.message, exit_code(exc)) from None


def print_json(data: Any) -> None:
    """``--json`` output: indented; what JSON has no type for (a datetime) as its text."""
    typer.echo(json.dumps(data, indent=2, default=str))


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Columns padded to their widest cell, two spaces apart; ``None`` shows as ``-``.
    Plain text, so that ``awk`` and ``grep`` read it as they read ``squeue``'s."""
    cells = [[str(h) for h in headers]] + [["-" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for r in cells:
        typer.echo("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())


def stream_logs(job_id: int, *, follow: bool) -> None:
    """Print a job's output as it arrives (``gpufleet logs``, ``gpufleet service logs``).
    Several servers: the first that answers (a GET); a stream cut once output was printed
    is an error, not a second copy of the output from another server."""
    import httpx

    from gpufleet.client import load_connection, tls_verify
    from gpufleet.failover import PROXY_DOWN, Servers, failure_of, parse_urls, proxy_failure

    conn = load_connection()
    try:
        walk = Servers(parse_urls(conn.url)).walk(repeatable=True)
    except ValueError as exc:
        raise fail(f"server URL: {exc}") from None
    headers = {"Authorization": f"Bearer {conn.token}"} if conn.token else {}
    params = {"follow": "true"} if follow else {}
    printed: list[bool] = []
    try:
        with httpx.Client(
            headers=headers, timeout=httpx.Timeout(30.0, read=None), verify=tls_verify(conn.ca_file)
        ) as http:
            for server in walk:
                try:
                    with http.stream("GET", f"{server}/v1/jobs/{job_id}/logs", params=params) as resp:
                        down = resp.status_code in PROXY_DOWN
                        if down and walk.failed(server, proxy_failure(resp.status_code)):
                            continue
                        _print_stream(resp, printed)
                        return
                except httpx.HTTPError as exc:
                    if printed:
                        raise fail(f"lost server {server} ({exc.__class__.__name__})") from None
                    walk.failed(server, failure_of(exc))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    raise fail(walk.message())


def _print_stream(resp: httpx.Response, printed: list[bool]) -> None:
    """A log stream's text to stdout (``printed`` gets an item once some was), or its error."""
    if resp.status_code >= 400:
        resp.read()
        detail = ""
        try:
            detail = str(resp.json().get("detail", ""))
        except ValueError:
            detail = resp.text[:200]
        raise fail(f"{resp.status_code}: {detail}")
    for text in resp.iter_text():
        if not printed:
            printed.append(True)
        sys.stdout.write(text)
        sys.stdout.flush()


__all__ = ["BAD_INPUT", "FAILED", "client", "error", "exit_code", "fail", "print_json", "print_table", "warn"]
