"""``scontrol``: what job scripts ask of it.

- ``show hostnames [LIST]`` (``$SLURM_JOB_NODELIST`` without one) and ``show hostlist
  LIST``: pure (``hostlist``), no server, no client imported;
- ``show job [ID]`` and ``show node [NAME]``: Slurm's ``Key=Value`` records, the first
  line flush left and the others indented three spaces (``-o/--oneliner``: one line
  each), with the keys scripts grep (``JobState=``, ``NodeList=``, ``BatchHost=``,
  ``StdOut=``, ``NumNodes=``, ``TRES=``...); ``show partition [NAME]`` for pools;
- ``requeue``, ``hold``, ``release`` (comma-separated ids), ``update JobId=ID
  TimeLimit=... JobName=...``: the caller's own jobs (the server decides: operators may
  act on others', a user gets Slurm's ``Invalid job id specified``, as for a job that
  is not there).

Errors are Slurm's lines (``scontrol: error: Invalid job id specified``,
``Requeue of JobId=7 returned an error: ...``, ``slurm_update error: ...``) and exit 1.
Keywords are taken in any case, as Slurm's.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Any

from gpufleet.slurm import hostlist
from gpufleet.slurm._common import (
    SlurmError,
    clock_time,
    connect,
    node_names,
    reason,
    run,
    run_time,
    slurm_state,
    started,
    timestamp,
)
from gpufleet.slurm.batchscript import BatchScript

if TYPE_CHECKING:
    from gpufleet.client import ClientError, GpufleetClient

PROG = "scontrol"
USAGE = """\
Usage: scontrol [-o] COMMAND
  show hostnames [HOSTLIST]    one host a line (default: $SLURM_JOB_NODELIST)
  show hostlist HOSTS          HOSTS (comma-separated) as a hostlist
  show job [JOBID]             jobs, as Key=Value records
  show node [NAME]             nodes
  show partition [NAME]        partitions (gpufleet's pools)
  requeue JOBID[,JOBID...]     stop running jobs and queue them again
  hold JOBID[,JOBID...]        hold pending jobs
  release JOBID[,JOBID...]     release held jobs
  update JobId=ID [TimeLimit=T] [JobName=NAME]
"""
INVALID_JOB = "Invalid job id specified"
DENIED = "Access/permission denied"


def main(argv: list[str]) -> int:
    words = [a for a in argv if a not in ("-o", "--oneliner", "-d", "--details", "-Q", "--quiet")]
    oneliner = any(a in ("-o", "--oneliner") for a in argv)
    if not words or words[0] in ("-h", "--help", "help"):
        sys.stdout.write(USAGE)
        return 0 if words else 1
    verb, rest = words[0].lower(), words[1:]
    if verb == "show":
        return _show(rest, oneliner=oneliner)
    if verb in ("requeue", "hold", "release", "uhold"):
        return run(PROG, lambda: _act(verb, rest))
    if verb == "update":
        return run(PROG, lambda: _update(rest))
    sys.stderr.write(f"invalid keyword: {words[0]}\n")
    return 1


# -- show --------------------------------------------------------------------------------------


def _show(rest: list[str], *, oneliner: bool) -> int:
    if not rest:
        sys.stderr.write(USAGE)
        return 1
    what, name = rest[0].lower(), (rest[1] if len(rest) > 1 else None)
    if what in ("hostnames", "hostname"):
        return _hostnames(name)
    if what == "hostlist":
        return _hostlist(name)
    if what == "job":
        return run(PROG, lambda: _print(_jobs(name), oneliner=oneliner))
    if what == "node":
        return run(PROG, lambda: _print(_nodes(name), oneliner=oneliner))
    if what == "partition":
        return run(PROG, lambda: _print(_partitions(name), oneliner=oneliner))
    sys.stderr.write(f"invalid entity: {rest[0]} for keyword: show\n")
    return 1


def _hostnames(text: str | None) -> int:
    given = text if text is not None else os.environ.get("SLURM_JOB_NODELIST", "")
    if not given.strip():
        sys.stderr.write("scontrol: error: host list is empty\n")
        return 1
    try:
        names = hostlist.expand(given)
    except ValueError as exc:
        sys.stderr.write(f"scontrol: error: invalid hostlist {exc}\n")
        return 1
    sys.stdout.write("".join(f"{n}\n" for n in names))
    return 0


def _hostlist(text: str | None) -> int:
    if text is None or not text.strip():
        sys.stderr.write("scontrol: error: host list is empty\n")
        return 1
    try:
        names = hostlist.expand(text)
    except ValueError as exc:
        sys.stderr.write(f"scontrol: error: invalid hostlist {exc}\n")
        return 1
    sys.stdout.write(hostlist.compress(names) + "\n")
    return 0


Record = list[list[tuple[str, object]]]
"""A record: its lines, each a list of (key, value)."""


def _print(records: list[Record], *, oneliner: bool) -> int:
    out: list[str] = []
    for record in records:
        lines = [
            " ".join(f"{k}={'(null)' if v is None or v == '' else v}" for k, v in line) for line in record
        ]
        out.append(" ".join(lines) if oneliner else "\n   ".join(lines))
    sys.stdout.write("".join(f"{text}\n" + ("" if oneliner else "\n") for text in out))
    return 0


def _value(v: object) -> str:
    return "(null)" if v is None or v == "" else str(v)


def _not_found(exc: ClientError) -> bool:
    return exc.status in (403, 404)


def _jobs(given: str | None) -> list[Record]:
    """The records of job ``given`` (``123``: the job, or every task of array 123;
    ``123_4``: one task), or of every job the caller may see."""
    from gpufleet.client import ClientError

    now = time.time()
    with connect() as c:
        if given is None:
            jobs = c.job_listing(states=["PENDING", "HELD", "SCHEDULED", "RUNNING"])
            if not jobs:
                sys.stdout.write("No jobs in the system\n")
            return [job_record(j, now) for j in jobs]
        head, _, task = given.partition("_")
        if not head.isdigit() or (task and not task.isdigit()):
            raise SlurmError(INVALID_JOB)
        try:
            job = c.request("GET", f"/jobs/{int(head)}")
        except ClientError as exc:
            if _not_found(exc):
                raise SlurmError(INVALID_JOB) from None
            raise
        if task or job.get("array_job_id") == job["id"]:
            tasks = c.job_listing(array=int(head))
            picked = [t for t in tasks if not task or t.get("array_task_id") == int(task)]
            if not picked:
                raise SlurmError(INVALID_JOB)
            return [job_record(t, now) for t in picked]
        return [job_record(job, now)]


def _fill(pattern: str | None, job: dict[str, Any]) -> str | None:
    """An output path with Slurm's ``%j %x %u %A %a %N %%`` filled in, under the job's
    working directory when relative."""
    if not pattern:
        return None
    array, task = job.get("array_job_id"), job.get("array_task_id")
    nodes = node_names(job)
    values = {
        "j": str(job["id"]),
        "x": str(job.get("name") or ""),
        "u": str(job.get("user") or ""),
        "A": str(array if array is not None else job["id"]),
        "a": str(task if task is not None else 4294967294),
        "N": nodes[0] if nodes else "",
        "%": "%",
    }
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "%" and i + 1 < len(pattern) and pattern[i + 1] in values:
            out.append(values[pattern[i + 1]])
            i += 2
            continue
        out.append(ch)
        i += 1
    path = "".join(out)
    where = job.get("workdir") or job.get("submit_dir")
    return path if path.startswith("/") or not where else os.path.join(str(where), path)


def _account(name: str) -> str:
    """``alice(1000)``: the name and its uid here, as Slurm shows ``UserId``."""
    import pwd

    try:
        return f"{name}({pwd.getpwnam(name).pw_uid})"
    except KeyError:
        return name


def tres(job: dict[str, Any]) -> str:
    """``cpu=16,mem=64G,node=2,billing=16,gres/gpu=16``: what it holds (or asks for)."""
    nodes = len(node_names(job)) or int(job.get("nodes") or 1)
    cpus = int(job.get("cpus_per_node") or 0) * nodes
    mem = int(job.get("mem_per_node_mb") or 0) * nodes
    parts = [f"cpu={cpus or nodes}"]
    if mem:
        parts.append(f"mem={mem}M")
    parts.append(f"node={nodes}")
    if job.get("gpus"):
        parts.append(f"gres/gpu={job['gpus']}")
    return ",".join(parts)


def job_record(job: dict[str, Any], now: float) -> Record:
    """Slurm's ``scontrol show job`` record for a job of the API (``JobOut``'s JSON)."""
    state = slurm_state(str(job["state"]))
    nodes = node_names(job)
    num_nodes = len(nodes) or int(job.get("nodes") or 1)
    cpus = int(job.get("cpus_per_node") or 0) * num_nodes or num_nodes
    limit = job.get("time_limit_s")
    start = started(job)
    end = job.get("ended_at")
    if end is None and start is not None and limit is not None:
        end = start + float(limit)
    if start is None:
        start = job.get("estimated_start")
    exit_code = job.get("exit_code")
    eligible = max(float(job.get("submit_time") or 0), float(job.get("begin_at") or 0)) or None
    array, task = job.get("array_job_id"), job.get("array_task_id")
    command = job.get("command") or []
    batch = BatchScript.of(command)
    script = batch.name if batch is not None else None
    first: list[tuple[str, object]] = [("JobId", job["id"])]
    if array is not None:
        first += [("ArrayJobId", array), ("ArrayTaskId", task)]
    first.append(("JobName", job.get("name")))
    output = _fill(job.get("output"), job)
    per_node = job.get("gpus_per_node") or 0
    return [
        first,
        [("UserId", _account(str(job["user"]))), ("Account", job.get("team")), ("QOS", "normal")],
        [("Priority", job.get("priority", 0)), ("Nice", 0)],
        [
            ("JobState", state),
            ("Reason", reason(job) if state == "PENDING" else "None"),
            ("Dependency", job.get("dependency")),
        ],
        [
            ("Requeue", 1 if job.get("requeue", True) else 0),
            ("Restarts", job.get("attempts", 0)),
            ("BatchFlag", 1 if script else 0),
            ("ExitCode", f"{exit_code if exit_code is not None else 0}:0"),
        ],
        [("RunTime", clock_time(run_time(job, now))), ("TimeLimit", clock_time(limit)), ("TimeMin", "N/A")],
        [
            ("SubmitTime", timestamp(job.get("submit_time"))),
            ("EligibleTime", timestamp(eligible)),
        ],
        [
            ("StartTime", timestamp(start, none="Unknown")),
            ("EndTime", timestamp(end, none="Unknown")),
            ("Deadline", timestamp(job.get("deadline"))),
        ],
        [("Partition", job.get("pool"))],
        [("NodeList", hostlist.compress(nodes) or None)],
        [("BatchHost", nodes[0] if nodes else None)],
        [
            ("NumNodes", num_nodes),
            ("NumCPUs", cpus),
            ("NumTasks", job.get("ntasks") or num_nodes),
            ("CPUs/Task", job.get("cpus_per_task") or 1),
        ],
        [("TRES", tres(job))],
        [("MinMemoryNode", f"{job.get('mem_per_node_mb') or 0}M")],
        [("Command", script or " ".join(str(a) for a in command))],
        [("WorkDir", job.get("workdir") or job.get("submit_dir"))],
        [("StdErr", _fill(job.get("error"), job) or output)],
        [("StdIn", _fill(job.get("input"), job) or "/dev/null")],
        [("StdOut", output)],
        [("TresPerNode", f"gres/gpu:{per_node}" if per_node else None)],
    ]


def _nodes(name: str | None) -> list[Record]:
    from gpufleet.client import ClientError

    with connect() as c:
        if name is None:
            return [node_record(n) for n in c.pages("/nodes")]
        try:
            return [node_record(c.request("GET", f"/nodes/{name}"))]
        except ClientError as exc:
            if exc.status == 404:
                raise SlurmError(f"Node {name} not found") from None
            raise


def node_state(node: dict[str, Any]) -> str:
    """Slurm's node state: ``DOWN`` (not ready, lost), ``DRAIN`` (cordoned or draining,
    empty) / ``DRAINING`` (with jobs still on it), else ``IDLE``, ``MIXED``,
    ``ALLOCATED`` by its GPUs in use."""
    used = int(node.get("gpus_used") or 0)
    if node.get("state") != "Ready" or node.get("lost"):
        return "DOWN"
    if node.get("cordoned") or node.get("draining"):
        return "DRAINING" if used else "DRAIN"
    total = int(node.get("gpus_total") or 0)
    if used == 0:
        return "IDLE"
    return "ALLOCATED" if used >= total else "MIXED"


def features_of(node: dict[str, Any]) -> list[str]:
    """Slurm's node features: what its agent reports and the labels operators added."""
    out: list[str] = []
    for f in [*(node.get("features") or ()), *(node.get("labels") or ())]:
        if str(f) not in out:
            out.append(str(f))
    return out


