"""KServe requests that are about the service, not one replica, so the gateway sends them
to every ready replica (all the feed lists) and answers once for all:

* **Statistics** (``GET /v2/models/stats``, ``/v2/models/{m}[/versions/{v}]/stats``):
  the replicas' Triton statistics summed (counts and nanoseconds added, the newest
  ``last_inference``, batch statistics added per batch size). One replica's answer was
  one replica's counts, and consecutive reads from different replicas went backwards
  (20,659 then 46,579), which ``perf_analyzer`` takes for a broken server. Replicas
  that fail are left out of the sum (the answer says how many were summed in
  ``X-Gpufleet-Replicas``); none answering 200 passes the first answer on, or is a 502.
* **Repository** (``POST /v2/repository/models/{m}/load`` and ``/unload``): applied to
  every replica, 200 only if every one answered 200; else the first failure's status
  with each failed replica named. A replica that joins later starts with the model as
  its command says (the server's ``service model`` records the wish; not this module).

Bodies are small JSON documents, read whole; replicas are asked at once.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpufleet.gateway.balancer import Slot
from gpufleet.gateway.upstream import Disconnected, Upstream, UpstreamError

STATS = re.compile(rb"/v2/models/(?:[^/]+/(?:versions/[^/]+/)?)?stats")
REPOSITORY = re.compile(rb"/v2/repository/models/[^/]+/(?:load|unload)")


def fanout_kind(method: str, rest: bytes) -> str | None:
    """ "stats" or "repository" for a request every replica must see; else None."""
    path = rest.split(b"?", 1)[0]
    if method == "GET" and STATS.fullmatch(path):
        return "stats"
    if method == "POST" and REPOSITORY.fullmatch(path):
        return "repository"
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    replica: str
    status: int
    body: bytes
    error: str = ""
    """Why no answer came (then ``status`` is 0)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Combined:
    status: int
    body: bytes
    replicas: str
    """The replicas whose answers made this one (``X-Gpufleet-Replicas``)."""


async def ask_all(
    upstream: Upstream,
    slots: Iterable[Slot],
    method: str,
    target: str,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
) -> list[Answer]:
    """Every replica's answer (or why there is none), asked at once: on a pooled
    connection, and once more on a fresh one when that was found closed before any
    answer (as the gateway's proxy does)."""

    async def one(slot: Slot) -> Answer:
        url = slot.endpoint.url
        for fresh in (False, True):
            try:
                resp = await upstream.request(url, method, target, headers, body, fresh=fresh)
                try:
                    return Answer(replica=slot.endpoint.id, status=resp.status, body=await resp.read())
                finally:
                    resp.release()
            except Disconnected as exc:
                if fresh:
                    return Answer(replica=slot.endpoint.id, status=0, body=b"", error=repr(exc))
            except UpstreamError as exc:
                return Answer(replica=slot.endpoint.id, status=0, body=b"", error=repr(exc))
        raise AssertionError("unreachable: the fresh attempt returns")

    return list(await asyncio.gather(*(one(s) for s in slots)))


def combine(kind: str, answers: list[Answer]) -> Combined:
    """One answer for the client (see the module docstring)."""
    good = [a for a in answers if a.status == 200]
    if kind == "stats" and good:
        try:
            docs = [json.loads(a.body) for a in good]
            summed = {"model_stats": sum_model_stats(d.get("model_stats") or [] for d in docs)}
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            return _failed([Answer(replica="*", status=502, body=b"", error=f"bad statistics: {exc!r}")])
        return Combined(status=200, body=json.dumps(summed).encode(), replicas=_ids(good))
    if kind == "repository" and answers and len(good) == len(answers):
        return Combined(status=200, body=good[0].body or b"{}", replicas=_ids(good))
    return _failed([a for a in answers if a.status != 200])


def _failed(bad: list[Answer]) -> Combined:
    if not bad:
        return Combined(status=503, body=json.dumps({"error": "no ready replica"}).encode(), replicas="")
    reasons = [f"replica {a.replica}: {a.error or _error_text(a)}" for a in bad]
    status = next((a.status for a in bad if a.status >= 400), 502)
    body = json.dumps({"error": "; ".join(reasons)}).encode()
    return Combined(status=status, body=body, replicas=_ids(bad))


def _error_text(a: Answer) -> str:
    try:
        doc = json.loads(a.body)
        return f"HTTP {a.status}: {doc['error'] if isinstance(doc, dict) and 'error' in doc else doc}"
    except ValueError:
        return f"HTTP {a.status}: {a.body[:200].decode(errors='replace')}"


def _ids(answers: list[Answer]) -> str:
    return ",".join(a.replica for a in answers)


def sum_model_stats(lists: Iterable[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Triton ``model_stats`` entries of several servers summed per (name, version)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for entries in lists:
        for e in entries:
            key = (str(e["name"]), str(e.get("version", "")))
            acc = out.get(key)
            out[key] = _copy(e) if acc is None else _add(acc, e)
    return list(out.values())


def _copy(e: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(e))  # type: ignore[no-any-return]


def _add(acc: dict[str, Any], e: dict[str, Any]) -> dict[str, Any]:
    acc["last_inference"] = max(int(acc.get("last_inference", 0)), int(e.get("last_inference", 0)))
    for k in ("inference_count", "execution_count"):
        acc[k] = int(acc.get(k, 0)) + int(e.get(k, 0))
    _add_durations(acc.setdefault("inference_stats", {}), e.get("inference_stats") or {})
    by_size = {int(b["batch_size"]): b for b in acc.get("batch_stats") or []}
    for b in e.get("batch_stats") or []:
        size = int(b["batch_size"])
        if size in by_size:
            _add_durations(by_size[size], b)
        else:
            by_size[size] = _copy(b)
    acc["batch_stats"] = [by_size[s] for s in sorted(by_size)]
    return acc


def _add_durations(acc: dict[str, Any], more: dict[str, Any]) -> None:
    """Add ``{"count", "ns"}`` durations key by key (``batch_size`` is a key, not a sum)."""
    for k, d in more.items():
        if not isinstance(d, dict):
            continue
        have = acc.setdefault(k, {"count": 0, "ns": 0})
        have["count"] = int(have.get("count", 0)) + int(d.get("count", 0))
        have["ns"] = int(have.get("ns", 0)) + int(d.get("ns", 0))


__all__ = ["Answer", "Combined", "ask_all", "combine", "fanout_kind", "sum_model_stats"]
