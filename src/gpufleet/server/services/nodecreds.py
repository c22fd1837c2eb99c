"""Node credentials: the token an agent authenticates with, and the client certificate
it trades that token for when the server runs with TLS (``gpufleet.pki``).

``gpufleet node join-token [--node NAME] [--ttl 1h]`` (operators and admins) creates
one; like API tokens only its HMAC with the server's key is stored (``tokenkey.py``; a
pre-0008 sha256 row is rewritten on first use) and the token (prefix ``gfn_``) is shown
once. A credential speaks for exactly one node: the one named at creation, or else the
first node that syncs with it (bound by compare-and-set, so two agents racing with one
fresh token cannot both own it). Speaking for another node is a 403.

Enrolment (as kubeadm's bootstrap tokens): a join token buys the node's certificate
**once** and only **until it expires** (``--ttl``, 1 h by default). The first certificate
it buys spends it (``used_at``), in the transaction that records the certificate and by
compare-and-set on ``used_at IS NULL``, so of two enrolments racing with one token one
gets a certificate and the other a 401; a spent token is refused for everything from
then on (this server's credential cache is cleared; another server's forgets it within
its ``CredCache.ttl_s``). A node that lost its certificate needs a new join token.
Tokens made before revision 0017 have no expiry; they are still spent by enrolling.

Decision, without TLS (or with TLS and ``--node-certs-required`` off): an agent still
syncs with its join token, as before, for the node's whole life: there is no certificate
to trade it for, so that token *is* the node's credential (``revoke_node`` ends it). The
expiry bounds enrolment only, not those syncs: a plain-HTTP cluster's tokens are as long
lived as its nodes, and the README says so. With certificates required a join token
only ever buys the certificate.

Certificates (``issue_certificate``): with the token (or an operator's token, or the
node's current certificate, to renew) an agent sends a CSR and gets a certificate whose
subject is the node; its serial is stored. ``revoke_node`` revokes every join token and
certificate of a node; ``Revocations`` is the in-memory set of revoked serials every
certificate sync is checked against (reloaded every few seconds, at once after a revoke
on this server).
"""

from __future__ import annotations

import secrets
import time
from functools import partial
from typing import TYPE_CHECKING

from sqlalchemy import Update, or_, select, update
from sqlalchemy.orm import Session

from gpufleet.api.credentials import CertificateOut, NodeCredentialList, NodeCredentialOut, RevokedOut
from gpufleet.api.nodes import JoinTokenOut
from gpufleet.server.problems import Failure, conflict, forbidden, invalid, not_found, unauthorized
from gpufleet.server.services.auth import Principal, hash_token
from gpufleet.server.store.agentstate import CredCache, NodeCred, Revocations
from gpufleet.server.store.db import Database

if TYPE_CHECKING:
    from gpufleet.pki import CertificateAuthority
from gpufleet.server.store.models import NodeCertificate, NodeCredential
from gpufleet.server.store.pages import cut, id_cursor
from gpufleet.server.store.tokenkey import TokenHasher, load_hasher
from gpufleet.server.store.writer import Writer

PREFIX = "gfn_"
JOIN_TTL_S = 3600.0
"""How long a join token may enrol a node unless ``--ttl`` says otherwise (kubeadm: 24 h;
an operator makes the token right before starting the agent)."""


def is_node_token(token: str) -> bool:
    return token.startswith(PREFIX)


def create_join_token(
    *,
    db: Database,
    actor: Principal,
    node: str | None,
    now: float,
    ttl_s: float | None = None,
    hasher: TokenHasher | None = None,
) -> JoinTokenOut | Failure:
    """A token that enrols a node once, within ``ttl_s`` (None: ``JOIN_TTL_S``).
    ``hasher``: the server's token key (None: the database's default one)."""
    if not actor.is_operator:
        return forbidden("only operators and admins create node join tokens")
    token = PREFIX + secrets.token_urlsafe(32)
    digest = (hasher or load_hasher(database_url=db.url)).digest(token)
    expires = now + (JOIN_TTL_S if ttl_s is None else ttl_s)
    with db.write() as s:
        row = NodeCredential(
            node=node,
            token_hash=digest,
            hint=token[-4:],
            created_by=actor.name,
            created_at=now,
            expires_at=expires,
        )
        s.add(row)
        s.flush()
        return JoinTokenOut(
            id=row.id, node=node, hint=row.hint, created_at=now, expires_at=expires, token=token
        )


def authenticate_node(
    *, db: Database, token: str, cache: CredCache, hasher: TokenHasher | None = None
) -> NodeCred | str:
    """The credential, or why it is refused (unknown, revoked, spent on a certificate).
    The cache is keyed by ``hash_token`` (in memory); the row by the HMAC (a pre-0008
    sha256 row is rewritten here, compare-and-set)."""
    key = hash_token(token)
    hit = cache.get(key)
    if hit is not None:
        return hit
    hasher = hasher or load_hasher(database_url=db.url)
    digest = hasher.digest(token)
    q = select(NodeCredential.id, NodeCredential.node, NodeCredential.revoked_at, NodeCredential.used_at)
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
        return "invalid node credential"
    if row.revoked_at is not None:
        return "this node credential is revoked"
    if row.used_at is not None:
        return _spent(row.node)
    cred = NodeCred(id=row.id, node=row.node)
    cache.put(key, cred)
    return cred


def _spent(node: str | None) -> str:
    return (
        f"this join token was used to enrol node {node} already (a join token buys one "
        "certificate): a node that lost its certificate needs a new join token"
    )


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
    """Sign the agent's CSR for ``node`` (the caller is already known to speak for it).
    With a join token (``credential_id``) the certificate spends it, in the same
    transaction: an expired or spent token gets no certificate (401)."""
    if ca is None:
        return conflict("this server has no certificate authority: start it with --tls-cert (and --ca-dir)")
    from gpufleet.pki import PkiError  # (loaded: the server has a CA; see app._load_ca)

    try:
        issued = ca.sign_node(csr.encode(), node=node)
    except PkiError as exc:
        return invalid(str(exc))
    with db.write() as s:
        if credential_id is not None:
            refused = _spend(s, credential_id=credential_id, now=now)
            if refused is not None:
                return refused  # nothing was written: the signed certificate is dropped
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


def _spend(s: Session, *, credential_id: int, now: float) -> Failure | None:
    """Mark the join token used, compare-and-set: only an unused, unexpired, unrevoked
    one (PostgreSQL re-checks the row after a concurrent spender commits, SQLite runs one
    writer at a time: of two racing enrolments one wins). None: spent now by this call."""
    live = (
        NodeCredential.id == credential_id,
        NodeCredential.used_at.is_(None),
        NodeCredential.revoked_at.is_(None),
        or_(NodeCredential.expires_at.is_(None), NodeCredential.expires_at > now),
    )
    if _count(s, update(NodeCredential).where(*live).values(used_at=now)) == 1:
        return None
    row = s.execute(
        select(
            NodeCredential.node, NodeCredential.used_at, NodeCredential.revoked_at, NodeCredential.expires_at
        ).where(NodeCredential.id == credential_id)
    ).first()
    if row is None or row.revoked_at is not None:
        return unauthorized("this node credential is revoked")
    if row.used_at is not None:
        return unauthorized(_spent(row.node))
    return unauthorized(
        f"this join token expired at {_when(row.expires_at)}: make a new one (gpufleet node join-token --ttl)"
    )


def _when(at: float | None) -> str:
    return "-" if at is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


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
                        expires_at=t.expires_at,
                        used_at=t.used_at,
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
