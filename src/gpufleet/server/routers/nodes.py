from __future__ import annotations

from fastapi import APIRouter

from gpufleet.api.nodes import NodeLabels, NodeOut, NodePut
from gpufleet.server.http.deps import Me, NodeNameIn, PartsDep
from gpufleet.server.problems import unwrap
from gpufleet.server.routers.agents import HotDep
from gpufleet.server.routers.paging import Cursor, Limit
from gpufleet.server.services import nodes
from gpufleet.server.store.pages import NodePage

router = APIRouter(prefix="/nodes", tags=["nodes"])


@router.get("", response_model=NodePage)
def list_nodes(
    parts: PartsDep, me: Me, hot: HotDep, pool: str | None = None, limit: Limit = 100, cursor: Cursor = None
) -> NodePage:
    """By name, a page at a time (``pages.py``)."""
    return nodes.list_nodes(
        db=parts.db, actor=me, live_since=parts.live_since(), pool=pool, hot=hot, limit=limit, cursor=cursor
    )


@router.get("/{name}", response_model=NodeOut)
def show(name: str, parts: PartsDep, me: Me, hot: HotDep) -> NodeOut:
    return unwrap(nodes.show_node(db=parts.db, actor=me, name=name, live_since=parts.live_since(), hot=hot))


@router.put("/{name}", response_model=NodeOut)
def put(name: NodeNameIn, spec: NodePut, parts: PartsDep, me: Me) -> NodeOut:
    return unwrap(
        nodes.put_node(
            db=parts.db,
            actor=me,
            name=name,
            spec=spec,
            now=parts.now(),
            live_since=parts.live_since(),
        )
    )


@router.post("/{name}/labels", response_model=NodeOut)
def label(name: str, change: NodeLabels, parts: PartsDep, me: Me) -> NodeOut:
    """Operators' features on a node, for ``--constraint`` (``gpufleet node label``)."""
    return unwrap(
        nodes.label_node(
            db=parts.db,
            actor=me,
            name=name,
            change=change,
            live_since=parts.live_since(),
        )
    )


@router.delete("/{name}", response_model=NodeOut)
def delete(name: str, parts: PartsDep, me: Me) -> NodeOut:
    return unwrap(nodes.delete_node(db=parts.db, actor=me, name=name))