def node_record(node: dict[str, Any]) -> Record:
    gpus, used = int(node.get("gpus_total") or 0), int(node.get("gpus_used") or 0)
    model = str(node.get("model") or "gpu").lower()
    cpus, mem = int(node.get("cpus") or 0), int(node.get("memory_mb") or 0)
    features = features_of(node)
    cfg = f"cpu={cpus},mem={mem}M,billing={cpus}" + (f",gres/gpu={gpus}" if gpus else "")
    return [
        [("NodeName", node["name"]), ("Arch", "x86_64")],
        [("CPUTot", cpus), ("CPULoad", "N/A")],
        [("AvailableFeatures", ",".join(map(str, features)) or None)],
        [("ActiveFeatures", ",".join(map(str, features)) or None)],
        [("Gres", f"gpu:{model}:{gpus}" if gpus else None)],
        [("NodeAddr", node.get("address") or node["name"]), ("NodeHostName", node["name"])],
        [("RealMemory", mem), ("AllocMem", 0), ("FreeMem", "N/A")],
        [("State", node_state(node))],
        [("Partitions", node.get("pool"))],
        [("CfgTRES", cfg)],
        [("AllocTRES", f"gres/gpu={used}" if used else None)],
        [("Reason", node.get("cordon_reason"))],
    ]


