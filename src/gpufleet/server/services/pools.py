"""Pools (Slurm's partitions): named sets of nodes. A pool with ``gpu=False`` is
CPU-only and takes only 0-GPU jobs; GPU pools take any job (0 GPUs: CPUs and memory on
any of its nodes, as in Slurm). One pool may be the default (Slurm's ``Default=YES``):
jobs that name no pool go there; with none marked, the pool ``default`` is."""

from __future__ import annotations

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from gpufleet.api.users import PoolIn, PoolOut, PoolPatch
from gpufleet.server.jobstate.states import TERMINAL
from gpufleet.server.problems import Failure, conflict, forbidden, not_found
from gpufleet.server.services.auth import Principal
from gpufleet.server.store.db import Database
from gpufleet.server.store.models import DEFAULT_POOL, Job, NodeRow, Pool
from gpufleet.server.store.pages import PoolPage, cut


def _out(s: Session, p: Pool) -> PoolOut:
    nodes = s.scalar(select(func.count()).select_from(NodeRow).where(NodeRow.pool == p.name)) or 0
    return PoolOut(name=p.name, gpu=p.gpu, description=p.description, nodes=nodes, default=p.is_default)


def _make_default(s: Session, p: Pool) -> None:
    """``p`` becomes the one default pool (the write that unmarks the others is in the
    same transaction)."""
    s.execute(update(Pool).where(Pool.name != p.name, Pool.is_default).values(is_default=False))
    p.is_default = True


def list_pools(*, db: Database, actor: Principal, limit: int = 100, cursor: str | None = None) -> PoolPage:
    with db.read() as s:
        q = select(Pool).order_by(Pool.name).limit(limit + 1)
        if cursor is not None:
            q = q.where(Pool.name > cursor)
        rows, after = cut(list(s.scalars(q)), limit, lambda p: p.name)
        return PoolPage(items=[_out(s, p) for p in rows], next_cursor=after)


def get_pool(*, db: Database, actor: Principal, name: str) -> PoolOut | Failure:
    with db.read() as s:
        p = s.get(Pool, name)
        return not_found(f"no pool {name}") if p is None else _out(s, p)


def create_pool(*, db: Database, actor: Principal, spec: PoolIn) -> PoolOut | Failure:
    if not actor.is_admin:
        return forbidden("only admins manage pools")
    with db.write() as s:
        if s.get(Pool, spec.name) is not None:
            return conflict(f"pool {spec.name} exists")
        p = Pool(name=spec.name, gpu=spec.gpu, description=spec.description)
        s.add(p)
        s.flush()
        if spec.default:
            _make_default(s, p)
        return _out(s, p)


def update_pool(*, db: Database, actor: Principal, name: str, patch: PoolPatch) -> PoolOut | Failure:
    if not actor.is_admin:
        return forbidden("only admins manage pools")
    with db.write() as s:
        p = s.get(Pool, name)
        if p is None:
            return not_found(f"no pool {name}")
        if patch.description is not None:
            p.description = patch.description
        if patch.default:
            _make_default(s, p)
        elif patch.default is False:
            p.is_default = False
        return _out(s, p)


def delete_pool(*, db: Database, actor: Principal, name: str) -> PoolOut | Failure:
    """Only an unused pool can go: no nodes and no job that is not finished, and never
    the default pool (like Kubernetes' ``default`` namespace: a node that registers by
    its first sync, and a job submitted without ``--pool``, land there)."""
    if not actor.is_admin:
        return forbidden("only admins manage pools")
    with db.write() as s:
        p = s.get(Pool, name)
        if p is None:
            return not_found(f"no pool {name}")
        if name == DEFAULT_POOL:
            return conflict(f"pool {name} cannot be deleted: nodes that register without a pool join it")
        out = _out(s, p)
        if out.nodes:
            return conflict(f"pool {name} still has {out.nodes} nodes")
        live = s.scalar(
            select(func.count())
            .select_from(Job)
            .where(Job.pool == name, Job.state.not_in([str(t) for t in TERMINAL]))
        )
        if live:
            return conflict(f"pool {name} still has {live} unfinished jobs")
        if s.scalar(select(func.count()).select_from(Job).where(Job.pool == name)):
            return conflict(f"pool {name} is referenced by finished jobs; keep it for their history")
        s.delete(p)
        return out
