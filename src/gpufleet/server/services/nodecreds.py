"""Node credentials: the token an agent authenticates with.

``gpufleet node join-token [--node NAME]`` (operators and admins) creates one; like API
tokens only the sha256 is stored and the token (prefix ``gfn_``) is shown once. A
credential speaks for exactly one node: the one named at creation, or else the first
node that syncs with it (bound by compare-and-set, so two agents racing with one fresh
token cannot both own it). Speaking for another node is a 403.
"""

from __future__ import annotations

import secrets
from functools import partial

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from gpufleet.server.db import Database
from gpufleet.server.hot import CredCache, NodeCred
from gpufleet.server.models import NodeCredential
from gpufleet.server.problems import Failure, forbidden
from gpufleet.server.schemas import JoinTokenOut
from gpufleet.server.services.accounts import Principal, hash_token
from gpufleet.server.writer import Writer

PREFIX = "gfn_"


def is_node_token(token: str) -> bool:
    return token.startswith(PREFIX)


def create_join_token(
    *, db: Database, actor: Principal, node: str | None, now: float
) -> JoinTokenOut | Failure:
    if not actor.is_operator:
        return forbidden("only operators and admins create node join tokens")
    token = PREFIX + secrets.token_urlsafe(32)
    with db.write() as s:
        row = NodeCredential(
            node=node, token_hash=hash_token(token), hint=token[-4:], created_by=actor.name, created_at=now
        )
        s.add(row)
        s.flush()
        return JoinTokenOut(id=row.id, node=node, hint=row.hint, created_at=now, token=token)


def authenticate_node(*, db: Database, token: str, cache: CredCache) -> NodeCred | None:
    digest = hash_token(token)
    hit = cache.get(digest)
    if hit is not None:
        return hit
    with db.read() as s:
        row = s.execute(
            select(NodeCredential.id, NodeCredential.node).where(
                NodeCredential.token_hash == digest, NodeCredential.revoked_at.is_(None)
            )
        ).first()
    if row is None:
        return None
    cred = NodeCred(id=row.id, node=row.node)
    cache.put(digest, cred)
    return cred


def _bind(s: Session, *, cred_id: int, node: str) -> str | None:
    s.execute(
        update(NodeCredential)
        .where(NodeCredential.id == cred_id, NodeCredential.node.is_(None))
        .values(node=node)
        .execution_options(synchronize_session=False)
    )
    return s.scalar(select(NodeCredential.node).where(NodeCredential.id == cred_id))


def bind(*, writer: Writer, token: str, cred: NodeCred, node: str, cache: CredCache) -> NodeCred:
    """The credential bound to ``node`` if it was unbound; whatever it is bound to now.
    Through the group-commit ``writer``: a fleet registering at once with fresh tokens
    shares its write transactions."""
    if cred.node is not None:
        return cred
    bound = writer.run(partial(_bind, cred_id=cred.id, node=node))
    out = NodeCred(id=cred.id, node=bound)
    cache.put(hash_token(token), out)
    return out
