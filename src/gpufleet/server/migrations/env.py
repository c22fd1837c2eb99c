"""Alembic environment: runs on the connection that ``gpufleet.server.store.db`` hands over."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from gpufleet.server.store.models import Base

config = context.config
connection = config.attributes.get("connection")
if connection is None:  # `alembic` run by hand for autogenerate
    engine = create_engine(config.get_main_option("sqlalchemy.url") or "sqlite://")
    with engine.begin() as conn:
        context.configure(connection=conn, target_metadata=Base.metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
else:
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
