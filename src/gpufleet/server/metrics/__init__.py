"""Prometheus metrics: ``GET /metrics`` (``routers/metrics.py``).

- ``collector.FleetCollector`` reads the in-memory telemetry and one cached ``FleetView``
  at scrape time (no per-GPU gauges kept up to date between scrapes);
- ``ServerMetrics`` holds what must be observed as it happens: API request latency (the
  ``LatencyMiddleware``), scheduling pass durations, fragmentation and queue waits (the
  scheduling loop's ``on_pass``).

Each app has its own ``CollectorRegistry`` (several apps in one test process must not
share series).

Modules are imported directly (``metrics.collector``, ...). The metrics layer sits above
services and loops (it reads the fleet view and the scheduling pass's reports) and below
the routers that serve it; the telemetry history it reads is storage
(``store/telemetry.py``); ``wiring.py`` at the server's root puts it into the app.
"""
