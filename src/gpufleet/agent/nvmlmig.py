"""MIG through NVML (``NvmlMig``, the part of ``NvmlProbe`` that knows MIG): reading a
GPU's MIG devices for the inventory and their memory for telemetry, never failing the
GPU's own inventory or sample over them; and changing a GPU's layout, where every NVML
error is a ``MigError`` that says what it means for the operator (root needed, slices
taken, a process in the way). Profile names come from ``gpufleet.mig``'s table (NVML
knows profile IDs); placements from ``mig.place_layout``.
"""

from __future__ import annotations

import ctypes
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from gpufleet import mig
from gpufleet.agent.nvmllib import (
    FUNCTION_NOT_FOUND,
    GPU_IS_LOST,
    IN_USE,
    INSUFFICIENT_RESOURCES,
    INVALID_ARGUMENT,
    NO_PERMISSION,
    NOT_FOUND,
    NOT_SUPPORTED,
    code,
    field,
    text,
)
from gpufleet.agent.probe import MigError, MigInstance, MigSample, ProbeError

log = logging.getLogger(__name__)

T = TypeVar("T")

# NVML_COMPUTE_INSTANCE_PROFILE_* by the compute slices of the GPU instance it fills.
_CI_PROFILE_FOR_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
_CI_ENGINE_SHARED = 0
_MIG_ERRORS = {
    NO_PERMISSION: "no permission: changing MIG instances needs root (or CAP_SYS_ADMIN)",
    INSUFFICIENT_RESOURCES: "insufficient resources: the slices are taken or the GPU holds no more",
    IN_USE: "in use: a process still holds it",
    NOT_SUPPORTED: "not supported by this GPU or driver",
    FUNCTION_NOT_FOUND: "not supported by this driver",
    GPU_IS_LOST: "the GPU is lost",
}
_MIG_NAME = re.compile(r"\bMIG\s+(\S+)\s*$", re.IGNORECASE)


