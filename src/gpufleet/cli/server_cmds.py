"""Commands that run or set up the control plane on this machine: ``gpufleet server`` and
``gpufleet ca init`` (``gpufleet demo``: ``demo_cmds.py``).

They import the server (or the agent) when they run, not when the CLI starts: the help
shows defaults from ``gpufleet.server.defaults`` and ``gpufleet.server.decide.health``, which
are plain constants. ``GPUFLEET_ADMIN_TOKEN``, when set, is the admin token of
``server``.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from gpufleet.cli._common import BAD_INPUT, fail
from gpufleet.cli.apps import ca_app
from gpufleet.cli.options import (
    flag,
    header_timeout_option,
    idle_timeout_option,
    keep_alive_option,
    max_conns_per_address_option,
)
from gpufleet.server.decide.health import DEFAULT_FATAL_XIDS
from gpufleet.server.defaults import NODE_TIMEOUT_S, REQUEUE_AFTER_S
from gpufleet.timefmt import parse_duration

if TYPE_CHECKING:
    from gpufleet.diagnosis import Signature
    from gpufleet.server.decide.suspicion import DiagnosisConfig


def server(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8080, "--port", min=1, max=65535),
    database_url: str | None = typer.Option(
        None,
        "--database-url",
        envvar="GPUFLEET_DATABASE_URL",
        help="SQLAlchemy URL (default: SQLite in the user data dir); one with a password: "
        "GPUFLEET_DATABASE_URL, not the command line.",
    ),
    policy: str = typer.Option("default", "--policy", help="Scheduling policy."),
    node_timeout: str = typer.Option(
        f"{NODE_TIMEOUT_S:g}s", "--node-timeout", help="A node unseen this long is NotReady."
    ),
    requeue_after: str = typer.Option(
        f"{REQUEUE_AFTER_S:g}s",
        "--requeue-after",
        help="NotReady this much longer: node lost, its jobs requeued.",
    ),
    gpu_max_temp: float = typer.Option(
        85.0,
        "--gpu-temp-limit",
        "--gpu-max-temp",
        help="A GPU at or above this (C) for --gpu-hot-for: cordon it.",
    ),
    gpu_hot_for: str = typer.Option("30s", "--gpu-hot-for"),
    gpu_recover_after: str = typer.Option(
        "10m", "--gpu-recover-after", help="An overheat cordon lifts after this long at normal temperature."
    ),
    gpu_fatal_xids: str = typer.Option(
        ",".join(map(str, sorted(DEFAULT_FATAL_XIDS))), "--gpu-fatal-xids", help="XIDs that cordon a GPU."
    ),
    gpu_max_ecc_dbe: int = typer.Option(1, "--gpu-max-ecc-dbe", min=0, help="DBE errors; 0: off."),
    gpu_max_retired_pages: int = typer.Option(60, "--gpu-max-retired-pages", min=0, help="0: off."),
    gpu_pcie_reports: int = typer.Option(
        3,
        "--gpu-pcie-reports",
        min=0,
        max=1000,
        help="A PCIe link below its max (width; generation under load) this many reports in a row: "
        "cordon the GPU; 0: off.",
    ),
    gpu_allow_ecc_off: bool = flag(
        "--gpu-allow-ecc-off", help="Do not cordon GPUs whose ECC is off where they support it."
    ),
    alert_webhook: str | None = typer.Option(
        None, "--alert-webhook", help="POST built-in alerts here (Alertmanager webhook JSON)."
    ),
    queue_wait_alert: str = typer.Option("30m", "--queue-wait-alert", help="QueueWaitHigh threshold."),
    idle_release: str = typer.Option(
        "15m", "--idle-release", help="Release a started reservation no owner job used for this long."
    ),
    max_preempt_grace: str = typer.Option(
        "2m",
        "--max-preempt-grace",
        help="A preempted job that asked --signal=SIG@SECONDS gets SIG and SECONDS, at most this long, "
        "before it is stopped (0: stop at once).",
    ),
    prices: Path | None = typer.Option(
        None, "--prices", help="Price schedule (JSON or .toml) to put in force at start."
    ),
    service_drain: str = typer.Option(
        "5s",
        "--service-drain",
        help="Stop a service replica this long after the gateways stopped sending it requests.",
    ),
    service_interval: str = typer.Option(
        "1s",
        "--service-interval",
        help="The replica controller and autoscaler's period (a service change or a load surge a "
        "gateway reports wakes it at once).",
    ),
    auto_mig: bool = flag(
        "--auto-mig",
        help="The MIG planner: lay out idle MIG-mode GPUs anew when MIG slice jobs wait and "
        "whole-GPU jobs do not (and back to whole in the reverse case), as an operator would "
        "(gpufleet node mig). Off: layouts are the operators' alone.",
    ),
    auto_mig_interval: str = typer.Option(
        "30s", "--auto-mig-interval", help="How often the MIG planner looks (with --auto-mig)."
    ),
    auto_mig_cooldown: str = typer.Option(
        "10m",
        "--auto-mig-cooldown",
        help="The MIG planner leaves alone a GPU laid out (by anyone) less than this long ago.",
    ),
    leader_ttl: str = typer.Option(
        "6s",
        "--leader-ttl",
        help="PostgreSQL: several servers may share the database; every one serves the API, and "
        "the one holding the leader's lease (renewed every third of this) runs the loops. A dead "
        "leader is replaced once its lease expires; a clean stop hands over at once. SQLite is "
        "for one server: a second one on the same file refuses to start.",
    ),
    scheduler_thread: bool = flag(
        "--scheduler-thread",
        help="Run scheduling passes in a thread of the API process (default: a child process).",
    ),
    tls_cert: Path | None = typer.Option(None, "--tls-cert", help="Serve HTTPS with this certificate (PEM)."),
    tls_key: Path | None = typer.Option(None, "--tls-key", help="The certificate's key (PEM, 0600)."),
    ca_dir: Path | None = typer.Option(
        None,
        "--ca-dir",
        help="The cluster CA (gpufleet ca init): with --tls-cert, agents sync with node certificates.",
    ),
    insecure_http: bool = flag("--insecure-http", help="Allow plain HTTP on an address other than loopback."),
    rate_user: str = typer.Option(
        "30/10", "--rate-user", help="A user's requests: BURST/PER_SECOND (a token bucket), or off."
    ),
    rate_operator: str = typer.Option(
        "300/100", "--rate-operator", help="An operator's requests (as --rate-user)."
    ),
    rate_admin: str = typer.Option("300/100", "--rate-admin", help="An admin's requests (as --rate-user)."),
    auth_failures: str = typer.Option(
        "20/1m", "--auth-failures", help="Failed authentications per address: N/WINDOW, then 429; or off."
    ),
    trusted_proxy: list[str] = typer.Option(
        [],
        "--trusted-proxy",
        help="An address (or CIDR) of a reverse proxy whose X-Forwarded-For names the client (repeat). "
        "Default: none; FORWARDED_ALLOW_IPS is not read.",
    ),
    header_timeout: float = header_timeout_option(),
    body_timeout: float = typer.Option(
        10.0, "--body-timeout", min=0.1, help="Seconds without a byte of a request body, then 408."
    ),
    min_body_rate: float = typer.Option(
        1024.0, "--min-body-rate", min=0.0, help="Bytes a second a body must average after 5 s (0: none)."
    ),
    idle_timeout: float = idle_timeout_option(),
    keep_alive: float = keep_alive_option(20.0),
    max_conns_per_address: int = max_conns_per_address_option(),
    node_lane: int = typer.Option(16, "--node-lane", min=1, help="Agent requests served at once."),
    admin_lane: int = typer.Option(8, "--admin-lane", min=1, help="Operator and admin requests at once."),
    user_lane: int = typer.Option(4, "--user-lane", min=1, help="User requests served at once."),
    max_pending_jobs: int = typer.Option(
        10_000, "--max-pending-jobs", min=0, help="Pending or held jobs per user (0: no cap)."
    ),
    max_reservations: int = typer.Option(
        100, "--max-reservations", min=0, help="Booked or active reservations per user (0: no cap)."
    ),
    max_tokens: int = typer.Option(50, "--max-tokens", min=0, help="Live API tokens per user (0: no cap)."),
    token_secret_file: Path | None = typer.Option(
        None,
        "--token-secret-file",
        envvar="GPUFLEET_TOKEN_SECRET_FILE",
        help="The key tokens are stored under (made, 0600, if missing). Default: GPUFLEET_TOKEN_SECRET, "
        "else DB.token-secret next to a SQLite DB or token-secret in the user data dir.",
    ),
    token_ttl: str = typer.Option("90d", "--token-ttl", help="API tokens expire after this."),
    session_ttl: str = typer.Option("12h", "--session-ttl", help="Web sign-ins expire after this."),
    audit_days: float = typer.Option(
        90.0, "--audit-days", min=0.0001, help="Keep audit rows this many days."
    ),
    job_log_max_mib: int = typer.Option(
        64, "--job-log-max-mib", min=1, help="Keep this much of each job attempt's log per node (MiB)."
    ),
    log_days: float = typer.Option(
        30.0, "--log-days", min=0.0001, help="Keep the logs of ended jobs this many days."
    ),
    diagnosis_rules: Path | None = typer.Option(
        None,
        "--diagnosis-rules",
        help="A TOML file of failure signatures ([[signature]] id, pattern, diagnosis, hint, blame, "
        "priority) added to the built-in ones; bad entries are skipped with a warning.",
    ),
    suspect_users: int = typer.Option(
        3,
        "--suspect-users",
        min=0,
        max=1000,
        help="Cordon a node once failed jobs of this many users show the same signature that blames "
        "it (0: never).",
    ),
    suspect_window: str = typer.Option("24h", "--suspect-window", help="...within this long."),
    metrics_public: bool = flag(
        "--metrics-public", help="Serve /metrics without a token (default: operators and admins)."
    ),
    team_cost_metrics: bool = flag(
        "--team-cost-metrics/--no-team-cost-metrics",
        default=True,
        help="Per-team cost and budget series in /metrics.",
    ),
    backup_dir: Path | None = typer.Option(
        None,
        "--backup-dir",
        help="Back the database up here (made 0700 if missing): gpufleet-<UTC time>.db or .dump, "
        "consistent while the server runs (SQLite backup API, pg_dump). Default: no backups.",
    ),
    backup_every: str = typer.Option("6h", "--backup-every", help="How often (with --backup-dir)."),
    backup_keep: int = typer.Option(
        14,
        "--backup-keep",
        min=1,
        help="Keep the newest N backups; older ones of the loop's are deleted (never other files).",
    ),
) -> None:
    """Run the control plane (API under /v1, scheduling and node-lifecycle loops).

    Health rules cordon one GPU and requeue its job: temperature above --gpu-max-temp
    for --gpu-hot-for, an XID in --gpu-fatal-xids, --gpu-max-ecc-dbe double-bit ECC
    errors, the GPU lost from the bus, --gpu-max-retired-pages retired pages.

    Every user has a request bucket (--rate-user; operators and admins their own); an
    address with --auth-failures failed logins gets 429. Agents, operators and users are
    served in separate lanes (--node-lane, --admin-lane, --user-lane requests at once), so
    a flood of user requests never queues a node's sync. A plain user may hold at most
    --max-pending-jobs queued jobs, --max-reservations reservations and --max-tokens tokens.

    Tokens are stored as HMAC-SHA256 under a secret (--token-secret-file; servers sharing
    one database need the same one) and expire (--token-ttl; the fleet page's sign-in
    after --session-ttl). Mutating requests are audited (gpufleet admin audit), kept
    --audit-days. /metrics takes an operator's or admin's token unless --metrics-public.

    One server or several: on SQLite (the default) one server serves the database; a second
    one on the same file refuses to start. On PostgreSQL (--database-url
    postgresql+psycopg://...) start as many as you like: every one serves the API, and the
    one holding the leader's lease (--leader-ttl) runs the loops, with every loop write
    fenced by the lease's epoch; gpufleet status shows who leads (README, Production)."""
    from gpufleet.netguard import GuardLimits
    from gpufleet.ratelimit import LaneSizes, Rate, RateLimits
    from gpufleet.scheduler import POLICIES
    from gpufleet.server import ServerConfig, StartupError, run
    from gpufleet.server.config import Caps
    from gpufleet.server.decide.health import HealthRules
    from gpufleet.server.decide.pricing import load_prices
    from gpufleet.server.store.db import default_database_url

    if policy not in POLICIES:
        raise fail(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}", BAD_INPUT)
    if tls_cert is None and not insecure_http and not _loopback(host):
        raise fail(
            f"--host {host} is reachable from other machines: serve it with --tls-cert/--tls-key "
            "(gpufleet ca init makes them), or pass --insecure-http to send tokens in clear",
            BAD_INPUT,
        )
    if (tls_key is not None or ca_dir is not None) and tls_cert is None:
        raise fail("--tls-key and --ca-dir go with --tls-cert", BAD_INPUT)
    from gpufleet.cli.credfile import url_from_env

    url_from_env(
        database_url, command="gpufleet server", option="--database-url", env="GPUFLEET_DATABASE_URL"
    )
    for f in (tls_cert, tls_key):
        if f is not None and not f.is_file():
            raise fail(f"{f}: no such file", BAD_INPUT)
    try:
        timeout_s = parse_duration(node_timeout)
        rules = HealthRules(
            max_temp_c=gpu_max_temp,
            temp_for_s=parse_duration(gpu_hot_for),
            recover_after_s=parse_duration(gpu_recover_after),
            fatal_xids=frozenset(int(x) for x in gpu_fatal_xids.split(",") if x.strip()),
            max_ecc_dbe=gpu_max_ecc_dbe,
            max_retired_pages=gpu_max_retired_pages,
            pcie_reports=gpu_pcie_reports,
            require_ecc=not gpu_allow_ecc_off,
        )
        requeue_s = parse_duration(requeue_after)
        queue_wait_s = parse_duration(queue_wait_alert)
        idle_release_s = parse_duration(idle_release)
        max_grace_s = parse_duration(max_preempt_grace)
        if not 0 <= max_grace_s <= 3600:
            raise ValueError("--max-preempt-grace must be between 0 and 1h")
        service_drain_s = parse_duration(service_drain)
        service_interval_s = parse_duration(service_interval)
        if service_interval_s <= 0:
            raise ValueError("--service-interval must be above 0")
        auto_mig_interval_s = parse_duration(auto_mig_interval)
        auto_mig_cooldown_s = parse_duration(auto_mig_cooldown)
        leader_ttl_s = parse_duration(leader_ttl)
        schedule = None if prices is None else load_prices(prices)
    except (OSError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        raise fail(f"--prices {prices}: {exc}" if isinstance(exc, OSError) else str(exc), BAD_INPUT) from None
    if auto_mig_interval_s <= 0:
        raise fail("--auto-mig-interval must be longer than 0", BAD_INPUT)
    if not 1 <= leader_ttl_s <= 600:
        raise fail("--leader-ttl must be between 1s and 10m", BAD_INPUT)
    backup_every_s = _backup_every(backup_every, backup_dir)
    try:
        token_ttl_s, session_ttl_s = parse_duration(token_ttl), parse_duration(session_ttl)
    except ValueError as exc:
        raise fail(f"--token-ttl/--session-ttl: {exc}", BAD_INPUT) from None
    if token_ttl_s <= 0 or session_ttl_s <= 0:
        raise fail("--token-ttl and --session-ttl must be longer than 0", BAD_INPUT)
    rates: dict[str, Rate | None] = {}
    for option, text in (
        ("rate-user", rate_user),
        ("rate-operator", rate_operator),
        ("rate-admin", rate_admin),
        ("auth-failures", auth_failures),
    ):
        try:
            rates[option] = Rate.parse(text)
        except ValueError as exc:
            raise fail(f"--{option}: {exc}", BAD_INPUT) from None
    config = ServerConfig(
        database_url=database_url or default_database_url(),
        policy=policy,
        node_timeout_s=timeout_s,
        requeue_after_s=requeue_s,
        health=rules,
        admin_token=os.environ.get("GPUFLEET_ADMIN_TOKEN") or None,
        alert_webhook=alert_webhook or None,
        queue_wait_alert_s=queue_wait_s,
        reservation_idle_release_s=idle_release_s,
        max_preempt_grace_s=max_grace_s,
        service_drain_s=service_drain_s,
        service_interval_s=service_interval_s,
        auto_mig=auto_mig,
        auto_mig_interval_s=auto_mig_interval_s,
        auto_mig_cooldown_s=auto_mig_cooldown_s,
        leader_ttl_s=leader_ttl_s,
        prices=schedule,
        scheduler_process=not scheduler_thread,
        tls_cert=tls_cert,
        tls_key=tls_key,
        ca_dir=ca_dir,
        rates=RateLimits(
            user=rates["rate-user"],
            operator=rates["rate-operator"],
            admin=rates["rate-admin"],
            auth_failures=rates["auth-failures"],
        ),
        lanes=LaneSizes(node=node_lane, admin=admin_lane, user=user_lane),
        guard=GuardLimits(
            header_timeout_s=header_timeout,
            body_timeout_s=body_timeout,
            min_body_rate=min_body_rate,
            idle_timeout_s=idle_timeout,
            keepalive_s=keep_alive,
            max_per_address=max_conns_per_address,
        ),
        trusted_proxies=tuple(trusted_proxy),
        caps=Caps(pending_jobs=max_pending_jobs, reservations=max_reservations, tokens=max_tokens),
        token_secret_file=token_secret_file,
        token_ttl_s=token_ttl_s,
        session_ttl_s=session_ttl_s,
        audit_days=audit_days,
        job_log_max_bytes=job_log_max_mib * 1024 * 1024,
        log_days=log_days,
        metrics_public=metrics_public,
        team_cost_metrics=team_cost_metrics,
        backup_dir=backup_dir,
        backup_every_s=backup_every_s,
        backup_keep=backup_keep,
        diagnosis=_diagnosis(diagnosis_rules, suspect_users, suspect_window),
    )
    try:
        run(config, host=host, port=port)
    except StartupError as exc:
        raise fail(str(exc)) from None


def _backup_every(every: str, directory: Path | None) -> float:
    """``--backup-every`` in seconds (1 s at least); ``--backup-dir`` made (0700) and
    writable, or a clear refusal before the server starts."""
    try:
        every_s = parse_duration(every)
    except ValueError as exc:
        raise fail(f"--backup-every: {exc}", BAD_INPUT) from None
    if every_s < 1:
        raise fail("--backup-every must be 1s or longer", BAD_INPUT)
    if directory is not None:
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise fail(f"--backup-dir {directory}: {exc.strerror}", BAD_INPUT) from None
        if not directory.is_dir() or not os.access(directory, os.W_OK | os.X_OK):
            raise fail(f"--backup-dir {directory}: not a folder this user may write in", BAD_INPUT)
    return every_s


def _diagnosis(rules: Path | None, users: int, window: str) -> DiagnosisConfig:
    """The signature table (the built-ins and ``--diagnosis-rules``: a file that cannot
    be read is refused, each bad entry skipped with a warning) and the suspicion rule."""
    from gpufleet.diagnosis import RulesError, load_rules, table
    from gpufleet.server.decide.suspicion import DiagnosisConfig, SuspicionRule

    try:
        window_s = parse_duration(window)
    except ValueError as exc:
        raise fail(f"--suspect-window: {exc}", BAD_INPUT) from None
    if not 60 <= window_s <= 90 * 86_400:
        raise fail("--suspect-window must be between 1m and 90d", BAD_INPUT)
    extra: tuple[Signature, ...] = ()
    if rules is not None:
        try:
            got = load_rules(rules)
        except RulesError as exc:
            raise fail(f"--diagnosis-rules: {exc}", BAD_INPUT) from None
        for why in got.skipped:
            typer.echo(f"warning: --diagnosis-rules {rules}: {why}: skipped", err=True)
        if got.skipped:
            typer.echo(
                f"warning: --diagnosis-rules {rules}: {len(got.skipped)} of "
                f"{len(got.skipped) + len(got.signatures)} signatures skipped",
                err=True,
            )
        extra = got.signatures
    return DiagnosisConfig(signatures=table(extra), suspicion=SuspicionRule(users=users, window_s=window_s))


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@ca_app.command("init")
def ca_init(
    directory: Path = typer.Argument(..., help="Where to keep ca.crt, ca.key, server.crt, server.key."),
    names: list[str] = typer.Option(
        ["localhost", "127.0.0.1"],
        "--name",
        help="Host names and IP addresses the server is reached at (repeat).",
    ),
) -> None:
    """Make the cluster CA and a server certificate signed by it (keys 0600).

    Then: gpufleet server --tls-cert DIR/server.crt --tls-key DIR/server.key --ca-dir DIR;
    agents and users pass --ca-file DIR/ca.crt (GPUFLEET_CA_FILE)."""
    from gpufleet.pki import CertificateAuthority, PkiError

    try:
        ca = CertificateAuthority.load_or_create(directory)
        crt, key = ca.issue_server(names, directory)
    except (PkiError, OSError) as exc:
        raise fail(str(exc), BAD_INPUT) from None
    typer.echo(f"CA          {directory / 'ca.crt'}  (give it to agents and users: --ca-file)")
    typer.echo(f"server cert {crt}  for {', '.join(names)}")
    typer.echo(f"server key  {key}")


__all__ = ["ca_init", "server"]
