"""``gpufleet gateway``: the inference gateway in front of gpufleet's services.

A service's replicas are jobs on the fleet, each serving HTTP at its own URL. The
gateway (a raw ASGI app under uvicorn, one or many processes behind any TCP balancer:
they share nothing) answers ``/s/{service}/{rest}`` by sending ``{rest}`` (query
string included) to one of the service's ready replicas:

* **Endpoints** come from the server's feed (``GET /v1/gateway/endpoints``, polled every
  ``--refresh`` seconds over one keep-alive connection) or from a JSON file; never per
  request. A failed read keeps the last good list, so a server restart is invisible
  here. A replica that leaves the feed gets no new requests; those in flight finish.
* **Auth**: ``Authorization: Bearer <service token>``; the feed lists the sha256 of each
  valid token, and the gateway looks the digest up in a set (a 256-bit random token has
  nothing to gain from a constant-time compare: the set lookup leaks, at most, timing
  about a hash the attacker chose). The token is not sent on to the replica.
* **Rate limit** per service token (the service's ``rate``, the server's token bucket):
  429 with ``Retry-After``.
* **Choice**: fewest requests in flight, then lowest GPU utilisation, then round robin;
  replicas that fail (connection refused, no accept in time while idle, 5xx other
  than 503 five times in a row) are ejected for a while (``balancer`` has the rules);
  a busy replica (a 503, or a connect timeout while it serves our other requests) and
  a closed idle connection are no verdict.
* **Overload**: at most ``max_in_flight_per_replica`` (256) requests in flight on one
  replica from this process; with every replica there, the gateway answers 503 with
  ``Retry-After: 1`` itself (counted in ``gpufleet_gateway_overloaded_total``), never
  a pile-up that ends in timeouts and ejections of healthy replicas.
* **Resend**: a request no replica answered (no byte of a response came back) is sent
  once more, whatever its method (its body is held whole), on a fresh connection: to
  another replica, or to the same one when a kept-alive connection was found closed
  (its idle timeout ran out as the request went; RFC 9112 9.3.1). Idle upstream
  connections are retired after ``UPSTREAM_KEEPALIVE_S`` (30 s), below the model
  server's keep-alive (75 s), so that race needs a replica with a shorter one.
* **Failures** are in the service's protocol's shape (``errors``): KServe
  ``{"error": ...}``, OpenAI ``{"error": {"message", "type", "param", "code"}}``,
  problem+json for ``http``: 401 bad or missing token, 404 unknown service, 413 body
  over 64 MiB, 429 rate limited, 503 (``Retry-After: 1``) no ready replica or
  overload, 502 the replica failed, 504 it was silent for 300 s.
* **Fan-out** (``fanout``, kserve-v2 services): Triton statistics are summed over the
  ready replicas; repository ``load``/``unload`` go to every ready replica (200 only
  if all did).
* **Upstream connections** (``upstream``): the gateway's own HTTP/1.1 client, a
  keep-alive pool per replica on httptools' C parser (aiohttp's client cost more CPU a
  request than the rest of the proxy: issue 30), idle connections reused newest first.
* Request bodies are read whole (a retry must resend them); response bodies stream
  through chunk by chunk (SSE). Every answer carries ``X-Request-Id`` (the client's
  when sane, else a new one; also sent upstream) and, from a replica,
  ``X-Gpufleet-Replica``.
* ``/healthz`` (alive), ``/readyz`` (a feed has been loaded), ``/metrics`` (Prometheus).
* ``/metrics`` takes ``Authorization: Bearer`` with a token whose sha256 is in
  ``GatewayConfig.metrics_tokens``: the gateway's own operator token (the one it reads
  the feed with) or a scraper's token from ``--metrics-token-file``, so Prometheus need
  not hold an operator's token. The gateway knows no API token but its own (the feed
  lists service tokens' digests only), so these are the tokens it can check without
  asking the server per scrape. ``--metrics-public`` opens it (as the server's flag);
  with neither token nor flag it answers 401 saying so. Its series name services the
  feed lists, never a caller's path: a request for an unknown service is counted in
  ``gpufleet_gateway_unknown_service_requests_total`` (no service label) and is never
  in the reports to the server (``report.py``).
* Upstream, a replica gets ``connect_timeout_s`` (2 s) to accept a connection and
  ``read_timeout_s`` (300 s) of silence, before or between response chunks, before
  the request fails (502 / 504); a stalled replica holds a gateway connection that
  long at most. A replica that keeps sending, however slowly, is a stream (SSE) and is
  not cut. The client side (header, body, idle timeouts, connections per address) is
  ``gpufleet.netguard``'s, in the server config of ``gpufleet gateway``.
"""

from __future__ import annotations

from gpufleet.gateway.app import Gateway, GatewayConfig, create_app
from gpufleet.gateway.balancer import Balancer, Endpoint, Feed, OutlierPolicy, Service, parse_feed
from gpufleet.gateway.feed import EndpointSource, FeedError, FileSource, ServerSource, StaticSource

__all__ = [
    "Balancer",
    "Endpoint",
    "EndpointSource",
    "Feed",
    "FeedError",
    "FileSource",
    "Gateway",
    "GatewayConfig",
    "OutlierPolicy",
    "ServerSource",
    "Service",
    "StaticSource",
    "create_app",
    "parse_feed",
]
