"""Every option of ``sbatch(1)`` and what gpufleet makes of it, in one table
(:data:`OPTIONS`), each of one kind:

- **honoured**: mapped to the API with its exact meaning (``--gres=gpu:N`` is per node,
  ``--gpus`` the total, as in Slurm; ``--time=90`` is minutes, ``UNLIMITED`` no limit);
- **harmless**: accepted, nothing to do (``--mail-type``, ``--comment``, accounting knobs);
- **refused**: gpufleet cannot give it its meaning; :class:`Refused` says why and what
  to do.

An option on none of the lists is refused too. Here too: what a script and the command
line ask for (:class:`SbatchOptions`) and Slurm's arithmetic over it (:func:`total_gpus`,
:func:`gpus_per_node`). How one option's value is read into it is ``slurmvalues.apply``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from gpufleet.cli.sbatch import Problem

UNLIMITED = math.inf
"""``time_limit_s`` of ``--time=UNLIMITED`` (or ``infinite``, or ``0``): no limit."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SbatchOptions:
    """What a script (and the command line) asks for; None = not given."""

    gpus: int | None = None
    gpus_per_node: int | None = None
    nodes: int | None = None
    gpu_type: str | None = None
    gpu_type_by: str | None = None
    """The option that set ``gpu_type`` (``gres``, ``gpus``, ``constraint``...): a flag
    that replaces it on the command line takes its GPU model with it, as Slurm replaces
    the whole option."""
    gpus_per_task: int | None = None
    exclude: tuple[str, ...] | None = None
    constraint: str | None = None  # canonical (gpufleet.constraint)
    qos: str | None = None
    licenses: tuple[tuple[str, int], ...] | None = None
    time_limit_s: float | None = None  # UNLIMITED: no limit
    name: str | None = None
    pool: str | None = None
    output: str | None = None
    error: str | None = None
    input: str | None = None
    chdir: str | None = None
    array: str | None = None  # canonical (arrayspec)
    dependency: str | None = None
    kill_on_invalid_dep: bool | None = None
    begin: float | None = None  # epoch seconds
    deadline: float | None = None
    signal: str | None = None  # canonical (slurmopts.parse_signal)
    checkpoint_every: str | None = None  # ``#GPUFLEET --checkpoint-every`` (``gpufleet_directives``)
    requeue: bool | None = None
    hold: bool | None = None
    export: str | None = None
    nice: int | None = None
    reservation: str | None = None
    exclusive: bool | None = None
    account: str | None = None
    priority: int | None = None
    max_price: float | None = None
    ntasks: int | None = None
    ntasks_per_node: int | None = None
    cpus_per_task: int | None = None
    mem: int | None = None  # MiB per node
    mem_per_cpu: int | None = None
    mem_per_gpu: int | None = None
    problems: tuple[Problem, ...] = field(default=())
    origins: tuple[tuple[str, str], ...] = field(default=())
    """(option, where it was given: ``job.sh line 4: #SBATCH --dependency=afterok:9``)
    for every option taken from a script: the server's word on a value names the line."""


# -- the options -------------------------------------------------------------------------------

Kind = Literal["honoured", "harmless", "refused"]
Arg = Literal["required", "none", "optional"]


@dataclass(frozen=True, slots=True)
class Option:
    """How gpufleet takes one option of ``sbatch(1)``."""

    kind: Kind
    arg: Arg = "required"
    why: str = ""
    """A refused option: why gpufleet cannot honour it, then ``; `` and what to do."""


def _refused(why: str, arg: Arg = "required") -> Option:
    return Option("refused", arg, why)


