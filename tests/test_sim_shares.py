"""Fractional jobs (``gpu_milli`` < 1000) replayed as GPU shares through the scheduling
core (``gpufleet.sim.shares``): the fleet shows shared GPUs as the server does, several
shares run on one GPU at once, whole-GPU jobs never get a shared GPU, and the report's
capacity figures (allocated share, fragmentation on shared GPUs, FGD's unallocated share
at the first failure) come out as computed by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from gpufleet.scheduler import make_policy
from gpufleet.sim import FleetSpec, SimConfig, SimResult, Simulator, TraceJob
from gpufleet.sim.loaders import load_trace
from gpufleet.sim.shares import fractional_peak_units, shared_gpu_count
from gpufleet.sim.trace import offered_load

SAMPLE = Path(__file__).parent / "data" / "openb_pod_list_sample.csv"
HEADER = "job_id,user,team,submit_s,duration_s,gpus,gpus_per_node,time_limit_s,priority,gpu_type,gpu_milli"

HAND_MADE = """\
w,u,t,0,100,1,0,,0,,
a,u,t,0,100,1,0,,0,,500
b,u,t,0,50,1,0,,0,,250
c,u,t,10,40,1,0,,0,,500
"""
"""On 1 node x 3 GPUs, GPU 2 shared (``shared_gpus`` 1): at 0, w takes a whole GPU, a and b
50 + 25 units of GPU 2; c (50 units) arrives at 10 and does not fit (the first failure:
1.75 of 3 GPUs allocated); b ends at 50 and c starts in its place (GPU 2 full); c ends at
90; w and a end at 100."""


def trace(tmp_path: Path, rows: str) -> list[TraceJob]:
    path = tmp_path / "trace.csv"
    path.write_text(f"{HEADER}\n{rows}")
    loaded = load_trace(path, "gpufleet")
    assert loaded.problems == []
    return loaded.jobs


def replay(
    jobs: list[TraceJob], spec: FleetSpec, policy: str = "fifo", **cfg: float
) -> tuple[Simulator, SimResult]:
    config = SimConfig(sched_interval_s=1.0, **cfg)  # type: ignore[arg-type]
    sim = Simulator(jobs, spec.build(), make_policy(policy), config, record=True)
    return sim, sim.run()


def starts(sim: Simulator) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Job -> (node, devices) of its (last) start."""
    return {job: (p[0].node, p[0].gpus) for _, what, job, p in sim.log if what == "start" and p}


def test_the_fleet_shows_shared_gpus_as_the_servers_inventory_does() -> None:
    """The reference: the server's own builder over the rows of the same servers, the
    last three GPUs marked shared."""
    from gpufleet.server.services.inventory import _build  # the server's node building

    spec = FleetSpec(nodes=2, gpus_per_node=4, shared_gpus=3)
    nodes = tuple(
        (f"node-{i:04d}", "default", "leaf-000", "rack-000", False, 1.0, 0, 0, None, frozenset())
        for i in range(2)
    )  # (name, pool, leaf, rack, cordoned, last seen, cpus, memory, cuda, features)
    gpus = tuple(
        (f"node-{i:04d}", g, spec.gpu_model, 81_920, 0, True, False, None, i * 4 + g >= 5)
        for i in range(2)
        for g in range(4)
    )
    server, skipped = _build(nodes, gpus, live_since=0.0)
    assert skipped == {}
    assert spec.build() == server
    assert [n.name for n in server.nodes] == [
        "node-0000", "node-0001", "node-0001:share1", "node-0001:share2", "node-0001:share3",
    ]  # fmt: skip


def most_at_once(sim: Simulator, node: str) -> int:
    """The most jobs that held devices of ``node`` at one time (from the start/stop log)."""
    now = most = 0
    for _, what, _, placement in sim.log:
        if any(p.node == node for p in placement):
            now += 1 if what == "start" else -1
            most = max(most, now)
    return most