class NvmlMig:
    """MIG on the GPUs of one ``lib`` (see ``nvmllib``); ``i`` is a GPU's index, ``h``
    its NVML handle (the probe checks the index)."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib
        self._sample_warned: set[int] = set()

    # -- reading ----------------------------------------------------------------------------
    def instances(self, i: int, h: Any, name: object) -> tuple[MigInstance, ...]:
        """The MIG devices of a GPU in MIG mode; () where the driver cannot tell (inventory
        never fails over MIG). A GPU that fell off the bus is still ``GpuLost``."""
        try:
            return self.read(h, None if name is None else text(name))
        except ProbeError as exc:
            log.warning("GPU %d: cannot enumerate MIG devices: %s", i, exc)
            return ()

    def read(self, h: Any, gpu_name: str | None) -> tuple[MigInstance, ...]:
        """The MIG devices of the GPU with handle ``h``, by placement (``ProbeError`` where
        NVML fails)."""
        lib = self.lib
        count = field(lib, lib.nvmlDeviceGetMaxMigDeviceCount, h)
        if not count:
            return ()
        names = self._profile_names(h, gpu_name)
        out: list[MigInstance] = []
        for k in range(int(count)):
            m = field(lib, lib.nvmlDeviceGetMigDeviceHandleByIndex, h, k, missing=NOT_FOUND)
            if m is not None and (inst := self._instance(h, m, names)) is not None:
                out.append(inst)
        return tuple(sorted(out, key=lambda x: (x.start, x.gpu_instance_id, x.compute_instance_id)))

    def _profile_names(self, h: Any, gpu_name: str | None) -> dict[int, str]:
        """NVML's profile ID (``nvmlGpuInstanceInfo_t.profileId``, e.g. 19 for an A100's
        1g.5gb) -> the table's name. The table holds profile *indices*
        (``NVML_GPU_INSTANCE_PROFILE_*``); the device says which ID each index has."""
        model = None if gpu_name is None else mig.model_for(gpu_name)
        if model is None:
            return {}
        out: dict[int, str] = {}
        for p in model.profiles.values():
            info = field(
                self.lib,
                self.lib.nvmlDeviceGetGpuInstanceProfileInfo,
                h,
                p.nvml_profile_id,
                missing=NOT_FOUND,
            )
            if info is not None:
                out[int(info.id)] = p.name
        return out

    def _instance(self, h: Any, m: Any, names: dict[int, str]) -> MigInstance | None:
        lib = self.lib
        uuid = field(lib, lib.nvmlDeviceGetUUID, m)
        gi_id = field(lib, lib.nvmlDeviceGetGpuInstanceId, m)
        ci_id = field(lib, lib.nvmlDeviceGetComputeInstanceId, m)
        if uuid is None or gi_id is None or ci_id is None:
            return None
        gi = field(lib, lib.nvmlDeviceGetGpuInstanceById, h, gi_id, missing=NOT_FOUND)
        info = None if gi is None else field(lib, lib.nvmlGpuInstanceGetInfo, gi)
        if info is None:
            return None
        mem = field(lib, lib.nvmlDeviceGetMemoryInfo, m)
        profile_id = int(info.profileId)
        return MigInstance(
            uuid=text(uuid),
            profile=names.get(profile_id) or self._nvml_profile_name(m, profile_id),
            gpu_instance_id=int(gi_id),
            compute_instance_id=int(ci_id),
            start=int(info.placement.start),
            size=int(info.placement.size),
            memory_mb=0 if mem is None else int(mem.total) // (1024 * 1024),
        )

    def _nvml_profile_name(self, m: Any, profile_id: int) -> str:
        """A profile the table lacks: the tail of the MIG device's name
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb" -> "1g.5gb"), else ``nvml-profile-<id>``."""
        name = field(self.lib, self.lib.nvmlDeviceGetName, m)
        found = None if name is None else _MIG_NAME.search(text(name))
        return found[1] if found else f"nvml-profile-{profile_id}"

    def samples(self, i: int, h: Any) -> tuple[MigSample, ...]:
        """Memory used and total of each MIG instance of a GPU in MIG mode, one per GPU
        instance (its compute instances share its memory), by GPU instance id; () when MIG
        is off or the driver cannot tell: the GPU's own sample never fails over its
        instances. No utilisation: see ``MigSample``. A GPU that fell off the bus is still
        ``GpuLost``."""
        lib = self.lib
        mode = field(lib, lib.nvmlDeviceGetMigMode, h)
        if mode is None or not mode[0]:
            return ()
        out: dict[int, MigSample] = {}
        try:
            count = field(lib, lib.nvmlDeviceGetMaxMigDeviceCount, h) or 0
            for k in range(int(count)):
                m = field(lib, lib.nvmlDeviceGetMigDeviceHandleByIndex, h, k, missing=NOT_FOUND)
                gi = None if m is None else field(lib, lib.nvmlDeviceGetGpuInstanceId, m)
                if gi is None or int(gi) in out:
                    continue
                mem = field(lib, lib.nvmlDeviceGetMemoryInfo, m)
                out[int(gi)] = MigSample(
                    gpu_instance_id=int(gi),
                    memory_used_mb=None if mem is None else int(mem.used) // (1024 * 1024),
                    memory_total_mb=None if mem is None else int(mem.total) // (1024 * 1024),
                )
        except ProbeError as exc:
            if i not in self._sample_warned:  # once per GPU: samples come every few seconds
                self._sample_warned.add(i)
                log.warning("GPU %d: no MIG instance telemetry: %s", i, exc)
            return ()
        return tuple(out[gi] for gi in sorted(out))

    # -- changing ---------------------------------------------------------------------------
    def apply_layout(self, i: int, h: Any, profiles: Sequence[str]) -> tuple[MigInstance, ...]:
        """Replace GPU ``i``'s (handle ``h``) MIG instances by ``profiles`` (``gpufleet.mig``
        names; empty: remove them all), each a GPU instance at the placement
        ``mig.place_layout`` chooses with one compute instance spanning it. Returns the
        GPU's MIG devices afterwards.

        Refuses (``MigError``, nothing changed) when MIG mode is off, the model is not in
        the table, the layout does not fit, or a process runs on a MIG device of the GPU.
        An NVML failure while destroying or creating is a ``MigError`` too; the GPU then
        holds whatever was done so far (the next inventory shows it)."""
        lib = self.lib
        mode = self._call(lib.nvmlDeviceGetMigMode, h, gpu=i, what="read the MIG mode")
        if not int(mode[0]):
            raise MigError(
                f"MIG mode is off on GPU {i}: enable it with nvidia-smi -i {i} -mig 1 (needs a GPU reset)"
            )
        name = text(self._call(lib.nvmlDeviceGetName, h, gpu=i, what="read the GPU name"))
        model = mig.model_for(name)
        if model is None:
            raise MigError(f"GPU {i} ({name}) is not a model in the MIG table; cannot place a layout")
        try:
            placements = mig.place_layout(model, profiles)
        except mig.LayoutError as exc:
            raise MigError(f"GPU {i}: {exc}") from exc
        busy = self._busy_devices(i, h)
        if busy:
            raise MigError(f"GPU {i}: MIG devices in use ({'; '.join(busy)}); stop their processes first")
        self._destroy(i, h)
        for n, pl in enumerate(placements):
            try:
                self._create_instance(i, h, model.profile(pl.profile), pl)
            except MigError as exc:
                done = ", ".join(f"{p.profile}@{p.start}" for p in placements[:n]) or "none"
                raise MigError(f"{exc} (created before it: {done})") from exc
        return self.read(h, name)

    def set_mode(self, i: int, h: Any, enabled: bool) -> None:
        """Turn MIG mode on or off (``nvmlDeviceSetMigMode``). The driver usually applies it
        only across a GPU reset: then a ``MigError`` says so (the mode is pending), and the
        GPU stays cordoned until an operator resets it and asks again."""
        status = self._call(
            self.lib.nvmlDeviceSetMigMode, h, 1 if enabled else 0, gpu=i, what="set the MIG mode"
        )
        if int(status or 0) != 0:
            raise MigError(
                f"GPU {i}: MIG mode {'on' if enabled else 'off'} is pending a GPU reset: "
                f"run nvidia-smi -i {i} -r with no process on the GPU, then ask again"
            )

    def _busy_devices(self, i: int, h: Any) -> list[str]:
        lib = self.lib
        count = self._try(lib.nvmlDeviceGetMaxMigDeviceCount, h, gpu=i, what="count MIG devices") or 0
        busy = []
        for k in range(int(count)):
            m = self._try(lib.nvmlDeviceGetMigDeviceHandleByIndex, h, k, gpu=i, what="open a MIG device")
            if m is None:
                continue
            procs = self._call(
                lib.nvmlDeviceGetComputeRunningProcesses, m, gpu=i, what="list processes on a MIG device"
            )
            if procs:
                uuid = self._try(lib.nvmlDeviceGetUUID, m, gpu=i, what="read a MIG device UUID")
                pids = ",".join(str(p.pid) for p in procs)
                busy.append(f"{'?' if uuid is None else text(uuid)}: pid {pids}")
        return busy

    def _destroy(self, i: int, h: Any) -> None:
        """Every compute instance of every GPU instance, then the GPU instance, over all
        profiles NVML knows (instances of profiles the table lacks go too)."""
        lib = self.lib
        for index in range(int(getattr(lib, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0x12))):
            info = self._try(
                lib.nvmlDeviceGetGpuInstanceProfileInfo, h, index, gpu=i, what="read a GPU instance profile"
            )
            if info is None or not info.instanceCount:
                continue
            gis = self._instances(
                lib.nvmlDeviceGetGpuInstances, h, info.id, lib.c_nvmlGpuInstance_t, info.instanceCount, gpu=i
            )
            for gi in gis:
                self._destroy_compute_instances(i, gi)
                self._call(lib.nvmlGpuInstanceDestroy, gi, gpu=i, what="destroy a GPU instance")

    def _destroy_compute_instances(self, i: int, gi: Any) -> None:
        lib = self.lib
        for index in range(int(getattr(lib, "NVML_COMPUTE_INSTANCE_PROFILE_COUNT", 9))):
            info = self._try(
                lib.nvmlGpuInstanceGetComputeInstanceProfileInfo,
                gi,
                index,
                _CI_ENGINE_SHARED,
                gpu=i,
                what="read a compute instance profile",
            )
            if info is None or not info.instanceCount:
                continue
            cis = self._instances(
                lib.nvmlGpuInstanceGetComputeInstances,
                gi,
                info.id,
                lib.c_nvmlComputeInstance_t,
                info.instanceCount,
                gpu=i,
            )
            for ci in cis:
                self._call(lib.nvmlComputeInstanceDestroy, ci, gpu=i, what="destroy a compute instance")

    def _instances(
        self, fn: Callable[..., Any], parent: Any, profile_id: int, kind: Any, most: int, *, gpu: int
    ) -> list[Any]:
        """pynvml's C-style listing: a caller-sized array of handles and a count pointer."""
        handles = (kind * max(1, int(most)))()
        count = ctypes.c_uint(0)
        self._call(fn, parent, profile_id, handles, ctypes.pointer(count), gpu=gpu, what="list MIG instances")
        return [handles[k] for k in range(count.value)]

    def _create_instance(self, i: int, h: Any, profile: mig.Profile, pl: mig.Placement) -> None:
        lib = self.lib
        where = f"{pl.profile} at memory slice {pl.start}"
        info = self._call(
            lib.nvmlDeviceGetGpuInstanceProfileInfo,
            h,
            profile.nvml_profile_id,
            gpu=i,
            what=f"look up {pl.profile}",
        )
        placement = lib.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = pl.start, pl.size
        gi = self._call(
            lib.nvmlDeviceCreateGpuInstanceWithPlacement,
            h,
            info.id,
            ctypes.pointer(placement),
            gpu=i,
            what=f"create GPU instance {where}",
        )
        slices = int(getattr(info, "sliceCount", 0) or profile.compute_slices)
        ci_profile = _CI_PROFILE_FOR_SLICES.get(slices)
        if ci_profile is None:
            raise MigError(f"GPU {i}: no compute instance profile spans {slices} slices ({where})")
        ci_info = self._call(
            lib.nvmlGpuInstanceGetComputeInstanceProfileInfo,
            gi,
            ci_profile,
            _CI_ENGINE_SHARED,
            gpu=i,
            what=f"look up the compute instance profile for {where}",
        )
        self._call(
            lib.nvmlGpuInstanceCreateComputeInstance,
            gi,
            ci_info.id,
            gpu=i,
            what=f"create the compute instance of {where}",
        )

    def _call(self, fn: Callable[..., T], *args: Any, gpu: int, what: str) -> T:
        """A MIG step: any NVML error is a ``MigError`` saying what it means for the operator."""
        try:
            return fn(*args)
        except self.lib.NVMLError as exc:
            raise self._error(exc, gpu=gpu, what=what) from exc

    def _try(self, fn: Callable[..., T], *args: Any, gpu: int, what: str) -> T | None:
        """Like ``_call``, but None for what the device lacks (a profile it does not
        offer, an empty MIG device index)."""
        try:
            return fn(*args)
        except self.lib.NVMLError as exc:
            if code(exc) in (NOT_SUPPORTED, INVALID_ARGUMENT, NOT_FOUND):
                return None
            raise self._error(exc, gpu=gpu, what=what) from exc

    def _error(self, exc: BaseException, *, gpu: int, what: str) -> MigError:
        why = _MIG_ERRORS.get(code(exc) or -1, str(exc))
        return MigError(f"GPU {gpu}: cannot {what}: {why}")
