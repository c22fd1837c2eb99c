"""The command groups (``gpufleet jobs ...``, ``gpufleet admin ...``), each with its help
line. The command modules add their commands to these; ``gpufleet.cli`` adds the groups
to ``gpufleet`` (its ``COMMANDS`` repeats each group's help line). Within a group,
commands are listed in the order they were added, so in the order the modules are
imported: ``gpufleet.cli`` imports those that fill one group in a fixed order
(``_BEFORE``)."""

from __future__ import annotations

import typer

jobs_app = typer.Typer(help="Jobs: list and show.", no_args_is_help=True)
admin_app = typer.Typer(help="Users, teams, quotas, pools (admins).", no_args_is_help=True)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
tokens_app = typer.Typer(help="Your API tokens.", no_args_is_help=True)
node_app = typer.Typer(
    help="Nodes (operators): credentials, cordon, drain, MIG, rollout, events.", no_args_is_help=True
)
ca_app = typer.Typer(help="The cluster's certificate authority (TLS for the server, mTLS for agents).")
reservation_app = typer.Typer(help="Reservations: create, list, cancel.", no_args_is_help=True)
service_app = typer.Typer(
    help="Inference services: deploy, list, show, events, logs, update, rollback, model, delete, tokens.",
    no_args_is_help=True,
)

__all__ = [
    "admin_app",
    "ca_app",
    "db_app",
    "jobs_app",
    "node_app",
    "reservation_app",
    "service_app",
    "tokens_app",
]
