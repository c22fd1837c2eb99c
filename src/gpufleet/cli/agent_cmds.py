"""``gpufleet agent``, ``gpufleet node join-token``, ``gpufleet logs`` and
``gpufleet demo``.

The agent's credential: ``--token-file`` (a file only its owner can read, as ssh wants of
a private key), else ``GPUFLEET_AGENT_TOKEN``; ``--token`` on the command line still works
for tests but warns, since every process on the node can read a command line.
``GPUFLEET_URL``/``GPUFLEET_TOKEN`` are the user commands' connection, as everywhere;
``GPUFLEET_ADMIN_TOKEN`` the demo's admin token.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from urllib.parse import urlsplit

import httpx
import platformdirs
import typer

from gpufleet.cli.options import flag, json_flag
from gpufleet.client import ClientError, GpufleetClient, load_connection, tls_verify
from gpufleet.sim.engine import NODES_PER_LEAF
from gpufleet.timefmt import parse_duration

node_app = typer.Typer(
    help="Nodes (operators): credentials, cordon, drain, rollout, events.", no_args_is_help=True
)
ca_app = typer.Typer(help="The cluster's certificate authority (TLS for the server, mTLS for agents).")


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


def _credential(token_file: Path | None, token: str | None, *, required: bool = True) -> str | None:
    """The node credential, from the file, the flag or the environment, in that order;
    the environment variable is removed so that nothing the agent starts inherits it.
    Not ``required`` when the agent already holds its certificate (mTLS)."""
    from_env = os.environ.pop("GPUFLEET_AGENT_TOKEN", None)
    if token_file is not None:
        try:
            st = token_file.stat()
            secret = token_file.read_text().strip()
        except OSError as exc:
            raise _fail(f"--token-file: cannot read {token_file}: {exc.strerror}", 2) from None
        if st.st_mode & 0o077:
            raise _fail(f"--token-file: {token_file} is readable by others: chmod 600 {token_file}", 2)
        if not secret:
            raise _fail(f"--token-file: {token_file} is empty", 2)
        return secret
    if token:
        typer.echo(
            "gpufleet agent: warning: --token puts the credential on the command line, where every "
            "process on this node can read it; use --token-file",
            err=True,
        )
        return token
    if from_env or not required:
        return from_env
    raise _fail("--token-file (or GPUFLEET_AGENT_TOKEN) is required", 2)


def _default_work_dir(node: str) -> Path:
    """``/var/lib/gpufleet/agent/NODE`` for a root agent (as slurmd's spool dir): jobs,
    running as their owners, must be able to pass through its parents to their own
    directories, which a home directory does not allow. Else the user's data dir."""
    if os.geteuid() == 0:
        return Path("/var/lib/gpufleet/agent") / node
    return Path(platformdirs.user_data_dir("gpufleet")) / "agent" / node


def _bytes(value: str, what: str) -> int:
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    v = value.strip().upper().removesuffix("B").removesuffix("I")
    num, unit = (v[:-1], v[-1]) if v and v[-1] in units else (v, "")
    try:
        n = int(float(num) * units[unit])
    except ValueError:
        raise _fail(f"{what}: expected a size like 512M or 64G, got {value!r}", 2) from None
    if n <= 0:
        raise _fail(f"{what}: must be above 0", 2)
    return n


def agent(
    server: str = typer.Option(..., "--server", help="Server URL, e.g. http://10.0.0.1:8080"),
    token_file: Path | None = typer.Option(
        None,
        "--token-file",
        help="File holding the node credential (gpufleet node join-token); mode 0600 or stricter.",
        show_default=False,
    ),
    token: str | None = typer.Option(
        None,
        "--token",
        help="The credential itself (tests only: visible to every process on the node; use --token-file).",
        show_default=False,
    ),
    ca_file: Path | None = typer.Option(
        None, "--ca-file", help="The cluster CA (ca.crt) the https:// server's certificate must chain to."
    ),
    cert_dir: Path | None = typer.Option(
        None, "--cert-dir", help="The node's key and certificate (default: WORK_DIR/pki); https:// only."
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
    container_allow_user: bool = flag(
        "--container-allow-user",
        help="Honour a job's GPUFLEET_CONTAINER_USER (never root); default: the owner's uid:gid.",
    ),
    container_read_only: bool = flag(
        "--container-read-only", help="Containers get a read-only root filesystem (and a /tmp tmpfs)."
    ),
    container_network: str | None = typer.Option(
        None,
        "--container-network",
        help="Docker network for multi-node container jobs (e.g. a macvlan on the fabric).",
    ),
    container_host_network: bool = flag(
        "--container-host-network",
        help="Multi-node container jobs use the host's network (default: a bridge network per job).",
    ),
    user_map: Path | None = typer.Option(
        None,
        "--user-map",
        help='TOML [users] table: gpufleet user = "POSIX account"; "*" for the rest (default: same name).',
    ),
    job_memory_max: str | None = typer.Option(
        None, "--job-memory-max", help="Memory limit of each job (e.g. 64G): its cgroup (v2) or container."
    ),
    job_pids_max: int = typer.Option(
        4096, "--job-pids-max", min=1, help="Process limit of each job: its cgroup (v2) or container."
    ),
    cgroup_root: Path = typer.Option(
        Path("/sys/fs/cgroup/gpufleet"), "--cgroup-root", help="Parent cgroup (v2) of the jobs' cgroups."
    ),
    verbose: bool = flag("--verbose", "-v", help="Log at INFO level (default: warnings only)."),
) -> None:
    """Run the node agent: report GPUs and jobs, run what the server places here.

    Stopping the agent (Ctrl-C, SIGTERM) leaves its jobs running; the next start on the
    same --work-dir re-adopts them."""
    from gpufleet.agent import (
        AgentConfig,
        AgentTransportError,
        Cgroups,
        ContainerPolicy,
        HttpTransport,
        Limits,
        NvmlProbe,
        ProbeError,
        RunAs,
        SimSpec,
        SimulatedProbe,
        UserMap,
        make_agent,
    )
    from gpufleet.agent.probe import GpuProbe

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(message)s")
    node = name or socket.gethostname().split(".")[0]
    wd = work_dir or _default_work_dir(node)
    tls = server.startswith("https://")
    pki = cert_dir or wd / "pki"
    held = tls and (pki / "node.crt").exists()
    secret = _credential(token_file, token, required=not held)
    try:
        users = UserMap.load(user_map) if user_map is not None else UserMap()
    except ValueError as exc:
        raise _fail(f"--user-map: {exc}", 2) from None
    run_as = RunAs(users=users, node=node)
    if run_as.note:
        typer.echo(f"gpufleet agent: {run_as.note}", err=True)
    limits = Limits(
        memory_max_bytes=_bytes(job_memory_max, "--job-memory-max") if job_memory_max else None,
        pids_max=job_pids_max,
    )
    cgroups = Cgroups(cgroup_root) if os.geteuid() == 0 else None
    if cgroups is not None and cgroups.disabled_reason:
        typer.echo(f"gpufleet agent: {cgroups.disabled_reason}", err=True)
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
    transport = HttpTransport(server, secret)
    if tls:
        from gpufleet.agent.enroll import ensure_certificate

        ca = str(ca_file) if ca_file else None
        try:
            cert = ensure_certificate(url=server, node=node, directory=pki, token=secret, ca_file=ca)
        except AgentTransportError as exc:
            raise _fail(str(exc)) from None
        transport = HttpTransport(server, ca_file=ca, cert=cert)
    bot = make_agent(
        config=config,
        probe=probe,
        transport=transport,
        run_as=run_as,
        cgroups=cgroups,
        limits=limits,
        container_policy=ContainerPolicy(
            allowed_caps=tuple(cap_add),
            allow_user=container_allow_user,
            pids_max=job_pids_max,
            memory_max_bytes=limits.memory_max_bytes,
            read_only_rootfs=container_read_only,
            network=container_network,
            host_network=container_host_network,
        ),
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


@node_app.command("credentials")
def credentials(
    node: str | None = typer.Option(None, "--node", help="Only this node's."),
    as_json: bool = json_flag(),
) -> None:
    """List node join tokens and certificates (never the secrets: a token's last
    characters, a certificate's serial)."""
    try:
        with GpufleetClient.from_env() as c:
            items = [it.model_dump() for it in c.node_credentials(node=node)]
    except ClientError as exc:
        raise _fail(exc.message, 2 if exc.status in (400, 422) else 1) from None
    if as_json:
        typer.echo(json.dumps(items, indent=2))
        return
    typer.echo(f"{'KIND':<11} {'ID':>5} {'NODE':<24} {'HINT/SERIAL':<40} {'EXPIRES':<10} STATE")
    for it in items:
        expires = time.strftime("%Y-%m-%d", time.localtime(it["not_after"])) if it["not_after"] else "-"
        state = "revoked" if it["revoked_at"] else ("unbound" if it["node"] is None else "active")
        typer.echo(
            f"{it['kind']:<11} {it['id']:>5} {it['node'] or '-':<24} {it['hint']:<40} {expires:<10} {state}"
        )


@node_app.command("revoke")
def revoke(
    node: str = typer.Argument(..., help="The node whose join tokens and certificates to revoke."),
) -> None:
    """Revoke every credential of a node: its next sync is refused (re-admit it with a
    new join token)."""
    try:
        with GpufleetClient.from_env() as c:
            got = c.request("POST", f"/nodes/{node}/revoke")
    except ClientError as exc:
        raise _fail(exc.message, 2 if exc.status in (400, 422) else 1) from None
    typer.echo(
        f"revoked {got['join_tokens']} join token(s) and {got['certificates']} certificate(s) of {node}"
    )


@ca_app.command("init")
def ca_init(
    directory: Path = typer.Argument(..., help="Where to keep ca.crt, ca.key, server.crt, server.key."),
    names: list[str] = typer.Option(
        ["localhost", "127.0.0.1"],
        "--name",
        help="Host names and IP addresses the server is reached at (repeat).",
    ),
) -> None:
    """Make the cluster CA and a server certificate signed by it (keys 0600).

    Then: gpufleet server --tls-cert DIR/server.crt --tls-key DIR/server.key --ca-dir DIR;
    agents and users pass --ca-file DIR/ca.crt (GPUFLEET_CA_FILE)."""
    from gpufleet.pki import CertificateAuthority, PkiError

    try:
        ca = CertificateAuthority.load_or_create(directory)
        crt, key = ca.issue_server(names, directory)
    except (PkiError, OSError) as exc:
        raise _fail(str(exc), 2) from None
    typer.echo(f"CA          {directory / 'ca.crt'}  (give it to agents and users: --ca-file)")
    typer.echo(f"server cert {crt}  for {', '.join(names)}")
    typer.echo(f"server key  {key}")


def logs(
    job_id: int = typer.Argument(...),
    follow: bool = flag("--follow", "-f", help="Stream until the job is over."),
) -> None:
    """A job's output (stdout and stderr, as its nodes shipped them)."""
    conn = load_connection()
    headers = {"Authorization": f"Bearer {conn.token}"} if conn.token else {}
    url = f"{conn.url.rstrip('/')}/v1/jobs/{job_id}/logs"
    try:
        with (
            httpx.Client(
                headers=headers, timeout=httpx.Timeout(30.0, read=None), verify=tls_verify(conn.ca_file)
            ) as http,
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
            tls=tls,
        )
    )
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("agent")(agent)
    app.command("logs")(logs)
    app.command("demo")(demo)
    app.add_typer(node_app, name="node")
    app.add_typer(ca_app, name="ca")


__all__ = ["register"]