_H, _OK = Option("honoured"), Option("harmless")
_NO_PLACEMENT = "gpufleet places jobs itself; use -p POOL, -C FEATURE or --exclude NODES to steer it"
_NO_CORES = "gpufleet counts CPUs per task and per node, not sockets, cores or threads; use -c N"
OPTIONS: dict[str, Option] = {
    # honoured: each becomes an API field with the same meaning
    "job-name": _H,
    "partition": _H,
    "nodes": _H,
    "ntasks": _H,
    "ntasks-per-node": _H,
    "tasks-per-node": _H,  # sbatch's own alias of --ntasks-per-node
    "gpus-per-task": _H,
    "exclude": _H,
    "qos": _H,
    "licenses": _H,
    "cpus-per-task": _H,
    "mem": _H,
    "mem-per-cpu": _H,
    "mem-per-gpu": _H,
    "gpus": _H,
    "gpus-per-node": _H,
    "gres": _H,
    "constraint": _H,
    "time": _H,
    "output": _H,
    "error": _H,
    "input": _H,
    "chdir": _H,
    "array": _H,
    "dependency": _H,
    "kill-on-invalid-dep": _H,
    "begin": _H,
    "deadline": _H,
    "signal": _H,
    "requeue": Option("honoured", "none"),
    "no-requeue": Option("honoured", "none"),
    "hold": Option("honoured", "none"),
    "export": _H,
    "nice": Option("honoured", "optional"),
    "reservation": _H,
    "exclusive": Option("honoured", "optional"),
    "account": _H,
    "priority": _H,
    "max-price": _H,
    # harmless: nothing to do here
    "mail-type": _OK,
    "mail-user": _OK,
    "comment": _OK,
    "parsable": Option("harmless", "none"),
    "quiet": Option("harmless", "none"),
    "verbose": Option("harmless", "none"),
    "ignore-pbs": Option("harmless", "none"),
    "wckey": _OK,
    "acctg-freq": _OK,
    "profile": _OK,
    "wait-all-nodes": _OK,  # 0 or 1: a job's nodes all start together here, so it waits anyway
    "hint": _OK,  # nomultithread and the like: CPUs are counted, not bound, here
    "overcommit": Option("harmless", "none"),  # a job's tasks run as many as it starts
    "get-user-env": Option("harmless", "optional"),  # the job gets the owner's login identity
    "open-mode": _H,  # append is what the agent does; truncate is refused (``_open_mode``)
    # refused: gpufleet cannot give them their meaning
    "nodelist": _refused(f"no job is pinned to named nodes; {_NO_PLACEMENT}"),
    "nodefile": _refused(f"no job is pinned to named nodes; {_NO_PLACEMENT}"),
    "switches": _refused("placement keeps a multi-node job in one leaf when it can; remove it"),
    "clusters": _refused("one gpufleet server is one cluster; remove it"),
    "cluster-constraint": _refused("one gpufleet server is one cluster; remove it"),
    "wait": _refused("sbatch returns once the job is in; use `gpufleet run` to wait for it", "none"),
    "wrap": _refused("a script holds its command; give one after --: gpufleet submit -- COMMAND"),
    "test-only": _refused("gpufleet has no dry run; remove it", "none"),
    "sockets-per-node": _refused(_NO_CORES),
    "cores-per-socket": _refused(_NO_CORES),
    "threads-per-core": _refused(_NO_CORES),
    "extra-node-info": _refused(_NO_CORES),
    "ntasks-per-core": _refused(_NO_CORES),
    "ntasks-per-socket": _refused(_NO_CORES),
    "ntasks-per-gpu": _refused("tasks are per node here; use --ntasks-per-node"),
    "core-spec": _refused(_NO_CORES),
    "thread-spec": _refused(_NO_CORES),
    "mincpus": _refused("CPUs are counted per task here; use -c/--cpus-per-task"),
    "cpus-per-gpu": _refused("CPUs are counted per task here; use -c/--cpus-per-task"),
    "gpus-per-socket": _refused("GPUs are counted per job or per node here; use --gpus or --gpus-per-node"),
    "gpu-bind": _refused("a job sees exactly its GPUs (CUDA_VISIBLE_DEVICES); remove it"),
    "cpu-bind": _refused("no CPU binding here; remove it"),
    "mem-bind": _refused("no memory binding here; remove it"),
    "distribution": _refused("no task distribution here; remove it"),
    "cpu-freq": _refused("no CPU frequency control here; remove it"),
    "gpu-freq": _refused("no GPU frequency control here; remove it"),
    "oversubscribe": _refused("GPUs are never shared between jobs; remove it", "none"),
    "no-kill": _refused(
        "a failed node requeues the job or fails it; choose with --requeue/--no-requeue", "optional"
    ),
    "tmp": _refused("no local-disk requests here; remove it"),
    "time-min": _refused("a job's limit is its --time; remove it"),
    "use-min-nodes": _refused("a job gets the fewest of -N MIN-MAX already; remove it", "none"),
    "contiguous": _refused(f"{_NO_PLACEMENT}", "none"),
    "spread-job": _refused(f"{_NO_PLACEMENT}", "none"),
    "prefer": _refused("constraints are never soft here; use -C, or remove it"),
    "export-file": _refused("no environment files here; use --export=VAR=value,..."),
    "propagate": _refused("limits are not carried to the nodes; remove it", "optional"),
    "uid": _refused("a job runs as its owner's account; remove it"),
    "gid": _refused("a job runs as its owner's account; remove it"),
    "mcs-label": _refused("gpufleet has no MCS labels; remove it"),
    "network": _refused("no network requests here; remove it"),
    "reboot": _refused("nodes are not rebooted for a job; remove it", "none"),
    "delay-boot": _refused("nodes are not rebooted for a job; remove it"),
    "power": _refused("no power requests here; remove it"),
    "container": _refused("no OCI bundles here; use gpufleet submit --image IMAGE"),
    "container-id": _refused("no OCI bundles here; use gpufleet submit --image IMAGE"),
    "bb": _refused("gpufleet has no burst buffers; remove it"),
    "bbf": _refused("gpufleet has no burst buffers; remove it"),
    "batch": _refused(f"{_NO_PLACEMENT}"),
    "x11": _refused("no X11 forwarding here; remove it", "optional"),
    "resv-ports": _refused("no reserved ports here (MASTER_PORT is set); remove it", "optional"),
}
SHORT: dict[str, str] = {
    "a": "array",
    "A": "account",
    "b": "begin",
    "B": "extra-node-info",
    "c": "cpus-per-task",
    "C": "constraint",
    "d": "dependency",
    "D": "chdir",
    "e": "error",
    "F": "nodefile",
    "G": "gpus",
    "H": "hold",
    "i": "input",
    "J": "job-name",
    "k": "no-kill",
    "L": "licenses",
    "m": "distribution",
    "M": "clusters",
    "n": "ntasks",
    "N": "nodes",
    "o": "output",
    "O": "overcommit",
    "p": "partition",
    "q": "qos",
    "Q": "quiet",
    "s": "oversubscribe",
    "S": "core-spec",
    "t": "time",
    "v": "verbose",
    "W": "wait",
    "w": "nodelist",
    "x": "exclude",
}


