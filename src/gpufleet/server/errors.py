"""The server's exceptions, all in one place (httpx-style: the whole tree is here).

Expected outcomes of a request (bad input, not allowed, not found, already taken) are
*values*: a service returns a ``problems.Failure`` and the router unwraps it into
RFC 9457 problem+json. Exceptions are for what the caller must not carry on through:

    GpufleetError                 base of every gpufleet server exception
    ├── Conflict                  a compare-and-set write lost: the row changed between
    │                             read and write. The caller rolls its transaction back
    │                             and retries from fresh state (bounded), or reports 409.
    ├── IllegalTransition         a job state change the state machine forbids: a bug in
    │                             the caller, never caused by input (a 500 if it escapes).
    ├── StartupError              the server cannot start; the message says why and what
    │   │                         to do (``gpufleet server`` prints it and exits 1).
    │   └── TokenKeyError         the token secret cannot be read or made.
    ├── ProblemError              the HTTP boundary: a status and a detail that the app's
    │                             handlers render as problem+json (``problems.py``).
    └── BackupError               a backup or restore could not be made (a tool failed, the
                                  disk is full, the file is not a backup); nothing was left
                                  under the backup's name (``store/backup.py``).
    Fenced (an Exception)         a leader's write refused: a newer leader exists
                                  (``store/leader.py``); the loops stop their step quietly.

Foreign errors are translated where they enter: a database error that means "someone
else wrote first" becomes ``Conflict`` (the loops treat SQLAlchemy's
``OperationalError``, a lock timeout, the same way); a ``PkiError`` or ``OSError`` at
start-up becomes ``StartupError`` (``raise ... from exc``).
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any


class GpufleetError(Exception):
    """Base class of the server's exceptions."""


class Conflict(GpufleetError):
    """A compare-and-set lost: the row moved between read and write. Roll back, read
    again, retry (a bounded number of times)."""

    def __init__(self, detail: str = "changed meanwhile", *, job_id: int | None = None) -> None:
        super().__init__(detail)
        self.job_id = job_id


class IllegalTransition(GpufleetError):
    """A caller asked for a transition the state machine forbids: a bug, not input."""


class StartupError(GpufleetError):
    """The server cannot start (the message says why and what to do)."""


class TokenKeyError(StartupError):
    """The token secret cannot be read or made (the message says which file and why)."""


class ProblemError(GpufleetError):
    """An HTTP error answer: ``status`` and ``detail`` (and validation ``errors``),
    rendered as problem+json by ``problems.install_handlers``."""

    def __init__(
        self, status: int, detail: str, *, title: str | None = None, errors: list[Any] | None = None
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.title = title or HTTPStatus(status).phrase
        self.errors = errors


__all__ = [
    "BackupError",
    "Conflict",
    "GpufleetError",
    "IllegalTransition",
    "ProblemError",
    "StartupError",
    "TokenKeyError",
]


class BackupError(GpufleetError):
    """A backup or restore failed; the message says why (``store/backup.py``)."""


class Fenced(Exception):
    """A leader's write refused: a newer leader exists (or the lease row is gone)."""
