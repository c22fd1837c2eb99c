"""Microsoft Philly trace (Jeon et al., ATC'19), in either published form.

* The processed CSV ``timestamp,duration,num_gpus,gpu_time,cluster``: no user or job id
  is given, so the virtual cluster is the team, the user is ``vc-<cluster>`` and the job
  id is ``philly-<line>``.
* The raw ``cluster_job_log`` of msr-fiddle/philly-traces: a JSON list of jobs. The last
  attempt is the run that counts: duration = its end - its start, GPUs = the GPUs of its
  placement. Jobs without attempts or with a missing time are skipped as problems. The
  line of a JSON job is the line its ``{`` is on.

The form is chosen by the first non-blank character of the file (``[`` means JSON).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO

from gpufleet.sim.loaders._rows import (
    BadRow,
    TraceBuilder,
    as_mapping,
    column_index,
    numbered_rows,
    open_trace,
    text,
    to_float,
    to_int,
    to_timestamp,
)
from gpufleet.sim.trace import TraceError, TraceJob, TraceLoad

CSV_COLUMNS = ("timestamp", "duration", "num_gpus", "cluster")


def load_philly(path: Path) -> TraceLoad:
    with open_trace(path) as handle:
        if _first_visible_char(handle) == "[":
            return _load_json(path, handle.read())
        return _load_csv(path, handle)


def _first_visible_char(handle: TextIO) -> str:
    """The first non-blank character ("" for a blank file); rewinds the handle."""
    while chunk := handle.read(4096):
        stripped = chunk.lstrip()
        if stripped:
            handle.seek(0)
            return stripped[0]
    handle.seek(0)
    return ""


def _load_csv(path: Path, handle: TextIO) -> TraceLoad:
    builder = TraceBuilder(source=str(path))
    rows = numbered_rows(handle)
    first = next(rows, None)
    if first is None:
        raise TraceError(f"{path}: empty file, expected a Philly CSV header or a JSON list")
    index = column_index(first[1], required=CSV_COLUMNS, fmt="Philly CSV")
    for line, record in rows:
        try:
            row = as_mapping(record, index)
            cluster = text(row, "cluster")
            job = TraceJob(
                job_id=f"philly-{line}",
                user=f"vc-{cluster}",
                team=cluster,
                submit_s=to_timestamp(text(row, "timestamp"), "timestamp"),
                duration_s=to_float(text(row, "duration"), "duration"),
                gpus=to_int(text(row, "num_gpus"), "num_gpus"),
            )
        except BadRow as exc:
            builder.skip(line, str(exc))
        else:
            builder.add(line, job)
    return builder.finish()


def _load_json(path: Path, content: str) -> TraceLoad:
    builder = TraceBuilder(source=str(path))
    for line, entry in _json_list_items(path, content):
        try:
            builder.add(line, _json_job(entry))
        except BadRow as exc:
            builder.skip(line, str(exc))
    return builder.finish()


def _json_list_items(path: Path, content: str) -> list[tuple[int, Any]]:
    """The items of a top-level JSON list, each with the line it starts on."""
    decoder = json.JSONDecoder()
    items: list[tuple[int, Any]] = []
    pos = content.index("[") + 1
    line, counted = 1, 0
    while True:
        pos = _skip_space(content, pos)
        if pos < len(content) and content[pos] == "]" and not items:
            return items
        try:
            item, end = decoder.raw_decode(content, pos)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{path}: invalid JSON: {exc}") from exc
        line += content.count("\n", counted, pos)
        counted = pos
        items.append((line, item))
        pos = _skip_space(content, end)
        if pos < len(content) and content[pos] == ",":
            pos += 1
        elif pos < len(content) and content[pos] == "]":
            return items
        else:
            raise TraceError(f"{path}: invalid JSON: expected ',' or ']' at offset {pos}")


def _skip_space(content: str, pos: int) -> int:
    while pos < len(content) and content[pos] in " \t\r\n":
        pos += 1
    return pos


def _json_job(entry: Any) -> TraceJob:
    if not isinstance(entry, dict):
        raise BadRow("job is not a JSON object")
    job_id = _json_text(entry, "jobid")
    attempts = entry.get("attempts")
    if not isinstance(attempts, list) or not attempts:
        raise BadRow(f"job {job_id} has no attempts")
    last = attempts[-1]
    if not isinstance(last, dict):
        raise BadRow(f"job {job_id}: attempt is not a JSON object")
    start = to_timestamp(_json_text(last, "start_time"), "start_time")
    end = to_timestamp(_json_text(last, "end_time"), "end_time")
    details = last.get("detail")
    if not isinstance(details, list) or not all(
        isinstance(d, dict) and isinstance(d.get("gpus"), list) for d in details
    ):
        raise BadRow(f"job {job_id}: attempt detail lacks a gpus list")
    vc = _json_text(entry, "vc")
    return TraceJob(
        job_id=job_id,
        user=_json_text(entry, "user"),
        team=vc,
        submit_s=to_timestamp(_json_text(entry, "submitted_time"), "submitted_time"),
        duration_s=end - start,
        gpus=sum(len(d["gpus"]) for d in details),
    )


def _json_text(entry: dict[str, Any], key: str) -> str:
    """A present, non-empty value; the published log writes unknown times as null or "None"."""
    value = entry.get(key)
    if value is None or value in ("", "None"):
        raise BadRow(f"missing {key}")
    return str(value)
