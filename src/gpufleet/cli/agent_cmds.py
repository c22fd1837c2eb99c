"""``gpufleet agent``: the node agent.

Its credential: ``--token-file`` (a file only its owner can read, as ssh wants of a
private key), else ``GPUFLEET_AGENT_TOKEN``; ``--token`` on the command line still works
for tests but warns, since every process on the node can read a command line.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from pathlib import Path
from types import FrameType
from urllib.parse import urlsplit

import platformdirs
import typer

from gpufleet.cli._common import BAD_INPUT, fail
from gpufleet.cli.options import flag
from gpufleet.timefmt import parse_duration


def _seconds(value: str, what: str) -> float:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise fail(f"{what}: {exc}", BAD_INPUT) from None


def _local_address(server_url: str) -> str:
    """The address this host uses to reach the server (what peers should dial)."""
    host = urlsplit(server_url).hostname or "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return str(s.getsockname()[0])
    except OSError:
        return socket.gethostname()


def _servers(given: str) -> tuple[str, ...]:
    """``--server``'s URLs: one, or a comma list of one cluster's servers, all http:// or
    all https:// (the agent's credential is a token, or a certificate, for all of them)."""
    from gpufleet.failover import parse_urls

    try:
        urls = parse_urls(given)
    except ValueError as exc:
        raise fail(f"--server: {exc}", BAD_INPUT) from None
    if len({u.split("://")[0] for u in urls}) > 1:
        raise fail("--server: give all http:// or all https:// URLs, not both", BAD_INPUT)
    return urls


def _credential(token_file: Path | None, token: str | None, *, required: bool = True) -> str | None:
    """The node credential, from the file, the flag or the environment, in that order;
    the environment variable is removed so that nothing the agent starts inherits it.
    Not ``required`` when the agent already holds its certificate (mTLS)."""
    from gpufleet.cli.credfile import SecretFlags, secret

    flags = SecretFlags(command="gpufleet agent", env="GPUFLEET_AGENT_TOKEN", what="the node credential")
    return secret(flags, path=token_file, given=token, required=required)


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
        raise fail(f"{what}: expected a size like 512M or 64G, got {value!r}", BAD_INPUT) from None
    if n <= 0:
        raise fail(f"{what}: must be above 0", BAD_INPUT)
    return n


def _features(value: str) -> tuple[str, ...]:
    """``--features a,b``: each a word of letters, digits and ``_.:+-`` (what the server
    takes), refused here rather than at every sync."""
    import re

    names = tuple(f.strip() for f in value.split(",") if f.strip())
    bad = [f for f in names if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.:+-]{0,63}", f)]
    if bad:
        raise fail(f"--features: {bad[0]!r} is not a feature name (letters, digits, _.:+-)", BAD_INPUT)
    if len(names) > 64:
        raise fail("--features: at most 64", BAD_INPUT)
    return names


def _node_memory(value: str | None) -> int | None:
    """``--simulate-memory`` in MiB, read as sbatch reads ``--mem`` (bare = megabytes), so
    a node's memory and a job's request are written alike."""
    if value is None:
        return None
    from gpufleet.slurmopts import parse_mem

    try:
        return parse_mem(value, flag="--simulate-memory")
    except ValueError as exc:
        raise fail(str(exc), BAD_INPUT) from None


