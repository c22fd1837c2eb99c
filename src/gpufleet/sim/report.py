"""A markdown report with PNG plots: JCT CDF per policy, utilisation and queue length
over time (sampled on a regular virtual clock to the end of the run). matplotlib with
the Agg backend: no display needed. Each policy has its own colour, line style and
marker, so a curve that lies on another one stays visible."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from gpufleet.sim.runner import Comparison, capacity_cells, capacity_title
from gpufleet.timefmt import format_duration

STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "x", "+", "*")


def _style(i: int) -> dict[str, Any]:
    """Distinct per policy: line style, marker, and the markers' positions staggered
    (every 8 % of the axis, offset per policy), so identical curves stay apart."""
    return {
        "linestyle": STYLES[i % len(STYLES)],
        "marker": MARKERS[i % len(MARKERS)],
        "markevery": (0.01 + 0.025 * (i % 3), 0.08),
    }


def write_report(comparison: Comparison, out_dir: Path, *, title: str = "gpufleet simulation") -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    _plot_jct_cdf(comparison, out_dir / "jct_cdf.png")
    _plot_timeline(comparison, "busy_gpus", "GPU utilisation", out_dir / "utilization.png")
    _plot_timeline(comparison, "pending_jobs", "Jobs waiting", out_dir / "queue.png")
    s = comparison.summary
    fleet = s["fleet"]
    lines = [
        f"# {title}",
        "",
        f"{s['jobs']} jobs on {fleet['nodes']} nodes x {fleet['gpus_per_node']} GPUs "
        f"({fleet['gpus']} GPUs, {fleet['nodes_per_leaf']} nodes per leaf switch); "
        f"offered load {s['offered_load']:.2f}; {s['rejected']} jobs rejected as too large for the fleet "
        "or for their team's hard limit.",
        "",
        f"Bounds: mean JCT >= {format_duration(s['bounds']['avg_jct_lower_s'])} (mean duration), "
        f"utilisation <= {s['bounds']['utilization_upper']:.1%}.",
        "",
        *(f"- {line}" for line in s["trace"]["lines"]),
        "",
        "| policy | avg JCT | p50 JCT | p99 JCT | avg queue | p99 queue | makespan | util | frag "
        "| preemptions | sim s |",
        "| --- " + "| ---: " * 10 + "|",
    ]
    for name, m in s["policies"].items():
        lines.append(
            f"| {name} | {format_duration(m['avg_jct_s'])} | {format_duration(m['p50_jct_s'])} | "
            f"{format_duration(m['p99_jct_s'])} | {format_duration(m['avg_queue_s'])} | "
            f"{format_duration(m['p99_queue_s'])} | {format_duration(m['makespan_s'])} | "
            f"{m['utilization']:.1%} | {m['fragmentation']:.2f} | {int(m['preemptions'])} | "
            f"{m['sim_wall_s']:.1f} |"
        )
    lines += _cost_lines(s)
    lines += _capacity_lines(s)
    lines += [
        "",
        "How to read the figures:",
        "",
        "- *offered load*: GPU-hours the trace asks for / GPU-hours the fleet has between the first and the",
        "  last submit; above 1 the queue must grow.",
        "- *util*: GPU-hours allocated / GPU-hours the fleet has over the whole makespan (first submit",
        "  to last finish), so a long tail with a few jobs left pulls it down even when the fleet was full",
        "  while work waited; the utilisation plot shows when.",
        "- *avg queue* and *p99 queue*: the total time a job waited (including after preemptions). The mean",
        "  is dominated by the few jobs that waited longest; when fewer than 1 % of the jobs wait long, the",
        "  mean can exceed the p99.",
        "- *GPU-h lost*: work done since the victims' last checkpoints, lost when they were preempted",
        "  (or, the next column, when an injected failure stopped them): they redo it.",
        "- *estimated start error*: for the jobs that waited past the first scheduling pass after",
        "  their submit, the start that pass estimated (what `gpufleet jobs show` would have told",
        "  the owner) against the real first start; relative: over the job's real wait.",
        "- *frag*: time-averaged share of free GPUs that cannot host the head waiting job's per-node part.",
        "- *allocated*: GPU-hours allocated / GPU-hours the fleet has over the makespan, a GPU share's",
        "  units counted as their part of a GPU (1 % each); *util* counts a shared GPU whole while any",
        "  share of it is held, so the two differ only on shared GPUs.",
        "- *shared frag*: of the free GPU-hours (GPUs in service, not allocated), the share that lay on",
        "  shared GPUs partly held: too little for a bigger share and never usable whole (n/a: no GPU",
        "  is shared).",
        "- *unallocated at 1st failure* (FGD's measure, Weng et al., ATC'23): the share of the fleet's",
        "  GPUs not allocated right after the first scheduling pass that left a newly arrived job",
        "  waiting (not a preempted or requeued one), and when (n/a: every job started in the pass",
        "  after it arrived).",
        "",
        "![JCT CDF](jct_cdf.png)",
        "",
        "![Utilisation](utilization.png)",
        "",
        "![Queue length](queue.png)",
        "",
    ]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines))
    return path


def _cost_lines(s: dict[str, Any]) -> list[str]:
    every = s["config"]["checkpoint_interval_s"]
    lines = [
        "",
        f"Lost work: jobs checkpoint every {format_duration(every)} unless the trace says"
        if every > 0
        else "Lost work: off (nothing lost at a preemption or failure unless the trace declares intervals)",
        "",
        "| policy | preemptions | GPU-h lost | GPU-h lost to failures | failures GPU/node | jobs hit "
        "| waited | estimated | est. error p50 | rel. error p50 |",
        "| --- " + "| ---: " * 9 + "|",
    ]
    for name, c in s["costs"].items():
        e = s["estimates"][name]
        est = ["-"] * 4
        if e is not None:
            err, rel = e["median_abs_error_s"], e["median_rel_error"]
            est = [
                str(int(e["estimated_jobs"] + e["no_estimate_jobs"])),
                str(int(e["estimated_jobs"])),
                "n/a" if err is None else format_duration(err),
                "n/a" if rel is None else f"{rel:.0%}",
            ]
        lines.append(
            f"| {name} | {int(c['preemptions'])} | {c['lost_gpu_h_preemption']:,.0f} | "
            f"{c['lost_gpu_h_failure']:,.0f} | {int(c['gpu_failures'])}/{int(c['node_failures'])} | "
            f"{int(c['jobs_hit_by_failures'])} | " + " | ".join(est) + " |"
        )
    return lines


def _capacity_lines(s: dict[str, Any]) -> list[str]:
    lines = [
        "",
        capacity_title(s),
        "",
        "| policy | allocated | shared frag | unallocated at 1st failure | 1st failure at |",
        "| --- " + "| ---: " * 4 + "|",
    ]
    for name, c in s["capacity"].items():
        lines.append(f"| {name} | " + " | ".join(capacity_cells(c)) + " |")
    return lines


def _plot_jct_cdf(comparison: Comparison, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, (name, result) in enumerate(comparison.results.items()):
        jct = np.sort(np.array([o.jct_s for o in result.outcomes]) / 3600.0)
        if jct.size:
            ax.plot(jct, np.arange(1, jct.size + 1) / jct.size, label=name, linewidth=1.2, **_style(i))
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours, log scale)")
    ax.set_ylabel("share of jobs")
    ax.set_title("JCT CDF per policy")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_timeline(comparison: Comparison, series: str, label: str, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 3.6))
    start = min((r.timeline["t"][0] for r in comparison.results.values() if r.timeline["t"]), default=0.0)
    for i, (name, result) in enumerate(comparison.results.items()):
        t = (np.array(result.timeline["t"]) - start) / 86400.0
        y = np.array(result.timeline[series])
        if series == "busy_gpus":
            y = y / result.fleet_gpus
        ax.plot(t, y, label=name, linewidth=1, **_style(i))
    ax.set_xlabel("days since trace start")
    ax.set_ylabel(label)
    ax.set_title(f"{label} over time")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
