"""Issue 29, finding 1: a job's environment never reaches a process that runs as root.

A preload library built here with the C compiler writes the uid of every process that
loads it to a mark file. The job asks for it with ``LD_PRELOAD`` (through its API env, a
service replica's env, or what ``sbatch --export`` turns into the same env): only the
job's own processes, running as the job's account, may load it; the root wrapper must
not (before the fix it did, and wrote uid 0). The job still sees its ``LD_PRELOAD``."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from gpufleet.agent import JobSpec, JobStore, ProcessRunner
from gpufleet.agent.runners import ROOT_ENV, write_env
from jobaccounts import JOB_ACCOUNT, ROOT, passable, run_as

CC = shutil.which("cc") or shutil.which("gcc")
PRELOAD_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    const char *f = getenv("PRELOAD_MARK");
    FILE *o = f ? fopen(f, "a") : NULL;
    if (o) { fprintf(o, "%d\n", (int)getuid()); fclose(o); }
}
"""

needs = pytest.mark.skipif(not (ROOT and CC), reason="needs root (to switch accounts) and a C compiler")


def preload(tmp_path: Path) -> tuple[Path, Path]:
    src = tmp_path / "p.c"
    src.write_text(PRELOAD_C)
    lib = tmp_path / "p.so"
    subprocess.run([str(CC), "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    lib.chmod(0o755)
    mark = tmp_path / "mark"
    mark.touch()
    mark.chmod(0o666)
    return lib, mark


@needs
@pytest.mark.parametrize(
    "extra",
    [{}, {"PORT": "18123", "GPUFLEET_HOST_PORT": "18123", "GPUFLEET_SERVICE_PORT": "18123"}],
    ids=["job-env", "service-replica-env"],
)
def test_ld_preload_from_the_job_never_runs_as_root(tmp_path: Path, extra: dict[str, str]) -> None:
    passable(tmp_path)
    lib, mark = preload(tmp_path)
    runner = ProcessRunner(JobStore(tmp_path / "work"), node="n1", run_as=run_as())
    env = {"LD_PRELOAD": str(lib), "PRELOAD_MARK": str(mark), "LD_LIBRARY_PATH": "/nowhere", **extra}
    spec = JobSpec(
        job_id=3, attempt=1, command=("/bin/sh", "-c", 'echo "seen=$LD_PRELOAD:$LD_LIBRARY_PATH"'), env=env
    )
    job = runner.start(spec, now=time.time())
    deadline = time.monotonic() + 10
    while runner.poll(job, now=time.time()) is None:
        assert time.monotonic() < deadline, "the job did not end"
        time.sleep(0.02)
    uids = {int(u) for u in mark.read_text().split()}
    assert 0 not in uids, "the job's LD_PRELOAD ran as root"
    assert uids == {pwd.getpwnam(JOB_ACCOUNT).pw_uid}  # the job's own process still loads it
    assert f"seen={lib}:/nowhere" in job.log_path.read_text()
    assert not (job.path / "env").exists()  # read once by the wrapper, then removed


def test_the_root_side_environment_is_fixed() -> None:
    assert set(ROOT_ENV) == {"PATH", "LANG"}


@pytest.mark.parametrize(
    "env",
    [{"A\0B": "1"}, {"A": "x\0y"}, {"A=B": "1"}, {"": "1"}],
    ids=["nul-in-key", "nul-in-value", "equals-in-key", "empty-key"],
)
def test_an_unusable_environment_is_refused_before_anything_runs(tmp_path: Path, env: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="unusable environment"):
        write_env(tmp_path / "env", env)


def test_the_env_file_is_private_and_nul_separated(tmp_path: Path) -> None:
    path = write_env(tmp_path / "env", {"A": "1", "B": "x=y\nz"})
    assert path.read_bytes() == b"A=1\0B=x=y\nz"
    assert os.stat(path).st_mode & 0o777 == 0o600
