"""What operators declare for jobs to ask for: pools (the default pool among them), QOS and licenses."""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    Integer,
    String,
    false,
    true,
)
from sqlalchemy.orm import Mapped, mapped_column

from gpufleet.server.store.models.base import Base

DEFAULT_POOL = "default"
"""The pool created with the schema; it cannot be deleted (``services/pools.delete_pool``)."""


class Pool(Base):
    __tablename__ = "pools"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    gpu: Mapped[bool] = mapped_column(Boolean, default=True)
    description: Mapped[str] = mapped_column(String(256), default="")
    default_cpus_per_gpu: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """CPUs a GPU job asks for per GPU when it says nothing (0: none; Slurm's
    ``DefCpuPerGPU``). A 0-GPU job that says nothing asks for 1 CPU."""
    default_mem_per_cpu_mb: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """Memory per requested CPU when a job says nothing (0: none; ``DefMemPerCPU``)."""
    is_default: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """Slurm's ``Default=YES``: a job that names no pool goes here (at most one pool;
    none: the pool ``default``)."""


class QosRow(Base):
    """A Slurm QOS (``gpufleet admin qos``): a priority added to its jobs', per-user
    limits the scheduler enforces (``scheduler/qos.py``), whether its jobs may be
    preempted; one may be the default (jobs without ``--qos`` get it)."""

    __tablename__ = "qos"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    priority: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    max_gpus_per_user: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_jobs_per_user: Mapped[int | None] = mapped_column(Integer, nullable=True)
    preemptable: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    is_default: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    description: Mapped[str] = mapped_column(String(256), default="", server_default="")


class LicenseRow(Base):
    """A license an operator declared (Slurm's ``Licenses=NAME:COUNT``), for ``-L``."""

    __tablename__ = "licenses"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    count: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
