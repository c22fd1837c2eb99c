"""``gpufleet simulate`` and ``gpufleet trace synth``.

``simulate --shared-gpus N|all|auto`` shares the fleet's last GPUs (the last node's
first) among the trace's fractional jobs (``gpu_milli`` < 1000: the openb pod lists, the
gpufleet CSV's optional column), which then ask for shares of them through the
scheduling core as the server's ``--gpu-fraction`` jobs do (``gpufleet.sim.shares``).
``auto`` (the default) shares what those jobs would hold at their peak if none waited,
rounded up to whole nodes, leaving the widest whole-GPU job its GPUs; a trace without
fractions shares none and runs as it always did. Besides the policy table, it prints
per policy the allocated GPU share, the fragmentation of free capacity on partly held
shared GPUs and FGD's unallocated share at the first failure (``SimResult.capacity``).

A preempted or failed job loses the work since its last checkpoint (``--checkpoint-every``,
30 min, for jobs whose trace row declares none; 0: nothing is lost); the second table
prints the GPU-hours lost per policy, the failures injected, and how far the estimated
starts a job's owner would have read at submit were from its real start
(``--no-estimates`` skips them for a faster replay). Each job's run time is predicted at
its submit from the jobs that ended before it, as the server does (``--no-predict``: none).
Before the tables: the trace's peak weekly offered load and its warnings (``sim/tracecheck.py``).
"""

from __future__ import annotations

import json
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpufleet.cli.options import flag
from gpufleet.scheduler import POLICIES, Quota
from gpufleet.server.defaults import NODE_TIMEOUT_S, REQUEUE_AFTER_S
from gpufleet.sim.config import NODES_PER_LEAF, FleetSpec, SimConfig
from gpufleet.sim.trace import TraceError, TraceLoad
from gpufleet.timefmt import format_duration, parse_duration

FORMATS = ("gpufleet", "philly", "helios", "alibaba", "sacct", "openb")
"""``gpufleet.sim.loaders.LOADERS``' names (a test keeps them equal; importing the loaders here
would cost every ``simulate --help``)."""
console = Console(stderr=True)
# Tables stay readable when piped or captured (Rich would fall back to 80 columns).
out = Console() if sys.stdout.isatty() else Console(width=140)


def sample_trace() -> Path:
    """The bundled slice of the Philly trace (see gpufleet/data/README.md)."""
    return Path(str(resources.files("gpufleet") / "data" / "philly-sample.csv"))


def _duration(value: str, what: str) -> float:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=what) from None


def parse_quotas(values: list[str]) -> tuple[Quota, ...]:
    """``--quota TEAM=GPUS[:LIMIT]`` values, one Quota per team (a team given twice is
    an error, not a silent override)."""
    out: dict[str, Quota] = {}
    for value in values:
        team, sep, amount = value.partition("=")
        gpus, _, limit = amount.partition(":")
        try:
            if not sep or not team.strip():
                raise ValueError
            q = Quota(team=team.strip(), gpus=int(gpus), limit=int(limit) if limit else None)
        except ValueError:
            raise typer.BadParameter(
                f"{value!r}: expected TEAM=GPUS or TEAM=GPUS:LIMIT (whole numbers)", param_hint="--quota"
            ) from None
        if q.gpus < 0 or (q.limit is not None and q.limit < 0):
            raise typer.BadParameter(f"{value!r}: GPUS and LIMIT must be >= 0", param_hint="--quota")
        if q.team in out:
            raise typer.BadParameter(f"team {q.team} given twice", param_hint="--quota")
        out[q.team] = q
    return tuple(out.values())


def load(path: Path, fmt: str) -> TraceLoad:
    from gpufleet.sim.loaders import load_trace

    try:
        return load_trace(path, fmt)
    except TraceError as exc:
        console.print(f"[red]error:[/red] {exc}", soft_wrap=True)  # one line: a long path never wraps
        raise typer.Exit(2) from None


