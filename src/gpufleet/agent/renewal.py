"""When an idle node's periodic sync can be a lease renewal (issue 35, "idle means idle").

A server that answers a full sync with nothing to do gives it a lease
(``SyncReply.lease``; ``server/services/renew.py``). While the node has nothing new to
say, the agent's periodic sync sends only that lease (``POST /v1/nodes/{name}/renew``,
tens of bytes) and the server notes the sighting in memory; the long-poll
(``doorbell.py``) still brings every change of what the node should run, and a renewal
the server refuses is followed at once by a full sync. Nothing new to say means the body
it would send equals the one that got the lease, except for telemetry within dead bands
(``BANDS``: as a monitoring agent's, so an idle GPU's drift of a degree or a few watts is
not news; every other field of a reading, ECC counters and XIDs included, must be
equal), and it carries no job, log, step task, MIG result, upgrade report or preflight.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from gpufleet.agent.transport import AgentTransportError, RenewTransport, SyncTransport

BANDS: Mapping[str, tuple[float, float]] = {
    "utilization_pct": (5.0, 0.0),
    "memory_used_mb": (512.0, 0.05),
    "temperature_c": (3.0, 0.0),
    "power_w": (10.0, 0.05),
    "sm_clock_mhz": (100.0, 0.1),
    "mem_clock_mhz": (100.0, 0.1),
}
"""Telemetry field -> (watts, degrees, ... absolute, share of the last sent value): a
reading moved only past the larger of the two."""
_ASKS = ("jobs", "logs", "steps", "mig_results", "upgrade", "preflight")


def within(old: object, new: object, band: tuple[float, float]) -> bool:
    """Whether ``new`` is within ``band`` of ``old`` (both numbers), or equal."""
    if isinstance(old, int | float) and isinstance(new, int | float):
        return abs(float(new) - float(old)) <= max(band[0], band[1] * abs(float(old)))
    return old == new


def same_telemetry(old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]) -> bool:
    """Whether ``new`` says nothing ``old`` did not (GPU by GPU, ``BANDS``)."""
    if len(old) != len(new):
        return False
    for a, b in zip(old, new, strict=True):
        if a.keys() != b.keys():
            return False
        for key, value in b.items():
            band = BANDS.get(key)
            if not (within(a[key], value, band) if band is not None else a[key] == value):
                return False
    return True


def _rest(body: Mapping[str, Any]) -> str:
    return json.dumps({k: v for k, v in body.items() if k != "telemetry"}, sort_keys=True, default=str)


class Renewals:
    """The lease of the last full sync and the body it was granted for."""

    def __init__(self) -> None:
        self.off = False
        """The server has no renewals (an older one): full syncs only."""
        self._lease: str | None = None
        self._rest = ""
        self._telemetry: list[Mapping[str, Any]] = []

    def granted(self, body: Mapping[str, Any], lease: object) -> None:
        """A full sync of ``body`` was answered, with ``lease`` or without."""
        if not isinstance(lease, str) or not lease or any(body.get(k) for k in _ASKS):
            self._lease = None
            return
        self._lease, self._rest, self._telemetry = lease, _rest(body), list(body.get("telemetry") or ())

    def lease_for(self, body: Mapping[str, Any]) -> str | None:
        """The lease to renew instead of sending ``body``, or None (sync in full)."""
        if self.off or self._lease is None or any(body.get(k) for k in _ASKS):
            return None
        if _rest(body) != self._rest or not same_telemetry(self._telemetry, body.get("telemetry") or ()):
            return None
        return self._lease

    def drop(self) -> None:
        """The server refused the lease, or the link failed: the next sync is a full one."""
        self._lease = None


def renewed(renewals: Renewals, transport: SyncTransport, node: str, body: Mapping[str, Any]) -> bool:
    """Renew instead of sending ``body`` where the lease allows it; True if the server took
    it. False: send ``body`` in full (no lease, refused, or a server without renewals).
    Raises ``AgentTransportError`` (the caller's failure path: then a full sync)."""
    lease = renewals.lease_for(body)
    if lease is None or not isinstance(transport, RenewTransport):
        return False
    try:
        ok = transport.renew(node, lease)
    except AgentTransportError as exc:
        renewals.drop()
        if exc.status in (404, 405):  # an older server: full syncs from now on
            renewals.off = True
            return False
        raise
    if not ok:
        renewals.drop()
    return ok
