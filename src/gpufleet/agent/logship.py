"""What of a job's log the next sync carries (issue 29: logs that cannot hurt the node
or the server).

A job's output is a file on the node (``output.log``) that the agent ships to the
server in chunks, each stored there only if it starts where the server's copy ends
(idempotent). The rules, each bounding what one job's output can cost:

- **Sized after encoding.** A chunk's cost is its size as JSON with every non-ASCII
  character escaped (``encoded_size``: an upper bound of what any JSON encoder sends; a
  NUL is 6 bytes, a byte that is no UTF-8 becomes U+FFFD, 6 bytes), and one sync's chunks
  stay within ``LogLimits.sync_bytes`` of it: far under the server's body limit
  (``ServerConfig.max_body_bytes``, 1 MiB) whatever the bytes are.
- **A rate cap per job**: at most ``job_sync_bytes`` (encoded) of one job per sync, and
  syncs for logs alone at most every ``AgentConfig.log_gap_s``.
- **A cap per job** (``max_bytes``, default 64 MiB, the agent's ``--job-log-max``): the
  read position never passes it. Past it, one chunk carries a marker line and skips to
  the file's end (``offset`` .. ``end`` with the marker as its data); later output is
  skipped the same way with no data; the server counts what was skipped.
- **Holes cost nothing**: a sparse file (``os.ftruncate(1, 10**12)``) is read with
  ``SEEK_DATA``: a hole is skipped with one line saying how many bytes it held.
- **The exit is not held back**: the agent reports a job's exit at once, with a chunk
  of its log in the same sync, and ships the rest afterwards: chunks with ``more`` keep
  the attempt's log open on the server (which takes them from a node that no longer
  holds the job), the one with ``last`` closes it (``gpufleet logs -f`` ends then).

The reply says how far the server has each log (``acked``): shipping goes on from there.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.agent.jobs import LocalJob

MIB = 1024 * 1024
CHUNK_OVERHEAD = 160
"""What a chunk's keys and numbers add to its data in JSON (bytes, generous)."""
HOLE_MIN = 4096
"""A hole shorter than a page is read as NULs (no filesystem makes smaller ones)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LogLimits:
    max_bytes: int = 64 * MIB
    """Per job attempt: output past this is not shipped (one marker line says so)."""
    chunk_bytes: int = 64 * 1024
    """Raw bytes read for one chunk at most."""
    job_sync_bytes: int = 256 * 1024
    """Encoded bytes of one job's chunks in one sync at most (the rate cap)."""
    sync_bytes: int = 512 * 1024
    """Encoded bytes of all chunks of one sync at most (the body limit is 1 MiB)."""


def cap_marker(limit: int) -> str:
    return (
        f"\ngpufleet: this job's log reached its cap of {limit} bytes on the node: "
        "the rest of its output is not kept\n"
    )


def encoded_size(text: str) -> int:
    """Bytes of ``text`` as a JSON string with every non-ASCII character escaped (the
    most any encoder sends for it)."""
    return len(json.dumps(text))


def _utf8_whole(raw: bytes) -> bytes:
    """``raw`` less an incomplete UTF-8 character at its end (at most 3 bytes)."""
    for cut in range(min(4, len(raw))):
        part = raw[: len(raw) - cut] if cut else raw
        try:
            part.decode("utf-8")
        except UnicodeDecodeError as exc:
            if exc.start < len(part) - 3:  # invalid inside: not a cut character
                return raw
            continue
        return part
    return raw


def _data_from(fd: int, offset: int) -> int:
    """Where data starts at or after ``offset`` (the file's end when only a hole is left;
    ``offset`` where the filesystem cannot say)."""
    try:
        return os.lseek(fd, offset, os.SEEK_DATA)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            return os.fstat(fd).st_size
        return offset


