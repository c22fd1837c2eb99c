"""Hot model load and unload on the replicas of this node (issue 30): the agent converges
each replica's loaded models to the set its service wants (``ServiceProbe.models``, down
with the sync) through Triton's repository API on the replica's port, and reports what
it saw per model (``ObservedJob.models``, up with the next sync).

Why the agent and not the server: the agent already probes its replicas on loopback
(``replicas.ReplicaProbes``); the server and the gateways need no new reach into node
ports, and "desired state down, observed state up" holds (DESIGN.md). Why at probe time:
a replica that starts after a wish was made is converged on its first successful probe,
before it is reported ready, so the gateways never send it a request with the wrong set.
A wish made while a replica serves is applied at its next probe; it stays in rotation.

One pass per replica and probe: ``POST /v2/repository/index``, then for each wished model
whose state differs (``calls``) ``POST /v2/repository/models/{m}/load`` or ``/unload``.
A refused call (an unknown model: the replica's 404 and its words) is reported
``FAILED`` with the reason and tried again only after ``RETRY_S`` or when the wish
changes: never a crash loop, the replica keeps serving what it has. A replica without
the repository API (any ``http`` server) reports ``UNKNOWN`` with the reason.

What a replica answers is its owner's: read at most ``MAX_BODY`` bytes, never
interpreted beyond the JSON fields named here, and reasons are cut and cleaned to
printable text before they travel (one odd byte must not make the server refuse the
node's whole sync).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

Key = tuple[int, int]
RETRY_S = 30.0
RECHECK_S = 5.0
"""A converged replica's index is read again this long after (a wish that changes is
applied at the next probe): catches drift (a direct load through the gateway) without an
index call, and an access-log line, at every probe."""
"""A refused load or unload is tried again this long after (or at once when the wish
for that model changes)."""
MAX_BODY = 1 << 20
REASON_CHARS = 500
LOADED = ("READY", "LOADING")


def calls(wants: Mapping[str, bool], index: Mapping[str, str]) -> list[tuple[str, str]]:
    """The repository calls that bring a replica whose index reads ``index`` (model ->
    Triton state; a model not listed is absent) to ``wants`` (model -> loaded), in name
    order: ``(model, "load"|"unload")``. A model that is loading counts as loaded (no
    second load); an absent one as unloaded (loading it is the replica's to refuse)."""
    out: list[tuple[str, str]] = []
    for model in sorted(wants):
        loaded = index.get(model) in LOADED
        if wants[model] and not loaded:
            out.append((model, "load"))
        elif not wants[model] and loaded:
            out.append((model, "unload"))
    return out


def clean(text: str) -> str:
    """A replica's words as a reason: printable, one line, at most ``REASON_CHARS``."""
    flat = "".join(ch if ch.isprintable() else " " for ch in text)
    return " ".join(flat.split())[:REASON_CHARS]


@dataclass(slots=True)
class _Replica:
    wants: dict[str, bool] = field(default_factory=dict)
    seen: dict[str, tuple[str, str]] = field(default_factory=dict)
    """model -> (state, reason), for the wished models, as of the last pass."""
    retry_at: dict[str, float] = field(default_factory=dict)
    passed: bool = False
    """A pass ran since the wishes were first given (readiness waits for it)."""
    checked_at: float = float("-inf")
    dirty: bool = True
    """The wishes changed since the last pass."""


class ModelConverger:
    """The wished and seen models of this node's replicas (one object, used under the
    agent's tick: no locking of its own)."""

    def __init__(self, *, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._replicas: dict[Key, _Replica] = {}

    def want(self, wants: Mapping[Key, Mapping[str, bool]], *, serving: Sequence[Key] = ()) -> None:
        """The wishes of every replica the node holds (from a sync reply; a replica not in
        ``wants`` has none). ``serving``: replicas already reported ready, which a new
        wish must not take out of rotation until their next pass."""
        for key in [k for k in self._replicas if k not in wants]:
            del self._replicas[key]
        for key, models in wants.items():
            rep = self._replicas.setdefault(key, _Replica(passed=key in serving))
            new = dict(models)
            for model in set(rep.wants) | set(new):
                if rep.wants.get(model) != new.get(model):
                    rep.retry_at.pop(model, None)
                    rep.seen.pop(model, None)
                    rep.dirty = True
            rep.wants = new

    def gates(self, key: Key) -> bool:
        """True while the replica must not be reported ready: it has wishes and no pass
        has run for it yet."""
        rep = self._replicas.get(key)
        return rep is not None and bool(rep.wants) and not rep.passed

    def seen(self, key: Key) -> list[dict[str, str]] | None:
        """What to report of the replica's wished models (None: no wishes, or no pass yet)."""
        rep = self._replicas.get(key)
        if rep is None or not rep.wants or not rep.seen:
            return None
        return [
            {"name": m, "state": state, "reason": reason, "wanted": "loaded" if rep.wants[m] else "unloaded"}
            for m, (state, reason) in sorted(rep.seen.items())
            if m in rep.wants
        ]

    def converge(self, key: Key, port: int, client: httpx.Client, *, now: float | None = None) -> bool:
        """One pass on a replica that answers its health probe; True if what it reports
        changed (news for the next sync)."""
        rep = self._replicas.get(key)
        if rep is None or not rep.wants:
            return False
        now = time.monotonic() if now is None else now
        if rep.passed and not rep.dirty and now - rep.checked_at < RECHECK_S:
            return False
        before = dict(rep.seen)
        base = f"http://127.0.0.1:{port}/v2/repository"
        index, why = self._index(client, base)
        if index is None:
            rep.seen = {m: ("UNKNOWN", why) for m in rep.wants}
        else:
            todo = dict(calls(rep.wants, {m: s for m, (s, _) in index.items()}))
            seen: dict[str, tuple[str, str]] = {}
            for model in sorted(rep.wants):
                verb = todo.get(model)
                if verb is None:
                    seen[model] = index.get(model, ("UNAVAILABLE", "not in the repository"))
                elif rep.retry_at.get(model, 0.0) > now:
                    seen[model] = rep.seen.get(model, ("FAILED", f"{verb} refused"))
                else:
                    seen[model] = self._call(client, base, model, verb)
                    if seen[model][0] == "FAILED":
                        rep.retry_at[model] = now + RETRY_S
                    else:
                        rep.retry_at.pop(model, None)
            rep.seen = seen
        rep.passed, rep.dirty, rep.checked_at = True, False, now
        return rep.seen != before

    def _index(self, client: httpx.Client, base: str) -> tuple[dict[str, tuple[str, str]] | None, str]:
        status, doc, text = self._post(client, f"{base}/index")
        if status is None:
            return None, f"repository index: {text}"
        if status >= 300 or not isinstance(doc, list):
            return None, clean(f"repository index: HTTP {status}: {text}")
        out: dict[str, tuple[str, str]] = {}
        for entry in doc:
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                continue
            state = str(entry.get("state") or "READY").upper()
            reason = entry.get("reason")
            out[entry["name"]] = (
                state if state in ("READY", "LOADING", "UNAVAILABLE") else "UNAVAILABLE",
                clean(reason) if isinstance(reason, str) else "",
            )
        return out, ""

    def _call(self, client: httpx.Client, base: str, model: str, verb: str) -> tuple[str, str]:
        status, doc, text = self._post(client, f"{base}/models/{quote(model, safe='')}/{verb}")
        if status is not None and status < 300:
            return ("READY", "") if verb == "load" else ("UNAVAILABLE", "unloaded")
        if status is None:
            return "FAILED", clean(f"{verb}: {text}")
        said = doc.get("error") if isinstance(doc, dict) else None
        return "FAILED", clean(f"{verb}: HTTP {status}: {said if isinstance(said, str) else text}")

    def _post(self, client: httpx.Client, url: str) -> tuple[int | None, Any, str]:
        """(status, parsed JSON or None, text for a reason); status None: no answer."""
        try:
            with client.stream("POST", url, json={}, timeout=self.timeout_s) as r:
                body = b""
                for chunk in r.iter_bytes():
                    body += chunk
                    if len(body) > MAX_BODY:
                        return r.status_code, None, f"an answer over {MAX_BODY} bytes"
                status = r.status_code
        except httpx.TimeoutException:
            return None, None, f"no answer within {self.timeout_s:g}s"
        except httpx.HTTPError as exc:
            return None, None, clean(f"{type(exc).__name__}: {exc}")
        text = body.decode("utf-8", errors="replace")
        try:
            doc = json.loads(text) if text.strip() else None
        except json.JSONDecodeError:
            doc = None
        return status, doc, clean(text[:REASON_CHARS])


__all__ = ["RECHECK_S", "RETRY_S", "ModelConverger", "calls", "clean"]
