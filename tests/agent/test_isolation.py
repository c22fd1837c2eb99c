"""Tenant isolation on a node: a job runs as its owner's account with an environment
built from scratch, and cannot reach the agent's credential or another user's job.

The takeover of issue 12, scripted against a real server and a real ``gpufleet agent``
process run as root (as on a GPU server): a job tries to read the agent's environ and
command line, its token file and another user's job directories, and every attempt
fails. Skipped where the suite does not run as root (the agent then cannot switch
accounts, and says so: ``test_an_unprivileged_agent_runs_jobs_as_itself``)."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufleet.agent import (
    Cgroups,
    FakeAccounts,
    JobSpec,
    JobStore,
    Limits,
    PosixAccount,
    ProcessRunner,
    Refusal,
    RunAs,
    UserMap,
)
from gpufleet.agent.users import REFUSED
from jobaccounts import JOB_ACCOUNT, OTHER_ACCOUNT, PYTHON, ROOT, passable, run_as, user_map_file
from server.conftest import Server, make_pool, make_team, ok, unique, wait_for

root_only = pytest.mark.skipif(
    not ROOT, reason="switching accounts needs root (run the suite as root, as CI does)"
)

PROBE = r"""
import os, sys
agent = sys.argv[1]
targets = {
    "agent-environ": f"/proc/{agent}/environ",
    "token-file": sys.argv[2],
    "other-run-dir": sys.argv[3] + "/run/secret.txt",
    "other-log": sys.argv[3] + "/output.log",
    "other-state": sys.argv[3] + "/state.json",
    "other-checkpoint": sys.argv[4] + "/ckpt.txt",
}
print("uid", os.getuid(), os.getgid(), flush=True)
for name, path in targets.items():
    try:
        with open(path, "rb") as f:
            data = f.read()
        print(name, "READ", len(data), flush=True)
    except OSError as exc:
        print(name, "DENIED", type(exc).__name__, flush=True)
for name, path in {"jobs-dir": os.path.dirname(sys.argv[3]), "work-dir": sys.argv[5]}.items():
    try:
        print(name, "LISTED", os.listdir(path), flush=True)
    except OSError as exc:
        print(name, "DENIED", type(exc).__name__, flush=True)
with open(f"/proc/{agent}/cmdline", "rb") as f:
    print("agent-cmdline", f.read().replace(b"\0", b" ").decode(), flush=True)
