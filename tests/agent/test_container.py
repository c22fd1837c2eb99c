"""Container jobs: the container's shape as data (``container_spec`` under a
``ContainerPolicy``: who it runs as, limits, root filesystem, networking) and the runner
against the in-package ``FakeDocker`` (per-job network created and removed, refusals,
a missing engine). A real engine is used only where one runs."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gpufleet.agent.container import (
    ContainerPolicy,
    ContainerRunner,
    ContainerSpec,
    container_spec,
    load_docker,
)
from gpufleet.agent.fakedocker import FakeDocker
from gpufleet.agent.jobs import JobSpec, JobStore, Peer
from gpufleet.agent.users import FakeAccounts, PosixAccount, Refusal, RunAs

ALICE = PosixAccount(name="alice", uid=1001, gid=1001, groups=(44, 0, 1001, 2000), home="/home/alice")
OWNER = PosixAccount(name="alice", uid=os.getuid() or 1001, gid=os.getgid() or 1001)
"""For the runner, which chowns the job's dirs to it: this user's ids unless root."""
PRESENT = frozenset({"/dev/nvidiactl", "/dev/nvidia-uvm"})


def job(job_id: int = 31, *, nodes: int = 1, rank: int = 0, **kw: object) -> JobSpec:
    peers = tuple(Peer(node=f"n{i}", address=f"10.0.0.{i}", gpus=(0,)) for i in range(nodes))
    base: dict[str, object] = {
        "command": ("python", "train.py"),
        "image": "pytorch:24.01",
        "gpus": (2, 5),
        "user": "alice",
        "peers": peers if nodes > 1 else (),
        "node_rank": rank,
    }
    return JobSpec(job_id=job_id, attempt=1, **(base | kw))  # type: ignore[arg-type]


def build(
    spec: JobSpec | None = None,
    *,
    account: PosixAccount | None = ALICE,
    policy: ContainerPolicy | None = None,
) -> ContainerSpec | Refusal:
    return container_spec(
        spec or job(),
        node="n1",
        job_dir=Path("/w/jobs/31-1"),
        checkpoint_dir=Path("/w/ck/31"),
        device_exists=PRESENT.__contains__,
        account=account,
        policy=policy or ContainerPolicy(),
    )


def built(spec: JobSpec | None = None, **kw: object) -> ContainerSpec:
    cs = build(spec, **kw)  # type: ignore[arg-type]
    assert isinstance(cs, ContainerSpec), cs
    return cs


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    return JobStore(tmp_path / "work")


def run_as(*accounts: PosixAccount) -> RunAs:
    return RunAs(accounts=FakeAccounts(accounts), euid=lambda: 0, node="n1")


# -- who the container runs as ------------------------------------------------------------------

ALLOW = ContainerPolicy(allow_user=True)


@pytest.mark.parametrize(
    ("override", "account", "policy", "want"),
    [
        (None, ALICE, ContainerPolicy(), ("1001:1001", ("44", "2000"))),
        (None, None, ContainerPolicy(), ("65534:65534", ())),
        ("   ", ALICE, ContainerPolicy(), ("1001:1001", ("44", "2000"))),
        ("0:0", ALICE, ContainerPolicy(), "is not allowed on this node"),
        ("1000:1000", ALICE, ContainerPolicy(), "is not allowed on this node"),
        ("0:0", ALICE, ALLOW, "never run as root"),
        ("root", ALICE, ALLOW, "never run as root"),
        ("1000:root", None, ALLOW, "never run as root"),
        ("1000:0", None, ALLOW, "never run as root"),
        ("000:1000", None, ALLOW, "never run as root"),
        ("1000", None, ALLOW, "expected numeric uid:gid"),
        ("alice:alice", None, ALLOW, "expected numeric uid:gid"),
        ("99999999999:1000", None, ALLOW, "expected numeric uid:gid"),
        ("4294967295:1000", None, ALLOW, "out of range"),
        ("1000:1000", ALICE, ALLOW, ("1000:1000", ())),
        (None, PosixAccount(name="toor", uid=0, gid=0), ContainerPolicy(), "never run as root"),
    ],
    ids=[
        "owner-uid-gid-and-groups",
        "nobody-without-account",
        "blank-override-is-unset",
        "root-override-refused-without-allow-user",
        "any-override-refused-without-allow-user",
        "root-override-refused-with-allow-user",
        "root-name-refused",
        "root-group-name-refused",
        "gid-0-refused",
        "zero-padded-uid-0-refused",
        "bare-uid-refused-gets-gid-0-in-image",
        "names-refused-image-passwd",
        "too-many-digits",
        "no-change-id",
        "allowed-non-root-override",
        "root-account-refused",
    ],
)
def test_container_user(
    override: str | None,
    account: PosixAccount | None,
    policy: ContainerPolicy,
    want: tuple[str, tuple[str, ...]] | str,
) -> None:
    env = {} if override is None else {"GPUFLEET_CONTAINER_USER": override}
    cs = build(job(env=env), account=account, policy=policy)
    if isinstance(want, str):
        assert isinstance(cs, Refusal) and want in cs.reason
    else:
        assert isinstance(cs, ContainerSpec), cs
        assert (cs.user, cs.group_add) == want
        kw = cs.docker_kwargs()
        assert kw["user"] == want[0] and kw.get("group_add", []) == list(want[1])


# -- what holds whatever the policy ------------------------------------------------------------

POLICIES = {
    "default": ContainerPolicy(),
    "permissive": ContainerPolicy(
        allowed_caps=("IPC_LOCK",), allow_user=True, host_network=True, runtime="nvidia"
    ),
    "locked-down": ContainerPolicy(pids_max=256, memory_max_bytes=2**30, cpus=1.0, read_only_rootfs=True),
}


@pytest.mark.parametrize("policy", POLICIES.values(), ids=POLICIES.keys())
@pytest.mark.parametrize("nodes", [1, 2], ids=["single-node", "multi-node"])
def test_container_is_never_privileged_and_sees_only_its_gpus(policy: ContainerPolicy, nodes: int) -> None:
    kw = built(job(nodes=nodes), policy=policy).docker_kwargs()
    assert kw["privileged"] is False
    assert kw["security_opt"] == ["no-new-privileges"]
    assert kw["cap_drop"] == ["ALL"] and kw.get("cap_add", []) == list(policy.allowed_caps)
    assert kw["devices"] == [
        "/dev/nvidia2:/dev/nvidia2:rwm",
        "/dev/nvidia5:/dev/nvidia5:rwm",
        "/dev/nvidiactl:/dev/nvidiactl:rwm",
        "/dev/nvidia-uvm:/dev/nvidia-uvm:rwm",
    ]
    assert kw["pids_limit"] == policy.pids_max
    assert not (kw.get("network") and kw.get("network_mode"))  # the SDK refuses both
    assert kw["user"] != "0" and not kw["user"].startswith("0:")


def test_container_env_volumes_and_name() -> None:
    cs = built(policy=ContainerPolicy(runtime="nvidia"))
    kw = cs.docker_kwargs()
    env = kw["environment"]
    assert env["NVIDIA_VISIBLE_DEVICES"] == "2,5" and env["GPUFLEET_CHECKPOINT_DIR"] == "/checkpoint"
    assert "PATH" not in env  # the image brings its own
    assert kw["volumes"] == {
        "/w/jobs/31-1/run": {"bind": "/work", "mode": "rw"},
        "/w/ck/31": {"bind": "/checkpoint", "mode": "rw"},
    }
    assert (kw["name"], kw["command"], kw["working_dir"], kw["runtime"]) == (
        "gpufleet-n1-31-1",
        ["python", "train.py"],
        "/work",
        "nvidia",
    )


def test_a_service_replica_publishes_its_port_on_the_nodes_port() -> None:
    """The agent gave the replica node port 41234 ($PORT, GPUFLEET_HOST_PORT); the model
    server inside listens on the spec's port (GPUFLEET_SERVICE_PORT): published there,
    and $PORT inside is the container's own port."""
    env = {"GPUFLEET_SERVICE_PORT": "8000", "GPUFLEET_HOST_PORT": "41234", "PORT": "41234"}
    kw = built(job(env=env)).docker_kwargs()
    assert kw["ports"] == {"8000/tcp": 41234}
    assert kw["environment"]["PORT"] == "8000"
    assert not built(job()).docker_kwargs().get("ports")  # a batch job publishes nothing


