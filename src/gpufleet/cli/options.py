"""Option makers shared by the command modules.

A flag takes no value (``--all``, not ``--all true``), so its help shows no type: Typer
prints every option's type (``<bool>`` for a flag), which reads as if a value followed.
An empty metavar leaves the type column blank. (``--help`` itself is Typer's own and
keeps its ``<bool>``.)
"""

from __future__ import annotations

from typing import Any

import typer


def flag(*names: str, help: str, default: bool | None = False, **kwargs: Any) -> Any:
    """A boolean flag: ``flag("--all", help=...)``, or ``flag("--x/--no-x", default=True,
    help=...)`` for one a user may also switch off."""
    return typer.Option(default, *names, help=help, metavar="", **kwargs)


def json_flag(instead_of: str = "the table") -> Any:
    """``--json``: what the command prints otherwise is named, since not every command
    prints a table."""
    return flag("--json", help=f"Print JSON instead of {instead_of}.")


def header_timeout_option() -> Any:
    """``--header-timeout``: the server's and the gateway's (one declaration, one default)."""
    return typer.Option(10.0, "--header-timeout", min=0.1, help="Seconds a request head may take, then 408.")


def idle_timeout_option() -> Any:
    """``--idle-timeout``: the server's and the gateway's."""
    return typer.Option(
        5.0, "--idle-timeout", min=0.1, help="Seconds a connection may wait idle for a request."
    )


def keep_alive_option(default: float) -> Any:
    """``--keep-alive``: how long an answered connection may wait for its next request."""
    return typer.Option(
        default,
        "--keep-alive",
        min=0.1,
        help="Seconds a connection that was answered may wait for its next request.",
    )


def max_conns_per_address_option() -> Any:
    """``--max-conns-per-address``: the server's and the gateway's."""
    return typer.Option(
        256, "--max-conns-per-address", min=0, help="Connections open at once from one address (0: no cap)."
    )


__all__ = [
    "flag",
    "header_timeout_option",
    "idle_timeout_option",
    "json_flag",
    "keep_alive_option",
    "max_conns_per_address_option",
]
