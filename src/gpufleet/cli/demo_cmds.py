"""``gpufleet demo``: a whole simulated fleet on this machine.

Not in ``server_cmds.py``: its defaults come from the simulator (``NODES_PER_LEAF``), and
``gpufleet server`` (that module) would import the simulator, and numpy, only to show them:
12 MB in every server process (issue 35). ``GPUFLEET_ADMIN_TOKEN``, when set, is the
demo's admin token.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from gpufleet.cli.options import flag
from gpufleet.sim.config import NODES_PER_LEAF


def demo(
    nodes: int = typer.Option(50, "--nodes", min=1, max=2000),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", min=1, max=64),
    port: int = typer.Option(8080, "--port", min=1, max=65535),
    no_workload: bool = flag("--no-workload", help="No background trace replay."),
    data_dir: Path | None = typer.Option(
        None, "--data-dir", help="Keep the database and agent dirs here (default: a temp dir, removed)."
    ),
    nodes_per_leaf: int = typer.Option(
        NODES_PER_LEAF, "--nodes-per-leaf", min=1, help="Servers under one leaf switch."
    ),
    speed: float = typer.Option(300.0, "--speed", min=1.0, help="Trace time compression."),
    tls: bool = flag(
        "--tls", help="HTTPS with the demo's own CA; agents enrol for node certificates (mTLS)."
    ),
    gateway_port: int = typer.Option(8081, "--gateway-port", min=1, max=65535, help="The inference gateway."),
    no_service: bool = flag("--no-service", help="No inference service (and no gateway)."),
) -> None:
    """A whole simulated fleet on this machine. Ctrl-C stops everything.

    The server on SQLite, agents with simulated H100s, a replay of the bundled Philly
    sample, an inference service behind a gateway, the fleet page and an admin token."""
    from gpufleet.demo import DemoOptions, run_demo

    code = run_demo(
        DemoOptions(
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            port=port,
            workload=not no_workload,
            data_dir=data_dir,
            nodes_per_leaf=nodes_per_leaf,
            speed=speed,
            admin_token=os.environ.get("GPUFLEET_ADMIN_TOKEN") or None,
            tls=tls,
            gateway_port=gateway_port,
            service=not no_service,
        )
    )
    raise typer.Exit(code)


__all__ = ["demo"]