def agent(
    server: str = typer.Option(
        ...,
        "--server",
        help="Server URL, e.g. http://10.0.0.1:8080; several (one cluster's servers) as a comma "
        "list, http://a:8080,http://b:8080: the agent uses the one that answered last and moves "
        "to the next when it fails.",
    ),
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
    cpu_only: bool = typer.Option(
        False, "--cpu-only", help="A node without GPUs (a CPU-only pool): no NVML, its CPUs and memory only."
    ),
    gpu_model: str = typer.Option("H100-80GB", "--gpu-model", help="Model of the simulated GPUs."),
    simulate_cpus: int | None = typer.Option(
        None,
        "--simulate-cpus",
        min=1,
        help="CPUs the simulated node reports (a real node's, e.g. 224; default 8 per GPU).",
        show_default=False,
    ),
    simulate_memory: str | None = typer.Option(
        None,
        "--simulate-memory",
        help="Memory the simulated node reports (2T, 1536G, MB bare; default 64G per GPU).",
        show_default=False,
    ),
    simulate_mig: list[str] = typer.Option(
        [],
        "--simulate-mig",
        help="A simulated GPU in MIG mode with these instances: GPU=PROFILES, e.g. 1=3g.40gb,3g.40gb "
        "(repeat for more GPUs; profiles of the --gpu-model in gpufleet's MIG table).",
        show_default=False,
    ),
    mps_pipe_dir: str = typer.Option(
        "",
        "--mps-pipe-dir",
        help="Pipe directory of the node's MPS control daemon (nvidia-cuda-mps-control -d), which "
        "enforces GPU shares' compute and memory limits (default: CUDA's /tmp/nvidia-mps). Without a "
        "daemon, shares run time-sliced and their limits are not enforced.",
        show_default=False,
    ),
    upgrade_hook: list[str] = typer.Option(
        [],
        "--upgrade-hook",
        help="A driver upgrade hook: NAME=/path (repeat). `gpufleet upgrade start --command NAME` runs it "
        "here with the expected driver version as its argument; the only program the server can have "
        "run as root: root-owned, not writable by group/others, checked at start.",
        show_default=False,
    ),
    upgrade_timeout: str = typer.Option("1h", "--upgrade-timeout", help="An upgrade hook is killed then."),
    smoke_user: str = typer.Option(
        "nobody", "--smoke-user", help="Account the GPU smoke check after an upgrade runs as (agent as root)."
    ),
    simulate_driver: str = typer.Option(
        "550.54.15-sim", "--simulate-driver", help="Driver version the simulated node reports."
    ),
    simulate_upgrade_to: str | None = typer.Option(
        None,
        "--simulate-upgrade-to",
        help="Driver the simulated node reports after an upgrade hook (default: the one expected).",
        show_default=False,
    ),
    simulate_smoke_fail: str = typer.Option(
        "", "--simulate-smoke-fail", help="Simulated GPUs whose smoke check fails (0,3).", show_default=False
    ),
    leaf: str | None = typer.Option(None, "--leaf", help="Leaf switch this node hangs off."),
    rack: str | None = typer.Option(None, "--rack"),
    features: str = typer.Option(
        "",
        "--features",
        help="Slurm's node features, comma-separated (ib,nvme,gpu80): what jobs' --constraint matches.",
        show_default=False,
    ),
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
        None,
        "--job-memory-max",
        help="Memory limit of each job (e.g. 64G): its cgroup (v2 or v1) or container.",
    ),
    job_pids_max: int = typer.Option(
        4096, "--job-pids-max", min=1, help="Process limit of each job: its cgroup (v2 or v1) or container."
    ),
    cgroup_root: Path = typer.Option(
        Path("/sys/fs/cgroup/gpufleet"),
        "--cgroup-root",
        help="Parent cgroup of the jobs' cgroups (v2; on cgroup v1 its name under each controller).",
    ),
    job_log_max: str = typer.Option(
        "64M",
        "--job-log-max",
        help="Log kept of each job attempt (past it: one marker line, the rest dropped).",
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
        LogLimits,
        NvmlProbe,
        ProbeError,
        RunAs,
        SimSpec,
        SimulatedProbe,
        UserMap,
        make_agent,
    )
    from gpufleet.agent.probe import GpuProbe, HostProbe

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(message)s")
    servers = _servers(server)
    node = name or socket.gethostname().split(".")[0]
    wd = work_dir or _default_work_dir(node)
    tls = servers[0].startswith("https://")
    pki = cert_dir or wd / "pki"
    held = tls and (pki / "node.crt").exists()
    secret = _credential(token_file, token, required=not held)
    try:
        users = UserMap.load(user_map) if user_map is not None else UserMap()
    except ValueError as exc:
        raise fail(f"--user-map: {exc}", BAD_INPUT) from None
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
        if cpu_only and simulate_gpus:
            raise fail("--cpu-only and --simulate-gpus exclude each other")
        if simulate_mig and not simulate_gpus:
            raise fail("--simulate-mig needs --simulate-gpus", BAD_INPUT)
        if (simulate_cpus is not None or simulate_memory is not None) and not simulate_gpus:
            raise fail("--simulate-cpus and --simulate-memory need --simulate-gpus", BAD_INPUT)
        node_memory_mb = _node_memory(simulate_memory)
        probe = (
            HostProbe()
            if cpu_only
            else SimulatedProbe(
                node=node,
                spec=SimSpec(
                    gpus=simulate_gpus, model=gpu_model, cpus=simulate_cpus, node_memory_mb=node_memory_mb
                ),
                mig=_mig_layouts(simulate_mig, simulate_gpus),
                driver=simulate_driver,
                upgrade_to=simulate_upgrade_to,
                smoke_fails=_indices(simulate_smoke_fail),
            )
            if simulate_gpus
            else NvmlProbe()
        )
    except ProbeError as exc:
        raise fail(str(exc)) from None
    except ValueError as exc:  # a layout the MIG table refuses for this model
        raise fail(f"--simulate-mig: {exc}", BAD_INPUT) from None
    config = AgentConfig(
        node=node,
        work_dir=wd,
        leaf=leaf,
        rack=rack,
        features=_features(features),
        address=address or _local_address(servers[0]),
        sync_interval_s=_seconds(sync_interval, "--sync-interval"),
        grace_s=_seconds(grace, "--grace"),
        checkpoint_root=checkpoint_root,
        mps_pipe_dir=mps_pipe_dir,
        log_limits=LogLimits(max_bytes=_bytes(job_log_max, "--job-log-max")),
        upgrade_hooks=_hooks(upgrade_hook),
        upgrade_timeout_s=_seconds(upgrade_timeout, "--upgrade-timeout"),
        smoke_user=smoke_user,
    )
    if not simulate_gpus and not cpu_only:
        from gpufleet.agent.jobs import mps_running

        if not mps_running(mps_pipe_dir):
            logging.getLogger("gpufleet.agent").warning(
                "no MPS control daemon in %s: jobs on shared GPUs run time-sliced, their compute "
                "and memory limits not enforced (start nvidia-cuda-mps-control -d)",
                mps_pipe_dir or "/tmp/nvidia-mps",
            )
    transport = HttpTransport(servers, secret)
    if tls:
        from gpufleet.agent.enroll import ensure_certificate

        ca = str(ca_file) if ca_file else None
        try:
            cert = ensure_certificate(url=servers, node=node, directory=pki, token=secret, ca_file=ca)
        except AgentTransportError as exc:
            raise fail(str(exc)) from None
        transport = HttpTransport(servers, ca_file=ca, cert=cert)
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
        f"re-adopted {adopted} job(s); server {', '.join(servers)}",
        err=True,
    )
    if not bot.sync_once() and bot.stats.last_status in (401, 403):
        bot.close()
        raise fail(bot.stats.last_error or "credential refused")
    thread = threading.Thread(target=bot.run, args=(stop,), name="gpufleet-agent", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.5)
    bot.close()
    typer.echo("gpufleet agent: stopped (jobs keep running; restart to re-adopt them)", err=True)


