"""A markdown report with PNG plots: JCT CDF per policy, utilisation and queue length
over time. matplotlib with the Agg backend: no display needed."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from gpufleet.sim.runner import Comparison
from gpufleet.timefmt import format_duration


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
        f"offered load {s['offered_load']:.2f}; {s['rejected']} jobs rejected as too large for the fleet.",
        "",
        f"Bounds: mean JCT >= {format_duration(s['bounds']['avg_jct_lower_s'])} (mean duration), "
        f"utilisation <= {s['bounds']['utilization_upper']:.1%}.",
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
    lines += [
        "",
        "Queue = total time a job waited (including after preemptions); frag = time-averaged share of free",
        "GPUs that cannot host the head waiting job's per-node part.",
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


def _plot_jct_cdf(comparison: Comparison, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, result in comparison.results.items():
        jct = np.sort(np.array([o.jct_s for o in result.outcomes]) / 3600.0)
        if jct.size:
            ax.plot(jct, np.arange(1, jct.size + 1) / jct.size, label=name)
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
    for name, result in comparison.results.items():
        t = np.array(result.timeline["t"]) / 86400.0
        y = np.array(result.timeline[series])
        if series == "busy_gpus":
            y = y / result.fleet_gpus
        ax.plot(t, y, label=name, linewidth=1)
    ax.set_xlabel("days since trace start")
    ax.set_ylabel(label)
    ax.set_title(f"{label} over time")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
