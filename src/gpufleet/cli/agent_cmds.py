"""``gpufleet agent``, ``gpufleet node join-token``, ``gpufleet logs`` and
``gpufleet demo``.

Environment: ``GPUFLEET_AGENT_TOKEN`` (the agent's credential when ``--token`` is not
given), ``GPUFLEET_URL``/``GPUFLEET_TOKEN`` (the user commands, as everywhere),
``GPUFLEET_ADMIN_TOKEN`` (the demo's admin token).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from types import FrameType
from urllib.parse import urlsplit

import httpx
import platformdirs
import typer

from gpufleet.client import ClientError, GpufleetClient, load_connection
from gpufleet.timefmt import parse_duration

node_app = typer.Typer(help="Node credentials (operators).", no_args_is_help=True)


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"gpufleet: error: {message}", err=True)
    return typer.Exit(code)


def _seconds(value: str, what: str) -> float:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise _fail(f"{what}: {exc}", 2) from None


def _local_address(server_url: str) -> str:
    """The address this host uses to reach the server (what peers should dial)."""
    host = urlsplit(server_url).hostname or "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return str(s.getsockname()[0])
    except OSError:
        return socket.gethostname()


def agent(
    server: str = typer.Option(..., "--server", help="Server URL, e.g. http://10.0.0.1:8080"),
    token: str | None = typer.Option(
        None,
        "--token",
        help="Node credential (gpufleet node join-token) or operator token.",
        show_default=False,
    ),
    name: str | None = typer.Option(None, "--name", help="Node name (default: the hostname)."),
    simulate_gpus: int = typer.Option(0, "--simulate-gpus", min=0, help="Simulate N GPUs (no NVML)."),
    gpu_model: str = typer.Option("H100-80GB", "--gpu-model", help="Model of the simulated GPUs."),
    leaf: str | None = typer.Option(None, "--leaf", help="Leaf switch this node hangs off."),
    rack: str | None = typer.Option(None, "--rack"),
    address: str | None = typer.Option(None, "--address", help="Address peers reach this node at."),
    work_dir: Path | None = typer.Option(None, "--work-dir", help="Job state, logs, checkpoints."),
    checkpoint_root: Path | None = typer.Option(
        None, "--checkpoint-root", help="Shared filesystem for GPUFLEET_CHECKPOINT_DIR (default: --work-dir)."
    ),
    sync_interval: str = typer.Option("10s", "--sync-interval"),
    grace: str = typer.Option("30s", "--grace", help="SIGTERM -> SIGKILL grace period."),
    cap_add: list[str] = typer.Option([], "--container-cap-add", help="Capability containers may keep."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Run the node agent: report GPUs and jobs, run what the server places here.

    Stopping the agent (Ctrl-C, SIGTERM) leaves its jobs running; the next start on the
    same --work-dir re-adopts them."""
    from gpufleet.agent import (
        AgentConfig,
        HttpTransport,
        NvmlProbe,
        ProbeError,
        SimSpec,
        SimulatedProbe,
        make_agent,
    )
    from gpufleet.agent.probe import GpuProbe

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(message)s")
    secret = token or os.environ.get("GPUFLEET_AGENT_TOKEN")
    if not secret:
        raise _fail("--token (or GPUFLEET_AGENT_TOKEN) is required", 2)
    node = name or socket.gethostname().split(".")[0]
    wd = work_dir or Path(platformdirs.user_data_dir("gpufleet")) / "agent" / node
    probe: GpuProbe
    try:
        probe = (
            SimulatedProbe(node=node, spec=SimSpec(gpus=simulate_gpus, model=gpu_model))
            if simulate_gpus
            else NvmlProbe()
        )
    except ProbeError as exc:
        raise _fail(str(exc)) from None
    config = AgentConfig(
        node=node,
        work_dir=wd,
        leaf=leaf,
        rack=rack,
        address=address or _local_address(server),
        sync_interval_s=_seconds(sync_interval, "--sync-interval"),
        grace_s=_seconds(grace, "--grace"),
        checkpoint_root=checkpoint_root,
    )
    bot = make_agent(
        config=config, probe=probe, transport=HttpTransport(server, secret), container_caps=tuple(cap_add)
    )
    adopted = bot.restore()
    stop = threading.Event()

    def _stop(_sig: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    typer.echo(
        f"gpufleet agent: node {node}, {len(bot.inventory.gpus)} GPU(s), work dir {wd}, "
        f"re-adopted {adopted} job(s); server {server}",
        err=True,
    )
    if not bot.sync_once() and bot.stats.last_status in (401, 403):
        bot.close()
        raise _fail(bot.stats.last_error or "credential refused")
    thread = threading.Thread(target=bot.run, args=(stop,), name="gpufleet-agent", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.5)
    bot.close()
    typer.echo("gpufleet agent: stopped (jobs keep running; restart to re-adopt them)", err=True)


@node_app.command("join-token")
def join_token(
    node: str | None = typer.Option(None, "--node", help="Bind to this node (default: first to sync)."),
) -> None:
    """Create a node credential for `gpufleet agent --token` (shown once)."""
    try:
        with GpufleetClient.from_env() as c:
            made = c.request("POST", "/nodes/join-tokens", json={"node": node})
    except ClientError as exc:
        raise _fail(exc.message, 2 if exc.status in (400, 422) else 1) from None
    typer.echo(made["token"])


def logs(
    job_id: int = typer.Argument(...),
    follow: bool = typer.Option(False, "--follow", "-f", help="Stream until the job is over."),
) -> None:
    """A job's output (stdout and stderr, as its nodes shipped them)."""
    conn = load_connection()
    headers = {"Authorization": f"Bearer {conn.token}"} if conn.token else {}
    url = f"{conn.url.rstrip('/')}/v1/jobs/{job_id}/logs"
    try:
        with (
            httpx.Client(headers=headers, timeout=httpx.Timeout(30.0, read=None)) as http,
            http.stream("GET", url, params={"follow": "true"} if follow else {}) as resp,
        ):
            if resp.status_code >= 400:
                resp.read()
                detail = ""
                try:
                    detail = str(resp.json().get("detail", ""))
                except ValueError:
                    detail = resp.text[:200]
                raise _fail(f"{resp.status_code}: {detail}")
            for text in resp.iter_text():
                sys.stdout.write(text)
                sys.stdout.flush()
    except httpx.HTTPError as exc:
        raise _fail(f"cannot reach server {conn.url} ({exc.__class__.__name__})") from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def demo(
    nodes: int = typer.Option(50, "--nodes", min=1, max=2000),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", min=1, max=64),
    port: int = typer.Option(8080, "--port", min=1, max=65535),
    no_workload: bool = typer.Option(False, "--no-workload", help="No background trace replay."),
    data_dir: Path | None = typer.Option(
        None, "--data-dir", help="Keep the database and agent dirs here (default: a temp dir, removed)."
    ),
    nodes_per_leaf: int = typer.Option(10, "--nodes-per-leaf", min=1),
    speed: float = typer.Option(300.0, "--speed", min=1.0, help="Trace time compression."),
) -> None:
    """A whole simulated fleet on this machine. Ctrl-C stops everything.

    The server on SQLite, agents with simulated H100s, a replay of the bundled Philly
    sample, the fleet page and an admin token."""
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
        )
    )
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("agent")(agent)
    app.command("logs")(logs)
    app.command("demo")(demo)
    app.add_typer(node_app, name="node")


__all__ = ["register"]
