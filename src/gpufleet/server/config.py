"""Server settings: one frozen object built by the CLI (or a test)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.netguard import GuardLimits
from gpufleet.ratelimit import LaneSizes, RateLimits
from gpufleet.server.decide.health import HealthRules
from gpufleet.server.decide.pricing import PriceSchedule
from gpufleet.server.decide.suspicion import DiagnosisConfig
from gpufleet.server.defaults import NODE_TIMEOUT_S, REQUEUE_AFTER_S

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class Caps:
    """What one plain user may hold (enforced in ``services/caps.py``)."""

    pending_jobs: int = 10_000
    reservations: int = 100
    tokens: int = 50

    @staticmethod
    def applies(role: str) -> bool:
        return role == "user"


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    database_url: str
    policy: str = "default"
    node_timeout_s: float = NODE_TIMEOUT_S
    """A node not seen (sync or registration) for this long is NotReady: nothing new
    lands on it."""
    requeue_after_s: float = REQUEUE_AFTER_S
    """NotReady this much longer: the node is declared lost and its jobs are requeued
    (``lifecycle.py``)."""
    health: HealthRules = field(default_factory=HealthRules)
    """Per-GPU health rules (``health.py``)."""
    schedule_interval_s: float = 1.0
    scheduler_process: bool = False
    """Run the scheduling passes in a child process (``loops/child.py``; ``gpufleet server``
    does) instead of a thread of the API process. The child uses the system clock."""
    tls_cert: Path | None = None
    tls_key: Path | None = None
    """``--tls-cert``/``--tls-key``: serve HTTPS (uvicorn's TLS)."""
    ca_dir: Path | None = None
    """The cluster CA (``gpufleet.pki``): signs node certificates and verifies them. With
    TLS on, node syncs must come with a node certificate (mTLS); a join token then only
    buys the certificate."""
    max_body_bytes: int = MIB
    guard: GuardLimits = field(default_factory=GuardLimits)
    """Every connection's header, body and idle timeouts, body-rate floor and cap per
    client address (``gpufleet.netguard``: ``--header-timeout``, ``--body-timeout``...)."""
    trusted_proxies: tuple[str, ...] = ()
    """``--trusted-proxy``: addresses whose ``X-Forwarded-For`` names the client (default:
    none; ``server.forwarding``)."""
    rates: RateLimits = field(default_factory=RateLimits)
    """Per-user request buckets by role and the failed-authentication throttle
    (``ratelimit.py``: ``--rate-user``, ``--rate-operator``, ``--rate-admin``, ``--auth-failures``)."""
    lanes: LaneSizes = field(default_factory=LaneSizes)
    """Seats of the node, admin and user lanes (``lanes.py``: ``--node-lane``...)."""
    caps: Caps = field(default_factory=Caps)
    """What one plain user may hold (``services/caps.py``: ``--max-pending-jobs``...)."""
    admin_token: str | None = field(default=None, repr=False)
    """GPUFLEET_ADMIN_TOKEN: the admin's token on first start with an empty database."""
    token_secret_file: Path | None = None
    """``--token-secret-file``: the key tokens are stored under (``tokenkey.py``; None:
    GPUFLEET_TOKEN_SECRET, else a file next to the SQLite database / in the data dir)."""
    token_ttl_s: float = 90 * 86400.0
    """API tokens expire after this (``--token-ttl``); ``POST /v1/tokens`` may ask less."""
    session_ttl_s: float = 12 * 3600.0
    """Web sessions (the fleet page's sign-in) expire after this (``--session-ttl``)."""
    audit_days: float = 90.0
    """Audit rows older than this are deleted (``--audit-days``; ``audit.py``)."""
    job_log_max_bytes: int = 64 * MIB
    """Of each job attempt's log from each node, this much is kept (``--job-log-max-mib``;
    ``services/logs.py``: one marker line, the rest counted, not kept)."""
    diagnosis: DiagnosisConfig = field(default_factory=DiagnosisConfig)
    """Failed jobs' output read against known signatures, and when a node becomes suspect
    (``--diagnosis-rules``, ``--suspect-users``, ``--suspect-window``;
    ``services/diagnoses.py``)."""
    log_days: float = 30.0
    """Logs of jobs that ended longer ago than this are deleted (``--log-days``)."""
    metrics_public: bool = False
    """``--metrics-public``: ``/metrics`` without a token (default: operators and admins)."""
    team_cost_metrics: bool = True
    """``--no-team-cost-metrics`` drops the per-team cost, GPU-hour, energy and budget series."""
    alert_webhook: str | None = None
    """POST built-in alerts here (Alertmanager webhook format); None: no built-in alerts."""
    alert_interval_s: float = 15.0
    queue_wait_alert_s: float = 1800.0
    """QueueWaitHigh fires when a pool's oldest pending job has waited this long."""
    reservation_idle_release_s: float = 900.0
    """A started reservation no owner job used for this long is released (``--idle-release``)."""
    max_preempt_grace_s: float = 120.0
    """At most this long between a preempted job's ``--signal`` and its stop
    (``--max-preempt-grace``; 0: preemptions stop jobs at once; ``jobstate/preemption.py``)."""
    prices: PriceSchedule | None = None
    """``--prices FILE``: put this schedule in force at start unless it already is."""
    accrual_interval_s: float = 15.0
    """Cost, energy and utilisation of running jobs are accrued this often."""
    service_drain_s: float = 5.0
    """A replica taken out of the gateways is stopped this long after (``--service-drain``):
    gateways poll every second, and requests sent before then finish meanwhile."""
    service_interval_s: float = 1.0
    """The replica controller's and autoscaler's period (``--service-interval``); it is also
    woken by every service change and by a gateway report whose in-flight requests surged
    (``traffic.surged``), so a load step is decided on as it is reported."""
    auto_mig: bool = False
    """``--auto-mig``: the MIG planner (``loops/automig.py``, ``scheduler/migplan.py``) lays
    out idle MIG GPUs anew for waiting slice jobs, and makes them whole again for waiting
    whole-GPU jobs, through the operator's path. Off: layouts are the operators' alone."""
    auto_mig_interval_s: float = 30.0
    """How often the MIG planner looks (``--auto-mig-interval``)."""
    auto_mig_cooldown_s: float = 600.0
    """A GPU laid out (by anyone) less than this long ago is left alone (``--auto-mig-cooldown``)."""
    auto_mig_max_changes: int = 2
    """GPUs the MIG planner lays out per look, at most."""
    leader_ttl_s: float = 6.0
    """PostgreSQL: the leader's lease (``leader.py``, ``--leader-ttl``). A leader stops its
    loops once it learns another server holds it; another server takes over once it has expired
    (at most this plus a third of it after the leader died; at once after a clean stop)."""
    backup_dir: Path | None = None
    """``--backup-dir``: the leader backs the database up here (``loops/backup.py``); None: no
    backup loop."""
    backup_every_s: float = 6 * 3600.0
    """``--backup-every``: the backup loop's period."""
    backup_keep: int = 14
    """``--backup-keep``: the loop's newest backups kept; older ones of its own are deleted."""

    @property
    def node_certs_required(self) -> bool:
        """mTLS for agents: TLS is on and this server holds the CA."""
        return self.tls_cert is not None and self.ca_dir is not None
