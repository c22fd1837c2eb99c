"""HTTP plumbing under the routers: who is calling (``deps``), admission lanes and rate
limits (``lanes``), the audit log (``audit``).

May import store, decide and services; never routers or loops."""
