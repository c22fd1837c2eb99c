"""Admin actions straight on the database (``--database-url``), for bootstrap and
recovery when no server runs. They call the same service functions as the API."""

from __future__ import annotations

import time

from gpufleet.server.db import Database, schema_problem
from gpufleet.server.problems import Failure, Kind
from gpufleet.server.schemas import UserIn
from gpufleet.server.services.accounts import Principal, create_user

_LOCAL_ADMIN = Principal(user_id=0, name="local-admin", role="admin")


def create_user_direct(*, database_url: str, name: str, role: str, teams: list[str]) -> str | Failure:
    """The new user's token, or why not."""
    db = Database.connect(database_url)
    try:
        problem = schema_problem(db.engine, database_url)
        if problem is not None:
            return Failure(kind=Kind.CONFLICT, detail=problem)
        try:
            spec = UserIn.model_validate({"name": name, "role": role, "teams": teams})
        except ValueError as exc:
            return Failure(kind=Kind.INVALID, detail=str(exc).splitlines()[0])
        made = create_user(db=db, actor=_LOCAL_ADMIN, spec=spec, now=time.time())
        return made if isinstance(made, Failure) else made.token
    finally:
        db.dispose()