class Refused(Exception):
    """An option (or one of its values) gpufleet cannot honour: why; what to do."""


def forget(opts: SbatchOptions, option: str) -> SbatchOptions:
    """``opts`` without what ``option`` set (a command-line flag replaces a directive
    whole, as in Slurm: ``--gres gpu:1`` drops a script's ``--gres=gpu:v100:1``'s model)."""
    if opts.gpu_type_by == option:
        opts = replace(opts, gpu_type=None, gpu_type_by=None)
    return opts


def total_gpus(opts: SbatchOptions, *, default: int = 0) -> int:
    """Slurm's arithmetic: ``--gpus`` is the total; ``--gres``/``--gpus-per-node`` count
    per node; ``--gpus-per-task`` per task (tasks: ``-n``, else tasks per node x nodes,
    else 1). With no GPU request at all the job gets ``default`` GPUs: none, as in Slurm."""
    if opts.gpus is not None:
        return opts.gpus
    if opts.gpus_per_node is not None:
        return opts.gpus_per_node * (opts.nodes or 1)
    if opts.gpus_per_task is not None:
        return opts.gpus_per_task * tasks(opts)
    return default


def tasks(opts: SbatchOptions) -> int:
    """Tasks in all: ``-n``, else ``--ntasks-per-node`` x nodes, else 1."""
    if opts.ntasks is not None:
        return opts.ntasks
    return (opts.ntasks_per_node or 1) * (opts.nodes or 1)


def gpus_per_node(opts: SbatchOptions) -> int | None:
    """GPUs per node as counted: ``--gres``/``--gpus-per-node``, or ``--gpus-per-task``
    x ``--ntasks-per-node`` (Slurm's per-node count of that pair); None: the scheduler
    splits the total."""
    if opts.gpus_per_node is not None:
        return opts.gpus_per_node
    if opts.gpus is None and opts.gpus_per_task is not None and opts.ntasks_per_node is not None:
        return opts.gpus_per_task * opts.ntasks_per_node
    return None


def asks_gpus(opts: SbatchOptions) -> bool:
    """Whether any option counted GPUs (without one, a job gets none, as in Slurm)."""
    return opts.gpus is not None or opts.gpus_per_node is not None or opts.gpus_per_task is not None