# -- limits and root filesystem ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "want"),
    [
        (
            ContainerPolicy(),
            {"pids_limit": 4096, "mem_limit": None, "memswap_limit": None, "nano_cpus": None},
        ),
        (ContainerPolicy(pids_max=512), {"pids_limit": 512}),
        (ContainerPolicy(memory_max_bytes=8 * 2**30), {"mem_limit": 8 * 2**30, "memswap_limit": 8 * 2**30}),
        (ContainerPolicy(cpus=2.5), {"nano_cpus": 2_500_000_000}),
        (ContainerPolicy(), {"read_only": False, "tmpfs": None}),
        (ContainerPolicy(read_only_rootfs=True), {"read_only": True, "tmpfs": {"/tmp": "rw,nosuid,nodev"}}),
    ],
    ids=["default-pids-only", "pids", "memory-no-extra-swap", "cpus", "rootfs-writable", "rootfs-read-only"],
)
def test_limits_and_root_filesystem(policy: ContainerPolicy, want: dict[str, object]) -> None:
    kw = built(policy=policy).docker_kwargs()
    assert {k: kw.get(k) for k in want} == want


@pytest.mark.parametrize(
    "bad",
    [{"pids_max": 0}, {"memory_max_bytes": 0}, {"cpus": 0.0}, {"cpus": float("nan")}],
    ids=["pids-0", "memory-0", "cpus-0", "cpus-nan"],
)
def test_policy_rejects_meaningless_limits(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ContainerPolicy(**bad)  # type: ignore[arg-type]


# -- networking --------------------------------------------------------------------------------

JOB_NET = "gpufleet-n1-31-1"


@pytest.mark.parametrize(
    ("nodes", "rank", "policy", "want"),
    [
        (1, 0, ContainerPolicy(), (None, None, False, {})),
        (1, 0, ContainerPolicy(host_network=True, network="fabric"), (None, None, False, {})),
        (2, 0, ContainerPolicy(), (None, JOB_NET, True, {"29500/tcp": 29500})),
        (2, 1, ContainerPolicy(), (None, JOB_NET, True, {})),
        (2, 1, ContainerPolicy(network="fabric"), (None, "fabric", False, {})),
        (2, 0, ContainerPolicy(host_network=True), ("host", None, False, {})),
        (2, 0, ContainerPolicy(host_network=True, network="fabric"), (None, "fabric", False, {})),
    ],
    ids=[
        "single-node-default-bridge",
        "single-node-ignores-network-policy",
        "multi-node-own-bridge-rank0-publishes-master-port",
        "multi-node-own-bridge-rank1",
        "multi-node-operator-network",
        "multi-node-host-by-policy-only",
        "multi-node-operator-network-wins",
    ],
)
def test_networking(
    nodes: int, rank: int, policy: ContainerPolicy, want: tuple[str | None, str | None, bool, dict[str, int]]
) -> None:
    cs = built(job(nodes=nodes, rank=rank), policy=policy)
    assert (cs.network_mode, cs.network, cs.job_network is not None, dict(cs.ports)) == want
    if cs.job_network is not None:
        assert cs.job_network.docker_kwargs() == {
            "name": JOB_NET,
            "driver": "bridge",
            "labels": {"gpufleet.job": "31", "gpufleet.attempt": "1", "gpufleet.node": "n1"},
        }


# -- the runner, against FakeDocker -------------------------------------------------------------


def test_runner_creates_the_job_network_first_and_removes_it_after(store: JobStore) -> None:
    fake = FakeDocker()
    runner = ContainerRunner(store, node="n1", run_as=run_as(OWNER), client=fake)
    j = runner.start(job(nodes=2), now=0.0)  # the fake refuses a container on a missing network
    assert j.exit_code is None and j.container == JOB_NET
    c = fake.ran[JOB_NET]
    assert c.kwargs["network"] == JOB_NET and c.kwargs["user"] == f"{OWNER.uid}:{OWNER.gid}"
    assert (j.path / "run").stat().st_uid == OWNER.uid  # /work is the owner's
    assert fake.made[JOB_NET].attrs["Labels"]["gpufleet.job"] == "31"
    assert runner.poll(j, now=1.0) is None
    c.exit_code, c.output = 0, b"done\n"
    assert runner.poll(j, now=2.0) == 0 and j.log_path.read_text() == "done\n"
    runner.release(j)
    assert c.removed and fake.made[JOB_NET].removed


def test_unprivileged_agent_runs_containers_as_itself(store: JobStore) -> None:
    fake = FakeDocker()
    me = RunAs(accounts=FakeAccounts((ALICE,)), euid=lambda: ALICE.uid, node="n1")
    j = ContainerRunner(store, node="n1", run_as=me, client=fake).start(job(user="bob"), now=0.0)
    assert j.exit_code is None and fake.ran[JOB_NET].kwargs["user"] == "1001:1001"
    assert j.log_path.stat().st_mode & 0o777 == 0o600


def test_hostfile_copy_never_follows_a_link_in_the_owners_dir(store: JobStore, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    run = store.job_dir(31, 1) / "run"
    run.mkdir(parents=True)
    (run / ".gpufleet-hostfile").symlink_to(victim)
    j = ContainerRunner(store, node="n1", client=FakeDocker()).start(job(nodes=2), now=0.0)
    assert j.exit_code is None and victim.read_text() == "precious"
    assert (run / ".gpufleet-hostfile").read_text() == "10.0.0.0 slots=1\n10.0.0.1 slots=1\n"


def test_runner_leaves_the_operators_network_alone(store: JobStore) -> None:
    fake = FakeDocker()
    fake.networks.create("fabric", driver="macvlan")
    runner = ContainerRunner(store, node="n1", policy=ContainerPolicy(network="fabric"), client=fake)
    j = runner.start(job(nodes=2), now=0.0)
    assert j.exit_code is None and fake.ran[JOB_NET].kwargs["network"] == "fabric"
    runner.release(j)
    assert fake.ran[JOB_NET].removed and not fake.made["fabric"].removed
    assert set(fake.made) == {"fabric"}


def test_runner_stops_with_sigterm_then_sigkill(store: JobStore) -> None:
    fake = FakeDocker()
    runner = ContainerRunner(store, node="n1", client=fake)
    j = runner.start(job(), now=0.0)
    j = runner.stop(j, now=10.0, grace_s=30.0)
    j = runner.stop(j, now=20.0, grace_s=30.0)
    j = runner.stop(j, now=40.0, grace_s=30.0)
    assert fake.ran[JOB_NET].kills == ["SIGTERM", "SIGKILL"] and j.killed


@pytest.mark.parametrize(
    ("spec", "runas", "fake", "want_code", "want_log"),
    [
        (job(user="mallory"), run_as(OWNER), FakeDocker(), 126, "no POSIX account 'mallory'"),
        (job(env={"GPUFLEET_CONTAINER_USER": "0:0"}), None, FakeDocker(), 126, "is not allowed on this node"),
        (job(), None, None, 125, "no Docker engine"),
        (
            job(nodes=2),
            None,
            FakeDocker(fail_run="no such image"),
            125,
            "cannot start container: no such image",
        ),
    ],
    ids=["owner-without-account", "root-override", "engine-missing", "run-fails"],
)
def test_runner_fails_the_job_with_its_reason(
    store: JobStore,
    spec: JobSpec,
    runas: RunAs | None,
    fake: FakeDocker | None,
    want_code: int,
    want_log: str,
) -> None:
    class NoEngine(ContainerRunner):
        @property
        def client(self) -> FakeDocker | None:
            return fake

    runner = NoEngine(store, node="n1", run_as=runas, client=fake)
    j = runner.start(spec, now=0.0)
    assert j.exit_code == want_code and runner.poll(j, now=1.0) == want_code
    assert want_log in j.log_path.read_text()
    runner.release(j)
    if fake is not None:
        assert not [c for c in fake.ran.values() if not c.removed]
        assert not [n for n in fake.made.values() if not n.removed]


def test_runner_never_raises_for_a_broken_job_dir(store: JobStore) -> None:
    d = store.job_dir(31, 1)
    d.parent.mkdir(parents=True, exist_ok=True)
    d.write_text("not a directory")
    runner = ContainerRunner(store, node="n1", client=FakeDocker())
    j = runner.start(job(), now=0.0)
    assert j.exit_code == 125
    runner.release(j)


def test_container_runs_on_a_real_engine(store: JobStore) -> None:
    client = load_docker()
    if client is None:
        pytest.skip("no Docker engine on this machine: container jobs are tested as data only")
    runner = ContainerRunner(store, node="n1", client=client)
    s = job(33, command=("sh", "-c", "id -u; echo $NVIDIA_VISIBLE_DEVICES"), image="busybox", gpus=())
    j = runner.start(s, now=0.0)
    deadline = time.monotonic() + 60
    code = None
    while code is None and time.monotonic() < deadline:
        code = runner.poll(j, now=0.0)
        time.sleep(0.2)
    runner.release(j)
    assert code == 0 and j.log_path.read_text().split()[0] == "65534"