def simulate(
    trace: Path | None = typer.Option(None, "--trace", help="Trace file to replay.", dir_okay=False),
    sample: bool = flag("--sample", help="Replay the bundled Philly sample instead of --trace."),
    fmt: str = typer.Option("gpufleet", "--format", help=f"Trace format: {', '.join(FORMATS)}."),
    nodes: int = typer.Option(50, "--nodes", min=1, help="Servers in the simulated fleet."),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", min=1, help="GPUs per server."),
    nodes_per_leaf: int = typer.Option(
        NODES_PER_LEAF, "--nodes-per-leaf", min=1, help="Servers under one leaf switch."
    ),
    policy: str = typer.Option(
        "fifo,backfill,sjf,las,srtf-oracle,fairshare,default",
        "--policy",
        help=f"Comma-separated policies: {', '.join(POLICIES)}.",
    ),
    json_out: Path | None = typer.Option(None, "--json", help="Write the summary as JSON here."),
    report: Path | None = typer.Option(
        None, "--report", help="Write report.md and PNG plots to this folder."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed for failure injection."),
    max_jobs: int | None = typer.Option(None, "--max-jobs", min=1, help="Replay only the first N jobs."),
    restart_overhead: str = typer.Option(
        "60s", "--restart-overhead", help="Cost of each restart after a preemption or failure."
    ),
    checkpoint_every: str = typer.Option(
        "30m",
        "--checkpoint-every",
        help="Jobs whose trace row declares no checkpoint_s checkpoint this often (work from each "
        "start); a preempted or failed job loses the work since its last checkpoint. 0: nothing lost.",
    ),
    estimates: bool = typer.Option(
        True,
        "--estimates/--no-estimates",
        help="Compare each job's estimated start at submit with its real start (slower replay).",
    ),
    predict: bool = typer.Option(
        True,
        "--predict/--no-predict",
        help="Predict each job's run time at its submit from the jobs that ended before it (by "
        "user, name and GPUs, down to team), as the server does, and let the policies use it.",
    ),
    sched_interval: str = typer.Option(
        "0.1s",
        "--sched-interval",
        help="A change (arrival, exit, failure) is acted on at the next multiple of this: the "
        "server's passes are woken at once and reach the node by push in tens of ms "
        "(0.1s); 10s models a polling cluster.",
    ),
    gpu_failures: float = typer.Option(
        0.0, "--gpu-failures-per-day", min=0, help="GPU failures per GPU-day."
    ),
    node_failures: float = typer.Option(
        0.0, "--node-failures-per-day", min=0, help="Node failures per node-day."
    ),
    repair: str = typer.Option("4h", "--repair-time", help="Time to repair a failed GPU or node."),
    requeue_after: str = typer.Option(
        "0s",
        "--requeue-after",
        help="A failed node's jobs re-enter the queue this long after it fails (a server: its "
        f"--node-timeout plus --requeue-after, by default {NODE_TIMEOUT_S:g}s + {REQUEUE_AFTER_S:g}s).",
    ),
    reservations_file: Path | None = typer.Option(
        None,
        "--reservations",
        help="CSV of reservations to replay with the trace "
        "(id,start_s,duration_s,gpus,gpus_per_node,gpu_type,users,team).",
        dir_okay=False,
    ),
    default_limit: str = typer.Option(
        "4h", "--default-time-limit", help="Assumed run time of jobs without a limit (estimates, backfill)."
    ),
    foresee: bool = flag(
        "--foresee-preemptions",
        help="Estimated starts foresee preemptions (preemptive policies): a waiting job is booked "
        "when it could preempt, not only when GPUs come free (a slower pass).",
    ),
    quota: list[str] = typer.Option(
        [],
        "--quota",
        help="A team's quota, TEAM=GPUS (fair share's weight) or TEAM=GPUS:LIMIT (LIMIT: a hard cap); "
        "repeat for each team.",
    ),
    shared_gpus: str = typer.Option(
        "auto",
        "--shared-gpus",
        help="GPUs shared among fractional jobs (gpu_milli < 1000), taken from the end of the fleet "
        "(the last node's first); a fractional job asks for ceil(gpu_milli/10) % of one of them. "
        "N: that many (0: none, a fractional job takes a whole GPU); all: every GPU; auto: what the "
        "fractional jobs would hold at their peak if none waited, rounded up to whole nodes, leaving "
        "the widest whole-GPU job its GPUs (none when the trace has no fractions).",
    ),
) -> None:
    """Replay a job trace through the scheduling core under each policy and compare them."""
    if fmt not in FORMATS:
        raise typer.BadParameter(
            f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}", param_hint="--format"
        )
    if sample == (trace is not None):
        raise typer.BadParameter("give either --trace FILE or --sample", param_hint="--trace")
    if sample:
        trace, fmt = sample_trace(), "philly"
    assert trace is not None
    names = [p.strip() for p in policy.split(",") if p.strip()]
    unknown = [n for n in names if n not in POLICIES]
    if unknown or not names:
        raise typer.BadParameter(
            f"unknown policy {unknown}; choose from {', '.join(POLICIES)}", param_hint="--policy"
        )
    config = SimConfig(
        restart_overhead_s=_duration(restart_overhead, "--restart-overhead"),
        checkpoint_interval_s=_duration(checkpoint_every, "--checkpoint-every"),
        estimate_starts=estimates,
        predict=predict,
        sched_interval_s=_duration(sched_interval, "--sched-interval"),
        gpu_failures_per_gpu_day=gpu_failures,
        node_failures_per_node_day=node_failures,
        repair_s=_duration(repair, "--repair-time"),
        requeue_after_s=_duration(requeue_after, "--requeue-after"),
        seed=seed,
        quotas=parse_quotas(quota),
    )
    loaded = load(trace, fmt)
    for problem in loaded.problems[:10]:
        console.print(f"[yellow]skipped[/yellow] {trace}:{problem}")
    if len(loaded.problems) > 10:
        console.print(f"[yellow]skipped {len(loaded.problems) - 10} more rows[/yellow]")
    jobs = loaded.jobs[:max_jobs] if max_jobs else loaded.jobs
    if not jobs:
        console.print("[red]error:[/red] the trace has no usable jobs")
        raise typer.Exit(2)
    from gpufleet.sim.shares import shared_gpu_count

    try:
        shared = shared_gpu_count(shared_gpus, jobs, nodes=nodes, gpus_per_node=gpus_per_node)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--shared-gpus") from None
    fleet = FleetSpec(
        nodes=nodes, gpus_per_node=gpus_per_node, nodes_per_leaf=nodes_per_leaf, shared_gpus=shared
    )

    from gpufleet.sim.loaders.reservations import ReservationRequest, load_reservations
    from gpufleet.sim.runner import compare_policies

    bookings: list[ReservationRequest] = []
    if reservations_file is not None:
        try:
            bookings, bad = load_reservations(reservations_file)
        except TraceError as exc:
            console.print(f"[red]error:[/red] {exc}", soft_wrap=True)  # one line: a long path never wraps
            raise typer.Exit(2) from None
        for problem in bad:
            console.print(f"[yellow]skipped[/yellow] {reservations_file}:{problem}")

    with Progress(
        TextColumn("{task.description:>12}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as bar:
        tasks = {n: bar.add_task(n, total=len(jobs)) for n in names}
        comparison = compare_policies(
            jobs,
            fleet,
            names,
            config,
            policy_params={
                "default_time_limit_s": _duration(default_limit, "--default-time-limit"),
                "foresee_preemptions": foresee,
            },
            progress=lambda name, n: bar.update(tasks[name], completed=n),
            reservations=bookings,
        )
    summary = comparison.summary
    table = Table(
        title=f"{summary['jobs']} jobs, {fleet.nodes}x{fleet.gpus_per_node} GPUs, "
        f"offered load {summary['offered_load']:.2f}"
    )
    for col in (
        "policy",
        "avg JCT",
        "p50 JCT",
        "p99 JCT",
        "avg queue",
        "p99 queue",
        "util",
        "frag",
        "preempt",
        "sim s",
    ):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for name, m in summary["policies"].items():
        table.add_row(
            name,
            format_duration(m["avg_jct_s"]),
            format_duration(m["p50_jct_s"]),
            format_duration(m["p99_jct_s"]),
            format_duration(m["avg_queue_s"]),
            format_duration(m["p99_queue_s"]),
            f"{m['utilization']:.1%}",
            f"{m['fragmentation']:.2f}",
            str(int(m["preemptions"])),
            f"{m['sim_wall_s']:.1f}",
        )
    for line in summary["trace"]["lines"]:
        out.print(line, soft_wrap=True)
    out.print(table)
    _print_costs(summary)
    booked = summary["reservations"]
    if reservations_file is not None:
        out.print(
            f"reservations: {booked['accepted']} accepted ({booked['reserved_gpu_hours']} GPU-hours), "
            f"{len(booked['refused'])} refused"
        )
        for refusal in booked["refused"]:
            out.print(f"  refused {refusal['id']}: {refusal['why']}")
    _print_capacity(summary)
    bound = summary["bounds"]
    out.print(
        f"bounds: avg JCT >= {format_duration(bound['avg_jct_lower_s'])}, "
        f"utilisation <= {bound['utilization_upper']:.1%}; "
        f"rejected (too large for the fleet or a team's hard limit): {summary['rejected']}"
    )
    if json_out is not None:
        json_out.write_text(json.dumps(summary, indent=2))
        out.print(f"summary: {json_out}")
    if report is not None:
        from gpufleet.sim.report import write_report

        path = write_report(comparison, report, title=f"gpufleet simulation of {trace.name}")
        out.print(f"report: {path}")


def _print_capacity(summary: dict[str, Any]) -> None:
    """The GPU capacity figures per policy (``SimResult.capacity``); n/a where there is none."""
    from gpufleet.sim.runner import capacity_cells, capacity_title

    table = Table(title=capacity_title(summary))
    for col in ("policy", "allocated", "shared frag", "unallocated at 1st failure", "1st failure at"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for name, c in summary["capacity"].items():
        table.add_row(name, *capacity_cells(c))
    out.print(table)


def _print_costs(summary: dict[str, Any]) -> None:
    """Per policy: GPU-hours lost since checkpoints, failures, and the estimated starts of the
    jobs that waited past their first pass (how many, how many had one, the median errors)."""
    every = summary["config"]["checkpoint_interval_s"]
    table = Table(
        title=f"Lost work (checkpoint every {format_duration(every)} unless the trace says)"
        if every > 0
        else "Lost work: off (--checkpoint-every 0)"
    )
    cols = (
        "policy",
        "preempt",
        "GPU-h lost",
        "GPU-h lost to failures",
        "failures GPU/node",
        "jobs hit",
        "waited, estimated",
    )
    for col in (*cols, "est. error p50", "rel. error p50"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for name, c in summary["costs"].items():
        e = summary["estimates"][name]
        cells = ["-", "-", "-"]
        if e is not None:
            err, rel = e["median_abs_error_s"], e["median_rel_error"]
            cells = [
                f"{int(e['estimated_jobs'] + e['no_estimate_jobs'])}, {int(e['estimated_jobs'])}",
                "n/a" if err is None else format_duration(err),
                "n/a" if rel is None else f"{rel:.0%}",
            ]
        table.add_row(
            name,
            str(int(c["preemptions"])),
            f"{c['lost_gpu_h_preemption']:,.0f}",
            f"{c['lost_gpu_h_failure']:,.0f}",
            f"{int(c['gpu_failures'])}/{int(c['node_failures'])}",
            str(int(c["jobs_hit_by_failures"])),
            *cells,
        )
    out.print(table)


trace_app = typer.Typer(help="Make and inspect job traces.", no_args_is_help=True)


@trace_app.command("synth")
def synth(
    jobs: int = typer.Option(..., "--jobs", min=1, help="Number of jobs."),
    seed: int = typer.Option(..., "--seed", help="Random seed (same seed, same trace)."),
    out_file: Path = typer.Option(..., "--out", help="CSV file to write (gpufleet format).", dir_okay=False),
    load_: float = typer.Option(0.9, "--load", min=0.01, help="Offered load relative to the fleet."),
    nodes: int = typer.Option(50, "--nodes", min=1, help="Fleet size the load refers to."),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", min=1, help="GPUs per node."),
) -> None:
    """Write a seeded synthetic trace: heavy-tailed durations, power-of-two gangs, diurnal arrivals."""
    from gpufleet.sim.loaders.gpufleet_csv import write_gpufleet_csv
    from gpufleet.sim.synth import synthesize
    from gpufleet.sim.trace import offered_load

    made = synthesize(jobs=jobs, seed=seed, load=load_, nodes=nodes, gpus_per_node=gpus_per_node)
    write_gpufleet_csv(out_file, made)
    out.print(
        f"wrote {len(made)} jobs to {out_file} "
        f"(offered load {offered_load(made, nodes * gpus_per_node):.2f} on {nodes}x{gpus_per_node} GPUs)"
    )


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate)
    app.add_typer(trace_app, name="trace")
