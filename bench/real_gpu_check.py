"""The real-GPU check of issue 17 (MIG and shared GPUs), for a machine with an NVIDIA GPU.

Run as root on a GPU machine (the agent's runner then runs each job as the unprivileged
``gpufleet-job`` account, made here if missing)::

    python3 bench/real_gpu_check.py [--out FILE]

It changes no GPU setting: MIG mode is only read (switching it needs a GPU reset), a MIG
layout is applied only to show the agent's refusal where MIG mode is off (the agent checks
the mode before it creates or destroys anything), and the MPS control daemon it starts for
the share jobs is stopped at the end. Steps, each reported whatever the others did:

1. the agent's NVML inventory and one telemetry sample (``NvmlProbe``);
2. ``gpufleet.mig``'s profile table against what NVML says the GPU offers (profile ids,
   compute and memory slices, memory, instance counts, placements);
3. ``apply_mig_layout`` on a GPU with MIG mode off: the agent's clear error;
4. a CUDA job through the agent's ``ProcessRunner`` on GPU 0 (``CUDA_VISIBLE_DEVICES``,
   the owner's account, a bf16 matrix product);
5. GPU shares under MPS: an MPS control daemon, then share jobs through the runner with
   ``JobSpec.share`` limits: the pinned-memory limit refuses an allocation past it, and the
   active-thread percentage slows a compute-bound kernel (25 % against 100 %).

Needs ``torch`` for the CUDA jobs (skipped with a message without it) and the package's
dependencies for ``gpufleet.agent`` (pydantic); nothing else.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

LINES: list[str] = []


def say(text: str = "") -> None:
    print(text, flush=True)
    LINES.append(text)


def step(title: str, fn: Callable[[], None]) -> bool:
    say(f"\n== {title}")
    t0 = time.monotonic()
    try:
        fn()
    except Exception:
        say("FAILED:\n" + traceback.format_exc().rstrip())
        return False
    say(f"-- {time.monotonic() - t0:.1f} s")
    return True


def shell(*cmd: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    return (done.stdout + done.stderr).strip()


def inventory() -> None:
    from gpufleet.agent.nvml import NvmlProbe

    say(shell("nvidia-smi", "-L"))
    q = "name,driver_version,memory.total,mig.mode.current,mig.mode.pending,compute_mode"
    say(shell("nvidia-smi", f"--query-gpu={q}", "--format=csv"))
    probe = NvmlProbe()
    try:
        inv = probe.inventory()
        for g in inv.gpus:
            say(
                f"GPU {g.index}: {g.model} uuid={g.uuid} memory={g.memory_mb} MiB "
                f"nvlink_domain={g.nvlink_domain} mig_enabled={g.mig_enabled} "
                f"mig_instances={[m.profile for m in g.mig_instances]}"
            )
        for s in probe.sample():
            say(f"sample GPU {s.index}: " + json.dumps({k: v for k, v in dataclasses.asdict(s).items() if v}))
    finally:
        probe.close()


def mig_table() -> None:
    import pynvml as nv

    from gpufleet import mig

    nv.nvmlInit()
    try:
        h = nv.nvmlDeviceGetHandleByIndex(0)
        name = nv.nvmlDeviceGetName(h)
        name = name.decode() if isinstance(name, bytes) else name
        model = mig.model_for(name)
        say(f"GPU 0 is {name!r}: gpufleet's MIG table model {model.name if model else None}")
        try:
            cur, pending = nv.nvmlDeviceGetMigMode(h)
            say(f"MIG mode: current={cur} pending={pending}")
        except nv.NVMLError as exc:
            say(f"MIG mode: not readable ({exc})")
        mem = nv.nvmlDeviceGetMemoryInfo(h).total // 2**20
        say(f"memory: {mem} MiB (table: {model.memory_mib if model else '-'} MiB)")
        agree = differ = 0
        for pid in range(12):
            try:
                info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, pid)
            except nv.NVMLError as exc:
                say(f"profile id {pid}: NVML says {exc}")
                continue
            ours = None if model is None else model.by_nvml_id(pid)
            try:
                places = nv.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id)
                starts = tuple(sorted(p.start for p in places))
            except (nv.NVMLError, AttributeError, TypeError) as exc:
                starts = ()
                say(f"  placements of profile id {pid}: {exc}")
            nvml = (
                f"id={info.id} slices={info.sliceCount} memory={info.memorySizeMB} MiB "
                f"instances={info.instanceCount} starts={starts}"
            )
            if ours is None:
                say(f"profile id {pid}: NVML {nvml}; NOT in gpufleet's table")
                differ += 1
                continue
            same = (
                ours.compute_slices == info.sliceCount
                and ours.max_instances == info.instanceCount
                and (not starts or ours.starts == starts)
            )
            agree += same
            differ += not same
            say(
                f"profile id {pid}: NVML {nvml}; gpufleet {ours.name} compute={ours.compute_slices} "
                f"memory_slices={ours.memory_slices} nominal={ours.memory_mib} MiB "
                f"instances={ours.max_instances} starts={ours.starts} -> {'agree' if same else 'DIFFER'}"
            )
        say(f"MIG table vs NVML: {agree} profiles agree, {differ} differ or are missing")
    finally:
        nv.nvmlShutdown()


def mig_refusal() -> None:
    from gpufleet.agent.nvml import NvmlProbe
    from gpufleet.agent.probe import MigError

    probe = NvmlProbe()
    try:
        g = probe.inventory().gpus[0]
        if g.mig_enabled:
            say(f"GPU 0 is in MIG mode with {[m.profile for m in g.mig_instances]}: left as it is")
            return
        from gpufleet import mig

        model = mig.model_for(g.model)
        smallest = next(iter(model.profiles)) if model else "1g.10gb"
        try:
            probe.apply_mig_layout(0, [smallest])
            say("apply_mig_layout did not refuse: UNEXPECTED")
        except MigError as exc:
            say(f"apply_mig_layout(0, [{smallest!r}]) refused as it should: {exc}")
    finally:
        probe.close()


def _runner() -> tuple[Any, Path]:
    from gpufleet.agent import JobStore, ProcessRunner, RunAs, UserMap

    if os.geteuid() == 0 and subprocess.run(["id", "gpufleet-job"], capture_output=True).returncode != 0:
        subprocess.run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                "--user-group",
                "gpufleet-job",
            ],
            check=True,
        )
    work = Path("/tmp/gpufleet-realgpu")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    work.chmod(0o755)
    store = JobStore(work / "work")
    return ProcessRunner(
        store, node="gpu0", run_as=RunAs(users=UserMap(entries={}, fallback="gpufleet-job"))
    ), work


JOB = r"""
import os, sys, time
import torch
print("user", os.getuid(), "CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
for k in ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_PIPE_DIRECTORY",
          "GPUFLEET_GPU_FRACTION"):
    if k in os.environ:
        print(k, os.environ[k])
