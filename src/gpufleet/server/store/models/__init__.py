"""SQLAlchemy models: the durable state. Times are UNIX seconds (float) from the
server's clock, so the scheduler core gets them as they are.

One module per domain (below); every model is importable from here (with the helpers
that read ``Job.stopping_on`` as a list), and importing this package registers every
table on ``Base.metadata``.
"""

from __future__ import annotations

from gpufleet.server.store.models.accounts import Membership, Team, Token, User
from gpufleet.server.store.models.base import Base
from gpufleet.server.store.models.control import AuditRow, LeaderLease, LeaderTerm, ServerRow, Setting
from gpufleet.server.store.models.diagnoses import JobDiagnosis
from gpufleet.server.store.models.jobs import (
    Allocation,
    Job,
    JobEvent,
    JobLogChunk,
    JobStep,
    JobStepOutput,
    JobStepTask,
    stopping_list,
    stopping_value,
)
from gpufleet.server.store.models.ledger import PriceScheduleRow, UsageRow
from gpufleet.server.store.models.nodes import (
    GpuEvent,
    GpuRow,
    NodeCertificate,
    NodeCredential,
    NodeRow,
    Rollout,
    RolloutNode,
)
from gpufleet.server.store.models.pools import DEFAULT_POOL, LicenseRow, Pool, QosRow
from gpufleet.server.store.models.power import PowerFigureRow, RackPowerRow
from gpufleet.server.store.models.reservations import ReservationEvent, ReservationRow
from gpufleet.server.store.models.services import (
    ServiceEvent,
    ServiceModelRow,
    ServiceRow,
    ServiceSpecRow,
    ServiceToken,
)

__all__ = [
    "DEFAULT_POOL",
    "Allocation",
    "AuditRow",
    "Base",
    "GpuEvent",
    "GpuRow",
    "Job",
    "JobDiagnosis",
    "JobEvent",
    "JobLogChunk",
    "JobStep",
    "JobStepOutput",
    "JobStepTask",
    "LeaderLease",
    "LeaderTerm",
    "LicenseRow",
    "Membership",
    "NodeCertificate",
    "NodeCredential",
    "NodeRow",
    "Pool",
    "PowerFigureRow",
    "PriceScheduleRow",
    "QosRow",
    "RackPowerRow",
    "ReservationEvent",
    "ReservationRow",
    "Rollout",
    "RolloutNode",
    "ServerRow",
    "ServiceEvent",
    "ServiceModelRow",
    "ServiceRow",
    "ServiceSpecRow",
    "ServiceToken",
    "Setting",
    "Team",
    "Token",
    "UsageRow",
    "User",
    "stopping_list",
    "stopping_value",
]