def test_fractional_jobs_share_one_gpu_and_whole_jobs_never_get_it(tmp_path: Path) -> None:
    """w2 takes the last whole GPU at 1; w3 (at 2) waits for it to end at 11, though GPU 2
    is only partly held."""
    jobs = trace(tmp_path, HAND_MADE + "w2,u,t,1,10,1,0,,0,,\nw3,u,t,2,10,1,0,,0,,\n")
    sim, result = replay(jobs, FleetSpec(nodes=1, gpus_per_node=3, shared_gpus=1))
    placed = starts(sim)
    units = {job: len(devices) for job, (node, devices) in placed.items() if node == "node-0000:share2"}
    assert units == {"a": 50, "b": 25, "c": 50}
    assert most_at_once(sim, "node-0000:share2") == 2  # a with b, then a with c
    for job in ("w", "w2", "w3"):
        node, devices = placed[job]
        assert node == "node-0000" and len(devices) == 1 and devices[0] in (0, 1)
    assert [t for t, what, job, _ in sim.log if what == "start" and job in ("c", "w3")] == [11.0, 50.0]
    assert sorted(o.job_id for o in result.outcomes) == ["a", "b", "c", "w", "w2", "w3"]


def test_a_whole_job_that_only_a_shared_gpu_could_hold_is_rejected(tmp_path: Path) -> None:
    jobs = trace(tmp_path, "big,u,t,0,10,3,0,,0,,\ns,u,t,0,10,1,0,,0,,100\n")
    _, result = replay(jobs, FleetSpec(nodes=1, gpus_per_node=3, shared_gpus=1))
    assert [job for job, _ in result.rejected] == ["big"]
    assert [o.job_id for o in result.outcomes] == ["s"]


def test_capacity_figures_by_hand(tmp_path: Path) -> None:
    _, result = replay(trace(tmp_path, HAND_MADE), FleetSpec(nodes=1, gpus_per_node=3, shared_gpus=1))
    # allocated: 1.75 GPUs for 50 s, 2 for 40 s, 1.5 for 10 s, of 3 GPUs for 100 s
    # free: 1.25 then 1 then 1.5; of it on GPU 2 partly held: 0.25, 0, 0.5
    assert result.capacity() == pytest.approx(
        {
            "allocated_share": (1.75 * 50 + 2 * 40 + 1.5 * 10) / 300,
            "shared_fragmentation": (0.25 * 50 + 0.5 * 10) / (1.25 * 50 + 1 * 40 + 1.5 * 10),
            "unallocated_at_first_failure": 1 - 1.75 / 3,
            "first_failure_s": 10.0,
        }
    )
    assert result.metrics()["utilization"] == pytest.approx(2 / 3)  # GPU 0 and GPU 2 occupied


def test_without_shared_gpus_a_fraction_takes_a_whole_gpu(tmp_path: Path) -> None:
    sim, result = replay(trace(tmp_path, HAND_MADE), FleetSpec(nodes=1, gpus_per_node=3))
    assert all(node == "node-0000" and len(d) == 1 for node, d in starts(sim).values())
    c = result.capacity()
    assert c["shared_fragmentation"] is None
    assert c["allocated_share"] == pytest.approx(result.metrics()["utilization"])
    assert c["first_failure_s"] == 10.0  # w, a, b hold all three GPUs: c waits


def traced(i: int, *, milli: int) -> TraceJob:
    return TraceJob(
        job_id=str(i),
        user="u",
        team="t",
        submit_s=30.0 * i,
        duration_s=600.0 + 37 * (i % 7),
        gpus=1,
        gpu_milli=milli,
    )


def test_a_failed_shared_gpu_takes_its_shares_down_and_nothing_is_lost() -> None:
    jobs = [traced(i, milli=(100, 250, 400, 700, 1000)[i % 5]) for i in range(60)]
    spec = FleetSpec(nodes=2, gpus_per_node=2, shared_gpus=3)
    sim, result = replay(
        jobs, spec, "las", gpu_failures_per_gpu_day=40.0, node_failures_per_node_day=10.0, repair_s=300.0
    )
    assert result.failures_injected > 0 and sum(o.failures for o in result.outcomes) > 0
    # jobs end on whole seconds here; a failure (any time) stopped several shares of one GPU
    stops = Counter((t, p[0].node) for t, what, _, p in sim.log if what == "stop" and p[0].node in sim.shared)
    assert max(n for (t, _), n in stops.items() if t % 1) > 1
    assert sorted(o.job_id for o in result.outcomes) == sorted(j.job_id for j in jobs)
    held: dict[tuple[str, int], str] = {}
    for _, what, job, placement in sim.log:  # no device is ever held twice
        for key in ((p.node, g) for p in placement for g in p.gpus):
            if what == "start":
                assert held.setdefault(key, job) == job
            else:
                assert held.pop(key) == job
    assert not held and sim.meter.allocated == 0 and sim.meter.stranded == 0 and sim.busy == 0


