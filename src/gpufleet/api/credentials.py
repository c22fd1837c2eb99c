"""Schemas of node credentials: join tokens, certificates, revocation (mTLS)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

PEM = Annotated[str, StringConstraints(min_length=1, max_length=16_384, pattern=r"^[\x20-\x7e\r\n]+$")]


class CertificateIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    csr: PEM
    """The agent's certificate request (PEM; only its public key is used)."""


class CertificateOut(BaseModel):
    node: str
    certificate: str
    ca: str
    serial: str
    not_after: float


class NodeCredentialOut(BaseModel):
    kind: Literal["join-token", "certificate"]
    id: int
    node: str | None
    hint: str
    """The token's last characters, or the certificate's serial."""
    created_by: str
    created_at: float
    not_after: float | None = None
    revoked_at: float | None = None
    expires_at: float | None = None
    """A join token's: it buys a certificate until then (None: never, or a certificate)."""
    used_at: float | None = None
    """A join token's: when it bought a certificate (it is spent: single use)."""


class NodeCredentialList(BaseModel):
    """A page: join tokens by id, then certificates by id."""

    items: list[NodeCredentialOut]
    next_cursor: str | None = Field(
        default=None, description="pass as `cursor` for the next page; null on the last page"
    )


class RevokedOut(BaseModel):
    node: str
    join_tokens: int
    certificates: int
