"""The ``gpufleet`` command. Each area registers its commands from its own module."""

from __future__ import annotations

import typer

from gpufleet import __version__
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


from gpufleet.cli import sim_cmds  # noqa: E402

sim_cmds.register(app)

from gpufleet.cli import api_cmds  # noqa: E402

api_cmds.register(app)

from gpufleet.cli import agent_cmds  # noqa: E402

agent_cmds.register(app)

from gpufleet.cli import chargeback_cmds, reservation_cmds  # noqa: E402

reservation_cmds.register(app)
chargeback_cmds.register(app)

from gpufleet.cli import db_cmds, node_cmds  # noqa: E402, F401  (commands on `db` and `node`)


def main() -> None:
    app()
