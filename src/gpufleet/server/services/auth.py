"""Who is calling: the ``Principal`` behind a bearer token, the token cache, and the
check of a token against the database (HMAC under the server's key, ``tokenkey.py``;
a pre-0008 sha256 row is accepted and rewritten on first use; an expired token is
refused with a detail that says so). ``services/tokens.py`` creates and revokes
tokens and re-exports these names.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import select, union_all, update

from gpufleet.api.base import Role
from gpufleet.server.store.db import Database
from gpufleet.server.store.models import NodeCredential, Token, User
from gpufleet.server.store.tokenkey import TokenHasher, load_hasher


@dataclass(frozen=True, slots=True, kw_only=True)
class Principal:
    """Who is calling: the user behind a valid token."""

    user_id: int
    name: str
    role: Role
    token_id: int | None = None
    expires_at: float | None = None
    """When the token stops working (None: never)."""
    session: bool = False
    """The token is a web session (``POST /v1/sessions``)."""
    job: int | None = None
    """The job whose own credential this is (``GPUFLEET_TOKEN`` inside a job): it acts as
    the job's owner while the job runs, and may not mint credentials that would outlive it."""

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    @property
    def is_operator(self) -> bool:
        """Operators and admins see and act on every job and node."""
        return self.role in ("admin", "operator")


def new_token() -> str:
    return "gf_" + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """The token caches' key (in memory only). Rows store ``TokenHasher.digest``; this
    is also what rows from before 0008 hold (``TokenHasher.legacy``)."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(slots=True)
class TokenCache:
    """Recently authenticated tokens, for ``ttl_s`` seconds: most requests then need no
    lookup. A revocation clears it in this process; another server process notices it
    within ``ttl_s``. An entry whose token expired (by ``clock``) is a miss.

    ``hasher``: the server's token key, which every check of a token not in the cache
    uses (``authenticate``); None: the database's default key (``tokenkey.load_hasher``)."""

    ttl_s: float = 5.0
    hasher: TokenHasher | None = None
    clock: Callable[[], float] = time.time
    _hits: dict[str, tuple[float, Principal]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, digest: str) -> Principal | None:
        with self._lock:
            hit = self._hits.get(digest)
        if hit is None or hit[0] <= time.monotonic():
            return None
        who = hit[1]
        return None if who.expires_at is not None and who.expires_at <= self.clock() else who

    def put(self, digest: str, who: Principal) -> None:
        with self._lock:
            if len(self._hits) > 10_000:
                self._hits.clear()
            self._hits[digest] = (time.monotonic() + self.ttl_s, who)

    def clear(self) -> None:
        with self._lock:
            self._hits.clear()


@dataclass(frozen=True, slots=True)
class Refused:
    """Why a token was not accepted (the 401's detail)."""

    detail: str


UNKNOWN = Refused("invalid or revoked token")


def hasher_for(db: Database, hasher: TokenHasher | None) -> TokenHasher:
    """``hasher``, or the database's default key (``tokenkey.load_hasher``)."""
    return hasher if hasher is not None else load_hasher(database_url=db.url)


def authenticate(*, db: Database, token: str, cache: TokenCache | None = None) -> Principal | None:
    """The caller, or None for a token that is unknown, revoked or expired."""
    who = check_token(db=db, token=token, cache=cache)
    return who if isinstance(who, Principal) else None


def check_token(*, db: Database, token: str, cache: TokenCache | None = None) -> Principal | Refused:
    """The caller, or why the token is refused. A pre-0008 (sha256) row is rewritten to
    the HMAC here, compare-and-set, on its first use."""
    key = hash_token(token)
    if cache is not None and (who := cache.get(key)) is not None:
        return who
    hasher = hasher_for(db, cache.hasher if cache is not None else None)
    digest = hasher.digest(token)
    q = select(User.id, User.name, User.role, Token.id.label("token_id"), Token.expires_at, Token.kind)
    q = q.join(Token, Token.user_id == User.id).where(Token.revoked_at.is_(None))
    with db.read() as s:
        row = s.execute(q.where(Token.token_hash == digest)).first()
        legacy = (
            None if row is not None else s.execute(q.where(Token.token_hash == hasher.legacy(token))).first()
        )
    if legacy is not None:
        with db.write() as s:
            s.execute(
                update(Token)
                .where(Token.id == legacy.token_id, Token.token_hash == hasher.legacy(token))
                .values(token_hash=digest)
                .execution_options(synchronize_session=False)
            )
        row = legacy
    if row is None:
        return UNKNOWN
    now = cache.clock() if cache is not None else time.time()
    if row.expires_at is not None and row.expires_at <= now:
        return Refused(_expired(row.expires_at, session=row.kind == "session"))
    who = Principal(
        user_id=row.id,
        name=row.name,
        role=row.role,
        token_id=row.token_id,
        expires_at=row.expires_at,
        session=row.kind == "session",
    )
    if cache is not None:
        cache.put(key, who)
    return who


def _expired(at: float, *, session: bool) -> str:
    when = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    if session:
        return f"web session expired at {when}: sign in again"
    return f"token expired at {when}: create a new one (gpufleet tokens create) or ask an admin"


def live_digests(db: Database) -> frozenset[str]:
    """The stored digests of every token and node credential not revoked
    (``ratelimit.KnownDigests``'s load). Expired ones are in too: they cost a look-up,
    which answers 401 saying so."""
    tokens = select(Token.token_hash).where(Token.revoked_at.is_(None))
    nodes = select(NodeCredential.token_hash).where(NodeCredential.revoked_at.is_(None))
    with db.read() as s:
        return frozenset(s.scalars(union_all(tokens, nodes)))
