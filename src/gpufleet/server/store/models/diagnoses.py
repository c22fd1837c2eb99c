"""What the server read in failed jobs' output (issue 34, ``services/diagnoses.py``).

One ``job_diagnoses`` row per failed job attempt per node whose log that node closed:
queued by the node's sync (``done_at`` NULL), then matched against the signature table
by the diagnosis loop, which fills in what it found (or nothing). Rows whose signature
implicates the node are the evidence of its suspicion: counted by distinct user within
the window, and marked ``spent`` once they cordoned it (after an operator's uncordon, it
takes as many fresh users again). The job's own row carries its chosen finding
(``Job.diagnosis``).
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, Float, ForeignKey, Index, Integer, String, UniqueConstraint, text
from sqlalchemy.orm import Mapped, mapped_column

from gpufleet.server.store.models.base import Base


class JobDiagnosis(Base):
    __tablename__ = "job_diagnoses"
    __table_args__ = (
        UniqueConstraint("job_id", "attempt", "node", name="uq_job_diagnoses_stream"),
        # the loop's look for work: only the rows still waiting are in it
        Index(
            "ix_job_diagnoses_pending",
            "id",
            sqlite_where=text("done_at IS NULL"),
            postgresql_where=text("done_at IS NULL"),
        ),
        Index("ix_job_diagnoses_node_signature", "node", "signature"),
        # the fleet view's read of unspent evidence against nodes (services/diagnosisview.py):
        # its query must say ``spent = false`` (``== false()``) for SQLite to use it
        Index(
            "ix_job_diagnoses_suspect",
            "done_at",
            sqlite_where=text("blame = 'node' AND spent = 0"),
            postgresql_where=text("blame = 'node' AND spent = false"),
        ),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(BigInteger)
    node: Mapped[str] = mapped_column(String(128))
    user_id: Mapped[int] = mapped_column(Integer)
    queued_at: Mapped[float] = mapped_column(Float)
    done_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    signature: Mapped[str | None] = mapped_column(String(64), nullable=True)
    """The signature found (None: none, or not looked at yet)."""
    blame: Mapped[str | None] = mapped_column(String(8), nullable=True)
    """``node``, ``job`` or ``unknown`` (``gpufleet.diagnosis.Blame``)."""
    line: Mapped[str | None] = mapped_column(String(512), nullable=True)
    """The matching line, truncated."""
    spent: Mapped[bool] = mapped_column(Boolean, default=False)
    """Counted in a cordon of its node already."""