__all__ = ["agent"]


def _mig_layouts(specs: list[str], gpus: int) -> dict[int, list[str]]:
    """``--simulate-mig GPU=PROFILES`` values: GPU index -> profile names."""
    from gpufleet.mig import parse_layout

    out: dict[int, list[str]] = {}
    for spec in specs:
        index, sep, profiles = spec.partition("=")
        if not sep or not index.strip().isdigit() or not 0 <= int(index) < gpus:
            raise fail(f"--simulate-mig {spec!r}: expected GPU=PROFILES with GPU 0..{gpus - 1}", BAD_INPUT)
        try:
            out[int(index)] = parse_layout(profiles)
        except ValueError as exc:
            raise fail(f"--simulate-mig {spec!r}: {exc}", BAD_INPUT) from None
    return out


def _hooks(specs: list[str]) -> dict[str, Path]:
    """``--upgrade-hook NAME=/path`` values, each checked (``agent/upgrade.py``): a hook the
    agent cannot trust stops it at start, not at the first upgrade."""
    from gpufleet.agent.upgrade import HookError, parse_hooks

    try:
        return parse_hooks(specs)
    except HookError as exc:
        raise fail(f"--upgrade-hook: {exc}", BAD_INPUT) from None


def _indices(value: str) -> tuple[int, ...]:
    """``--simulate-smoke-fail 0,3``: GPU indices."""
    try:
        return tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise fail(f"--simulate-smoke-fail: expected GPU indices (0,3), got {value!r}", BAD_INPUT) from None
