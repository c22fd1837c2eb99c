"""Inference services (``services/inference.py``), and the endpoint feed of the gateways."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response

from gpufleet.api.servicemodels import MODEL_NAME, ServiceModelIn, ServiceModelOut
from gpufleet.api.services import (
    SERVICE_NAME,
    GatewayFeed,
    GatewayReport,
    ServiceEventOut,
    ServiceOut,
    ServicePatch,
    ServiceRollback,
    ServiceSpec,
    ServiceTokenOut,
)
from gpufleet.server.http.deps import Me, PartsDep
from gpufleet.server.problems import ObjectId, ProblemError, unwrap
from gpufleet.server.services import gatewayfeed, inference, servicemodels, servicetokens

router = APIRouter(prefix="/services", tags=["services"])
gateway_router = APIRouter(prefix="/gateway", tags=["services"])
ServiceNameIn = Annotated[
    str, Path(pattern=SERVICE_NAME, description="a DNS label: lowercase letters, digits and '-'")
]


def _traffic(request: Request, parts: PartsDep) -> inference.Traffic:
    store = request.app.state.hot.traffic
    now = parts.now()
    return lambda name: store.stats(name, now)


@router.get("", response_model=list[ServiceOut])
def list_services(request: Request, parts: PartsDep, me: Me) -> list[ServiceOut]:
    """Yours (operators and admins: everyone's), with their replicas and traffic."""
    return inference.list_services(db=parts.db, actor=me, traffic=_traffic(request, parts))


@router.put("/{name}", response_model=ServiceOut)
def deploy(name: ServiceNameIn, spec: ServiceSpec, parts: PartsDep, me: Me) -> ServiceOut:
    """Create the service, or replace its spec (``kubectl apply``): a change of what the
    replicas run rolls them one by one, with no failed request."""
    if spec.name != name:
        raise ProblemError(422, f"name: the spec names {spec.name!r}, the URL {name!r}")
    out = unwrap(inference.deploy(db=parts.db, actor=me, spec=spec, now=parts.now()))
    return out


@router.get("/{name}", response_model=ServiceOut)
def show(name: ServiceNameIn, request: Request, parts: PartsDep, me: Me) -> ServiceOut:
    return unwrap(inference.show(db=parts.db, actor=me, name=name, traffic=_traffic(request, parts)))


@router.get("/{name}/events", response_model=list[ServiceEventOut])
def events(
    name: ServiceNameIn, parts: PartsDep, me: Me, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> list[ServiceEventOut]:
    """The newest events, oldest first: deploys, updates, replicas, scaling decisions."""
    return unwrap(inference.events(db=parts.db, actor=me, name=name, limit=limit))


@router.patch("/{name}", response_model=ServiceOut)
def update(name: ServiceNameIn, patch: ServicePatch, parts: PartsDep, me: Me) -> ServiceOut:
    """Change some fields; the rest of the spec stays."""
    return unwrap(inference.update(db=parts.db, actor=me, name=name, patch=patch, now=parts.now()))


@router.post("/{name}/rollback", response_model=ServiceOut)
def rollback(name: ServiceNameIn, body: ServiceRollback, parts: PartsDep, me: Me) -> ServiceOut:
    """Run an earlier generation's replicas again (default: the previous one), rolling."""
    return unwrap(
        inference.rollback(
            db=parts.db,
            actor=me,
            name=name,
            generation=body.generation,
            now=parts.now(),
        )
    )


@router.delete("/{name}", response_model=ServiceOut, status_code=202)
def delete(name: ServiceNameIn, parts: PartsDep, me: Me) -> ServiceOut:
    """Drain and stop every replica and revoke its tokens; the service is gone once its
    replicas are (202: under way)."""
    return unwrap(inference.delete(db=parts.db, actor=me, name=name, now=parts.now()))


ModelNameIn = Annotated[str, Path(pattern=MODEL_NAME, description="a model's name in a repository")]


@router.get("/{name}/models", response_model=list[ServiceModelOut])
def list_models(name: ServiceNameIn, parts: PartsDep, me: Me) -> list[ServiceModelOut]:
    """The models wished loaded or unloaded on every replica, and where each replica
    stands (``api/servicemodels.py``)."""
    return unwrap(servicemodels.list_models(db=parts.db, actor=me, name=name))


@router.put("/{name}/models/{model}", response_model=ServiceModelOut)
def set_model(
    name: ServiceNameIn, model: ModelNameIn, body: ServiceModelIn, parts: PartsDep, me: Me
) -> ServiceModelOut:
    """Want the model loaded (or unloaded) on every replica, later ones included; each
    replica's agent converges it through Triton's repository API (``gpufleet service
    model load|unload``)."""
    return unwrap(
        servicemodels.set_model(
            db=parts.db, actor=me, name=name, model=model, wanted=body.state, now=parts.now()
        )
    )


@router.delete("/{name}/models/{model}", response_model=ServiceModelOut)
def forget_model(name: ServiceNameIn, model: ModelNameIn, parts: PartsDep, me: Me) -> ServiceModelOut:
    """Forget the wish: replicas keep what they have, new ones start as their server does."""
    return unwrap(servicemodels.forget_model(db=parts.db, actor=me, name=name, model=model, now=parts.now()))


@router.post("/{name}/tokens", response_model=ServiceTokenOut, status_code=201)
def create_token(name: ServiceNameIn, parts: PartsDep, me: Me) -> ServiceTokenOut:
    """A token for callers of the service at the gateway (shown once)."""
    return unwrap(servicetokens.create_token(db=parts.db, actor=me, name=name, now=parts.now()))


@router.get("/{name}/tokens", response_model=list[ServiceTokenOut])
def list_tokens(name: ServiceNameIn, parts: PartsDep, me: Me) -> list[ServiceTokenOut]:
    return unwrap(servicetokens.list_tokens(db=parts.db, actor=me, name=name))


@router.delete("/{name}/tokens/{token_id}", response_model=ServiceTokenOut)
def revoke_token(name: ServiceNameIn, token_id: ObjectId, parts: PartsDep, me: Me) -> ServiceTokenOut:
    return unwrap(
        servicetokens.revoke_token(db=parts.db, actor=me, name=name, token_id=token_id, now=parts.now())
    )


@gateway_router.post("/report", status_code=204)
def report(body: GatewayReport, request: Request, parts: PartsDep, me: Me) -> Response:
    """A gateway's counters per service (cumulative since it started): the services'
    QPS, latency, errors and in-flight requests come from these (``traffic.py``). An
    entry that is not a service's name or not counters is skipped and counted
    (``gpufleet_gateway_report_rejected_items_total``); the others are taken."""
    if not me.is_operator:
        raise ProblemError(403, "gateway reports are for gateways (an operator or admin token)")
    if gatewayfeed.take_report(hot=request.app.state.hot, report=body, now=parts.now()):
        # a load step: the autoscaler decides now, not a period later. A direct wake, not an
        # after-commit effect (``store/effects.py``): the report is kept in memory, nothing
        # is written, so there is no commit to wait for.
        parts.replicas.wake()
    return Response(status_code=204)


@gateway_router.get("/endpoints", response_model=GatewayFeed)
def endpoints(request: Request, parts: PartsDep, me: Me) -> Response:
    """What a gateway routes to: every active service's token digests and its ready,
    not draining replicas with their GPUs' utilisation (operators and admins: a
    gateway's credential)."""
    if not me.is_operator:
        raise ProblemError(403, "the endpoint feed is for gateways (an operator or admin token)")
    out = gatewayfeed.feed(db=parts.db, telemetry=request.app.state.hot.telemetry, now=parts.now())
    return Response(out.model_dump_json(), media_type="application/json")
