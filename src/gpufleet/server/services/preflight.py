"""What the server does with an agent's preflight (``agent/preflight.py``, sent in a
sync's ``preflight``), inside the sync's transaction:

- a fatal finding cordons the node with the findings' reasons and a critical event
  (once per reason: an agent resending the same report after a lost answer writes
  nothing more). A node an operator (or a rollout) already cordoned keeps that cordon
  and its reason; the finding is an event beside it;
- a warning is an event (severity warning);
- a clean preflight changes nothing: the server uncordons nothing by itself (an
  operator does, ``gpufleet node uncordon``, once the node is fixed), as DCGM's health
  checks leave the decision to put a node back to whoever runs the cluster.
"""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from gpufleet.api.nodes import Preflight
from gpufleet.server.services.nodeops import add_event
from gpufleet.server.store.models import NodeRow

__all__ = ["PREFIX", "record"]

log = logging.getLogger("gpufleet.server")
ACTOR = "preflight"
PREFIX = "preflight: "
"""How a preflight's cordon reason starts (what tells it from an operator's)."""


def record(s: Session, node: NodeRow, pf: Preflight, now: float) -> bool:
    """Apply one preflight report of ``node``; True if the node's cordon changed."""
    fatal = [f for f in pf.findings if f.severity == "fatal"]
    warnings = [f for f in pf.findings if f.severity == "warning"]
    changed = False
    if fatal:
        reason = (PREFIX + "; ".join(f.reason for f in fatal))[:256]
        ours = not node.cordoned or (node.cordon_reason or "").startswith(PREFIX)
        if node.cordon_reason != reason:
            if ours:
                node.cordoned, node.cordon_reason = True, reason
                changed = True
            add_event(
                s,
                at=now,
                node=node.name,
                kind="cordoned" if ours else "preflight_failed",
                severity="critical",
                actor=ACTOR,
                reason=reason + ("; nothing new lands on it until an operator uncordons it" if ours else ""),
            )
            log.warning("node %s: %s", node.name, reason)
    for f in warnings:
        add_event(
            s,
            at=now,
            node=node.name,
            gpu=f.gpu,
            kind="preflight_warning",
            severity="warning",
            actor=ACTOR,
            reason=f"{f.check}: {f.reason}",
        )
    return changed
