"""Server settings: one frozen object built by the CLI (or a test)."""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    database_url: str
    policy: str = "default"
    node_timeout_s: float = 60.0
    """A node not seen (sync or registration) for this long is NotReady: nothing new
    lands on it. (Requeueing its jobs is the node-lifecycle loop of a later issue.)"""
    schedule_interval_s: float = 1.0
    max_body_bytes: int = MIB
    admin_token: str | None = None
    """GPUFLEET_ADMIN_TOKEN: the admin's token on first start with an empty database."""
