"""What a gateway tells the server after every feed read (``POST /v1/gateway/report``,
the shape of ``api.services.GatewayReport``): its counters per service, cumulative since
the process started, read off its own Prometheus registry. The server turns the reports
of all gateways into each service's QPS, errors, latency and in-flight requests
(``server/decide/traffic.py``), which the autoscaler, the page and ``/metrics`` use.

Only service names go in: requests for a name the feed does not list are counted in a
series of their own, without a service label (``gpufleet_gateway_unknown_service_requests``),
and a label that is not a service's name (an endpoints file's, say) is left out here,
so that no stray name can make the server refuse a report."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from gpufleet.api.services import SERVICE_NAME

INF = 1e9
"""JSON has no infinity: the +Inf bucket's bound is sent as a second past any answer."""
_NAME = re.compile(SERVICE_NAME)


def traffic_report(registry: CollectorRegistry, gateway: str) -> dict[str, Any]:
    services: dict[str, dict[str, Any]] = {}

    def svc(name: str) -> dict[str, Any]:
        return services.setdefault(name, {"codes": {}, "inflight": 0})

    def latency(name: str) -> dict[str, Any]:
        lat: dict[str, Any] = svc(name).setdefault(
            "latency", {"le": [], "counts": [], "sum": 0.0, "count": 0}
        )
        return lat

    for family in registry.collect():
        for sample in family.samples:
            name = sample.labels.get("service")
            if name is None or _NAME.fullmatch(name) is None:
                continue
            if sample.name == "gpufleet_gateway_requests_total":
                svc(name)["codes"][sample.labels["code"]] = int(sample.value)
            elif sample.name == "gpufleet_gateway_in_flight":
                svc(name)["inflight"] = max(0, int(sample.value))
            elif sample.name == "gpufleet_gateway_upstream_seconds_bucket":
                lat = latency(name)
                lat["le"].append(min(INF, float(sample.labels["le"])))
                lat["counts"].append(int(sample.value))
            elif sample.name == "gpufleet_gateway_upstream_seconds_sum":
                latency(name)["sum"] = max(0.0, sample.value)
            elif sample.name == "gpufleet_gateway_upstream_seconds_count":
                latency(name)["count"] = int(sample.value)
    return {"gateway": gateway, "services": services}


SURGE_WINDOW_S = 2.0


class Surges:
    """Whether a report's in-flight counts surged: for some service, at least twice the
    mean of this gateway's reports of the last ``SURGE_WINDOW_S`` and at least 4 more.
    The server's rule for waking the autoscaler (``server/traffic.surged``), copied: the
    gateway imports nothing of the server, and reads its feed fast when the server is
    about to change it."""

    def __init__(self) -> None:
        self._seen: dict[str, deque[tuple[float, int]]] = {}

    def seen(self, now: float, inflight: Mapping[str, int]) -> bool:
        surged = False
        for name, count in inflight.items():
            past = self._seen.setdefault(name, deque())
            while past and past[0][0] < now - SURGE_WINDOW_S:
                past.popleft()
            mean = sum(c for _, c in past) / len(past) if past else 0.0
            surged = surged or (count >= 2 * mean and count - mean >= 4)
            past.append((now, count))
        for name in self._seen.keys() - inflight.keys():
            del self._seen[name]
        return surged