print("devices", torch.cuda.device_count(), torch.cuda.get_device_name(0))
want = [int(x) for x in sys.argv[1:]]
for gib in want:
    try:
        t = torch.empty(gib * 2**30, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        print(f"alloc {gib} GiB: ok")
        del t
        torch.cuda.empty_cache()
    except Exception as exc:  # the MPS memory limit
        print(f"alloc {gib} GiB: refused: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    a @ b
torch.cuda.synchronize()
t0 = time.perf_counter()
reps = 20
for _ in range(reps):
    a @ b
torch.cuda.synchronize()
dt = time.perf_counter() - t0
print(f"bf16 {n}^3 matmul: {2 * n**3 * reps / dt / 1e12:.0f} TFLOP/s")
"""


def _run(runner: Any, work: Path, job_id: int, args: list[str], **kw: Any) -> str:
    from gpufleet.agent import JobSpec

    script = work / "job.py"
    script.write_text(JOB)
    script.chmod(0o644)
    passed = {k: os.environ[k] for k in ("LD_LIBRARY_PATH",) if k in os.environ}  # the driver's libraries
    spec = JobSpec(job_id=job_id, attempt=1, command=(sys.executable, str(script), *args), env=passed, **kw)
    job = runner.start(spec, now=time.time())
    deadline = time.monotonic() + 120
    code = None
    while time.monotonic() < deadline:
        code = runner.poll(job, now=time.time())
        if code is not None:
            break
        time.sleep(0.1)
    return f"exit {code}\n" + job.log_path.read_text().strip()


def have_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        say("no torch here: the CUDA jobs are skipped")
        return False
    return True


def cuda_job() -> None:
    if not have_torch():
        return
    runner, work = _runner()
    say(_run(runner, work, 1, [], gpus=(0,)))


def mps_shares() -> None:
    if not have_torch():
        return
    from gpufleet import mig
    from gpufleet.agent.jobs import mps_running

    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        say("no nvidia-cuda-mps-control on PATH: shares would run time-sliced (limits not enforced)")
        return
    pipe, logs = Path("/tmp/gpufleet-mps/pipe"), Path("/tmp/gpufleet-mps/log")
    for d in (pipe, logs):
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o777)
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logs)}
    started = subprocess.run([control, "-d"], env=env, capture_output=True, text=True, timeout=30)
    say(f"{control} -d: exit {started.returncode} {started.stdout}{started.stderr}".strip())
    try:
        for _ in range(50):
            if mps_running(str(pipe)):
                break
            time.sleep(0.1)
        say(f"mps_running({pipe}): {mps_running(str(pipe))}")
        runner, work = _runner()
        units = tuple(mig.share_index(0, u) for u in range(25))
        quarter = _run(
            runner, work, 2, ["2", "6"], gpus=units, devices=("0",), share=(25, 4096), mps_pipe_dir=str(pipe)
        )
        say("share 25 %, 4096 MiB:\n" + quarter)
        full = tuple(mig.share_index(0, u) for u in range(100))
        whole = _run(
            runner, work, 3, ["6"], gpus=full, devices=("0",), share=(100, 16384), mps_pipe_dir=str(pipe)
        )
        say("share 100 %, 16384 MiB:\n" + whole)
    finally:
        done = subprocess.run([control], input="quit\n", env=env, capture_output=True, text=True, timeout=30)
        say(f"MPS control daemon asked to quit: exit {done.returncode}")
        log = logs / "control.log"
        if log.exists():
            say("control.log (last lines):\n" + "\n".join(log.read_text().splitlines()[-8:]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    args = parser.parse_args()
    ok = [
        step("1. NVML inventory (the agent's probe)", inventory),
        step("2. gpufleet's MIG table against NVML's profiles", mig_table),
        step("3. a MIG layout where MIG mode is off: the agent's refusal", mig_refusal),
        step("4. a CUDA job through the agent's runner on GPU 0", cuda_job),
        step("5. GPU shares under MPS through the runner", mps_shares),
    ]
    say(f"\n{sum(ok)} of {len(ok)} steps ran to the end")
    if args.out is not None:
        args.out.write_text("\n".join(LINES) + "\n")
    return 0 if all(ok) else 1


if __name__ == "__main__":
    raise SystemExit(main())
