"""gpufleet's control-plane server: REST API (``/v1``), state in SQL, control loops.

Public surface: ``create_app``, ``ServerConfig``, ``StartupError``, ``run``. Imported
lazily so that importing the package costs nothing (the ``server`` command's options
read ``gpufleet.server.defaults``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpufleet.server.app import create_app
    from gpufleet.server.config import ServerConfig
    from gpufleet.server.errors import StartupError


def run(config: ServerConfig, *, host: str, port: int) -> None:
    """Serve until interrupted: uvicorn, one API process (handlers on its event loop and
    thread pool); the scheduling loop runs in a child process when
    ``config.scheduler_process`` (``gpufleet server``'s default), else in a thread.
    Every connection is guarded (``gpufleet.netguard``: header, body and idle timeouts,
    a body-rate floor, a cap per client address; counted in ``/metrics``).
    With ``config.tls_cert``, HTTPS; with ``config.ca_dir`` too, client certificates
    from that CA are verified and handed to the app (agents' mTLS).
    Raises StartupError on a bad schema."""
    import ssl

    import uvicorn

    from gpufleet import netguard
    from gpufleet.server.app import create_app

    app = create_app(config)
    tls: dict[str, Any] = {}
    base: type[Any] = netguard.default_protocol()
    if config.tls_cert is not None:
        from gpufleet.tlsproto import CoalescingHttpToolsProtocol

        tls = {"ssl_certfile": str(config.tls_cert), "ssl_keyfile": str(config.tls_key or config.tls_cert)}
        base = CoalescingHttpToolsProtocol
        if config.ca_dir is not None:  # agents present node certificates; users need none
            from gpufleet.tlsproto import TlsHttpToolsProtocol

            tls |= {
                "ssl_ca_certs": str(config.ca_dir / "ca.crt"),
                "ssl_cert_reqs": ssl.CERT_OPTIONAL,
            }
            base = TlsHttpToolsProtocol
    stats = netguard.GuardStats()
    app.state.metrics.registry.register(netguard.GuardCollector(stats, prefix="gpufleet_http"))
    guard = netguard.uvicorn_options(config.guard, stats, base=base)
    bell = app.state.bell

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            bell.close()  # agents' long-polls end now: uvicorn waits for open requests
            super().handle_exit(sig, frame)

    Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            **forwarding(config.trusted_proxies),
            **guard,
            **tls,
        )
    ).run()


def forwarding(trusted: tuple[str, ...]) -> dict[str, Any]:
    """uvicorn's proxy-header options: ``X-Forwarded-For`` (and ``-Proto``) are believed
    only from the addresses ``--trusted-proxy`` names. uvicorn's own default believes them
    from 127.0.0.1 (or ``FORWARDED_ALLOW_IPS``), so any local process, a job on a node
    that runs the server, or a same-host reverse proxy passing a client's header through,
    could pick the address the failed-login throttle (``ratelimit.AuthThrottle``) and the
    audit log see. Default here: no proxy is trusted, and ``FORWARDED_ALLOW_IPS`` is not
    read (the setting is one flag, in one place)."""
    if not trusted:
        return {"proxy_headers": False, "forwarded_allow_ips": ""}
    return {"proxy_headers": True, "forwarded_allow_ips": list(trusted)}


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from gpufleet.server.app import create_app

        return create_app
    if name == "StartupError":
        from gpufleet.server.errors import StartupError

        return StartupError
    if name == "ServerConfig":
        from gpufleet.server.config import ServerConfig

        return ServerConfig
    raise AttributeError(name)


__all__ = ["ServerConfig", "StartupError", "create_app", "run"]
