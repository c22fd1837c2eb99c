"""``gpufleet gateway``: the inference gateway (``gpufleet.gateway``), one process.

It imports uvicorn, aiohttp and the gateway when it runs, not when the CLI starts. Its
own credential for the server's endpoint feed (an operator's token) comes from
``--token-file`` (mode 0600 or stricter) or ``GPUFLEET_TOKEN`` (removed from the
environment once read), never from the command line a local user could read
(``--token`` still works, with a warning; ``cli/credfile.py``). Clients bring their
service tokens with each request.

``/metrics`` takes a bearer token by default: the gateway's own token, or the one in
``--metrics-token-file`` (a scraper's, so Prometheus needs no operator token);
``--metrics-public`` opens it, as the server's ``--metrics-public`` does.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import typer

from gpufleet.cli._common import BAD_INPUT, fail
from gpufleet.cli.credfile import SecretFlags, read_secret_file, secret
from gpufleet.cli.options import header_timeout_option, idle_timeout_option, max_conns_per_address_option

FLAGS = SecretFlags(command="gpufleet gateway", env="GPUFLEET_TOKEN", what="the gateway's token")


def gateway(
    server: str | None = typer.Option(
        None,
        "--server",
        envvar="GPUFLEET_SERVER",
        help="Server whose endpoint feed to follow; several (one cluster's servers) as a comma "
        "list, http://a:8080,http://b:8080: read from the one that answered last, the next when "
        "it fails.",
    ),
    token_file: Path | None = typer.Option(
        None,
        "--token-file",
        help="File holding the gateway's credential for the feed (an operator's token); mode 0600 "
        "or stricter. Else GPUFLEET_TOKEN.",
        show_default=False,
    ),
    token: str | None = typer.Option(
        None,
        "--token",
        help="The credential itself (warns: every local user can read a command line; use "
        "--token-file or GPUFLEET_TOKEN).",
        show_default=False,
    ),
    metrics_token_file: Path | None = typer.Option(
        None,
        "--metrics-token-file",
        help="File holding a token /metrics also takes (a scraper's); mode 0600 or stricter.",
        show_default=False,
    ),
    metrics_public: bool = typer.Option(
        False, "--metrics-public", help="Serve /metrics without a token (default: the gateway's token)."
    ),
    ca_file: Path | None = typer.Option(
        None, "--ca-file", help="The cluster CA (ca.crt) the https:// server's certificate must chain to."
    ),
    endpoints_file: Path | None = typer.Option(
        None,
        "--endpoints-file",
        help="Read the feed's JSON from this file (re-read when it changes), no server.",
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8080, "--port", min=1, max=65535),
    refresh: float = typer.Option(1.0, "--refresh", min=0.05, help="Seconds between reads of the feed."),
    tls_cert: Path | None = typer.Option(None, "--tls-cert", help="Serve HTTPS with this certificate (PEM)."),
    tls_key: Path | None = typer.Option(None, "--tls-key", help="Its private key (default: in --tls-cert)."),
    header_timeout: float = header_timeout_option(),
    idle_timeout: float = idle_timeout_option(),
    max_conns_per_address: int = max_conns_per_address_option(),
    max_in_flight_per_replica: int = typer.Option(
        256,
        "--max-in-flight-per-replica",
        min=0,
        help="Requests in flight on one replica at most; with every replica at it, 503 + Retry-After"
        " (0: no cap).",
    ),
) -> None:
    """Route /s/SERVICE/... to the service's ready replicas.

    Clients send Authorization: Bearer SERVICE_TOKEN; the gateway checks it against the
    feed, applies the service's rate limit, picks the replica with the fewest requests
    in flight (then the least busy GPU) and streams its answer back. Replicas that fail
    (refused, or 5xx in a row) are ejected for a while, busy ones (503) never; a request
    no replica answered is sent once more; overload is a 503 with Retry-After. Errors
    are in the service's protocol's shape (KServe, OpenAI, else problem+json).
    /healthz, /readyz and /metrics (Prometheus; with the gateway's or the metrics
    token, unless --metrics-public) are served too."""
    if endpoints_file is None and server is None:
        raise fail("give --server (GPUFLEET_SERVER) or --endpoints-file", BAD_INPUT)
    # --endpoints-file wins over a GPUFLEET_SERVER in the env, and needs no token
    token = secret(FLAGS, path=token_file, given=token, required=False)
    if endpoints_file is None and not token:
        raise fail("--server needs the gateway's --token-file (or GPUFLEET_TOKEN)", BAD_INPUT)
    metrics = {hashlib.sha256(t.encode()).hexdigest() for t in (token,) if t}
    if metrics_token_file is not None:
        metrics.add(
            hashlib.sha256(read_secret_file(metrics_token_file, "--metrics-token-file").encode()).hexdigest()
        )
    if not metrics and not metrics_public:
        typer.echo(
            "gpufleet gateway: /metrics is closed: give --metrics-token-file or --metrics-public", err=True
        )
    if tls_key is not None and tls_cert is None:
        raise fail("--tls-key goes with --tls-cert", BAD_INPUT)
    for f in (ca_file, endpoints_file, tls_cert, tls_key):
        if f is not None and not f.is_file():
            raise fail(f"{f}: no such file", BAD_INPUT)
    servers: tuple[str, ...] = ()
    if endpoints_file is None and server is not None:
        from gpufleet.failover import parse_urls

        try:
            servers = parse_urls(server)
        except ValueError as exc:
            raise fail(f"--server: {exc}", BAD_INPUT) from None

    import logging

    import uvicorn

    from gpufleet.gateway import FileSource, GatewayConfig, ServerSource, create_app
    from gpufleet.gateway.feed import EndpointSource

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    source: EndpointSource
    if endpoints_file is not None:
        source = FileSource(endpoints_file)
    else:
        assert servers and token is not None
        source = ServerSource(servers, token, ca_file=ca_file)
    config = GatewayConfig(
        refresh_s=refresh,
        metrics_tokens=frozenset(metrics),
        metrics_public=metrics_public,
        max_in_flight_per_replica=max_in_flight_per_replica,
    )
    app = create_app(source, config=config)
    from gpufleet import netguard

    options: dict[str, object] = {}
    base: type[object] = netguard.default_protocol()
    if tls_cert is not None:
        from gpufleet.tlsproto import CoalescingHttpToolsProtocol

        # one TLS record per response head+body (see tlsproto)
        options = {"ssl_certfile": str(tls_cert), "ssl_keyfile": str(tls_key or tls_cert)}
        base = CoalescingHttpToolsProtocol
    limits = netguard.GuardLimits(
        header_timeout_s=header_timeout, idle_timeout_s=idle_timeout, max_per_address=max_conns_per_address
    )
    stats = netguard.GuardStats()  # counted in /metrics: gpufleet_gateway_connections_*
    app.metrics.registry.register(netguard.GuardCollector(stats, prefix="gpufleet_gateway"))
    options |= netguard.uvicorn_options(limits, stats, base=base)  # header, body, idle
    uvicorn.run(
        app,
        host=host,
        port=port,
        loop="uvloop" if _has("uvloop") else "asyncio",
        lifespan="on",
        log_level="warning",
        access_log=False,
        server_header=False,
        date_header=False,
        **options,  # type: ignore[arg-type]
    )


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


__all__ = ["gateway"]
