"""Who a job runs as on this node: a gpufleet user mapped to a POSIX account.

Slurm runs a job as the submitting user's uid, so the account must exist on every node;
gpufleet does the same. The owner's name maps to an account name (by default the same
name; ``UserMap`` adds exact entries and an optional ``*`` fallback, e.g. the demo's
made-up users all mapped to ``nobody``), the account is looked up in the node's user
database (``AccountDb``; ``SystemAccounts`` is ``pwd``/``grp``, ``FakeAccounts`` the
in-package double), and ``RunAs.resolve`` decides:

- agent running as root: the mapped account, never uid 0; an owner with no account on
  this node is refused with the reason (the job fails with it in its log);
- agent not root (a laptop, a CI runner): every job runs as the agent's own user,
  since it cannot switch; it says so once in its log and in ``RunAs.note``.

A refusal is a value (``Refusal``), not an exception: the runner turns it into a job that
exited 126 with the reason in its output, and the agent loop goes on.
"""

from __future__ import annotations

import logging
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

log = logging.getLogger("gpufleet.agent")

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
REFUSED = 126
"""A job that may not run here exits with this code (POSIX: found but cannot execute)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PosixAccount:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...] = ()
    home: str = "/"
    shell: str = "/bin/sh"


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    reason: str


class AccountDb(Protocol):
    def by_name(self, name: str) -> PosixAccount | None: ...

    def by_uid(self, uid: int) -> PosixAccount | None: ...


class SystemAccounts:
    """The node's own user database (``/etc/passwd``, NSS: LDAP/SSSD where configured)."""

    def by_name(self, name: str) -> PosixAccount | None:
        import pwd

        try:
            pw = pwd.getpwnam(name)
        except (KeyError, ValueError):  # ValueError: a NUL in the name
            return None
        return self._account(pw)

    def by_uid(self, uid: int) -> PosixAccount | None:
        import pwd

        try:
            return self._account(pwd.getpwuid(uid))
        except KeyError:
            return None

    @staticmethod
    def _account(pw: object) -> PosixAccount:
        import pwd

        assert isinstance(pw, pwd.struct_passwd)
        try:
            groups = tuple(g for g in os.getgrouplist(pw.pw_name, pw.pw_gid) if g != pw.pw_gid)
        except OSError:
            groups = ()
        return PosixAccount(
            name=pw.pw_name,
            uid=pw.pw_uid,
            gid=pw.pw_gid,
            groups=groups,
            home=pw.pw_dir,
            shell=pw.pw_shell or "/bin/sh",
        )


@dataclass(frozen=True, slots=True)
class FakeAccounts:
    """An in-memory user database for tests."""

    accounts: tuple[PosixAccount, ...] = ()

    def by_name(self, name: str) -> PosixAccount | None:
        return next((a for a in self.accounts if a.name == name), None)

    def by_uid(self, uid: int) -> PosixAccount | None:
        return next((a for a in self.accounts if a.uid == uid), None)


@dataclass(frozen=True, slots=True, kw_only=True)
class UserMap:
    """gpufleet user name -> POSIX account name: an exact entry, else ``fallback``
    (the ``*`` entry), else the same name."""

    entries: Mapping[str, str] = field(default_factory=dict)
    fallback: str | None = None

    def account_name(self, user: str) -> str:
        return self.entries.get(user) or self.fallback or user

    @classmethod
    def parse(cls, text: str) -> UserMap:
        """TOML: ``[users]`` with ``gpufleet_name = "posix_name"``; ``"*"`` is the
        fallback. Raises ValueError with the reason on a bad file."""
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"not TOML: {exc}") from None
        users = raw.get("users", {})
        if not isinstance(users, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and v for k, v in users.items()
        ):
            raise ValueError('expected a [users] table of name = "account" strings')
        entries = {k: v for k, v in users.items() if k != "*"}
        return cls(entries=entries, fallback=users.get("*"))

    @classmethod
    def load(cls, path: Path) -> UserMap:
        try:
            return cls.parse(path.read_text())
        except OSError as exc:
            raise ValueError(f"cannot read {path}: {exc.strerror}") from None


class RunAs:
    """Resolves a job's owner to the account it runs as on this node."""

    def __init__(
        self,
        *,
        accounts: AccountDb | None = None,
        users: UserMap | None = None,
        euid: Callable[[], int] = os.geteuid,
        node: str = "",
    ) -> None:
        self.accounts = accounts or SystemAccounts()
        self.users = users or UserMap()
        self.node = node
        self.privileged = euid() == 0
        self._self: PosixAccount | Refusal | None = None
        self.note = ""
        if not self.privileged:
            me = self.accounts.by_uid(euid())
            self._self = me or Refusal(reason=f"the agent's uid {euid()} has no account entry")
            name = me.name if me else str(euid())
            self.note = f"the agent is not root: every job on this node runs as {name}, the agent's own user"

    def resolve(self, owner: str) -> PosixAccount | Refusal:
        if self._self is not None:
            return self._self
        name = self.users.account_name(owner)
        acct = self.accounts.by_name(name)
        where = f" on node {self.node}" if self.node else ""
        if acct is None:
            return Refusal(reason=f"no POSIX account {name!r} for gpufleet user {owner!r}{where}")
        if acct.uid == 0 or acct.gid == 0:
            why = f"gpufleet user {owner!r} maps to {name!r} (uid/gid 0): jobs never run as root"
            return Refusal(reason=why)
        return acct


def base_env(acct: PosixAccount | None) -> dict[str, str]:
    """The environment every job starts from, nothing of the agent's: a minimal PATH,
    the account's identity (what ``login`` would set), C.UTF-8 text, and unbuffered
    Python output so ``gpufleet logs -f`` shows progress as it happens (a job's own env
    may set any of these otherwise)."""
    env = {"PATH": DEFAULT_PATH, "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1"}
    if acct is not None:
        env |= {
            "HOME": acct.home,
            "USER": acct.name,
            "LOGNAME": acct.name,
            "SHELL": acct.shell,
        }
    return env