def read_chunk(path: Path, offset: int, limit: int, *, budget: int | None = None) -> tuple[int, str] | None:
    """Bytes from ``offset`` (at most ``limit``) as (end offset, text), the text at most
    ``budget`` bytes as JSON (``encoded_size``). A full-size chunk ends after its last
    newline, or else on a UTF-8 character boundary. A hole at ``offset`` is skipped: the
    text then says so, and the end is where data starts again."""
    try:
        with open(path, "rb") as f:
            start = _data_from(f.fileno(), offset)
            if start - offset >= HOLE_MIN:
                return (
                    start,
                    f"gpufleet: {start - offset} bytes of a hole in the log (never written) skipped\n",
                )
            f.seek(offset)
            raw = f.read(limit)
    except OSError:
        return None
    if not raw:
        return None
    if len(raw) == limit:
        nl = raw.rfind(b"\n")
        raw = raw[: nl + 1] if nl >= 0 else _utf8_whole(raw)
    text = raw.decode("utf-8", errors="replace")
    while budget is not None and len(raw) > 1 and encoded_size(text) > budget:
        raw = _utf8_whole(raw[: max(1, len(raw) * budget // encoded_size(text) - 1)]) or raw[:1]
        text = raw.decode("utf-8", errors="replace")
    return offset + len(raw), text


def chunks_of(job: LocalJob, limits: LogLimits, budget: int) -> tuple[list[dict[str, Any]], int]:
    """The chunks of ``job`` for this sync within ``budget`` encoded bytes (its rate
    cap applies too) and what they cost. A job that is over and not yet closed always
    gets one (empty if need be, ``last`` set when it ends the log), whatever is left of
    the budget: its exit is reported with it (``Agent.build_sync``)."""
    if job.log_done:
        return [], 0
    size = job.log_size()
    over = job.exit_code is not None
    budget = min(budget, limits.job_sync_bytes)
    out: list[dict[str, Any]] = []
    cost = 0
    at = job.log_acked
    stop = min(size, limits.max_bytes)
    while at < stop and budget - cost > CHUNK_OVERHEAD:
        got = read_chunk(
            job.log_path, at, min(limits.chunk_bytes, stop - at), budget=budget - cost - CHUNK_OVERHEAD
        )
        if got is None:
            break
        end, data = got
        out.append({"job_id": job.job_id, "attempt": job.attempt, "offset": at, "end": end, "data": data})
        cost += encoded_size(data) + CHUNK_OVERHEAD
        at = end
    if at >= limits.max_bytes and size > at:  # the cap: skip the rest, with the marker once
        data = "" if job.log_capped else cap_marker(limits.max_bytes)
        out.append({"job_id": job.job_id, "attempt": job.attempt, "offset": at, "end": size, "data": data})
        cost += encoded_size(data) + CHUNK_OVERHEAD
        at = size
    if over and at >= size:
        if not out:  # all shipped already: an empty chunk closes it
            out.append({"job_id": job.job_id, "attempt": job.attempt, "offset": at, "end": at, "data": ""})
            cost += CHUNK_OVERHEAD
        out[-1]["last"] = True
    elif over and not out:  # out of budget: still one small chunk, so its exit goes now
        got = read_chunk(job.log_path, at, min(1024, stop - at), budget=1024) if at < stop else None
        if got is not None:
            out.append(
                {"job_id": job.job_id, "attempt": job.attempt, "offset": at, "end": got[0], "data": got[1]}
            )
            cost += encoded_size(got[1]) + CHUNK_OVERHEAD
    if over:  # the server keeps the log open for what follows (``services/logs.py``)
        for c in out:  # the keys only when set: a server older than them refuses them
            if not c.get("last"):
                c["more"] = True
    return out, cost


def pending(job: LocalJob) -> bool:
    """Whether the job still has log to ship (or to close)."""
    return not job.log_done and (job.log_size() > job.log_acked or job.exit_code is not None)


def acked(
    jobs: Mapping[tuple[int, int], LocalJob],
    ends: Mapping[tuple[int, int], int],
    sent: Sequence[dict[str, Any]],
    limits: LogLimits,
) -> dict[tuple[int, int], LocalJob]:
    """The attempts of ``jobs`` whose records change with a reply's log acks (``ends``:
    how far the server has each log; ``sent``: the chunks the sync carried), as they are
    to be saved: ``log_acked`` moves up; the cap's marker and the closing chunk count
    (``log_capped``, ``log_done``) once the ack reaches their end."""
    out: dict[tuple[int, int], LocalJob] = {}
    for c in sent:
        key = (c["job_id"], c["attempt"])
        job = out.get(key) or jobs.get(key)
        if job is None or ends.get(key, -1) < c["end"]:
            continue
        if c.get("last") and not job.log_done:
            job = out[key] = dataclasses.replace(job, log_done=True)
        if c["data"] == cap_marker(limits.max_bytes) and not job.log_capped:
            out[key] = dataclasses.replace(job, log_capped=True)
    for key, end in ends.items():
        job = out.get(key) or jobs.get(key)
        if job is not None and end > job.log_acked:
            out[key] = dataclasses.replace(job, log_acked=end)
    return out
