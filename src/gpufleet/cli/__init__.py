"""The ``gpufleet`` command: every command and group is named here, in the order
``gpufleet --help`` lists them.

Layout: ``_common`` (the client, output and errors every client command shares),
``apps`` (the command groups), one ``*_cmds`` module per subject, and helpers that hold
no command (``jobview``, ``sbatch``, ``localtime``, ``words``, ``options``, ``servicespec``). No command
module imports another.

A command's module is imported only when that command runs (or shows its own help):
``gpufleet queue`` is run as often as ``squeue``, and importing every module (numpy for
the simulator, the server's constants, every API model) cost each command ~0.35 s of
start-up. :data:`COMMANDS` names each command's function (or group) and the line
``gpufleet --help`` shows for it, so that the root's help imports no command module at
all (tests/test_cli_imports.py checks that each entry loads and that its line is the
command's own).

The root keeps Typer's Rich-formatted help, as every ``gpufleet X --help`` has it:
~140 ms on the bench machine against ~60 ms for plain click help (Rich, markdown-it and
the rendering), within the 150 ms goal of ``gpufleet --help`` (bench/bench_cli.py). Plain
help would be the first thing to give up if that goal is missed.
"""

from __future__ import annotations

import copy
import gc
import importlib
import os
import sys
from collections.abc import Iterator, MutableMapping
from typing import TYPE_CHECKING, Any, NamedTuple

import typer
from typer.core import TyperCommand, TyperGroup

from gpufleet import __version__
from gpufleet.cli.options import flag

if TYPE_CHECKING:  # the Typer installed (0.29) carries its own copy of click
    from typer._click import Command, Context, HelpFormatter


class Lazy(NamedTuple):
    target: str
    """``module:attribute`` in ``gpufleet.cli``: the command's function, or the group's
    ``typer.Typer`` (which the module fills)."""
    help: str
    """What ``gpufleet --help`` shows: the first paragraph of the function's docstring
    (lines joined), or the group's help."""
    context_settings: dict[str, Any] | None = None
    hidden: bool = False
    """An old spelling kept working but left out of ``gpufleet --help``."""
    quick: bool = False
    """A client command that asks the server and prints (``queue``, ``submit``...): run
    without the garbage collector and ended without the interpreter's teardown
    (:func:`main`). Never one that runs for long (``server``, ``agent``, ``run``...)."""


