"""The agent tests reuse the server tests' real-server fixture (SQLite, and PostgreSQL
when GPUFLEET_TEST_DATABASE_URL is set)."""

from __future__ import annotations

from server.conftest import server

__all__ = ["server"]
