"""The GPU smoke check after a driver upgrade: does a tiny CUDA kernel run on this GPU
and give the right answer? (The NVIDIA GPU Operator's validator runs a CUDA sample for
the same reason: NVML answering says the driver loaded, not that CUDA works.)

``CudaSmoke`` runs ``python -m gpufleet.agent.smoke`` in a child process, one GPU at a
time (``CUDA_VISIBLE_DEVICES`` its UUID), as an unprivileged account when the agent is
root (``--smoke-user``, default ``nobody``), with a scrubbed environment and a timeout.
The child needs no new dependency: ctypes on ``libcuda.so.1`` (the driver API, which
ships with the driver): ``cuInit``, a context, ``cuModuleLoadData`` of the vector add
in ``PTX`` below (JIT-compiled by the driver being checked), a launch over ``N``
floats, the result copied back and compared. It prints one JSON line.

A simulated GPU has no CUDA: the agent asks ``SimulatedProbe.smoke`` instead
(``agent/upgrade.py``). NOT RUN ON A GPU: this module's CUDA path was written against
the CUDA driver API's documentation and has not been run on real hardware here
(``bench/real_gpu_check.py`` is where such checks go).
"""

from __future__ import annotations

import ctypes
import json
import os
import pwd
import subprocess
import sys
from dataclasses import dataclass

N = 1 << 16
BLOCK = 256
SMOKE_TIMEOUT_S = 60.0

PTX = b"""
.version 7.0
.target sm_50
.address_size 64

.visible .entry vadd(
    .param .u64 pa,
    .param .u64 pb,
    .param .u64 pc,
    .param .u32 pn
)
{
    .reg .pred p;
    .reg .b32 r<5>;
    .reg .b64 rd<11>;
    .reg .f32 f<4>;

    ld.param.u64 rd1, [pa];
    ld.param.u64 rd2, [pb];
    ld.param.u64 rd3, [pc];
    ld.param.u32 r1, [pn];
    mov.u32 r2, %ctaid.x;
    mov.u32 r3, %ntid.x;
    mov.u32 r4, %tid.x;
    mad.lo.s32 r2, r2, r3, r4;
    setp.ge.u32 p, r2, r1;
    @p bra DONE;
    cvta.to.global.u64 rd4, rd1;
    cvta.to.global.u64 rd5, rd2;
    cvta.to.global.u64 rd6, rd3;
    mul.wide.u32 rd7, r2, 4;
    add.s64 rd8, rd4, rd7;
    add.s64 rd9, rd5, rd7;
    add.s64 rd10, rd6, rd7;
    ld.global.f32 f1, [rd8];
    ld.global.f32 f2, [rd9];
    add.f32 f3, f1, f2;
    st.global.f32 [rd10], f3;
DONE:
    ret;
}
\x00"""


class CudaError(Exception):
    pass


def _check(cuda: ctypes.CDLL, code: int, what: str) -> None:
    if code != 0:
        msg = ctypes.c_char_p()
        cuda.cuGetErrorString(code, ctypes.byref(msg))
        text = msg.value.decode(errors="replace") if msg.value else f"CUresult {code}"
        raise CudaError(f"{what}: {text}")


def vector_add(library: str = "libcuda.so.1") -> str | None:
    """Run the kernel on device 0 of this process (None: passed, else why not)."""
    try:
        cuda = ctypes.CDLL(library)
    except OSError as exc:
        return f"cannot load {library}: {exc}"
    ctx, mod, fn, dev = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_int()
    bufs = [ctypes.c_uint64() for _ in range(3)]
    size = N * 4
    a = (ctypes.c_float * N)(*[float(i) for i in range(N)])
    b = (ctypes.c_float * N)(*[float(2 * i) for i in range(N)])
    c = (ctypes.c_float * N)()
    try:
        _check(cuda, cuda.cuInit(0), "cuInit")
        _check(cuda, cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
        _check(cuda, cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev), "cuCtxCreate")
        _check(cuda, cuda.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(PTX)), "cuModuleLoadData")
        _check(cuda, cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"vadd"), "cuModuleGetFunction")
        for buf in bufs:
            _check(cuda, cuda.cuMemAlloc_v2(ctypes.byref(buf), ctypes.c_size_t(size)), "cuMemAlloc")
        _check(cuda, cuda.cuMemcpyHtoD_v2(bufs[0], a, ctypes.c_size_t(size)), "cuMemcpyHtoD")
        _check(cuda, cuda.cuMemcpyHtoD_v2(bufs[1], b, ctypes.c_size_t(size)), "cuMemcpyHtoD")
        n = ctypes.c_uint32(N)
        args = [ctypes.cast(ctypes.pointer(x), ctypes.c_void_p) for x in (*bufs, n)]
        params = (ctypes.c_void_p * 4)(*args)
        grid = (N + BLOCK - 1) // BLOCK
        _check(
            cuda, cuda.cuLaunchKernel(fn, grid, 1, 1, BLOCK, 1, 1, 0, None, params, None), "cuLaunchKernel"
        )
        _check(cuda, cuda.cuCtxSynchronize(), "cuCtxSynchronize")
        _check(cuda, cuda.cuMemcpyDtoH_v2(c, bufs[2], ctypes.c_size_t(size)), "cuMemcpyDtoH")
    except CudaError as exc:
        return str(exc)
    finally:
        for buf in bufs:
            if buf.value:
                cuda.cuMemFree_v2(buf)
        if mod.value:
            cuda.cuModuleUnload(mod)
        if ctx.value:
            cuda.cuCtxDestroy_v2(ctx)
    wrong = next((i for i in range(N) if c[i] != 3.0 * i), None)
    return None if wrong is None else f"wrong result at {wrong}: {c[wrong]} instead of {3.0 * wrong}"


@dataclass(frozen=True, slots=True, kw_only=True)
class CudaSmoke:
    """The smoke check of a real GPU, in a child process (see the module's docstring)."""

    user: str = "nobody"
    timeout_s: float = SMOKE_TIMEOUT_S

    def check(self, index: int, uuid: str) -> str | None:
        """None: the kernel ran right on the GPU; else why not."""
        env = {"PATH": "/usr/bin:/bin", "LANG": "C", "CUDA_VISIBLE_DEVICES": uuid or str(index)}
        uid = gid = None
        if os.geteuid() == 0:  # never as root: the account's own uid and group, nothing more
            try:
                pw = pwd.getpwnam(self.user)
            except KeyError:
                return f"no account {self.user!r} to run the smoke check as (--smoke-user)"
            uid, gid = pw.pw_uid, pw.pw_gid
        try:
            done = subprocess.run(
                [sys.executable, "-m", "gpufleet.agent.smoke"],
                env=env,
                cwd="/",
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=self.timeout_s,
                check=False,
                user=uid,
                group=gid,
                extra_groups=[] if uid is not None else None,
            )
        except subprocess.TimeoutExpired:
            return f"the smoke kernel did not finish within {self.timeout_s:g}s"
        except (OSError, ValueError) as exc:  # no python, no permission
            return f"could not start the smoke check: {exc}"
        try:
            said = json.loads(done.stdout.decode(errors="replace").strip().splitlines()[-1])
            return None if said.get("ok") else str(said.get("error"))[:300]
        except (ValueError, IndexError, AttributeError):
            err = done.stderr.decode(errors="replace").strip()[-300:]
            return f"the smoke check exited {done.returncode}: {err or 'no output'}"


def main() -> None:
    error = vector_add()
    print(json.dumps({"ok": error is None, "error": error}))


if __name__ == "__main__":
    main()
