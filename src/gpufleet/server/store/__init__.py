"""Storage: the SQL models, engines, the group-commit writer, keyset pages, the leader's lease,
LISTEN/NOTIFY between servers, the agents' in-memory state and telemetry history.

May import ``gpufleet.api``, ``gpufleet.scheduler``, ``server.decide`` and the root's
``errors``/``problems``/``defaults``; never services, routers, loops, http or metrics."""