def _partitions(name: str | None) -> list[Record]:
    with connect() as c:
        pools = c.pages("/pools")
        nodes = c.pages("/nodes")
    if name is not None:
        pools = [p for p in pools if p.get("name") == name]
        if not pools:
            raise SlurmError(f"Partition {name} not found")
    out: list[Record] = []
    for p in pools:
        mine = [str(n["name"]) for n in nodes if n.get("pool") == p["name"]]
        gpus = sum(int(n.get("gpus_total") or 0) for n in nodes if n.get("pool") == p["name"])
        out.append(
            [
                [("PartitionName", p["name"])],
                [("Default", "YES" if p.get("default") else "NO"), ("State", "UP")],
                [("Nodes", hostlist.compress(mine) or None)],
                [("TotalNodes", len(mine)), ("TRES", f"gres/gpu={gpus}" if gpus else None)],
            ]
        )
    return out


# -- acting on jobs ----------------------------------------------------------------------------


def _ids(rest: list[str], verb: str) -> list[int]:
    ids = [x.strip() for a in rest for x in a.split(",") if x.strip()]
    if not ids:
        raise SlurmError(f"{verb}: job id required")
    if not all(x.isdigit() for x in ids):
        bad = next(x for x in ids if not x.isdigit())
        raise SlurmError(f"Invalid job id {bad}")
    return [int(x) for x in ids]


