"""``NvmlProbe``: real GPUs through NVML, in-process (``nvidia-ml-py``'s ``pynvml``),
never by running ``nvidia-smi``.

The library is passed in (``NvmlProbe(nvml=...)``) or imported lazily on first use, so
importing gpufleet needs no driver and tests drive the translation layer with a fake
module. NVML errors are translated here, at the boundary: a field the GPU does not
support (or this driver does not know) is ``None``; a GPU that fell off the bus is a
sample with ``lost=True``; anything else is a ``ProbeError``.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from gpufleet import mig
from gpufleet.agent.probe import (
    GpuInfo,
    GpuSample,
    MigError,
    MigInstance,
    MigSample,
    NodeInventory,
    ProbeError,
    host_resources,
    nvlink_domains,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

# NVML return codes (nvml.h); kept here so a fake library need not define them all.
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
IN_USE = 19
INSUFFICIENT_RESOURCES = 23
TIMEOUT = 10
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
INVALID_ARGUMENT = 2
_UNSUPPORTED = frozenset({NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND})

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

_THROTTLE_NAMES = (
    ("nvmlClocksThrottleReasonGpuIdle", "gpu_idle"),
    ("nvmlClocksThrottleReasonApplicationsClocksSetting", "applications_clocks"),
    ("nvmlClocksThrottleReasonSwPowerCap", "sw_power_cap"),
    ("nvmlClocksThrottleReasonHwSlowdown", "hw_slowdown"),
    ("nvmlClocksThrottleReasonSyncBoost", "sync_boost"),
    ("nvmlClocksThrottleReasonSwThermalSlowdown", "sw_thermal_slowdown"),
    ("nvmlClocksThrottleReasonHwThermalSlowdown", "hw_thermal_slowdown"),
    ("nvmlClocksThrottleReasonHwPowerBrakeSlowdown", "hw_power_brake"),
)


class _Lost(Exception):
    pass


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def load_nvml() -> Any:
    """Import ``pynvml`` (nvidia-ml-py), or say clearly why not."""
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise ProbeError(
            "NVML bindings are not installed (pip install nvidia-ml-py); "
            "on a machine without GPUs run the agent with --simulate-gpus N"
        ) from exc


class NvmlProbe:
    """``nvml`` is the ``pynvml`` module or anything with the same functions, constants
    and ``NVMLError`` (with ``.value``)."""

    def __init__(self, nvml: Any = None) -> None:
        self.lib = nvml if nvml is not None else load_nvml()
        self._call(self.lib.nvmlInit, what="initialise NVML (is the NVIDIA driver installed?)")
        self._handles: list[Any] = []
        self._events: Any = None
        self._mig_sample_warned: set[int] = set()
        try:
            count = int(self._call(self.lib.nvmlDeviceGetCount, what="count GPUs"))
            self._handles = [
                self._call(self.lib.nvmlDeviceGetHandleByIndex, i, what=f"open GPU {i}") for i in range(count)
            ]
            self._events = self._register_xid_events()
        except ProbeError:
            self.close()
            raise

    # -- error translation ------------------------------------------------------------------
    def _code(self, exc: BaseException) -> int | None:
        value = getattr(exc, "value", None)
        return value if isinstance(value, int) else None

    def _call(self, fn: Callable[..., T], *args: Any, what: str) -> T:
        try:
            return fn(*args)
        except self.lib.NVMLError as exc:
            raise ProbeError(f"NVML: cannot {what}: {exc}") from exc

    def _field(self, fn: Callable[..., T], *args: Any, missing: int | None = None) -> T | None:
        """One optional field: None when unsupported (or the ``missing`` code: e.g. an
        empty MIG device index); _Lost when the GPU is gone."""
        try:
            return fn(*args)
        except self.lib.NVMLError as exc:
            code = self._code(exc)
            if code in _UNSUPPORTED or code == INVALID_ARGUMENT or (missing is not None and code == missing):
                return None
            if code == GPU_IS_LOST:
                raise _Lost from exc
            raise ProbeError(f"NVML: {getattr(fn, '__name__', 'call')} failed: {exc}") from exc

    # -- inventory --------------------------------------------------------------------------
    def inventory(self) -> NodeInventory:
        lib = self.lib
        driver = self._field(lib.nvmlSystemGetDriverVersion)
        cuda = self._field(lib.nvmlSystemGetCudaDriverVersion)
        bus_ids: dict[str, int] = {}
        for i, h in enumerate(self._handles):
            try:
                pci = self._field(lib.nvmlDeviceGetPciInfo, h)
            except _Lost:
                continue
            if pci is not None:
                bus_ids[_text(pci.busId).lower()] = i
        peers = {i: self._nvlink_peers(h, bus_ids) for i, h in enumerate(self._handles)}
        switched = {i for i, (_, via_switch) in peers.items() if via_switch}
        graph = {
            i: sorted(set(direct) | (switched - {i} if i in switched else set()))
            for i, (direct, _) in peers.items()
        }
        domains = nvlink_domains(graph)
        gpus = []
        for i, h in enumerate(self._handles):
            try:
                gpus.append(self._gpu_info(i, h, tuple(graph[i]), domains[i]))
            except _Lost:
                continue
        cpus, memory_mb = host_resources()
        return NodeInventory(
            gpus=tuple(gpus),
            driver_version=None if driver is None else _text(driver),
            cuda_version=None if cuda is None else f"{int(cuda) // 1000}.{int(cuda) % 1000 // 10}",
            cpus=cpus,
            memory_mb=memory_mb,
        )

    def _gpu_info(self, i: int, h: Any, peers: tuple[int, ...], domain: int) -> GpuInfo:
        lib = self.lib
        mem = self._field(lib.nvmlDeviceGetMemoryInfo, h)
        mig = self._field(lib.nvmlDeviceGetMigMode, h)
        uuid = self._field(lib.nvmlDeviceGetUUID, h)
        name = self._field(lib.nvmlDeviceGetName, h)
        return GpuInfo(
            index=i,
            uuid="" if uuid is None else _text(uuid),
            model="unknown" if name is None else _text(name),
            memory_mb=0 if mem is None else int(mem.total) // (1024 * 1024),
            pcie_gen=self._field(lib.nvmlDeviceGetCurrPcieLinkGeneration, h),
            pcie_width=self._field(lib.nvmlDeviceGetCurrPcieLinkWidth, h),
            nvlink_peers=peers,
            nvlink_domain=domain,
            mig_enabled=None if mig is None else bool(mig[0]),
            mig_instances=self._mig_instances(i, h, name) if mig is not None and mig[0] else (),
        )

    def _nvlink_peers(self, h: Any, bus_ids: dict[str, int]) -> tuple[list[int], bool]:
        """(local GPUs linked directly, whether any link goes to something else: an NVSwitch)."""
        lib = self.lib
        direct: list[int] = []
        via_switch = False
        for link in range(int(getattr(lib, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                state = self._field(lib.nvmlDeviceGetNvLinkState, h, link)
                if not state:
                    if state is None:
                        break
                    continue
                remote = self._field(lib.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
            except _Lost:
                break
            if remote is None:
                continue
            peer = bus_ids.get(_text(remote.busId).lower())
            if peer is None:
                via_switch = True
            else:
                direct.append(peer)
        return direct, via_switch

    # -- MIG --------------------------------------------------------------------------------
    def _mig_instances(self, i: int, h: Any, name: object) -> tuple[MigInstance, ...]:
        """The MIG devices of a GPU in MIG mode; () where the driver cannot tell (inventory
        never fails over MIG). A GPU that fell off the bus is still ``_Lost``."""
        try:
            return self._read_mig(h, None if name is None else _text(name))
        except ProbeError as exc:
            log.warning("GPU %d: cannot enumerate MIG devices: %s", i, exc)
            return ()

    def _read_mig(self, h: Any, gpu_name: str | None) -> tuple[MigInstance, ...]:
        lib = self.lib
        count = self._field(lib.nvmlDeviceGetMaxMigDeviceCount, h)
        if not count:
            return ()
        names = self._profile_names(h, gpu_name)
        out: list[MigInstance] = []
        for k in range(int(count)):
            m = self._field(lib.nvmlDeviceGetMigDeviceHandleByIndex, h, k, missing=NOT_FOUND)
            if m is not None and (inst := self._mig_instance(h, m, names)) is not None:
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
            info = self._field(
                self.lib.nvmlDeviceGetGpuInstanceProfileInfo, h, p.nvml_profile_id, missing=NOT_FOUND
            )
            if info is not None:
                out[int(info.id)] = p.name
        return out

    def _mig_instance(self, h: Any, m: Any, names: dict[int, str]) -> MigInstance | None:
        lib = self.lib
        uuid = self._field(lib.nvmlDeviceGetUUID, m)
        gi_id = self._field(lib.nvmlDeviceGetGpuInstanceId, m)
        ci_id = self._field(lib.nvmlDeviceGetComputeInstanceId, m)
        if uuid is None or gi_id is None or ci_id is None:
            return None
        gi = self._field(lib.nvmlDeviceGetGpuInstanceById, h, gi_id, missing=NOT_FOUND)
        info = None if gi is None else self._field(lib.nvmlGpuInstanceGetInfo, gi)
        if info is None:
            return None
        mem = self._field(lib.nvmlDeviceGetMemoryInfo, m)
        profile_id = int(info.profileId)
        return MigInstance(
            uuid=_text(uuid),
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
        name = self._field(self.lib.nvmlDeviceGetName, m)
        found = None if name is None else _MIG_NAME.search(_text(name))
        return found[1] if found else f"nvml-profile-{profile_id}"

    def apply_mig_layout(self, gpu_index: int, profiles: Sequence[str]) -> tuple[MigInstance, ...]:
        """Replace GPU ``gpu_index``'s MIG instances by ``profiles`` (``gpufleet.mig``
        names; empty: remove them all), each a GPU instance at the placement
        ``mig.place_layout`` chooses with one compute instance spanning it. Returns the
        GPU's MIG devices afterwards.

        Refuses (``MigError``, nothing changed) when MIG mode is off, the model is not in
        the table, the layout does not fit, or a process runs on a MIG device of the GPU.
        An NVML failure while destroying or creating is a ``MigError`` too; the GPU then
        holds whatever was done so far (the next inventory shows it)."""
        lib = self.lib
        if not 0 <= gpu_index < len(self._handles):
            raise MigError(f"no GPU {gpu_index} on this node ({len(self._handles)} GPUs)")
        i, h = gpu_index, self._handles[gpu_index]
        mode = self._mig_call(lib.nvmlDeviceGetMigMode, h, gpu=i, what="read the MIG mode")
        if not int(mode[0]):
            raise MigError(
                f"MIG mode is off on GPU {i}: enable it with nvidia-smi -i {i} -mig 1 (needs a GPU reset)"
            )
        name = _text(self._mig_call(lib.nvmlDeviceGetName, h, gpu=i, what="read the GPU name"))
        model = mig.model_for(name)
        if model is None:
            raise MigError(f"GPU {i} ({name}) is not a model in the MIG table; cannot place a layout")
        try:
            placements = mig.place_layout(model, profiles)
        except mig.LayoutError as exc:
            raise MigError(f"GPU {i}: {exc}") from exc
        busy = self._busy_mig_devices(i, h)
        if busy:
            raise MigError(f"GPU {i}: MIG devices in use ({'; '.join(busy)}); stop their processes first")
        self._destroy_mig(i, h)
        for n, pl in enumerate(placements):
            try:
                self._create_instance(i, h, model.profile(pl.profile), pl)
            except MigError as exc:
                done = ", ".join(f"{p.profile}@{p.start}" for p in placements[:n]) or "none"
                raise MigError(f"{exc} (created before it: {done})") from exc
        return self._read_mig(h, name)

    def set_mig_mode(self, gpu_index: int, enabled: bool) -> None:
        """Turn MIG mode on or off (``nvmlDeviceSetMigMode``). The driver usually applies it
        only across a GPU reset: then a ``MigError`` says so (the mode is pending), and the
        GPU stays cordoned until an operator resets it and asks again."""
        if not 0 <= gpu_index < len(self._handles):
            raise MigError(f"no GPU {gpu_index} on this node ({len(self._handles)} GPUs)")
        i, h = gpu_index, self._handles[gpu_index]
        status = self._mig_call(
            self.lib.nvmlDeviceSetMigMode, h, 1 if enabled else 0, gpu=i, what="set the MIG mode"
        )
        if int(status or 0) != 0:
            raise MigError(
                f"GPU {i}: MIG mode {'on' if enabled else 'off'} is pending a GPU reset: "
                f"run nvidia-smi -i {i} -r with no process on the GPU, then ask again"
            )

    def gpu_pids(self, gpu_index: int) -> tuple[int, ...]:
        """The compute processes NVML lists on a whole GPU (``probe.ProcessProbe``); empty
        when it cannot say (a MIG device's processes are on its own handle)."""
        if not 0 <= gpu_index < len(self._handles):
            return ()
        try:
            procs = self.lib.nvmlDeviceGetComputeRunningProcesses(self._handles[gpu_index])
        except self.lib.NVMLError:
            return ()
        return tuple(int(p.pid) for p in procs or ())

    def _busy_mig_devices(self, i: int, h: Any) -> list[str]:
        lib = self.lib
        count = self._mig_try(lib.nvmlDeviceGetMaxMigDeviceCount, h, gpu=i, what="count MIG devices") or 0
        busy = []
        for k in range(int(count)):
            m = self._mig_try(lib.nvmlDeviceGetMigDeviceHandleByIndex, h, k, gpu=i, what="open a MIG device")
            if m is None:
                continue
            procs = self._mig_call(
                lib.nvmlDeviceGetComputeRunningProcesses, m, gpu=i, what="list processes on a MIG device"
            )
            if procs:
                uuid = self._mig_try(lib.nvmlDeviceGetUUID, m, gpu=i, what="read a MIG device UUID")
                pids = ",".join(str(p.pid) for p in procs)
                busy.append(f"{'?' if uuid is None else _text(uuid)}: pid {pids}")
        return busy

    def _destroy_mig(self, i: int, h: Any) -> None:
        """Every compute instance of every GPU instance, then the GPU instance, over all
        profiles NVML knows (instances of profiles the table lacks go too)."""
        lib = self.lib
        for index in range(int(getattr(lib, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0x12))):
            info = self._mig_try(
                lib.nvmlDeviceGetGpuInstanceProfileInfo, h, index, gpu=i, what="read a GPU instance profile"
            )
            if info is None or not info.instanceCount:
                continue
            gis = self._instances(
                lib.nvmlDeviceGetGpuInstances, h, info.id, lib.c_nvmlGpuInstance_t, info.instanceCount, gpu=i
            )
            for gi in gis:
                self._destroy_compute_instances(i, gi)
                self._mig_call(lib.nvmlGpuInstanceDestroy, gi, gpu=i, what="destroy a GPU instance")

    def _destroy_compute_instances(self, i: int, gi: Any) -> None:
        lib = self.lib
        for index in range(int(getattr(lib, "NVML_COMPUTE_INSTANCE_PROFILE_COUNT", 9))):
            info = self._mig_try(
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
                self._mig_call(lib.nvmlComputeInstanceDestroy, ci, gpu=i, what="destroy a compute instance")

    def _instances(
        self, fn: Callable[..., Any], parent: Any, profile_id: int, kind: Any, most: int, *, gpu: int
    ) -> list[Any]:
        """pynvml's C-style listing: a caller-sized array of handles and a count pointer."""
        handles = (kind * max(1, int(most)))()
        count = ctypes.c_uint(0)
        self._mig_call(
            fn, parent, profile_id, handles, ctypes.pointer(count), gpu=gpu, what="list MIG instances"
        )
        return [handles[k] for k in range(count.value)]

    def _create_instance(self, i: int, h: Any, profile: mig.Profile, pl: mig.Placement) -> None:
        lib = self.lib
        where = f"{pl.profile} at memory slice {pl.start}"
        info = self._mig_call(
            lib.nvmlDeviceGetGpuInstanceProfileInfo,
            h,
            profile.nvml_profile_id,
            gpu=i,
            what=f"look up {pl.profile}",
        )
        placement = lib.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = pl.start, pl.size
        gi = self._mig_call(
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
        ci_info = self._mig_call(
            lib.nvmlGpuInstanceGetComputeInstanceProfileInfo,
            gi,
            ci_profile,
            _CI_ENGINE_SHARED,
            gpu=i,
            what=f"look up the compute instance profile for {where}",
        )
        self._mig_call(
            lib.nvmlGpuInstanceCreateComputeInstance,
            gi,
            ci_info.id,
            gpu=i,
            what=f"create the compute instance of {where}",
        )

    def _mig_call(self, fn: Callable[..., T], *args: Any, gpu: int, what: str) -> T:
        """A MIG step: any NVML error is a ``MigError`` saying what it means for the operator."""
        try:
            return fn(*args)
        except self.lib.NVMLError as exc:
            raise self._mig_error(exc, gpu=gpu, what=what) from exc

    def _mig_try(self, fn: Callable[..., T], *args: Any, gpu: int, what: str) -> T | None:
        """Like ``_mig_call``, but None for what the device lacks (a profile it does not
        offer, an empty MIG device index)."""
        try:
            return fn(*args)
        except self.lib.NVMLError as exc:
            if self._code(exc) in (NOT_SUPPORTED, INVALID_ARGUMENT, NOT_FOUND):
                return None
            raise self._mig_error(exc, gpu=gpu, what=what) from exc

    def _mig_error(self, exc: BaseException, *, gpu: int, what: str) -> MigError:
        why = _MIG_ERRORS.get(self._code(exc) or -1, str(exc))
        return MigError(f"GPU {gpu}: cannot {what}: {why}")

    # -- telemetry --------------------------------------------------------------------------
    def sample(self) -> tuple[GpuSample, ...]:
        xids = self._drain_xids()
        out = []
        for i, h in enumerate(self._handles):
            try:
                out.append(self._sample(i, h, tuple(xids.get(i, ()))))
            except _Lost:
                out.append(GpuSample(index=i, lost=True, xid_events=tuple(xids.get(i, ()))))
        return tuple(out)

    def _sample(self, i: int, h: Any, xids: tuple[int, ...]) -> GpuSample:
        lib = self.lib
        util = self._field(lib.nvmlDeviceGetUtilizationRates, h)
        mem = self._field(lib.nvmlDeviceGetMemoryInfo, h)
        power_mw = self._field(lib.nvmlDeviceGetPowerUsage, h)
        mask = self._field(lib.nvmlDeviceGetCurrentClocksThrottleReasons, h)
        corrected = getattr(lib, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0)
        uncorrected = getattr(lib, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
        volatile = getattr(lib, "NVML_VOLATILE_ECC", 0)
        temp = self._field(lib.nvmlDeviceGetTemperature, h, getattr(lib, "NVML_TEMPERATURE_GPU", 0))
        return GpuSample(
            index=i,
            utilization_pct=None if util is None else float(util.gpu),
            memory_used_mb=None if mem is None else int(mem.used) // (1024 * 1024),
            temperature_c=None if temp is None else float(temp),
            power_w=None if power_mw is None else power_mw / 1000.0,
            sm_clock_mhz=self._field(lib.nvmlDeviceGetClockInfo, h, getattr(lib, "NVML_CLOCK_SM", 1)),
            mem_clock_mhz=self._field(lib.nvmlDeviceGetClockInfo, h, getattr(lib, "NVML_CLOCK_MEM", 2)),
            throttle_reasons=() if mask is None else self._throttle_names(int(mask)),
            ecc_sbe=self._field(lib.nvmlDeviceGetTotalEccErrors, h, corrected, volatile),
            ecc_dbe=self._field(lib.nvmlDeviceGetTotalEccErrors, h, uncorrected, volatile),
            xid_events=xids,
            pcie_replay=self._field(lib.nvmlDeviceGetPcieReplayCounter, h),
            retired_pages=self._retired_pages(h),
            mig_instances=self._mig_samples(i, h),
        )

    def _mig_samples(self, i: int, h: Any) -> tuple[MigSample, ...]:
        """Memory used and total of each MIG instance of a GPU in MIG mode, one per GPU
        instance (its compute instances share its memory), by GPU instance id; () when MIG
        is off or the driver cannot tell: the GPU's own sample never fails over its
        instances. No utilisation: see ``MigSample``. A GPU that fell off the bus is still
        ``_Lost``."""
        lib = self.lib
        mode = self._field(lib.nvmlDeviceGetMigMode, h)
        if mode is None or not mode[0]:
            return ()
        out: dict[int, MigSample] = {}
        try:
            count = self._field(lib.nvmlDeviceGetMaxMigDeviceCount, h) or 0
            for k in range(int(count)):
                m = self._field(lib.nvmlDeviceGetMigDeviceHandleByIndex, h, k, missing=NOT_FOUND)
                gi = None if m is None else self._field(lib.nvmlDeviceGetGpuInstanceId, m)
                if gi is None or int(gi) in out:
                    continue
                mem = self._field(lib.nvmlDeviceGetMemoryInfo, m)
                out[int(gi)] = MigSample(
                    gpu_instance_id=int(gi),
                    memory_used_mb=None if mem is None else int(mem.used) // (1024 * 1024),
                    memory_total_mb=None if mem is None else int(mem.total) // (1024 * 1024),
                )
        except ProbeError as exc:
            if i not in self._mig_sample_warned:  # once per GPU: samples come every few seconds
                self._mig_sample_warned.add(i)
                log.warning("GPU %d: no MIG instance telemetry: %s", i, exc)
            return ()
        return tuple(out[gi] for gi in sorted(out))

    def _retired_pages(self, h: Any) -> int | None:
        """Pages retired for multiple single-bit and for double-bit ECC errors (None where
        the driver does not report retirement, e.g. GPUs with row remapping)."""
        fn = getattr(self.lib, "nvmlDeviceGetRetiredPages", None)
        if fn is None:
            return None
        total = 0
        for name, default in (
            ("NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", 0),
            ("NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1),
        ):
            pages = self._field(fn, h, getattr(self.lib, name, default))
            if pages is None:
                return None
            total += len(pages)
        return total

    def _throttle_names(self, mask: int) -> tuple[str, ...]:
        return tuple(label for attr, label in _THROTTLE_NAMES if mask & int(getattr(self.lib, attr, 0) or 0))

    # -- XID events -------------------------------------------------------------------------
    def _register_xid_events(self) -> Any:
        lib = self.lib
        events = self._field(lib.nvmlEventSetCreate)
        if events is None:
            return None
        kind = getattr(lib, "nvmlEventTypeXidCriticalError", 8)
        for h in self._handles:
            try:
                self._field(lib.nvmlDeviceRegisterEvents, h, kind, events)
            except _Lost:
                continue
        return events

    def _drain_xids(self) -> dict[int, list[int]]:
        """Non-blocking: every XID event queued since the last sample."""
        out: dict[int, list[int]] = {}
        if self._events is None:
            return out
        lib = self.lib
        for _ in range(1000):
            try:
                data = lib.nvmlEventSetWait(self._events, 0)
            except lib.NVMLError as exc:
                if self._code(exc) == TIMEOUT:
                    break
                raise ProbeError(f"NVML: reading XID events failed: {exc}") from exc
            try:
                index = int(lib.nvmlDeviceGetIndex(data.device))
            except lib.NVMLError:
                index = -1
            out.setdefault(index, []).append(int(data.eventData))
        return out

    def close(self) -> None:
        lib = self.lib
        if self._events is not None:
            with contextlib.suppress(lib.NVMLError):
                lib.nvmlEventSetFree(self._events)
            self._events = None
        with contextlib.suppress(lib.NVMLError):
            lib.nvmlShutdown()
