"""Admin actions straight on the database (``--database-url``), for bootstrap and
recovery when no server runs (or when every admin token lapsed: the break-glass path).
They call the same service functions as the API, with the server's token key
(``tokenkey.py``: the same ``--token-secret-file`` / ``GPUFLEET_TOKEN_SECRET`` rules)."""

from __future__ import annotations

import time
from pathlib import Path

from gpufleet.api.users import UserIn
from gpufleet.server.errors import TokenKeyError
from gpufleet.server.problems import Failure, Kind
from gpufleet.server.services.auth import Principal
from gpufleet.server.services.tokens import TOKEN_TTL_S
from gpufleet.server.services.users import create_user
from gpufleet.server.store.db import Database, schema_problem
from gpufleet.server.store.tokenkey import check_key, load_hasher

_LOCAL_ADMIN = Principal(user_id=0, name="local-admin", role="admin")


def create_user_direct(
    *,
    database_url: str,
    name: str,
    role: str,
    teams: list[str],
    secret_file: Path | None = None,
    ttl_s: float = TOKEN_TTL_S,
) -> str | Failure:
    """The new user's token (valid ``ttl_s``), or why not."""
    try:
        hasher = load_hasher(database_url=database_url, secret_file=secret_file)
    except TokenKeyError as exc:
        return Failure(kind=Kind.CONFLICT, detail=str(exc))
    db = Database.connect(database_url)
    try:
        problem = schema_problem(db.engine, database_url) or check_key(db, hasher)
        if problem is not None:
            return Failure(kind=Kind.CONFLICT, detail=problem)
        try:
            spec = UserIn.model_validate({"name": name, "role": role, "teams": teams})
        except ValueError as exc:
            return Failure(kind=Kind.INVALID, detail=str(exc).splitlines()[0])
        made = create_user(db=db, actor=_LOCAL_ADMIN, spec=spec, now=time.time(), hasher=hasher, ttl_s=ttl_s)
        return made if isinstance(made, Failure) else made.token
    finally:
        db.dispose()