def _act(verb: str, rest: list[str]) -> int:
    """requeue/hold/release each job; Slurm's line for each one refused, exit 1 then."""
    from gpufleet.client import ClientError

    ids = _ids(rest, verb)
    route = {"requeue": "requeue", "hold": "hold", "uhold": "hold", "release": "release"}[verb]
    failed = 0
    with connect() as c:
        for jid in ids:
            try:
                if verb == "requeue" or not _whole_array(c, route, jid):
                    c.request("POST", f"/jobs/{jid}/{route}")
            except ClientError as exc:
                if exc.status is None:
                    raise
                failed += 1
                why = INVALID_JOB if _not_found(exc) else (exc.detail or exc.message)
                if verb == "requeue":
                    sys.stderr.write(f"Requeue of JobId={jid} returned an error: {why}\n")
                else:
                    sys.stderr.write(f"scontrol: error: {verb} of job {jid}: {why}\n")
    return 1 if failed else 0


def _array_request(c: GpufleetClient, verb: str, body: dict[str, Any]) -> dict[str, Any] | None:
    """``POST /v1/jobs/{verb}`` (hold, release, update) for every task of the array in
    ``body``; None when that id is no array of yours (or the server is from before bulk
    changes: 404/405; an id out of range: 422), so the caller acts on one job instead."""
    from gpufleet.client import BULK_TIMEOUT_S, ClientError

    try:
        out: dict[str, Any] = c.request("POST", f"/jobs/{verb}", json=body, timeout=BULK_TIMEOUT_S)
    except ClientError as exc:
        if exc.status in (404, 405, 422):
            return None
        raise
    return out if out.get("changed") or out.get("skipped") else None


