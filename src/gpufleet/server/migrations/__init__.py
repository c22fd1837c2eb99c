"""Alembic migrations, shipped with the package (configured in ``gpufleet.server.store.db``)."""