@pytest.mark.parametrize(
    ("value", "rows", "want"),
    [
        ("auto", "w,u,t,0,10,1,0,,0,,\n", 0),  # no fractions: nothing shared, the run as before
        ("auto", "a,u,t,0,10,1,0,,0,,300\nb,u,t,5,10,1,0,,0,,800\n", 4),  # 110 units: 2 GPUs, 1 node
        ("auto", "a,u,t,0,10,1,0,,0,,300\nb,u,t,10,10,1,0,,0,,800\n", 4),  # never at once: 1 GPU
        ("auto", "a,u,t,0,10,1,0,,0,,300\nw,u,t,0,10,6,0,,0,,\n", 2),  # the 6-GPU job keeps 6
        ("auto", "a,u,t,0,10,1,0,,0,,300\nw,u,t,0,10,8,0,,0,,\n", 1),  # at least one
        ("all", "w,u,t,0,10,1,0,,0,,\n", 8),
        ("3", "w,u,t,0,10,1,0,,0,,\n", 3),
    ],
    ids=["no-fractions", "peak-110-units", "one-at-a-time", "widest-whole-job", "at-least-one", "all", "n"],
)
def test_shared_gpu_count(tmp_path: Path, value: str, rows: str, want: int) -> None:
    assert shared_gpu_count(value, trace(tmp_path, rows), nodes=2, gpus_per_node=4) == want


@pytest.mark.parametrize(
    ("value", "message"), [("9", "the fleet has 8"), ("-1", "the fleet has 8"), ("x", "auto")]
)
def test_shared_gpu_count_refuses(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        shared_gpu_count(value, [], nodes=2, gpus_per_node=4)


def test_openb_sample_replays_with_shares() -> None:
    jobs = load_trace(SAMPLE, "openb").jobs
    assert fractional_peak_units(jobs) == 166
    count = shared_gpu_count("auto", jobs, nodes=1, gpus_per_node=4)
    assert count == 1  # the 8-GPU pod asks more than the fleet: one GPU still shared
    sim, result = replay(jobs, FleetSpec(nodes=1, gpus_per_node=4, shared_gpus=count), "default")
    rejected = dict(result.rejected)
    assert "no schedulable T4 SHARED GPUs" in rejected["openb-pod-0002"]  # the fleet is H100s
    fractional = {j.job_id: j.gpu_milli for j in jobs if j.gpu_milli < 1000 and j.job_id not in rejected}
    placed = starts(sim)
    assert {job: placed[job] for job in fractional} == {
        job: ("node-0000:share3", placed[job][1]) for job in fractional
    }
    assert {job: len(placed[job][1]) for job in fractional} == {
        job: -(-m // 10) for job, m in fractional.items()
    }
    assert offered_load(jobs, 4, shares=True) < offered_load(jobs, 4)
    # at 150 pod 9 (LS, 50 units) preempts pod 3 (Burstable, 10), which then waits: not
    # a new job; at 350 pod 27 (10 units) finds 4 free on GPU 3: the first failure
    assert result.preemptions == 1
    c = result.capacity()
    assert c["first_failure_s"] == 350.0
    assert c["unallocated_at_first_failure"] == pytest.approx(1 - (1 + 0.96) / 4)


def gpufleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufleet", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_simulate_cli_on_the_openb_sample(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    ran = gpufleet(
        "simulate", "--trace", str(SAMPLE), "--format", "openb", "--nodes", "2", "--gpus-per-node", "8",
        "--policy", "fifo", "--json", str(out),
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    summary = json.loads(out.read_text())
    assert summary["fleet"]["shared_gpus"] == 8 and summary["fractional_jobs"] == 7
    assert set(summary["capacity"]["fifo"]) == {
        "allocated_share", "shared_fragmentation", "unallocated_at_first_failure", "first_failure_s",
    }  # fmt: skip
    assert "8 of 16 GPUs shared" in ran.stdout and "unallocated at 1st failure" in ran.stdout
    bad = gpufleet("simulate", "--sample", "--shared-gpus", "lots")
    assert bad.returncode == 2 and "--shared-gpus" in bad.stderr
