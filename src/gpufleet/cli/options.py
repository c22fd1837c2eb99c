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


__all__ = ["flag", "json_flag"]
