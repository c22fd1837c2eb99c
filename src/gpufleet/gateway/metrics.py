"""The gateway's own Prometheus series, and who may read them.

``GatewayMetrics``: the series of one gateway process, in a registry of its own (what
``/metrics`` serves and ``report.py`` reads for the server). ``scrape_refused``: the rule
of ``/metrics`` (a bearer token whose sha256 the gateway was given, unless public; the
package docstring says which tokens and why).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class GatewayMetrics:
    """prometheus_client series in a registry of this app's own; the per-label children
    are kept, so a request costs no label lookup."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        svc = ["service"]
        self.requests = Counter("gpufleet_gateway_requests", "Answers by status.", [*svc, "code"], registry=r)
        self.latency = Histogram(
            "gpufleet_gateway_upstream_seconds",
            "Time from sending a request upstream to its response headers.",
            svc,
            registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.in_flight = Gauge("gpufleet_gateway_in_flight", "Requests being proxied.", svc, registry=r)
        self.ejections = Counter("gpufleet_gateway_ejections", "Outlier ejections.", svc, registry=r)
        self.endpoints = Gauge("gpufleet_gateway_endpoints", "Endpoints in the feed.", svc, registry=r)
        self.feed_failures = Counter("gpufleet_gateway_feed_failures", "Failed feed reads.", registry=r)
        self.retries = Counter(
            "gpufleet_gateway_retries",
            "Requests resent because the first replica never answered (refused, or a closed keep-alive).",
            registry=r,
        )
        self.overloaded = Counter(
            "gpufleet_gateway_overloaded",
            "503s the gateway answered because every replica had its cap of requests in flight.",
            svc,
            registry=r,
        )
        self.report_failures = Counter(
            "gpufleet_gateway_report_failures", "Traffic reports the server refused or never got.", registry=r
        )
        self.unknown = Counter(
            "gpufleet_gateway_unknown_service_requests",
            "Requests for a service the feed does not list (404): no service label, never reported.",
            registry=r,
        )
        self._codes: dict[tuple[str, int], Any] = {}
        self._per_service: dict[str, tuple[Any, Any]] = {}

    def answered(self, service: str, code: int) -> None:
        child = self._codes.get((service, code))
        if child is None:
            child = self._codes[(service, code)] = self.requests.labels(service, str(code))
        child.inc()

    def service(self, name: str) -> tuple[Any, Any]:
        """(latency histogram, in-flight gauge) of ``name``."""
        pair = self._per_service.get(name)
        if pair is None:
            pair = self._per_service[name] = (self.latency.labels(name), self.in_flight.labels(name))
        return pair


def scrape_refused(headers: Iterable[tuple[bytes, bytes]], tokens: frozenset[str], public: bool) -> str:
    """Why ``/metrics`` is refused to a request with these headers ("" when it is not):
    it takes a bearer token whose sha256 hex digest is in ``tokens`` unless ``public``."""
    if public:
        return ""
    if not tokens:
        return "/metrics is closed: start the gateway with --metrics-token-file or --metrics-public"
    auth = next((v for k, v in headers if k == b"authorization"), b"")
    digest = hashlib.sha256(auth[7:].strip()).hexdigest() if auth[:7].lower() == b"bearer " else ""
    if digest in tokens:
        return ""
    return "/metrics takes a token: Authorization: Bearer <the gateway's or its metrics token>"


__all__ = ["GatewayMetrics", "scrape_refused"]
