"""token expiry and kind, the audit log, server settings (the token key's fingerprint)

Existing tokens keep their sha256 digest (rewritten to the HMAC on first use) and get
no expiry here: the server gives each a full ``--token-ttl`` from its first start on
this revision (``accounts.bound_lifetimes``). The first admin's token (the lowest id,
named ``bootstrap``) becomes kind ``bootstrap``: it does not expire.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_PG_FUNCTION = """
CREATE OR REPLACE FUNCTION gpufleet_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit rows are append-only';
END
$$
"""


def upgrade() -> None:
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.add_column(sa.Column("expires_at", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("kind", sa.String(16), nullable=False, server_default="api"))
    op.execute(
        "UPDATE tokens SET kind = 'bootstrap' WHERE name = 'bootstrap' AND id = (SELECT MIN(id) FROM tokens)"
    )
    op.create_table(
        "audit",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("actor", sa.String(140), nullable=True),
        sa.Column("role", sa.String(16), nullable=True),
        sa.Column("token_id", sa.Integer(), nullable=True),
        sa.Column("address", sa.String(64), nullable=False),
        sa.Column("method", sa.String(8), nullable=False),
        sa.Column("path", sa.String(512), nullable=False),
        sa.Column("object", sa.String(256), nullable=True),
        sa.Column("status", sa.Integer(), nullable=False),
    )
    op.create_index("ix_audit_at", "audit", ["at"])
    op.create_index("ix_audit_actor_id", "audit", ["actor", "id"])
    if _pg():
        op.execute(_PG_FUNCTION)
        op.execute(
            "CREATE TRIGGER audit_append_only BEFORE UPDATE ON audit "
            "FOR EACH ROW EXECUTE FUNCTION gpufleet_audit_append_only()"
        )
    else:
        op.execute(
            "CREATE TRIGGER audit_append_only BEFORE UPDATE ON audit "
            "BEGIN SELECT RAISE(ABORT, 'audit rows are append-only'); END"
        )
    op.create_table(
        "settings",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.String(256), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("settings")
    op.execute("DROP TRIGGER IF EXISTS audit_append_only" + (" ON audit" if _pg() else ""))
    if _pg():
        op.execute("DROP FUNCTION IF EXISTS gpufleet_audit_append_only()")
    op.drop_index("ix_audit_actor_id", table_name="audit")
    op.drop_index("ix_audit_at", table_name="audit")
    op.drop_table("audit")
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.drop_column("kind")
        batch_op.drop_column("expires_at")


def _pg() -> bool:
    return op.get_bind().dialect.name == "postgresql"