COMMANDS: dict[str, Lazy] = {
    "simulate": Lazy(
        "sim_cmds:simulate",
        "Replay a job trace through the scheduling core under each policy and compare them.",
    ),
    "server": Lazy(
        "server_cmds:server", "Run the control plane (API under /v1, scheduling and node-lifecycle loops)."
    ),
    "login": Lazy(
        "account_cmds:login",
        "Check the token against the server and save url, token and CA file (mode 0600).",
    ),
    # `submit job.sh --flag`: options after the script are the script's, as sbatch reads them
    "submit": Lazy(
        "submit_cmds:submit",
        "Submit a job; prints its id. Options override #SBATCH directives.",
        {"allow_interspersed_args": False},
        quick=True,
    ),
    "run": Lazy(
        "submit_cmds:run",
        "Run a job and wait for it, like srun: prints its output as it comes and exits with its exit code.",
        {"allow_interspersed_args": False},
    ),
    "queue": Lazy("job_cmds:queue", "Waiting and running jobs, like squeue.", quick=True),
    "history": Lazy(
        "history_cmds:history",
        "Jobs that were in the system in a window of time, like sacct (default: since midnight).",
        quick=True,
    ),
    "cancel": Lazy(
        "job_cmds:cancel",
        "Cancel jobs (scancel): by id, or every job of yours the filters match.",
        quick=True,
    ),
    "hold": Lazy("job_cmds:hold", "Hold pending jobs (scontrol hold).", quick=True),
    "release": Lazy("job_cmds:release", "Release held jobs (scontrol release).", quick=True),
    "requeue": Lazy(
        "job_cmds:requeue",
        "Put running jobs back in the queue (scontrol requeue): each stops and waits again, keeping its id "
        "and history.",
        quick=True,
    ),
    "update": Lazy(
        "job_cmds:update",
        "Change a job (scontrol update): its time limit (only down, except for operators), its name, held "
        "or not.",
        quick=True,
    ),
    "nodes": Lazy("node_cmds:nodes", "Nodes and their GPUs, like sinfo.", quick=True),
    "status": Lazy(
        "node_cmds:status",
        "The servers and their leader: which server runs the loops, its epoch (the fencing token, "
        "raised at every change of leader) and the age of its lease.",
        quick=True,
    ),
    "default-team": Lazy(
        "account_cmds:default_team",
        "Your default team: where a job goes when `submit` names no --team (Slurm's default account). "
        "It starts as the first team you joined.",
    ),
    "agent": Lazy(
        "agent_cmds:agent", "Run the node agent: report GPUs and jobs, run what the server places here."
    ),
    "gateway": Lazy("gateway_cmds:gateway", "Route /s/SERVICE/... to the service's ready replicas."),
    "model-server": Lazy(
        "model_cmds:model_server",
        "Serve a small real model: KServe v2 (Triton's HTTP protocol, binary tensors included) for a "
        "seeded MLP, and OpenAI-compatible toy /v1/completions, /v1/chat/completions and /v1/models.",
    ),
    "loadgen": Lazy(
        "loadgen_cmds:loadgen",
        "Open-loop load: requests leave on schedule whatever the answers, and latency counts from each "
        "request's scheduled time (no coordinated omission).",
    ),
    "logs": Lazy("job_cmds:logs", "A job's output (stdout and stderr, as its nodes shipped them)."),
    "demo": Lazy("demo_cmds:demo", "A whole simulated fleet on this machine. Ctrl-C stops everything."),
    "reserve": Lazy(
        "reservation_cmds:reserve",
        "Book GPUs for a window. Inside it only the jobs of those it is for (--team, --users) run there; "
        "you are the one who booked it.",
        hidden=True,  # reservation create
    ),
    "reservations": Lazy(
        "reservation_cmds:reservations",
        "Reservations you may see (operators: all), times in local time.",
        hidden=True,  # reservation list
    ),
    "price": Lazy(
        "chargeback_cmds:price",
        "GPU prices now, and when each GPU model gets cheaper (for work that can wait).",
        quick=True,
    ),
    "usage": Lazy(
        "chargeback_cmds:usage",
        "GPU-hours, cost, energy, jobs, utilisation and idle waste per user, team, pool or model.",
        quick=True,
    ),
    # the groups, after the commands (as Typer lists groups added with add_typer)
    "trace": Lazy("sim_cmds:trace_app", "Make and inspect job traces."),
    "jobs": Lazy("job_cmds:jobs_app", "Jobs: list and show.", quick=True),
    "admin": Lazy("chargeback_cmds:admin_app", "Users, teams, quotas, pools (admins)."),
    "db": Lazy("db_cmds:db_app", "Database schema."),
    "tokens": Lazy("account_cmds:tokens_app", "Your API tokens."),
    "node": Lazy(
        "node_cmds:node_app", "Nodes (operators): credentials, cordon, drain, MIG, rollout, events."
    ),
    "upgrade": Lazy("upgrade_cmds:upgrade_app", "Rolling driver upgrades that verify (operators)."),
    "ca": Lazy(
        "server_cmds:ca_app", "The cluster's certificate authority (TLS for the server, mTLS for agents)."
    ),
    "reservation": Lazy("reservation_cmds:reservation_app", "Reservations: create, list, cancel."),
    "service": Lazy(
        "service_cmds:service_app",
        "Inference services: deploy, list, show, events, logs, update, rollback, model, delete, tokens.",
    ),
    "slurm": Lazy(
        "slurm_cmds:slurm_app", "Slurm's own commands (squeue, sbatch, scontrol...) speaking to gpufleet."
    ),
}
"""Every command of ``gpufleet``, in the order its help lists them."""

_BEFORE = {"chargeback_cmds": ("admin_cmds", "rack_cmds")}
"""Modules imported before a module: three modules fill ``admin`` (``@apps.admin_app.command``,
in import order), admin_cmds (users, teams...) and rack_cmds (``admin rack``) before
chargeback_cmds (prices, budgets), whichever command (``admin``, ``price``, ``usage``)
imports them."""


def _import(module: str) -> Any:
    for first in _BEFORE.get(module, ()):
        _import(first)
    return importlib.import_module(f"gpufleet.cli.{module}")


