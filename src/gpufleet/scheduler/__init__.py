"""gpufleet's pure scheduling core: ``plan(snapshot, policy, cache=...) -> Plan``.

No I/O, no clock, no global state. The server and the simulator both call ``plan``;
each keeps its own ``PlanCache`` (one per loop) for what may be reused between passes.
"""

from gpufleet.scheduler.cache import PlanCache
from gpufleet.scheduler.core import gpu_type_matches, plan
from gpufleet.scheduler.model import (
    Blocked,
    Fleet,
    Gpu,
    Hold,
    JobRequest,
    Node,
    NodeGpus,
    PendingStatus,
    Placement,
    Plan,
    Preemption,
    QosLimit,
    Quota,
    Reservation,
    ReservationMove,
    RunningJob,
    Snapshot,
    Start,
    Status,
    shared_gpu_node,
)
from gpufleet.scheduler.policies import POLICIES, Policy, make_policy
from gpufleet.scheduler.reservations import admit_reservation

__all__ = [
    "POLICIES",
    "Blocked",
    "Fleet",
    "Gpu",
    "Hold",
    "JobRequest",
    "Node",
    "NodeGpus",
    "PendingStatus",
    "Placement",
    "Plan",
    "PlanCache",
    "Policy",
    "Preemption",
    "QosLimit",
    "Quota",
    "Reservation",
    "ReservationMove",
    "RunningJob",
    "Snapshot",
    "Start",
    "Status",
    "admit_reservation",
    "gpu_type_matches",
    "make_policy",
    "plan",
    "shared_gpu_node",
]
