"""``gpufleet service deploy|list|show|update|delete|token|logs``: inference services
(``gpufleet.api.services``), the way ``kubectl apply`` and ``dstack apply`` are used::

    gpufleet service deploy llm.yaml                 # create, or replace the spec
    gpufleet service deploy --name llm --image vllm/vllm-openai --protocol openai --team ml
    gpufleet service update llm --model-version v2   # rolls the replicas one by one
    gpufleet service token llm                       # a caller's token, shown once
    gpufleet service logs llm --replica 1 -f

A spec file is YAML or JSON with the fields of ``ServiceSpec``; options override its
fields. It is checked here before it is sent, so a typo is named at once and nothing is
created. ``command`` may be one string in the file, split as a shell splits it (as
``--command`` is). ``update`` sends only what its options name (``ServicePatch``).
"""

from __future__ import annotations

import shlex
import time
from typing import Any, TypeVar

import typer
from pydantic import BaseModel, TypeAdapter, ValidationError

from gpufleet.api.services import (
    ReplicaOut,
    ServiceEventOut,
    ServiceOut,
    ServicePatch,
    ServiceSpec,
    ServiceTokenOut,
)
from gpufleet.cli import words
from gpufleet.cli._common import BAD_INPUT, client, fail, print_json, print_table, stream_logs
from gpufleet.cli.apps import service_app
from gpufleet.cli.options import flag, json_flag
from gpufleet.cli.servicemodel_cmds import model_app, print_models
from gpufleet.cli.servicespec import env_pairs, read_spec_file, spec_fields, validated
from gpufleet.client import GpufleetClient
from gpufleet.placefmt import gpu_ranges
from gpufleet.timefmt import format_duration

M = TypeVar("M", bound=BaseModel)
_LABEL = 16
_HELP = {
    "image": "Run this container image (--port: the port inside it).",
    "command": 'The model server, split as a shell splits it ("python serve.py --model m"); '
    "it listens on the port its environment names in PORT.",
    "replicas": "Copies to run (0 keeps the service with no replica).",
    "gpus": "GPUs of each replica (0 only in a CPU-only pool).",
    "port": "With --image: the port inside the container (default 8000).",
    "health": "Readiness probe path (default by protocol: /, /v1/models or /v2/health/ready).",
    "timeout": "How long a new replica has to become ready: 300, 5m, 1h.",
    "priority": "Priority of the replica jobs, -1000..1000.",
    "protocol": "http, openai or kserve-v2.",
    "version": "Given to replicas as GPUFLEET_MODEL_VERSION; a change rolls them.",
    "rate": "Gateway limit per caller token: BURST/PER_SECOND (200/100), N/WINDOW (1000/1m) or off.",
    "min": "Autoscaling: the fewest replicas (autoscaled when below --max-replicas).",
    "max": "Autoscaling: the most replicas.",
    "metric": "Autoscaling metric per ready replica: gpu_util (default), inflight or qps.",
    "target": "Its target: default gpu_util 70 (%), inflight 4, qps 50.",
    "warm": "Standby replicas kept started and ready, out of rotation (a scale-up takes them first).",
    "slo": "The p99 latency objective in ms (the ServiceP99AboveSLO alert).",
    "up": "After a scale-up, no other for this long (default 30s).",
    "down": "Scale down only after this long of lower load and no scaling (default 5m).",
    "surge": "Rollouts: replicas a rollout may add above --replicas (default 1).",
    "unavailable": "Rollouts: ready replicas a rollout may take below --replicas (default 0: an old "
    "replica goes only once a new one is ready).",
    "deadline": "Rollouts: how long a new generation may take to be ready before its rollout is "
    "called stalled (default 10m).",
}


# -- talking to the server ------------------------------------------------------------------


def _reply(model: type[Any], answer: Any, path: str) -> Any:
    """``answer`` as ``model`` (a reply type, or ``list[...]`` of one)."""
    try:
        return TypeAdapter(model).validate_python(answer)
    except ValidationError as exc:
        raise fail(f"unexpected answer from {path}: {exc.error_count()} schema errors") from None


def _service(c: GpufleetClient, method: str, name: str, **kw: Any) -> ServiceOut:
    path = f"/services/{name}"
    out: ServiceOut = _reply(ServiceOut, c.request(method, path, **kw), path)
    return out