def load(name: str) -> Command:
    """The click command of ``gpufleet NAME``, built by Typer exactly as when every
    command was added to ``app`` up front (same settings, same help)."""
    lazy = COMMANDS[name]
    module, attribute = lazy.target.split(":")
    target = getattr(_import(module), attribute)
    one = typer.Typer(
        rich_markup_mode=app.rich_markup_mode, pretty_exceptions_short=app.pretty_exceptions_short
    )
    if isinstance(target, typer.Typer):
        one.add_typer(target, name=name, hidden=lazy.hidden)
    else:
        one.command(name, context_settings=lazy.context_settings, hidden=lazy.hidden)(target)
    return typer.main.get_group(one).commands[name]


class LazyCommands(MutableMapping[str, "Command"]):
    """A group's ``commands``: the names of :data:`COMMANDS` and, once looked up, their
    commands (built then); ``keys()`` and ``in`` build nothing."""

    def __init__(self) -> None:
        self._built: dict[str, Command] = {}

    def __getitem__(self, name: str) -> Command:
        if name not in self._built:
            if name not in COMMANDS:
                raise KeyError(name)
            self._built[name] = load(name)
        return self._built[name]

    def __setitem__(self, name: str, command: Command) -> None:
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        raise TypeError("gpufleet's commands are fixed")

    def __iter__(self) -> Iterator[str]:
        yield from COMMANDS
        yield from (name for name in self._built if name not in COMMANDS)

    def __len__(self) -> int:
        return len(COMMANDS) + sum(name not in COMMANDS for name in self._built)

    def __contains__(self, name: object) -> bool:
        return name in COMMANDS or name in self._built

    def listed(self, markup_mode: Any) -> dict[str, Command]:
        """What ``gpufleet --help`` lists: each command's name and help line (the command
        itself where it is built already)."""
        return {
            name: self._built.get(name)
            or TyperCommand(name, help=COMMANDS[name].help, rich_markup_mode=markup_mode)
            for name in self
            if name not in COMMANDS or not COMMANDS[name].hidden
        }


class LazyGroup(TyperGroup):
    """The root group: a command is imported and built when it is looked up (to run it,
    or to show its help); the root's own help lists :data:`COMMANDS` without importing
    one (the lazy-loading pattern of click's docs)."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        added, self.commands = self.commands, LazyCommands()
        self.commands.update(added)  # any added to ``app`` itself (none today)

    def list_commands(self, ctx: Context) -> list[str]:
        return list(self.commands)

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        assert isinstance(self.commands, LazyCommands)
        listing = copy.copy(self)
        listing.commands = self.commands.listed(self.rich_markup_mode)
        TyperGroup.format_help(listing, ctx, formatter)


app = typer.Typer(
    cls=LazyGroup,
    name="gpufleet",
    help="gpufleet: one control plane for a shared GPU cluster.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # reflow docstring paragraphs to the terminal's width
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpufleet {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = flag("--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """gpufleet: one control plane for a shared GPU cluster."""


def quick(argv: list[str]) -> bool:
    """Whether ``gpufleet ARGV`` is a quick client command (:attr:`Lazy.quick`), or the
    root's help or version (no command named)."""
    name = next((a for a in argv if not a.startswith("-")), None)
    return name is None or (name in COMMANDS and COMMANDS[name].quick)


def main() -> None:
    """The ``gpufleet`` console script.

    httpx imports its own command line (click, rich, pygments: ~30 ms) when it can;
    gpufleet never runs it. Only the ``gpufleet`` process does without it: a library
    leaves the process that imports it alone (``app`` runs as it is in tests).

    A quick command (``gpufleet queue`` runs as often as ``squeue``) runs with the
    garbage collector off (a process of a fraction of a second frees its memory by
    ending: the collector's passes over the imports and a 1,000-job listing cost ~10
    ms) and ends with ``os._exit`` once its output is flushed, skipping the
    interpreter's teardown of every module (~20 ms; bench/bench_cli.py). A quick
    command holds no thread, temporary file or ``atexit`` work by then. Any other
    command (the server, agents, ``run``, the simulator) runs and ends normally."""
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
    if not quick(sys.argv[1:]):
        app()
        return
    gc.disable()
    try:
        app()
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    if code is not None and not isinstance(code, int):  # sys.exit("why"), as Python prints it
        sys.stderr.write(f"{code}\n")
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:  # a closed pipe (`gpufleet queue | head -1`): Python's own code then
        code = 120
    os._exit(code or 0)


__all__ = ["COMMANDS", "Lazy", "LazyGroup", "app", "load", "main", "quick"]
