"""``gpufleet service model load|unload|list|forget``: hot model load and unload on
every replica of a service (issue 30; ``api/servicemodels.py`` has the rules).

``load``/``unload`` record the wish (``PUT /v1/services/NAME/models/MODEL``); each
replica's agent applies it through Triton's repository API, on replicas that start
later too. ``--wait`` returns once every serving replica has it (exit 1 if one
refused, with its reason). A thin client: nothing of the server is imported.
"""

from __future__ import annotations

import time
from typing import Any

import typer
from pydantic import TypeAdapter, ValidationError

from gpufleet.api.servicemodels import ServiceModelOut
from gpufleet.cli._common import client, fail, print_json, print_table
from gpufleet.cli.options import json_flag
from gpufleet.client import GpufleetClient

model_app = typer.Typer(
    help="Models on every replica: load, unload (now and on replicas that start later), list, forget.",
    no_args_is_help=True,
)
WAIT_POLL_S = 0.5


def _parse(model: Any, answer: Any, path: str) -> Any:
    try:
        return TypeAdapter(model).validate_python(answer)
    except ValidationError as exc:
        raise fail(f"unexpected answer from {path}: {exc.error_count()} schema errors") from None


def _models(c: GpufleetClient, name: str) -> list[ServiceModelOut]:
    path = f"/services/{name}/models"
    out: list[ServiceModelOut] = _parse(list[ServiceModelOut], c.request("GET", path), path)
    return out


def status_line(m: ServiceModelOut) -> str:
    """One line: what is wanted and how many serving replicas have it."""
    want = "READY" if m.wanted == "loaded" else "UNAVAILABLE"
    line = f"{m.name}: wanted {m.wanted}; {m.converged}/{m.replicas} replicas {want}"
    pending = sum(1 for r in m.per_replica if r.state == "PENDING")
    if pending:
        line += f", {pending} not reported yet"
    if m.failed:
        line += f", {m.failed} failed"
    return line


def failure_lines(m: ServiceModelOut) -> list[str]:
    return [
        f"  replica {r.replica} (job {r.job_id}): {r.state}: {r.reason or '-'}"
        for r in m.per_replica
        if r.state in ("FAILED", "UNKNOWN")
    ]


def print_models(models: list[ServiceModelOut]) -> None:
    """``service show``'s models part (nothing when no model is wished)."""
    if not models:
        return
    typer.echo("\nmodels:")
    for m in models:
        typer.echo(f"  {status_line(m)}")
        for line in failure_lines(m):
            typer.echo(f"  {line}")


def _settled(m: ServiceModelOut) -> bool:
    """Every serving replica reported for the current wish (converged or refused)."""
    return all(r.state != "PENDING" for r in m.per_replica) and m.converged + m.failed >= m.replicas


def _wait(c: GpufleetClient, name: str, model: str, timeout_s: float) -> ServiceModelOut:
    deadline = time.monotonic() + timeout_s
    while True:
        got = next((m for m in _models(c, name) if m.name == model), None)
        if got is None:
            raise fail(f"service {name}: the wish for {model} is gone (forgotten meanwhile?)")
        if _settled(got) or time.monotonic() >= deadline:
            return got
        time.sleep(WAIT_POLL_S)


def _set(name: str, model: str, state: str, wait: float | None, json_out: bool) -> None:
    path = f"/services/{name}/models/{model}"
    with client() as c:
        out: ServiceModelOut = _parse(ServiceModelOut, c.request("PUT", path, json={"state": state}), path)
        if wait is not None:
            out = _wait(c, name, model, wait)
    if json_out:
        print_json(out.model_dump())
    else:
        typer.echo(f"service {name}: {status_line(out)}")
        for line in failure_lines(out):
            typer.echo(line)
    if wait is not None and (out.failed or not _settled(out)):
        raise typer.Exit(1)


WAIT_HELP = "Return once every serving replica has it (or refused it), at most this many seconds."


@model_app.command("load")
def load(
    name: str = typer.Argument(..., help="The service."),
    model: str = typer.Argument(..., help="The model's name in the replicas' repository."),
    wait: float | None = typer.Option(None, "--wait", min=0.0, max=3600.0, help=WAIT_HELP),
    json_out: bool = json_flag("a line"),
) -> None:
    """Load MODEL on every replica of NAME, and on every replica that starts later
    (Triton's repository load on each; a refusal is shown with the replica's reason)."""
    _set(name, model, "loaded", wait, json_out)


@model_app.command("unload")
def unload(
    name: str = typer.Argument(..., help="The service."),
    model: str = typer.Argument(..., help="The model's name in the replicas' repository."),
    wait: float | None = typer.Option(None, "--wait", min=0.0, max=3600.0, help=WAIT_HELP),
    json_out: bool = json_flag("a line"),
) -> None:
    """Unload MODEL on every replica of NAME, and on every replica that starts later."""
    _set(name, model, "unloaded", wait, json_out)


@model_app.command("list")
def list_(name: str = typer.Argument(..., help="The service."), json_out: bool = json_flag()) -> None:
    """The models wished loaded or unloaded, and where each replica stands."""
    with client() as c:
        models = _models(c, name)
    if json_out:
        print_json([m.model_dump() for m in models])
        return
    print_table(
        ("MODEL", "WANTED", "REPLICA", "JOB", "STATE", "REASON"),
        [
            (m.name, m.wanted, r.replica, r.job_id, r.state, r.reason or None)
            for m in models
            for r in m.per_replica or []
        ]
        + [(m.name, m.wanted, None, None, None, "no serving replica") for m in models if not m.per_replica],
    )


@model_app.command("forget")
def forget(
    name: str = typer.Argument(..., help="The service."),
    model: str = typer.Argument(..., help="The model."),
    json_out: bool = json_flag("a line"),
) -> None:
    """Forget the wish: replicas keep what they have; new ones start as their server does."""
    path = f"/services/{name}/models/{model}"
    with client() as c:
        out: ServiceModelOut = _parse(ServiceModelOut, c.request("DELETE", path), path)
    if json_out:
        print_json(out.model_dump())
    else:
        typer.echo(f"service {name}: {model} no longer converged (it was wanted {out.wanted})")


__all__ = ["model_app", "print_models", "status_line"]