def _whole_array(c: GpufleetClient, route: str, jid: int) -> bool:
    """Hold or release every task of array ``jid`` in one request, as Slurm takes an
    array's id; False when ``jid`` is no array of yours (``_array_request``): then it is
    one job's. ClientError (409) when it is an array none of whose tasks could be."""
    from gpufleet.client import ClientError

    out = _array_request(c, route, {"array": jid})
    if out is None:
        return False
    if not out.get("changed"):
        state = "pending" if route == "hold" else "held"
        raise ClientError(f"no task of array {jid} is {state}", status=409, detail=f"Job is not {state}")
    return True


def _update_array(c: GpufleetClient, jid: int, changes: dict[str, Any]) -> bool:
    """``scontrol update JobId=ARRAY``: every live task of array ``jid`` in one request
    (``POST /v1/jobs/update``); False when ``jid`` is no array of yours (then it is one
    job's, ``PATCH /v1/jobs/ID``, whose errors are Slurm's lines)."""
    from gpufleet.client import ClientError

    out = _array_request(c, "update", {"array": jid, "set": changes})
    if out is None:
        return False
    if not out.get("changed"):
        raise ClientError(
            f"array {jid}: no task took it",
            status=409,
            detail="no task could take it (ended, or a time limit only operators raise)",
        )
    return True


def _update(rest: list[str]) -> int:
    from gpufleet.client import ClientError
    from gpufleet.timefmt import parse_duration

    pairs: dict[str, str] = {}
    for word in rest:
        key, eq, value = word.partition("=")
        if not eq:
            raise SlurmError(f"Invalid input: {word}")
        pairs[key.lower()] = value
    jid = pairs.pop("jobid", None) or pairs.pop("job", None)
    if jid is None or not jid.isdigit():
        raise SlurmError("No job identification provided" if jid is None else INVALID_JOB)
    changes: dict[str, Any] = {}
    for key, value in pairs.items():
        if key == "timelimit":
            if value.upper() in ("UNLIMITED", "INFINITE"):
                raise SlurmError("TimeLimit=UNLIMITED: gpufleet lifts no limit; give a time")
            try:
                changes["time_limit"] = parse_duration(value, bare_unit_s=60)
            except ValueError:
                raise SlurmError(f"Invalid TimeLimit value: {value}") from None
        elif key in ("jobname", "name"):
            changes["name"] = value
        else:
            raise SlurmError(f"Update of this parameter is not supported: {key}={value}")
    if not changes:
        raise SlurmError("No changes specified")
    with connect() as c:
        try:
            if not _update_array(c, int(jid), changes):
                c.request("PATCH", f"/jobs/{int(jid)}", json=changes)
        except ClientError as exc:
            if exc.status is None:
                raise
            why = INVALID_JOB if _not_found(exc) else (exc.detail or exc.message)
            sys.stderr.write(f"slurm_update error: {why}\n")
            return 1
    return 0


__all__ = ["features_of", "job_record", "main", "node_record", "node_state", "tres"]
