"""What an agent is told and what it counts: ``AgentConfig`` (its node, work dir and
timings, from ``gpufleet agent``'s flags) and ``AgentStats`` (its syncs and jobs, for
the demo, the tests and the log)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpufleet.agent.logship import LogLimits

SYNC_INTERVAL_S = 10.0
"""A node's periodic sync (or lease renewal: ``renewal.py``); ``gpufleet agent
--sync-interval`` and the demo's agents."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentConfig:
    node: str
    work_dir: Path
    leaf: str | None = None
    rack: str | None = None
    address: str | None = None
    features: tuple[str, ...] = ()
    """Slurm's node features this node reports (``--features ib,nvme``; none: none sent)."""
    sync_interval_s: float = SYNC_INTERVAL_S
    news_gap_s: float = 0.3
    """At most this often when there is news (a job started or stopped)."""
    urgent_gap_s: float = 0.02
    """At most this often when a job ended or a GPU shows a new fault (a batch of exits
    that close together shares one sync)."""
    wait_s: float = 45.0
    """How long one long-poll waits on the server before it is sent again (each time
    0.75-1.25 x this; the server takes at most 60 s). Longer: fewer renewals (1,000
    agents renew ~22 times a second at 45 s)."""
    log_gap_s: float = 2.0
    """At most this often when only new log output is waiting."""
    tick_s: float = 0.5
    grace_s: float = 30.0
    log_limits: LogLimits = dataclasses.field(default_factory=LogLimits)
    log_tail_s: float = 600.0
    """How long after a job's end the rest of its log is still shipped (a server that
    never takes it must not keep the record for ever)."""
    real_job_util: float = 0.5
    """The utilisation a simulated GPU shows while a real process holds it."""
    health_interval_s: float = 2.0
    """The GPUs are checked this often between syncs; a new fault syncs at once."""
    checkpoint_root: Path | None = None
    """Where ``checkpoints/<job>`` (GPUFLEET_CHECKPOINT_DIR) lives: a filesystem shared
    by all nodes lets a requeued job resume on another node (default: the work dir)."""
    probe_interval_s: float = 1.0
    probe_timeout_s: float = 1.0
    upgrade_hooks: Mapping[str, Path] = dataclasses.field(default_factory=dict)
    """Driver upgrade hooks by name (``--upgrade-hook NAME=/path``, checked at start:
    ``agent/upgrade.py``): the only programs a server's upgrade order can run here."""
    upgrade_timeout_s: float = 3600.0
    smoke_user: str = "nobody"
    """The account the GPU smoke check runs as (``agent/smoke.py``) when the agent is root."""
    mps_pipe_dir: str = ""
    """The MPS control daemon's pipe directory for GPU shares' jobs ("": CUDA's default,
    /tmp/nvidia-mps). Without a daemon there, shares run time-sliced, their limits not
    enforced (``jobs.share_env``)."""


@dataclass(slots=True)
class AgentStats:
    syncs: int = 0
    renewals: int = 0
    """Periodic syncs sent as a lease renewal (``renewal.py``)."""
    failures: int = 0
    started: int = 0
    stopped: int = 0
    last_error: str | None = None
    last_status: int | None = None