def _live_tokens(c: GpufleetClient, name: str) -> list[ServiceTokenOut]:
    path = f"/services/{name}/tokens"
    tokens: list[ServiceTokenOut] = _reply(list[ServiceTokenOut], c.request("GET", path), path)
    return [t for t in tokens if t.revoked_at is None]


# -- reading what the user gave -------------------------------------------------------------


# -- showing --------------------------------------------------------------------------------


def _at(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _runs(spec: ServiceSpec) -> str:
    if spec.image is not None:
        inside = f"image {spec.image} (port {spec.port or 8000} inside)"
        return f"{inside}: {shlex.join(spec.command)}" if spec.command else inside
    return shlex.join(spec.command or [])


def summary_lines(svc: ServiceOut, *, now: float) -> list[str]:
    """``service show``'s head: what the service runs and how it stands."""
    spec = svc.spec
    gpus = words.count(spec.gpus_per_replica, "GPU") + " per replica"
    if spec.gpu_fraction is not None:
        gpus = f"{spec.gpu_fraction:g} of a shared GPU per replica"
    fields: list[tuple[str, object]] = [
        ("name", svc.name),
        ("owner", svc.owner),
        ("team", svc.team),
        ("state", svc.state),
        ("ready", f"{svc.replicas_ready}/{words.count(svc.replicas_desired, 'replica')}" + _warm(svc)),
        ("autoscaling", _scaling(spec)),
        ("traffic", _traffic(svc)),
        ("generation", svc.generation),
        ("rollout", _rollout(svc)),
        ("runs", _runs(spec)),
        ("model version", spec.model_version),
        ("rate limit", spec.rate_limit),
        ("protocol", f"{spec.protocol} (readiness probe {spec.probe_path})"),
        ("gpus", gpus + (f" ({spec.gpu_type})" if spec.gpu_type else "")),
        ("cuda", spec.cuda),
        ("pool", spec.pool),
        ("priority", spec.priority),
        ("env", ", ".join(sorted(spec.env)) + " (values: --json)" if spec.env else None),
        ("gateway path", svc.url_path),
        ("age", format_duration(max(0.0, now - svc.created_at))),
    ]
    return [f"{k:>{_LABEL}}: {'-' if v is None else v}" for k, v in fields]


def _rollout(svc: ServiceOut) -> str | None:
    r = svc.rollout
    if r is None:
        return None
    return r.state if r.state == "complete" else f"{r.state.upper()}: {r.reason}"


def _warm(svc: ServiceOut) -> str:
    return f", {svc.replicas_warm} warm" if svc.spec.warm or svc.replicas_warm else ""


def _scaling(spec: ServiceSpec) -> str | None:
    if not spec.autoscaled:
        return None
    unit = {"gpu_util": "% GPU", "inflight": " in flight", "qps": " req/s"}[spec.metric]
    up, down = spec.scale_up_stabilization, spec.scale_down_cooldown
    return (
        f"{spec.min_replicas}..{spec.max_replicas} on {spec.metric} (target {spec.scale_target:g}{unit} "
        f"per replica; up every {up:g}s at most, down after {down:g}s)"
    )


def _traffic(svc: ServiceOut) -> str | None:
    t = svc.traffic
    if t is None:
        return None
    p99 = "-" if t.p99_ms is None else f"{t.p99_ms:.1f} ms"
    errors = f"{t.error_rate:.2%}"
    return f"{t.qps:.1f} req/s, p99 {p99}, errors {errors}, {t.inflight} in flight (last {t.window_s:.0f}s)"


def _print(svc: ServiceOut) -> None:
    """The summary, the replicas (the jobs that serve it) and the recent events."""
    for line in summary_lines(svc, now=time.time()):
        typer.echo(line)
    if svc.replicas:
        typer.echo("")
        print_table(
            ("REPLICA", "JOB", "GEN", "STATE", "READY", "ROTATION", "NODE", "GPUS", "ENDPOINT", "REASON"),
            [
                (
                    r.replica,
                    r.job_id,
                    r.generation,
                    r.state,
                    "yes" if r.ready else "no",
                    "draining" if r.draining else "warm" if r.warm else "in",
                    ",".join(r.nodes) or None,
                    gpu_ranges(r.gpus) or None,
                    r.endpoint,
                    r.reason,
                )
                for r in sorted(svc.replicas, key=lambda r: (r.replica, r.generation, r.job_id))
            ],
        )
    print_models(svc.models)
    if svc.events:
        typer.echo("\nevents:")
        for e in svc.events:
            typer.echo(f"  {_at(e.at)}  {e.kind:<10} {e.actor}: {e.reason}")


# -- commands -------------------------------------------------------------------------------

service_app.add_typer(model_app, name="model")  # service model load|unload|list|forget (issue 30)


@service_app.command("deploy")
def deploy(
    file: str | None = typer.Argument(None, help="A YAML or JSON spec; - reads it from stdin."),
    name: str | None = typer.Option(None, "--name", help="The service's name (a DNS label)."),
    image: str | None = typer.Option(None, "--image", help=_HELP["image"]),
    command: str | None = typer.Option(None, "--command", help=_HELP["command"]),
    replicas: int | None = typer.Option(None, "--replicas", help=_HELP["replicas"] + " Default 1."),
    gpus_per_replica: int | None = typer.Option(
        None, "--gpus-per-replica", help=_HELP["gpus"] + " Default 1."
    ),
    gpu_type: str | None = typer.Option(
        None, "--gpu-type", help="A GPU model, or MIG slices: 'MIG 1g.10gb'."
    ),
    gpu_fraction: float | None = typer.Option(
        None, "--gpu-fraction", help="Each replica on part of one shared GPU (0.25), under MPS limits."
    ),
    cuda: str | None = typer.Option(
        None, "--cuda", help="The CUDA version replicas need (12.4): only nodes whose driver supports it."
    ),
    pool: str | None = typer.Option(None, "--pool", "-p", help="The pool to run in (default: default)."),
    team: str | None = typer.Option(
        None, "--team", help="The team it counts against (default: your default team)."
    ),
    port: int | None = typer.Option(None, "--port", help=_HELP["port"]),
    health_path: str | None = typer.Option(None, "--health-path", help=_HELP["health"]),
    readiness_timeout: str | None = typer.Option(None, "--readiness-timeout", help=_HELP["timeout"]),
    env: list[str] = typer.Option(
        [], "--env", "-e", help="KEY=VALUE for the replicas; repeat; added to the file's env."
    ),
    priority: int | None = typer.Option(None, "--priority", help=_HELP["priority"]),
    protocol: str | None = typer.Option(None, "--protocol", help=_HELP["protocol"] + " Default http."),
    model_version: str | None = typer.Option(None, "--model-version", help=_HELP["version"]),
    rate_limit: str | None = typer.Option(None, "--rate-limit", help=_HELP["rate"]),
    min_replicas: int | None = typer.Option(None, "--min-replicas", help=_HELP["min"]),
    max_replicas: int | None = typer.Option(None, "--max-replicas", help=_HELP["max"]),
    metric: str | None = typer.Option(None, "--metric", help=_HELP["metric"]),
    target: float | None = typer.Option(None, "--target", help=_HELP["target"]),
    warm: int | None = typer.Option(None, "--warm", help=_HELP["warm"]),
    slo_p99_ms: float | None = typer.Option(None, "--slo-p99-ms", help=_HELP["slo"]),
    scale_up_stabilization: str | None = typer.Option(None, "--scale-up-stabilization", help=_HELP["up"]),
    scale_down_cooldown: str | None = typer.Option(None, "--scale-down-cooldown", help=_HELP["down"]),
    max_surge: int | None = typer.Option(None, "--max-surge", help=_HELP["surge"]),
    max_unavailable: int | None = typer.Option(None, "--max-unavailable", help=_HELP["unavailable"]),
    progress_deadline: str | None = typer.Option(None, "--progress-deadline", help=_HELP["deadline"]),
    json_out: bool = json_flag("the summary"),
) -> None:
    """Create a service, or replace its spec (kubectl apply): from a file, options, or
    both (options win). A change of what the replicas run rolls them one by one."""
    body = read_spec_file(file) if file is not None else {}
    body |= spec_fields(
        {
            "name": name,
            "pool": pool,
            "team": team,
            "image": image,
            "command": command,
            "replicas": replicas,
            "gpus_per_replica": gpus_per_replica,
            "gpu_type": gpu_type,
            "gpu_fraction": gpu_fraction,
            "cuda": cuda,
            "port": port,
            "health_path": health_path,
            "readiness_timeout": readiness_timeout,
            "priority": priority,
            "protocol": protocol,
            "model_version": model_version,
            "rate_limit": rate_limit,
            "min_replicas": min_replicas,
            "max_replicas": max_replicas,
            "metric": metric,
            "target": target,
            "warm": warm,
            "slo_p99_ms": slo_p99_ms,
            "scale_up_stabilization": scale_up_stabilization,
            "scale_down_cooldown": scale_down_cooldown,
            "max_surge": max_surge,
            "max_unavailable": max_unavailable,
            "progress_deadline": progress_deadline,
        }
    )
    if env:
        file_env = body.get("env")
        body["env"] = {**(file_env if isinstance(file_env, dict) else {}), **env_pairs(env)}
    if "name" not in body:
        raise fail("a service needs a name: --name, or name: in the spec file", BAD_INPUT)
    spec = validated(ServiceSpec, body, "the spec")
    with client() as c:
        svc = _service(c, "PUT", spec.name, json=spec.model_dump(mode="json", exclude_unset=True))
        tokens = _live_tokens(c, svc.name)
    if json_out:
        print_json(svc.model_dump())
        return
    _print(svc)
    typer.echo("")
    hint = f"callers reach it through a gateway at $GATEWAY{svc.url_path}"
    if not tokens:
        hint += f" with a token: gpufleet service token {svc.name}"
    typer.echo(hint)


@service_app.command("list")
def list_(json_out: bool = json_flag()) -> None:
    """Your services (operators: everyone's). READY: ready replicas / replicas asked."""
    with client() as c:
        items: list[ServiceOut] = _reply(list[ServiceOut], c.request("GET", "/services"), "/services")
    if json_out:
        print_json([s.model_dump() for s in items])
        return
    now = time.time()
    print_table(
        ("NAME", "OWNER", "TEAM", "READY", "GEN", "PROTOCOL", "STATE", "AGE"),
        [
            (
                s.name,
                s.owner,
                s.team,
                f"{s.replicas_ready}/{s.replicas_desired}",
                s.generation,
                s.spec.protocol,
                s.state,
                format_duration(max(0.0, now - s.created_at)),
            )
            for s in items
        ],
    )


@service_app.command("show")
def show(name: str = typer.Argument(...), json_out: bool = json_flag("the summary")) -> None:
    """A service: its spec, its replicas (the jobs that serve it) and its recent events."""
    with client() as c:
        svc = _service(c, "GET", name)
    if json_out:
        print_json(svc.model_dump())
    else:
        _print(svc)


@service_app.command("events")
def events(
    name: str = typer.Argument(...),
    limit: int = typer.Option(50, "--limit", "-n", min=1, max=1000, help="The newest N events."),
    json_out: bool = json_flag(),
) -> None:
    """What happened to a service, oldest first: deploys, updates, replicas made and
    stopped, and every scaling decision with its inputs."""
    with client() as c:
        path = f"/services/{name}/events"
        got = _reply(list[ServiceEventOut], c.request("GET", path, params={"limit": limit}), path)
    if json_out:
        print_json([e.model_dump() for e in got])
        return
    print_table(["TIME", "KIND", "BY", "WHAT"], [(_at(e.at), e.kind, e.actor, e.reason) for e in got])


@service_app.command("update")
def update(
    name: str = typer.Argument(...),
    image: str | None = typer.Option(None, "--image", help=_HELP["image"]),
    command: str | None = typer.Option(None, "--command", help=_HELP["command"]),
    replicas: int | None = typer.Option(None, "--replicas", help=_HELP["replicas"]),
    gpus_per_replica: int | None = typer.Option(None, "--gpus-per-replica", help=_HELP["gpus"]),
    gpu_type: str | None = typer.Option(None, "--gpu-type"),
    cuda: str | None = typer.Option(None, "--cuda", help="The CUDA version replicas need (12.4)."),
    port: int | None = typer.Option(None, "--port", help=_HELP["port"]),
    health_path: str | None = typer.Option(None, "--health-path", help=_HELP["health"]),
    readiness_timeout: str | None = typer.Option(None, "--readiness-timeout", help=_HELP["timeout"]),
    env: list[str] = typer.Option(
        [], "--env", "-e", help="KEY=VALUE; repeat. Replaces the whole env map (give every variable)."
    ),
    priority: int | None = typer.Option(None, "--priority", help=_HELP["priority"]),
    protocol: str | None = typer.Option(None, "--protocol", help=_HELP["protocol"]),
    model_version: str | None = typer.Option(None, "--model-version", help=_HELP["version"]),
    rate_limit: str | None = typer.Option(None, "--rate-limit", help=_HELP["rate"]),
    min_replicas: int | None = typer.Option(None, "--min-replicas", help=_HELP["min"]),
    max_replicas: int | None = typer.Option(None, "--max-replicas", help=_HELP["max"]),
    metric: str | None = typer.Option(None, "--metric", help=_HELP["metric"]),
    target: float | None = typer.Option(None, "--target", help=_HELP["target"]),
    warm: int | None = typer.Option(None, "--warm", help=_HELP["warm"]),
    slo_p99_ms: float | None = typer.Option(None, "--slo-p99-ms", help=_HELP["slo"]),
    scale_up_stabilization: str | None = typer.Option(None, "--scale-up-stabilization", help=_HELP["up"]),
    scale_down_cooldown: str | None = typer.Option(None, "--scale-down-cooldown", help=_HELP["down"]),
    max_surge: int | None = typer.Option(None, "--max-surge", help=_HELP["surge"]),
    max_unavailable: int | None = typer.Option(None, "--max-unavailable", help=_HELP["unavailable"]),
    progress_deadline: str | None = typer.Option(None, "--progress-deadline", help=_HELP["deadline"]),
    json_out: bool = json_flag("the summary"),
) -> None:
    """Change some fields of a service; the rest of its spec stays. A change of what the
    replicas run rolls them one by one; --replicas only adds or drains replicas. (Pool
    and team: deploy the whole spec again.)"""
    patch = spec_fields(
        {
            "image": image,
            "command": command,
            "replicas": replicas,
            "gpus_per_replica": gpus_per_replica,
            "gpu_type": gpu_type,
            "cuda": cuda,
            "port": port,
            "health_path": health_path,
            "readiness_timeout": readiness_timeout,
            "priority": priority,
            "protocol": protocol,
            "model_version": model_version,
            "rate_limit": rate_limit,
            "min_replicas": min_replicas,
            "max_replicas": max_replicas,
            "metric": metric,
            "target": target,
            "warm": warm,
            "slo_p99_ms": slo_p99_ms,
            "scale_up_stabilization": scale_up_stabilization,
            "scale_down_cooldown": scale_down_cooldown,
            "max_surge": max_surge,
            "max_unavailable": max_unavailable,
            "progress_deadline": progress_deadline,
        }
    )
    if env:
        patch["env"] = env_pairs(env)
    if not patch:
        raise fail("nothing to change: give an option (gpufleet service update --help)", BAD_INPUT)
    validated(ServicePatch, patch, "the update")
    with client() as c:
        before = _service(c, "GET", name)
        svc = _service(c, "PATCH", name, json=patch)
    if json_out:
        print_json(svc.model_dump())
        return
    _print(svc)
    typer.echo("")
    if svc.generation != before.generation:
        typer.echo(f"generation {svc.generation}: replicas roll one by one")
    else:
        typer.echo(f"generation {svc.generation} still: no replica restarts")


@service_app.command("rollback")
def rollback(
    name: str = typer.Argument(...),
    to_generation: int | None = typer.Option(
        None,
        "--to-generation",
        min=1,
        help="The generation whose replicas to run again (default: the previous).",
    ),
    json_out: bool = json_flag("the summary"),
) -> None:
    """Run an earlier generation's replicas again (kubectl rollout undo): what the replicas
    run as it was then, the replica count and bounds as they are now; a new generation,
    rolled one by one like any update."""
    with client() as c:
        svc = _service(c, "POST", f"{name}/rollback", json={"generation": to_generation})
    if json_out:
        print_json(svc.model_dump())
        return
    _print(svc)
    typer.echo("")
    typer.echo(f"generation {svc.generation}: rolling back, replicas roll one by one")


@service_app.command("delete")
def delete(name: str = typer.Argument(...), json_out: bool = json_flag("a line")) -> None:
    """Delete a service: its tokens stop working at once, its replicas drain and stop,
    and then it is gone."""
    with client() as c:
        svc = _service(c, "DELETE", name)
    if json_out:
        print_json(svc.model_dump())
        return
    live = words.count(len(svc.replicas), "replica")
    typer.echo(f"service {svc.name}: deleting ({live} draining; gone once they stop)")


@service_app.command("token")
def token(
    name: str = typer.Argument(...),
    revoke: int | None = typer.Option(None, "--revoke", help="Revoke the token with this ID."),
    list_tokens: bool = flag("--list", help="List the service's tokens (never the secrets)."),
    json_out: bool = json_flag("the token"),
) -> None:
    """Create a token for the service's callers at the gateway (shown once), list them or
    revoke one. Rotate: create a new one, then revoke the old."""
    if revoke is not None and list_tokens:
        raise fail("give --list or --revoke, not both", BAD_INPUT)
    path = f"/services/{name}/tokens"
    with client() as c:
        if list_tokens:
            items: list[ServiceTokenOut] = _reply(list[ServiceTokenOut], c.request("GET", path), path)
        elif revoke is not None:
            items = [_reply(ServiceTokenOut, c.request("DELETE", f"{path}/{revoke}"), path)]
        else:
            items = [_reply(ServiceTokenOut, c.request("POST", path, json={}), path)]
    if json_out:
        print_json([t.model_dump() for t in items] if list_tokens else items[0].model_dump())
    elif list_tokens:
        print_table(
            ("ID", "HINT", "CREATED", "BY", "STATE"),
            [(t.id, t.hint + "...", _at(t.created_at), t.created_by, _token_state(t)) for t in items],
        )
    elif revoke is not None:
        typer.echo(f"token {items[0].id} ({items[0].hint}...) of service {name} revoked")
    else:
        typer.echo(items[0].token)
        typer.echo(
            "gpufleet: the token is shown only this once. Callers send it to a gateway "
            f'($GATEWAY: its URL):\n  curl -H "Authorization: Bearer {items[0].token}" $GATEWAY/s/{name}/...',
            err=True,
        )


def _token_state(t: ServiceTokenOut) -> str:
    return "live" if t.revoked_at is None else f"revoked {_at(t.revoked_at)}"


def pick_replica(replicas: list[ReplicaOut], slot: int | None) -> ReplicaOut | None:
    """The live replica job of ``slot`` (default: the lowest slot). During a roll a slot
    has two: the one that stays (not draining, newest generation) is taken."""
    if not replicas:
        return None
    want = min(r.replica for r in replicas) if slot is None else slot
    mine = [r for r in replicas if r.replica == want]
    return min(mine, key=lambda r: (r.draining, -r.generation, -r.job_id), default=None)


@service_app.command("logs")
def logs(
    name: str = typer.Argument(...),
    replica: int | None = typer.Option(None, "--replica", min=0, help="Its slot (default: the lowest)."),
    follow: bool = flag("--follow", "-f", help="Stream until the replica's job is over."),
    previous: bool = flag(
        "--previous", "-p", help="The job that served the slot before this one (after a crash: why)."
    ),
) -> None:
    """A replica's output: the logs of the job that serves it (gpufleet logs JOB), or with
    --previous of the one before it in the same slot (kubectl logs -p)."""
    with client() as c:
        svc = _service(c, "GET", name)
    got = pick_replica(svc.replicas, replica)
    if got is None:
        if replica is None or not svc.replicas:
            raise fail(f"service {name} has no live replica")
        slots = ", ".join(str(s) for s in sorted({r.replica for r in svc.replicas}))
        raise fail(f"service {name} has no live replica {replica} (its replicas: {slots})")
    if previous:
        if got.previous_job_id is None:
            raise fail(f"replica {got.replica} of service {name} has no previous job")
        typer.echo(f"gpufleet: replica {got.replica} was job {got.previous_job_id} before", err=True)
        stream_logs(got.previous_job_id, follow=follow)
        return
    typer.echo(
        f"gpufleet: replica {got.replica} is job {got.job_id} (generation {got.generation}, {got.state})",
        err=True,
    )
    stream_logs(got.job_id, follow=follow)  # a replica is a job: gpufleet logs JOB


__all__ = [
    "delete",
    "deploy",
    "list_",
    "logs",
    "pick_replica",
    "rollback",
    "show",
    "summary_lines",
    "token",
    "update",
]
