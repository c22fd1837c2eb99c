"""Node credentials: the token an agent authenticates with, and the client certificate
it trades that token for when the server runs with TLS (``gpufleet.pki``).

``gpufleet node join-token [--node NAME]`` (operators and admins) creates one; like API
tokens only its HMAC with the server's key is stored (``tokenkey.py``; a pre-0008 sha256
row is rewritten on first use) and the token (prefix ``gfn_``) is shown once. Join
tokens do not expire: an agent syncs with its token for the node's whole life (or
trades it for a certificate, which does expire); ``revoke_node`` ends them. A
credential speaks for exactly one node: the one named at creation, or else the first
node that syncs with it (bound by compare-and-set, so two agents racing with one fresh
token cannot both own it). Speaking for another node is a 403.

Certificates (``issue_certificate``): with the token (or an operator's token, or the
node's current certificate, to renew) an agent sends a CSR and gets a certificate whose
subject is the node; its serial is stored. ``revoke_node`` revokes every join token and
certificate of a node; ``Revocations`` is the in-memory set of revoked serials every
certificate sync is checked against (reloaded every few seconds, at once after a revoke
on this server).
"""

from __future__ import annotations

import secrets
from functools import partial

from sqlalchemy import Update, select, update
from sqlalchemy.orm import Session

from gpufleet.api.credentials import CertificateOut, NodeCredentialList, NodeCredentialOut, RevokedOut
from gpufleet.api.nodes import JoinTokenOut
from gpufleet.pki import CertificateAuthority, PkiError
from gpufleet.server.agentstate import CredCache, NodeCred, Revocations
from gpufleet.server.db import Database
from gpufleet.server.models import NodeCertificate, NodeCredential
from gpufleet.server.pages import cut, id_cursor
from gpufleet.server.problems import Failure, conflict, forbidden, invalid, not_found
from gpufleet.server.services.auth import Principal, hash_token
from gpufleet.server.tokenkey import TokenHasher, load_hasher
from gpufleet.server.writer import Writer

PREFIX = "gfn_"


def is_node_token(token: str) -> bool:
    return token.startswith(PREFIX)


def create_join_token(
    *, db: Database, actor: Principal, node: str | None, now: float, hasher: TokenHasher | None = None
) -> JoinTokenOut | Failure:
    """``hasher``: the server's token key (None: the database's default one)."""
    if not actor.is_operator:
        return forbidden("only operators and admins create node join tokens")
    token = PREFIX + secrets.token_urlsafe(32)
    digest = (hasher or load_hasher(database_url=db.url)).digest(token)
    with db.write() as s:
        row = NodeCredential(
            node=node, token_hash=digest, hint=token[-4:], created_by=actor.name, created_at=now
        )
        s.add(row)
        s.flush()
        return JoinTokenOut(id=row.id, node=node, hint=row.hint, created_at=now, token=token)


def authenticate_node(
    *, db: Database, token: str, cache: CredCache, hasher: TokenHasher | None = None
) -> NodeCred | None:
    """The credential, or None. The cache is keyed by ``hash_token`` (in memory); the
    row by the HMAC (a pre-0008 sha256 row is rewritten here, compare-and-set)."""
    key = hash_token(token)
    hit = cache.get(key)
    if hit is not None:
        return hit
    hasher = hasher or load_hasher(database_url=db.url)
    digest = hasher.digest(token)
    q = select(NodeCredential.id, NodeCredential.node).where(NodeCredential.revoked_at.is_(None))
    with db.read() as s:
        row = s.execute(q.where(NodeCredential.token_hash == digest)).first()
        legacy = None if row is not None else s.execute(q.where(NodeCredential.token_hash == key)).first()
    if legacy is not None:
        with db.write() as s:
            s.execute(
                update(NodeCredential)
                .where(NodeCredential.id == legacy.id, NodeCredential.token_hash == key)
                .values(token_hash=digest)
                .execution_options(synchronize_session=False)
            )
        row = legacy
    if row is None:
        return None
    cred = NodeCred(id=row.id, node=row.node)
    cache.put(key, cred)
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


# -- certificates --------------------------------------------------------------------------------


