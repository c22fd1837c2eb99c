"""QOS: ``GET /qos``, ``PUT /qos/{name}``, ``DELETE /qos/{name}`` (``services/qos.py``)."""

from __future__ import annotations

from fastapi import APIRouter

from gpufleet.api.qos import QosIn, QosList, QosOut
from gpufleet.server.http.deps import Me, PartsDep
from gpufleet.server.problems import invalid, unwrap
from gpufleet.server.services import qos

router = APIRouter(prefix="/qos", tags=["qos"])


@router.get("", response_model=QosList)
def list_qos(parts: PartsDep, me: Me) -> QosList:
    return qos.list_qos(db=parts.db, actor=me)


@router.put("/{name}", response_model=QosOut)
def put_qos(name: str, spec: QosIn, parts: PartsDep, me: Me) -> QosOut:
    if spec.name != name:
        return unwrap(invalid(f"name: {spec.name} is not the {name} of the path"))
    return unwrap(qos.put_qos(db=parts.db, actor=me, spec=spec))


@router.delete("/{name}", response_model=QosOut)
def delete_qos(name: str, parts: PartsDep, me: Me) -> QosOut:
    return unwrap(qos.delete_qos(db=parts.db, actor=me, name=name))
