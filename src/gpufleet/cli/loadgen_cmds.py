"""``gpufleet loadgen``: open-loop HTTP load against a URL (a service behind the gateway,
a replica), a table per interval and a summary.

The engine is :mod:`gpufleet.loadgen`, imported (with aiohttp) when the command runs.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from gpufleet.cli._common import BAD_INPUT, FAILED, fail, print_json
from gpufleet.timefmt import parse_duration

if TYPE_CHECKING:
    from gpufleet.loadgen import Interval, Summary

_COLUMNS = f"{'time':>11}  {'offered':>8}  {'achieved':>8}  {'p50_ms':>8}  {'p99_ms':>8}  errors"


def _duration(option: str, text: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise fail(f"{option}: {exc}", BAD_INPUT) from None
    if seconds <= 0:
        raise fail(f"{option}: must be above 0", BAD_INPUT)
    return seconds


def _headers(values: list[str], token: str | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values:
        name, sep, rest = value.partition(":")
        if not sep or not name.strip():
            raise fail(f"--header: expected 'Name: value', got {value!r}", BAD_INPUT)
        out[name.strip()] = rest.strip()
    if token:
        out["Authorization"] = f"Bearer {token}"
    return out


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _errors(errors: dict[str, int]) -> str:
    return " ".join(f"{code}:{n}" for code, n in errors.items()) or "-"


def _row(i: Interval) -> str:
    span = f"{i.start_s:g}-{i.end_s:g}s"
    return (
        f"{span:>11}  {i.offered_qps:>8.1f}  {i.achieved_qps:>8.1f}  {_ms(i.p50_ms):>8}  {_ms(i.p99_ms):>8}"
        f"  {_errors(i.errors)}"
    )


def _summary_lines(s: Summary) -> list[str]:
    return [
        f"sent {s.sent} in {s.duration_s:g}s (offered {s.offered_qps:.1f}/s), {s.ok} ok"
        f" (achieved {s.achieved_qps:.1f}/s over {s.elapsed_s:.2f}s), errors: {_errors(s.errors)}",
        f"latency ms: mean {_ms(s.mean_ms)}  p50 {_ms(s.p50_ms)}  p90 {_ms(s.p90_ms)}"
        f"  p99 {_ms(s.p99_ms)}  p99.9 {_ms(s.p999_ms)}  max {_ms(s.max_ms)}",
    ]


def loadgen(
    url: str = typer.Argument(..., help="The URL every request goes to."),
    qps: float = typer.Option(
        100.0, "--qps", min=0.001, help="Requests per second (the low rate of a shape)."
    ),
    duration: str = typer.Option("60s", "--duration", help="How long to send (30s, 5m)."),
    shape: str = typer.Option(
        "constant",
        "--shape",
        help="constant, step, ramp (to --peak-qps) or sine (between --qps and --peak-qps).",
    ),
    peak_qps: float | None = typer.Option(
        None, "--peak-qps", min=0.001, help="step, ramp, sine: the other rate."
    ),
    period: str = typer.Option("60s", "--period", help="sine: the period of one cycle."),
    step_at: str | None = typer.Option(
        None, "--step-at", help="step: when --peak-qps starts (default: half-way)."
    ),
    arrivals: str = typer.Option(
        "poisson", "--arrivals", help="poisson (random gaps, bursts) or uniform (evenly spaced)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the arrival times."),
    body: Path | None = typer.Option(
        None,
        "--body",
        exists=True,
        dir_okay=False,
        help="Request body. Default: a KServe v2 request for the built-in model"
        " when the URL ends with /infer.",
    ),
    header: list[str] = typer.Option([], "--header", "-H", help="'Name: value' (repeatable)."),
    token_file: Path | None = typer.Option(
        None,
        "--token-file",
        help="File holding the service token sent as Authorization: Bearer (mode 0600 or "
        "stricter). Else GPUFLEET_SERVICE_TOKEN.",
        show_default=False,
    ),
    token: str | None = typer.Option(
        None, "--token", help="The token itself (warns: every local user can read a command line)."
    ),
    method: str | None = typer.Option(None, "--method", help="Default: POST with a body, else GET."),
    concurrency_limit: int = typer.Option(
        1024, "--concurrency-limit", min=1, help="Most requests open at once (beyond: they wait, counted)."
    ),
    timeout: str = typer.Option("30s", "--timeout", help="A request not answered by then is an error."),
    report_every: str = typer.Option("5s", "--report-every", help="One table row per this much time."),
    json_out: Path | None = typer.Option(None, "--json-out", help="Write {intervals, summary} to this file."),
    as_json: bool = typer.Option(False, "--json", help="Print {intervals, summary} as JSON, no table."),
) -> None:
    """Open-loop load: requests leave on schedule whatever the answers, and latency counts
    from each request's scheduled time (no coordinated omission).

    Prints, every --report-every, the offered and achieved requests/s (2xx), p50 and p99
    latency and errors by status (timeout, conn: no answer), then a summary. Exits 1 when
    no request succeeded.
    """
    from gpufleet.loadgen import ARRIVALS, SHAPES, LoadShape, Target, kserve_body, run_load

    if shape not in SHAPES:
        raise fail(f"--shape: one of {', '.join(SHAPES)}, got {shape!r}", BAD_INPUT)
    if arrivals not in ARRIVALS:
        raise fail(f"--arrivals: one of {', '.join(ARRIVALS)}, got {arrivals!r}", BAD_INPUT)
    try:
        load = LoadShape(
            kind=shape,
            qps=qps,
            duration_s=_duration("--duration", duration),
            peak_qps=peak_qps,
            period_s=_duration("--period", period),
            step_at_s=None if step_at is None else parse_duration(step_at),
        )
    except ValueError as exc:
        raise fail(str(exc), BAD_INPUT) from None
    from gpufleet.cli.credfile import SecretFlags, secret

    flags = SecretFlags(command="gpufleet loadgen", env="GPUFLEET_SERVICE_TOKEN", what="the service token")
    headers = _headers(header, secret(flags, path=token_file, given=token, required=False))
    data = body.read_bytes() if body is not None else None
    if data is None and url.rstrip("/").endswith("/infer"):
        data = kserve_body()
        headers.setdefault("Content-Type", "application/json")
    target = Target(
        url=url,
        method=(method or ("POST" if data is not None else "GET")).upper(),
        body=data,
        headers=headers,
        timeout_s=_duration("--timeout", timeout),
        concurrency_limit=concurrency_limit,
    )

    def show(interval: Interval) -> None:
        typer.echo(_row(interval))

    if not as_json:
        typer.echo(_COLUMNS)
    report = asyncio.run(
        run_load(
            target,
            load,
            arrivals=arrivals,
            seed=seed,
            report_every_s=_duration("--report-every", report_every),
            on_interval=None if as_json else show,
        )
    )
    doc: dict[str, Any] = report.as_json()
    if json_out is not None:
        json_out.write_text(json.dumps(doc, indent=2) + "\n")
    if as_json:
        print_json(doc)
    else:
        for line in _summary_lines(report.summary):
            typer.echo(line)
    if report.summary.ok == 0:
        raise typer.Exit(FAILED)


__all__ = ["loadgen"]
