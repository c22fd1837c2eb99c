from __future__ import annotations

from fastapi import APIRouter

from gpufleet.server.deps import Me, PartsDep
from gpufleet.server.problems import unwrap
from gpufleet.server.routers.agents import HotDep
from gpufleet.server.schemas import NodeOut, NodePut
from gpufleet.server.services import nodes

router = APIRouter(prefix="/nodes", tags=["nodes"])


@router.get("", response_model=list[NodeOut])
def list_nodes(parts: PartsDep, me: Me, hot: HotDep, pool: str | None = None) -> list[NodeOut]:
    return nodes.list_nodes(db=parts.db, actor=me, live_since=parts.live_since(), pool=pool, hot=hot)


@router.get("/{name}", response_model=NodeOut)
def show(name: str, parts: PartsDep, me: Me, hot: HotDep) -> NodeOut:
    return unwrap(nodes.show_node(db=parts.db, actor=me, name=name, live_since=parts.live_since(), hot=hot))


@router.put("/{name}", response_model=NodeOut)
def put(name: str, spec: NodePut, parts: PartsDep, me: Me) -> NodeOut:
    return unwrap(
        nodes.put_node(
            db=parts.db,
            actor=me,
            name=name,
            spec=spec,
            now=parts.now(),
            live_since=parts.live_since(),
            fleets=parts.fleets,
            waker=parts.scheduler.wake,
        )
    )


@router.delete("/{name}", response_model=NodeOut)
def delete(name: str, parts: PartsDep, me: Me) -> NodeOut:
    return unwrap(nodes.delete_node(db=parts.db, actor=me, name=name, fleets=parts.fleets))
