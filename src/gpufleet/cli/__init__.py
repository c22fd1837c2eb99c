"""The ``gpufleet`` command: every command and group is added here, in the order
``gpufleet --help`` lists them.

Layout: ``_common`` (the client, output and errors every client command shares),
``apps`` (the command groups), one ``*_cmds`` module per subject, and helpers that hold
no command (``jobview``, ``sbatch``, ``localtime``, ``words``, ``options``, ``servicespec``). No command
module imports another.
"""

from __future__ import annotations

import typer

from gpufleet import __version__

# Importing a module adds its group commands (``@apps.admin_app.command``) in its source
# order; two modules fill ``admin``, in this import order: admin_cmds (users, teams...)
# before chargeback_cmds (prices, budgets). admin_cmds and db_cmds only fill groups.
from gpufleet.cli import (  # noqa: F401
    account_cmds,
    admin_cmds,
    agent_cmds,
    apps,
    chargeback_cmds,
    db_cmds,
    gateway_cmds,
    job_cmds,
    loadgen_cmds,
    model_cmds,
    node_cmds,
    reservation_cmds,
    server_cmds,
    service_cmds,
    sim_cmds,
)
from gpufleet.cli.options import flag

app = typer.Typer(
    name="gpufleet",
    help="gpufleet: one control plane for a shared GPU cluster.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # reflow docstring paragraphs to the terminal's width
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpufleet {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = flag("--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """gpufleet: one control plane for a shared GPU cluster."""


sim_cmds.register(app)  # simulate, and the trace group

app.command("server")(server_cmds.server)
app.command("login")(account_cmds.login)
# `submit job.sh --flag`: options after the script are the script's, as sbatch reads them
app.command("submit", context_settings={"allow_interspersed_args": False})(job_cmds.submit)
app.command("queue")(job_cmds.queue)
app.command("cancel")(job_cmds.cancel)
app.command("hold")(job_cmds.hold)
app.command("release")(job_cmds.release)
app.command("nodes")(node_cmds.nodes)
app.command("default-team")(account_cmds.default_team)
app.command("agent")(agent_cmds.agent)
app.command("gateway")(gateway_cmds.gateway)
app.command("model-server")(model_cmds.model_server)
app.command("loadgen")(loadgen_cmds.loadgen)
app.command("logs")(job_cmds.logs)
app.command("demo")(server_cmds.demo)
app.command("reserve")(reservation_cmds.reserve)
app.command("reservations")(reservation_cmds.reservations)
app.command("price")(chargeback_cmds.price)
app.command("usage")(chargeback_cmds.usage)

app.add_typer(apps.jobs_app, name="jobs")
app.add_typer(apps.admin_app, name="admin")
app.add_typer(apps.db_app, name="db")
app.add_typer(apps.tokens_app, name="tokens")
app.add_typer(apps.node_app, name="node")
app.add_typer(apps.ca_app, name="ca")
app.add_typer(apps.reservation_app, name="reservation")
app.add_typer(apps.service_app, name="service")


def main() -> None:
    app()


__all__ = ["app", "main"]
