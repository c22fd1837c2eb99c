"""Your account: ``gpufleet login``, ``gpufleet default-team`` and ``gpufleet tokens``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from gpufleet.cli._common import BAD_INPUT, client, fail, print_json, print_table, warn
from gpufleet.cli.apps import tokens_app
from gpufleet.cli.options import json_flag
from gpufleet.client import ClientError, Connection, GpufleetClient, save_connection
from gpufleet.timefmt import format_duration

if TYPE_CHECKING:
    from gpufleet.api.users import UserOut


def login(
    urls: list[str] = typer.Argument(
        ...,
        help="Server URL, e.g. http://127.0.0.1:8080; several (one cluster's servers, space- or "
        "comma-separated) to fail over between.",
        metavar="URL...",
        show_default=False,
    ),
    token: str = typer.Option(..., "--token", help="Your API token."),
    ca_file: Path | None = typer.Option(
        None, "--ca-file", help="The cluster CA (ca.crt) for an https:// server gpufleet's CA signed."
    ),
) -> None:
    """Check the token against the server and save url, token and CA file (mode 0600).

    Several servers: the token is checked against each (one that cannot be reached now
    is saved with a warning, one that refuses the token is an error), and commands then
    use whichever answers (see GPUFLEET_URL)."""
    from gpufleet.failover import PROXY_DOWN, parse_urls

    ca = str(ca_file.resolve()) if ca_file is not None else None
    try:
        servers = parse_urls(urls)
    except ValueError as exc:
        raise fail(f"server URL: {exc}", BAD_INPUT) from None
    me: UserOut | None = None
    for url in servers:
        try:
            with GpufleetClient(url, token, ca_file=ca) as c:
                answer = c.whoami()
        except ClientError as exc:
            if len(servers) == 1 or (exc.status is not None and exc.status not in PROXY_DOWN):
                raise fail(f"{url}: {exc.message}" if len(servers) > 1 else exc.message) from None
            warn(f"{exc.message}: saved all the same")
            continue
        except OSError as exc:  # an unreadable or malformed --ca-file
            raise fail(f"--ca-file: {exc}", BAD_INPUT) from None
        if me is not None and answer.name != me.name:
            raise fail(f"{url} knows this token as {answer.name}, not {me.name}: not one cluster's servers")
        me = answer
    if me is None:
        raise fail("no server answered: nothing saved")
    path = save_connection(Connection(url=",".join(servers), token=token, ca_file=ca))
    typer.echo(f"logged in as {me.name} ({me.role}); saved to {path}")


def default_team(
    team: str | None = typer.Argument(None, help="The team to make the default; without it, show it."),
    user: str | None = typer.Option(None, "--user", help="Admins: another user's."),
) -> None:
    """Your default team: where a job goes when `submit` names no --team (Slurm's default
    account). It starts as the first team you joined."""
    with client() as c:
        if team is None:
            me = c.whoami() if user is None else next((u for u in c.users() if u.name == user), None)
            if me is None:
                raise fail(f"no user {user}")
            teams = ", ".join(me.teams) or "-"
            typer.echo(f"{me.name}: default team {me.default_team or '- (none)'}; teams: {teams}")
            return
        out = c.set_default_team(user or c.whoami().name, team)
    typer.echo(f"{out.name}: default team {out.default_team}")


@tokens_app.command("list")
def tokens_list(
    user: str | None = typer.Option(None, "--user", help="Admins: another user's tokens."),
    json_out: bool = json_flag(),
) -> None:
    """List tokens (only a hint of each is shown)."""
    with client() as c:
        items = c.tokens(user=user)
    if json_out:
        print_json([t.model_dump() for t in items])
    else:
        print_table(
            ("ID", "USER", "NAME", "KIND", "HINT", "EXPIRES", "REVOKED"),
            [
                (t.id, t.user, t.name, t.kind, "..." + t.hint, _expires(t.expires_at), t.revoked)
                for t in items
            ],
        )


def _expires(at: float | None) -> str:
    if at is None:
        return "never"
    delta = at - time.time()
    return "expired" if delta <= 0 else "in " + format_duration(delta)


@tokens_app.command("create")
def tokens_create(
    name: str = typer.Option("cli", "--name"),
    user: str | None = typer.Option(None, "--user", help="Admins: for another user."),
    ttl: str | None = typer.Option(
        None, "--ttl", help="Lifetime, e.g. 1h or 30d (default and most: the server's --token-ttl)."
    ),
) -> None:
    """Create a token; printed once."""
    with client() as c:
        typer.echo(c.create_token(name=name, user=user, expires_in=ttl).token)


@tokens_app.command("revoke")
def tokens_revoke(token_id: int = typer.Argument(...)) -> None:
    """Revoke a token."""
    with client() as c:
        typer.echo(f"token {c.revoke_token(token_id).id} revoked")


__all__ = ["default_team", "login", "tokens_create", "tokens_list", "tokens_revoke"]
