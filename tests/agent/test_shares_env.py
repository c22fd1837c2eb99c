"""A GPU share's job on the agent's side: the units the server hands it
(``migindex.share_index``) become one visible GPU and the MPS client limits
(``jobs.share_env``): its percent of the GPU's compute and the same part of its memory.
``mps_running`` finds an MPS control daemon by its control socket."""

from __future__ import annotations

import socket
from pathlib import Path

from agent.test_mig_sync import Unused, desired, sync
from gpufleet import mig
from gpufleet.agent import AgentConfig, SimSpec, SimulatedProbe, make_agent
from gpufleet.agent.jobs import JobSpec, launch_env, mps_running, share_env


def test_a_share_is_its_gpu_and_its_limits(tmp_path: Path) -> None:
    probe = SimulatedProbe(node="n1", spec=SimSpec(gpus=2))
    agent = make_agent(
        config=AgentConfig(node="n1", work_dir=tmp_path / "n1", mps_pipe_dir="/run/mps"),
        probe=probe,
        transport=Unused(),
    )
    units = [mig.share_index(1, u) for u in range(40, 65)]
    memory = agent.inventory.gpus[1].memory_mb
    assert agent._devices(units) == ("1",)
    assert agent._share(units) == (25, memory * 25 // 100)
    assert agent._share([0, 1]) is None and agent._devices([0, 1]) == ()
    sync(agent, [], jobs=[desired(7, units)])
    [job] = agent.jobs.values()
    assert job.gpus == tuple(units)
    spec = JobSpec(
        job_id=7, attempt=1, gpus=tuple(units), devices=("1",), share=(25, 20480), mps_pipe_dir="/run/mps"
    )
    env = launch_env(spec, node="n1", checkpoint_dir="/c", hostfile="/h", base={})
    assert env["CUDA_VISIBLE_DEVICES"] == "1" == env["SLURM_JOB_GPUS"]
    assert env["LOCAL_WORLD_SIZE"] == "1" == env["SLURM_GPUS_ON_NODE"]
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/mps"
    assert env["GPUFLEET_GPU_FRACTION"] == "0.25"


def test_a_whole_gpu_job_gets_no_limits_and_cannot_set_its_own_share() -> None:
    spec = JobSpec(job_id=1, attempt=1, gpus=(0, 1), env={"GPUFLEET_GPU_FRACTION": "1"})
    assert share_env(spec) == {}
    env = launch_env(spec, node="n1", checkpoint_dir="/c", hostfile="/h", base={})
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env and env["CUDA_VISIBLE_DEVICES"] == "0,1"
    shared = JobSpec(
        job_id=2,
        attempt=1,
        gpus=(mig.share_index(0, 0),),
        devices=("0",),
        share=(1, 800),
        env={"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=80G"},
    )
    env = launch_env(shared, node="n1", checkpoint_dir="/c", hostfile="/h", base={})
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "1"  # gpufleet's limits win over the job's
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=800M"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"  # always named


def test_mps_running_looks_for_the_control_socket(tmp_path: Path) -> None:
    assert not mps_running(str(tmp_path))
    (tmp_path / "control").write_text("")
    assert not mps_running(str(tmp_path))  # a file, not a socket
    (tmp_path / "control").unlink()
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "control"))
        assert mps_running(str(tmp_path))
