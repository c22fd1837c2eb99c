"""An idle node's lease renewal: ``POST /v1/nodes/{name}/renew`` (issue 35, "idle means idle").

Kubernetes splits a node's heartbeat in two: a small Lease renewed every 10 s, and the
full NodeStatus sent only when it changed (or every 5 minutes). Here a full sync whose
reply asks nothing of the node grants a lease (``services/sync.py``,
``agentstate.Leases``); an agent with nothing new to say (the same inventory and facts,
no job, no log, no step, no report, its telemetry within its dead bands:
``agent/renewal.py``) sends the lease back instead of syncing. A renewal touches no
database row: it notes the sighting in ``AgentState.heartbeats`` (flushed in bulk,
every sixth of the node timeout) and re-reads the telemetry the server holds for the
node at the renewal's time (``/metrics``, the health rules, energy accounting and,
under HA, the leader see it as fresh as after a sync), the power readings' refresh
included. Refused (``renewed: false``), the agent syncs in full at once.

Liveness stays what it was: the node-lifecycle loop adds the in-memory sightings to
``nodes.last_seen``, every other reader of ``last_seen`` (the scheduling pass's Ready,
``GET /v1/nodes``, another server on the same PostgreSQL) sees it at most a flush
interval late (5 s of the 30 s timeout), and a node that stops renewing goes NotReady
and then lost exactly as one that stops syncing.
"""

from __future__ import annotations

from gpufleet.api.nodes import RenewReply
from gpufleet.server.problems import Failure, forbidden
from gpufleet.server.services import racks
from gpufleet.server.services.nodes import write_heartbeats
from gpufleet.server.services.sync import AgentActor
from gpufleet.server.store.agentstate import AgentState
from gpufleet.server.store.writer import Writer


def renew_node(
    *,
    hot: AgentState,
    writer: Writer,
    actor: AgentActor,
    name: str,
    lease: str,
    version: str,
    now: float,
) -> RenewReply | Failure:
    """Renew ``name``'s lease if it stands (``version``: the node's dispatch version now)."""
    if actor.node is not None and actor.node != name:
        return forbidden(f"this node credential belongs to node {actor.node}, not {name}")
    if not hot.leases.renew(name, lease, version=version, now=now):
        return RenewReply(node=name, renewed=False)
    hot.renewals += 1
    hot.heartbeats.note(name, now)
    hot.heartbeats.maybe_flush(writer, write_heartbeats)
    held = hot.telemetry.get(name)
    if held is not None:  # within the agent's dead bands of what it last sent
        gpus = list(held.gpus.values())
        hot.telemetry_seen(name, at=now, gpus=gpus, driver=held.driver_version, cuda=held.cuda_version)
        if hot.relay is not None:  # several servers: the leader's health rules see it too
            hot.relay.telemetry(name, now, gpus, held.driver_version, held.cuda_version)
        hot.power.note(name, at=now, gpus=gpus)  # a reading's refresh, when one is due
    hot.power.maybe_flush(writer, racks.write_gpu_power)
    return RenewReply(node=name, renewed=True)