def issue_certificate(
    *,
    db: Database,
    ca: CertificateAuthority | None,
    node: str,
    csr: str,
    actor: str,
    credential_id: int | None,
    now: float,
) -> CertificateOut | Failure:
    """Sign the agent's CSR for ``node`` (the caller is already known to speak for it)."""
    if ca is None:
        return conflict("this server has no certificate authority: start it with --tls-cert (and --ca-dir)")
    try:
        issued = ca.sign_node(csr.encode(), node=node)
    except PkiError as exc:
        return invalid(str(exc))
    with db.write() as s:
        s.add(
            NodeCertificate(
                node=node,
                serial=issued.serial,
                not_after=issued.not_after,
                credential_id=credential_id,
                created_by=actor,
                created_at=now,
            )
        )
    return CertificateOut(
        node=node,
        certificate=issued.certificate.decode(),
        ca=ca.pem.decode(),
        serial=issued.serial,
        not_after=issued.not_after,
    )


def list_credentials(
    *, db: Database, actor: Principal, node: str | None = None, limit: int = 100, cursor: str | None = None
) -> NodeCredentialList | Failure:
    """Join tokens by id, then certificates by id, a page at a time: ``cursor`` is the
    previous page's ``next_cursor`` (``join-token:ID`` or ``certificate:ID``)."""
    if not actor.is_operator:
        return forbidden("only operators and admins list node credentials")
    kind, after = "join-token", 0
    if cursor is not None:
        kind, _, raw = cursor.partition(":")
        try:
            after = id_cursor(raw) or 0
        except ValueError:
            kind = ""
        if kind not in ("join-token", "certificate"):
            return invalid(f"cursor: not a cursor of this list: {cursor[:40]!r}")
    items: list[NodeCredentialOut] = []
    with db.read() as s:
        if kind == "join-token":
            q = select(NodeCredential).where(NodeCredential.id > after).order_by(NodeCredential.id)
            if node is not None:
                q = q.where(NodeCredential.node == node)
            for t in s.scalars(q.limit(limit + 1)):
                items.append(
                    NodeCredentialOut(
                        kind="join-token",
                        id=t.id,
                        node=t.node,
                        hint=t.hint,
                        created_by=t.created_by,
                        created_at=t.created_at,
                        revoked_at=t.revoked_at,
                    )
                )
            after = 0
        if len(items) <= limit:
            cq = select(NodeCertificate).where(NodeCertificate.id > after).order_by(NodeCertificate.id)
            if node is not None:
                cq = cq.where(NodeCertificate.node == node)
            for c in s.scalars(cq.limit(limit + 1 - len(items))):
                items.append(
                    NodeCredentialOut(
                        kind="certificate",
                        id=c.id,
                        node=c.node,
                        hint=c.serial,
                        created_by=c.created_by,
                        created_at=c.created_at,
                        not_after=c.not_after,
                        revoked_at=c.revoked_at,
                    )
                )
    page, next_cursor = cut(items, limit, lambda it: f"{it.kind}:{it.id}")
    return NodeCredentialList(items=page, next_cursor=next_cursor)


def _count(s: Session, stmt: Update) -> int:
    """Rows an UPDATE changed."""
    result = s.execute(stmt.execution_options(synchronize_session=False))
    return int(getattr(result, "rowcount", 0) or 0)


def revoke_node(
    *, db: Database, actor: Principal, node: str, now: float, cache: CredCache, revocations: Revocations
) -> RevokedOut | Failure:
    """Revoke every join token and certificate of ``node``; refused from the next
    request on (this server's caches are cleared; others reload within seconds)."""
    if not actor.is_operator:
        return forbidden("only operators and admins revoke node credentials")
    with db.write() as s:
        tokens = _count(
            s,
            update(NodeCredential)
            .where(NodeCredential.node == node, NodeCredential.revoked_at.is_(None))
            .values(revoked_at=now),
        )
        certs = _count(
            s,
            update(NodeCertificate)
            .where(NodeCertificate.node == node, NodeCertificate.revoked_at.is_(None))
            .values(revoked_at=now),
        )
    if not tokens and not certs:
        return not_found(f"node {node} has no credential that is not revoked")
    cache.clear()
    revocations.invalidate()
    return RevokedOut(node=node, join_tokens=tokens, certificates=certs)


def refresh_revocations(db: Database, revocations: Revocations) -> None:
    """Reload the revoked serials when the cached set is stale."""
    if revocations.stale():
        with db.read() as s:
            serials = s.scalars(select(NodeCertificate.serial).where(NodeCertificate.revoked_at.is_not(None)))
            revocations.load(frozenset(serials))
