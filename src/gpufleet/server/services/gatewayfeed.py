"""What the gateways route to (``GET /v1/gateway/endpoints``): every active service with
its live token digests, its rate limit, and its ready replicas in rotation (not
draining, not warm) with their GPUs' utilisation from the agents' telemetry; and what
they report back (``take_report``: each entry on its own, a bad one skipped and
counted, never the whole report refused for it)."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import select

from gpufleet.api.services import GatewayEndpoint, GatewayFeed, GatewayRate, GatewayReport, GatewayService
from gpufleet.ratelimit import Rate
from gpufleet.server.services.inference import IN_ROTATION
from gpufleet.server.store.agentstate import AgentState, TelemetryStore
from gpufleet.server.store.db import Database
from gpufleet.server.store.models import Allocation, Job, ServiceRow, ServiceToken

log = logging.getLogger("gpufleet.server")


def _rounded(util: float | None) -> float | None:
    return None if util is None else round(util, 1)


def _rate(text: object) -> GatewayRate | None:
    """A spec's ``rate_limit`` as the gateways take it (the pattern was checked on the way in)."""
    if not isinstance(text, str):
        return None
    try:
        rate = Rate.parse(text)
    except ValueError:
        return None
    return None if rate is None else GatewayRate(burst=rate.burst, per_s=rate.per_s)


def feed(*, db: Database, telemetry: TelemetryStore, now: float, max_age_s: float = 30.0) -> GatewayFeed:
    """Every active service with its live tokens and its ready, not draining replicas
    (a replica stops receiving traffic as soon as it is drained or not ready)."""
    with db.read() as s:
        rows = s.scalars(
            select(ServiceRow).where(ServiceRow.state == "active").order_by(ServiceRow.name)
        ).all()
        tokens: dict[int, list[str]] = {}
        for sid, digest in s.execute(
            select(ServiceToken.service_id, ServiceToken.token_hash).where(ServiceToken.revoked_at.is_(None))
        ):
            tokens.setdefault(sid, []).append(digest)
        ready = s.execute(
            select(
                Job.id,
                Job.service_id,
                Job.replica,
                Job.generation,
                Job.endpoint,
                Allocation.node,
                Allocation.gpu_index,
            )
            .join(Allocation, Allocation.job_id == Job.id)
            .where(*IN_ROTATION, Job.endpoint.is_not(None))
            .order_by(Job.id)
        ).all()
    per: dict[int | None, dict[int, dict[str, Any]]] = {}
    for jid, service_id, replica, gen, url, node, idx in ready:
        ep = per.setdefault(service_id, {}).setdefault(
            jid,
            {
                "job_id": jid,
                "replica": replica or 0,
                "generation": gen or 0,
                "url": url,
                "node": node,
                "gpus": [],
            },
        )
        if idx is not None:
            ep["gpus"].append((node, idx))  # a replica may span nodes
    services = []
    for row in rows:
        eps = [
            GatewayEndpoint(
                id=f"{e['job_id']}.{e['replica']}",
                job_id=e["job_id"],
                replica=e["replica"],
                url=e["url"],
                node=e["node"],
                generation=e["generation"],
                gpu_util=_rounded(telemetry.mean_util(e["gpus"], now=now, max_age_s=max_age_s)),
            )
            for e in per.get(row.id, {}).values()
        ]
        services.append(
            GatewayService(
                name=row.name,
                protocol=str(row.spec.get("protocol", "http")),
                tokens=sorted(tokens.get(row.id, [])),
                rate=_rate(row.spec.get("rate_limit")),
                endpoints=eps,
            )
        )
    return GatewayFeed(at=now, services=services)


def take_report(*, hot: AgentState, report: GatewayReport, now: float) -> bool:
    """Keep a gateway's counters (``traffic.py``; relayed to the other servers when
    several share the database). Its bad entries are skipped and counted, one warning
    per gateway and name: a stray name must not cost the services their traffic data.
    True when a service's demand surged in it (the caller wakes the autoscaler: a load
    step is acted on as it is reported, not a period later)."""
    good, skipped = report.entries()
    surging = hot.traffic.put(report.gateway, now, good)
    if hot.relay is not None:  # several servers: the leader's autoscaler sees it too
        hot.relay.traffic(report.gateway, now, good)
    if skipped:
        for name, reason in hot.traffic.reject(report.gateway, dict(skipped)):
            why = "not a service name" if reason == "name" else "malformed counters"
            log.warning(
                "gateway %s reported %r (%s): skipped, its other entries taken", report.gateway, name, why
            )
    return bool(surging)
