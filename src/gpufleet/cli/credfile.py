"""Secrets of the long-running commands (``agent``, ``gateway``, ``loadgen``, the
``server``'s database URL), kept off
their command lines: every local user can read ``/proc/PID/cmdline``, only the owner
(and root) a 0600 file or the process's environment.

``secret`` takes, in this order: ``--token-file`` (refused unless only its owner may
read or write it, as ssh wants of a private key, and refused empty), the flag itself
(still works, with a warning: tests and one-off runs), the environment variable. The
variable is removed from the process environment once read, whatever the source, so
that nothing the command starts inherits it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import typer

from gpufleet.cli._common import BAD_INPUT, fail


@dataclass(frozen=True, slots=True, kw_only=True)
class SecretFlags:
    """Where one command's secret may come from, as its messages name them."""

    command: str
    """``gpufleet agent``: the warning's prefix."""
    file_option: str = "--token-file"
    flag: str = "--token"
    env: str
    what: str = "the credential"


def read_secret_file(path: Path, option: str) -> str:
    """The file's secret (stripped); exits with a clear message when others may read it,
    it cannot be read or it is empty."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise fail(f"{option}: cannot read {path}: {exc.strerror}", BAD_INPUT) from None
    with os.fdopen(fd, "rb") as f:  # the mode checked is the one of the file read
        mode = os.fstat(f.fileno()).st_mode
        if mode & 0o077:
            raise fail(
                f"{option}: {path} is mode {mode & 0o777:04o}, readable by others: chmod 600 {path}",
                BAD_INPUT,
            )
        data = f.read(65_536)
    secret = data.decode("utf-8", "replace").strip()
    if not secret:
        raise fail(f"{option}: {path} is empty", BAD_INPUT)
    return secret


def secret(flags: SecretFlags, *, path: Path | None, given: str | None, required: bool = True) -> str | None:
    """The secret from ``path``, ``given`` (the flag) or the environment, in that order;
    None when none gave one and it is not ``required`` (else exit with the flags to use)."""
    from_env = os.environ.pop(flags.env, None)
    if path is not None:
        return read_secret_file(path, flags.file_option)
    if given:
        typer.echo(
            f"{flags.command}: warning: {flags.flag} puts {flags.what} on the command line, where every "
            f"process on this machine can read it; use {flags.file_option} (or {flags.env})",
            err=True,
        )
        return given
    if from_env or not required:
        return from_env or None
    raise fail(f"{flags.file_option} (or {flags.env}) is required", BAD_INPUT)


def url_from_env(url: str | None, *, command: str, option: str, env: str) -> None:
    """A URL option that may hold a password (``--database-url``, also read from ``env``):
    warn when the password came on the command line, and drop ``env`` from the
    environment either way. libpq's ``PGPASSWORD`` and ``~/.pgpass`` work too."""
    from urllib.parse import urlsplit

    from_env = os.environ.pop(env, None)
    try:
        password = urlsplit(url).password if url else None
    except ValueError:
        password = None
    if password and url != from_env:
        typer.echo(
            f"{command}: warning: {option} holds a password, which every process on this machine can "
            f"read on the command line; set {env} (or PGPASSWORD, ~/.pgpass) instead",
            err=True,
        )


__all__ = ["SecretFlags", "read_secret_file", "secret", "url_from_env"]
