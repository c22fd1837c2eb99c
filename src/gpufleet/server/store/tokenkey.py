"""The server's token key: API tokens and node join tokens are stored as
HMAC-SHA256(key, token), so a copy of the database alone (a dump, a backup, a stolen
disk image of the database volume) does not let anyone check a guessed token offline.

Where the key comes from, first found wins:

1. ``--token-secret-file PATH`` (or ``GPUFLEET_TOKEN_SECRET_FILE``): a file holding the
   secret; created (random, mode 0600) when missing, refused when others may read it.
2. ``GPUFLEET_TOKEN_SECRET``: the secret itself (a container's secret environment).
3. A file created on first use: next to a SQLite database (``gpufleet.db`` ->
   ``gpufleet.db.token-secret``), else ``<user data dir>/gpufleet/token-secret``.

Several servers on one PostgreSQL must share the secret (the same file on each host, or
the same ``GPUFLEET_TOKEN_SECRET``). The database keeps a fingerprint of the key (the
``settings`` row ``token_key_id``; HMAC of a fixed label, not the key); a server whose key
does not match refuses to start instead of refusing every token (``check_key``).

Before 0008 tokens were stored as plain sha256: such a row is still accepted, and its
first use rewrites it to the HMAC (``accounts.authenticate``, ``nodecreds``).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs
from sqlalchemy import select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError

from gpufleet.server.errors import TokenKeyError
from gpufleet.server.store.db import Database, create_private
from gpufleet.server.store.models import Setting

MIN_SECRET = 32
KEY_ID = "token_key_id"
_LABEL = b"gpufleet token key id v1"


@dataclass(frozen=True, slots=True)
class TokenHasher:
    """What a token is stored as. ``legacy`` is the pre-0008 form (plain sha256)."""

    key: bytes = field(repr=False)

    def digest(self, token: str) -> str:
        return hmac.new(self.key, token.encode(), hashlib.sha256).hexdigest()

    @staticmethod
    def legacy(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    @property
    def key_id(self) -> str:
        """A fingerprint of the key that says nothing about it (stored in the database)."""
        return hmac.new(self.key, _LABEL, hashlib.sha256).hexdigest()[:16]


def default_secret_path(database_url: str) -> Path:
    """Next to a SQLite database file; in the user data dir for anything else."""
    u = make_url(database_url)
    db = u.database
    if u.get_backend_name() == "sqlite" and db and db != ":memory:" and not db.startswith("file:"):
        return Path(db).expanduser().with_name(Path(db).name + ".token-secret")
    return Path(platformdirs.user_data_dir("gpufleet")) / "token-secret"


def load_hasher(*, database_url: str, secret_file: Path | None = None) -> TokenHasher:
    """The key by the rules in the module docstring; TokenKeyError when unusable."""
    secret_file = secret_file or _env_path("GPUFLEET_TOKEN_SECRET_FILE")
    if secret_file is None and (env := os.environ.get("GPUFLEET_TOKEN_SECRET")):
        return TokenHasher(_checked(env.strip(), "GPUFLEET_TOKEN_SECRET"))
    return TokenHasher(_read_or_create(secret_file or default_secret_path(database_url)))


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


def _checked(secret: str, where: object) -> bytes:
    if len(secret) < MIN_SECRET:
        raise TokenKeyError(f"{where}: the token secret must be at least {MIN_SECRET} characters")
    return secret.encode()


def _read_or_create(path: Path) -> bytes:
    """The file's secret; a new random one (0600, written whole before it appears)
    when there is none. Two servers starting at once agree on the first one written."""
    for _ in range(50):
        try:
            return _read(path)
        except FileNotFoundError:
            pass
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
            create_private(tmp, secrets.token_urlsafe(48) + "\n")
            try:
                os.link(tmp, path)  # fails if another process made it first: then read theirs
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
        except OSError as exc:
            raise TokenKeyError(f"cannot create the token secret {path}: {exc}") from None
        time.sleep(0.01)
    raise TokenKeyError(f"cannot read the token secret {path}")


def _read(path: Path) -> bytes:
    try:
        st = path.stat()
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise TokenKeyError(f"{path}: the token secret may be read by others; chmod 600 it")
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenKeyError(f"cannot read the token secret {path}: {exc}") from None
    return _checked(text, path)


def check_key(db: Database, hasher: TokenHasher) -> str | None:
    """None when the database's tokens are hashed with ``hasher``'s key (recording its
    fingerprint on first use), else why this server must not use it."""
    with db.read() as s:
        stored = s.scalar(select(Setting.value).where(Setting.name == KEY_ID))
    if stored is None:
        with contextlib.suppress(IntegrityError), db.write() as s:  # another server raced us
            s.add(Setting(name=KEY_ID, value=hasher.key_id))
        with db.read() as s:
            stored = s.scalar(select(Setting.value).where(Setting.name == KEY_ID))
    if stored == hasher.key_id:
        return None
    return (
        f"this database's tokens are hashed with another token secret (key id {stored}; this "
        f"server's is {hasher.key_id}): give every server of one database the same secret "
        "(--token-secret-file or GPUFLEET_TOKEN_SECRET)"
    )