print("env", sorted(os.environ), flush=True)
print("job-token", os.environ.get("GPUFLEET_TOKEN", "-"), flush=True)
"""

VICTIM = (
    'echo bob-secret > secret.txt; echo bob-ckpt > "$GPUFLEET_CHECKPOINT_DIR/ckpt.txt"; echo ready; sleep 60'
)


def _agent(
    server: Server, work: Path, node: str, token_file: Path, user_map: Path
) -> subprocess.Popen[bytes]:
    args = ["agent", "--server", server.url, "--token-file", str(token_file), "--name", node]
    args += ["--simulate-gpus", "2", "--work-dir", str(work), "--user-map", str(user_map)]
    args += ["--sync-interval", "0.5s", "--grace", "1s", "--address", "127.0.0.1"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    proc = subprocess.Popen([sys.executable, "-m", "gpufleet", *args], env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    with server.client() as c:
        while ok(c.get(f"/nodes/{node}"))["gpus_total"] < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "the agent did not register"
            time.sleep(0.1)
    return proc


def _log(server: Server, job_id: int, token: str) -> str:
    with server.client(token) as c:
        return c.get(f"/jobs/{job_id}/logs").text


@root_only
def test_a_job_cannot_take_over_its_node(server: Server, tmp_path: Path) -> None:
    team, pool, node = make_team(server), make_pool(server), unique("iso")
    with server.client() as c:
        ok(c.put(f"/nodes/{node}", json={"pool": pool, "gpus": []}))
        credential = ok(c.post("/nodes/join-tokens", json={"node": node}), 201)["token"]
        alice, bob = unique("alice"), unique("bob")
        tokens = {
            u: ok(c.post("/users", json={"name": u, "role": "user", "teams": [team]}), 201)["token"]
            for u in (alice, bob)
        }
    passable(tmp_path)
    token_file = tmp_path / "node.token"
    token_file.write_text(credential + "\n")
    token_file.chmod(0o600)
    work = tmp_path / "work"
    proc = _agent(
        server, work, node, token_file, user_map_file(tmp_path, **{alice: JOB_ACCOUNT, bob: OTHER_ACCOUNT})
    )
    try:
        with server.client(tokens[bob]) as c:
            spec = {"command": ["sh", "-c", VICTIM], "pool": pool, "team": team, "env": {"SECRET": "bob-env"}}
            victim = ok(c.post("/jobs", json=spec), 201)["id"]
        wait_for(server, victim, "RUNNING", token=tokens[bob], timeout=30)
        deadline = time.monotonic() + 20
        while "ready" not in _log(server, victim, tokens[bob]):
            assert time.monotonic() < deadline, "the victim job never said ready"
            time.sleep(0.1)
        (victim_dir,) = (work / "jobs").glob(f"{victim}-*")
        argv = [
            str(proc.pid),
            str(token_file),
            str(victim_dir),
            str(work / "checkpoints" / str(victim)),
            str(work),
        ]
        with server.client(tokens[alice]) as c:
            spec = {"command": [PYTHON, "-c", PROBE, *argv], "pool": pool, "team": team}
            probe = ok(c.post("/jobs", json=spec), 201)["id"]
        wait_for(server, probe, "COMPLETED", token=tokens[alice], timeout=30)
        out = dict(
            line.split(" ", 1) for line in _log(server, probe, tokens[alice]).splitlines() if " " in line
        )
        mine = pwd.getpwnam(JOB_ACCOUNT)
        assert out["uid"] == f"{mine.pw_uid} {mine.pw_gid}" and mine.pw_uid != 0
        for target in ("agent-environ", "token-file", "other-run-dir", "other-log", "other-state"):
            assert out[target].startswith("DENIED"), (target, out[target])
        assert out["other-checkpoint"].startswith("DENIED")
        assert out["jobs-dir"].startswith("DENIED") and out["work-dir"].startswith("DENIED")
        assert credential not in out["agent-cmdline"] and "--token-file" in out["agent-cmdline"]
        env = out["env"]
        assert "GPUFLEET_AGENT_TOKEN" not in env and "SECRET" not in env
        # its GPUFLEET_TOKEN is its own credential (issue 31: the Slurm commands a job
        # calls), never the node's
        assert out["job-token"].startswith("gfj.") and credential not in out["job-token"]
        # bob's job ran as bob's account and its files are his
        victim_run = victim_dir / "run" / "secret.txt"
        assert victim_run.stat().st_uid == pwd.getpwnam(OTHER_ACCOUNT).pw_uid
        assert (victim_dir / "output.log").stat().st_mode & 0o077 == 0
        with server.client(tokens[bob]) as c:
            ok(c.post(f"/jobs/{victim}/cancel"))
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    assert b"warning: --token" not in err


@pytest.mark.parametrize(
    ("owner", "users", "want"),
    [
        ("alice", UserMap(), "alice:1001"),
        ("alice", UserMap(entries={"alice": "asmith"}), "asmith:1002"),
        ("mallory", UserMap(), "refused:no POSIX account 'mallory'"),
        ("mallory", UserMap(fallback="nobody"), "nobody:65534"),
        ("eve", UserMap(entries={"eve": "root"}), "refused:jobs never run as root"),
        ("root", UserMap(), "refused:jobs never run as root"),
        ("bad\x00name", UserMap(), "refused:no POSIX account"),
    ],
    ids=["same-name", "mapped", "no-account", "fallback", "maps-to-root", "named-root", "nul-in-name"],
)
def test_a_root_agent_resolves_the_owner_account(owner: str, users: UserMap, want: str) -> None:
    accounts = FakeAccounts(
        (
            PosixAccount(name="root", uid=0, gid=0),
            PosixAccount(name="alice", uid=1001, gid=1001),
            PosixAccount(name="asmith", uid=1002, gid=1002),
            PosixAccount(name="nobody", uid=65534, gid=65534),
        )
    )
    got = RunAs(accounts=accounts, users=users, euid=lambda: 0).resolve(owner)
    if isinstance(got, Refusal):
        kind, text = want.split(":", 1)
        assert kind == "refused" and text in got.reason
    else:
        assert f"{got.name}:{got.uid}" == want


def test_an_unprivileged_agent_runs_jobs_as_itself() -> None:
    accounts = FakeAccounts((PosixAccount(name="me", uid=1000, gid=1000),))
    run_as = RunAs(accounts=accounts, users=UserMap(entries={"alice": "asmith"}), euid=lambda: 1000)
    got = run_as.resolve("alice")
    assert isinstance(got, PosixAccount) and got.name == "me" and not run_as.privileged
    assert "not root" in run_as.note


@root_only
def test_a_refused_owner_fails_with_the_reason_in_its_log(tmp_path: Path) -> None:
    runner = ProcessRunner(JobStore(tmp_path / "work"), node="n1", run_as=RunAs(node="n1"))
    spec = JobSpec(job_id=5, attempt=1, command=("true",), user="no-such-account-here")
    job = runner.start(spec, now=0.0)
    assert job.exit_code == REFUSED and job.pid is None
    assert "no POSIX account 'no-such-account-here'" in job.log_path.read_text()


@pytest.mark.parametrize(
    ("mode", "content", "want"),
    [
        (0o644, "secret\n", "readable by others: chmod 600"),
        (0o600, "\n", "is empty"),
        (None, "", "cannot read"),
    ],
    ids=["world-readable", "empty", "missing"],
)
def test_the_agent_refuses_an_unsafe_token_file(
    tmp_path: Path, mode: int | None, content: str, want: str
) -> None:
    path = tmp_path / "token"
    if mode is not None:
        path.write_text(content)
        path.chmod(mode)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufleet",
            "agent",
            "--server",
            "http://127.0.0.1:9",
            "--token-file",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and want in done.stderr


def _cgroupfs(tmp_path: Path) -> Path:
    """A directory laid out like a cgroup v2 mount (what ``Cgroups`` reads and writes)."""
    mount = tmp_path / "cgroup"
    mount.mkdir()
    (mount / "cgroup.controllers").write_text("cpu memory pids\n")
    (mount / "cgroup.subtree_control").write_text("")
    return mount


@pytest.mark.parametrize(
    ("limits", "files"),
    [
        (Limits(memory_max_bytes=1 << 30, pids_max=64), {"memory.max": "1073741824", "pids.max": "64"}),
        (Limits(), {"pids.max": "4096"}),
    ],
    ids=["memory-and-pids", "default-pids-only"],
)
def test_a_job_cgroup_gets_its_limits_and_is_removed(
    tmp_path: Path, limits: Limits, files: dict[str, str]
) -> None:
    mount = _cgroupfs(tmp_path)
    groups = Cgroups(mount / "gpufleet", mount=mount)
    assert groups.mode == "v2"
    made = groups.create(7, 3, limits, node="n1")
    path = mount / "gpufleet" / "n1-job-7-3"
    assert made == str(path)
    assert {f.name: f.read_text().strip() for f in path.iterdir()} == files
    assert "+memory" in (mount / "gpufleet" / "cgroup.subtree_control").read_text()
    groups.remove(made)
    assert not path.exists()


def test_no_cgroup_hierarchy_means_no_cgroup_and_a_reason(tmp_path: Path) -> None:
    groups = Cgroups(tmp_path / "gpufleet", mount=tmp_path)
    assert groups.mode == "none"
    assert groups.create(1, 1, Limits()) is None
    assert groups.disabled_reason is not None and "no cgroup hierarchy" in groups.disabled_reason


def _cgroupfs_v1(tmp_path: Path, controllers: tuple[str, ...] = ("memory", "pids", "freezer")) -> Path:
    """A directory laid out like a cgroup v1 mount: one directory per controller."""
    mount = tmp_path / "cgroup"
    for c in controllers:
        (mount / c).mkdir(parents=True)
        (mount / c / "cgroup.procs").write_text("")
    return mount


@pytest.mark.parametrize(
    ("controllers", "limits", "want", "reason"),
    [
        (
            ("memory", "pids", "freezer"),
            Limits(memory_max_bytes=1 << 28, pids_max=64),
            {"memory": {"memory.limit_in_bytes": "268435456"}, "pids": {"pids.max": "64"}, "freezer": {}},
            None,
        ),
        (
            ("memory", "pids", "freezer"),
            Limits(),
            {"memory": {}, "pids": {"pids.max": "4096"}, "freezer": {}},
            None,
        ),
        (
            ("pids", "freezer"),
            Limits(memory_max_bytes=1 << 28),
            {"pids": {"pids.max": "4096"}, "freezer": {}},
            "memory",
        ),
    ],
    ids=["v1-memory-and-pids", "v1-default-pids-only", "v1-without-memory-says-so"],
)
def test_a_v1_job_cgroup_has_one_directory_per_controller(
    tmp_path: Path,
    controllers: tuple[str, ...],
    limits: Limits,
    want: dict[str, dict[str, str]],
    reason: str | None,
) -> None:
    mount = _cgroupfs_v1(tmp_path, controllers)
    groups = Cgroups(mount / "gpufleet", mount=mount)
    assert groups.mode == "v1"
    made = groups.create(7, 3, limits, node="n1")
    dirs = {c: mount / c / "gpufleet" / "n1-job-7-3" for c in want}
    assert made == os.pathsep.join(str(d) for d in dirs.values())
    assert {c: {f.name: f.read_text().strip() for f in d.iterdir()} for c, d in dirs.items()} == want
    if reason is None:
        assert groups.disabled_reason is None
    else:
        assert groups.disabled_reason is not None and reason in groups.disabled_reason
    groups.remove(made)
    assert not any(d.exists() for d in dirs.values())


def test_the_wrapper_puts_the_job_in_its_cgroup(tmp_path: Path) -> None:
    passable(tmp_path)
    mount = _cgroupfs(tmp_path)
    store = JobStore(tmp_path / "work")
    runner = ProcessRunner(
        store, node="n1", run_as=run_as(), cgroups=Cgroups(mount / "gpufleet", mount=mount)
    )
    job = runner.start(JobSpec(job_id=4, attempt=2, command=("true",), user="someone"), now=0.0)
    assert job.cgroup == str(mount / "gpufleet" / "n1-job-4-2")
    deadline = time.monotonic() + 10
    while runner.poll(job, now=0.0) is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    procs = (Path(job.cgroup) / "cgroup.procs").read_text().split()
    assert procs == [str(job.pid)]  # the wrapper joined before it started the job
    runner.release(job)
    assert not Path(job.cgroup).exists()
