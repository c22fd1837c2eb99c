"""A pynvml-shaped fake: the functions, constants and ``NVMLError`` that ``NvmlProbe``
uses, over a list of ``FakeGpu`` s. Passed to ``NvmlProbe(nvml=...)``; nothing patched.
Errors are raised through ``self.NVMLError`` / ``self.NVMLError_NotSupported``, so a test
can swap in pynvml's own exception classes."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from gpufleet import mig

INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
IN_USE = 19
INSUFFICIENT_RESOURCES = 23
TIMEOUT = 10
GPU_IS_LOST = 15
LIBRARY_NOT_FOUND = 12


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class NVMLError_NotSupported(NVMLError):  # pynvml's name
    """pynvml raises a subclass per return code; this is the one for NOT_SUPPORTED."""

    def __init__(self) -> None:
        super().__init__(NOT_SUPPORTED)


# GPU instance profile index (NVML_GPU_INSTANCE_PROFILE_*) -> the profile ID a device reports
# for it (``nvidia-smi mig -lgip`` on an A100: 1g.5gb is 19, 7g.40gb is 0): not the index,
# so a probe that confuses the two names instances wrongly.
PROFILE_IDS = {0: 19, 1: 14, 2: 9, 3: 5, 4: 0, 7: 20, 9: 15}
# compute slices -> NVML_COMPUTE_INSTANCE_PROFILE_* that spans them.
CI_PROFILES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}


@dataclass
class FakeCi:
    id: int
    uuid: str
    processes: list[int] = field(default_factory=list)
    """PIDs running on this MIG device."""


@dataclass
class FakeGi:
    id: int
    profile_id: int
    """NVML's profile ID (a ``PROFILE_IDS`` value), as ``nvmlGpuInstanceInfo_t.profileId``."""
    start: int
    size: int
    slices: int
    """Compute slices."""
    memory_mb: int
    name: str = ""
    """The profile's name in the MIG device name ("1g.10gb")."""
    cis: list[FakeCi] = field(default_factory=list)
    used_mb: int = 0
    """Memory in use on the instance (what ``nvmlDeviceGetMemoryInfo`` on its MIG device says)."""


class c_nvmlGpuInstancePlacement_t(ctypes.Structure):  # pynvml's name and fields
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


@dataclass(frozen=True)
class MigHandle:
    gpu: int
    gi: int
    ci: int


@dataclass
class FakeGpu:
    name: str | bytes = "NVIDIA H100 80GB HBM3"
    uuid: str | bytes = "GPU-0"
    bus_id: str = "00000000:18:00.0"
    total_mb: int = 81_559
    used_mb: int = 1_024
    util: int = 42
    temp: int = 55
    power_mw: int = 312_000
    sm_clock: int = 1980
    mem_clock: int = 2619
    throttle: int = 0
    sbe: int = 0
    dbe: int = 0
    replay: int = 0
    pcie: tuple[int, int] = (5, 16)
    pcie_max: tuple[int, int] = (5, 16)
    """The most the GPU and its slot can do (generation, width)."""
    ecc: tuple[int, int] = (1, 1)
    """ECC mode (current, pending); "ecc_mode" in ``unsupported``: a GPU without ECC."""
    links_down: set[int] = field(default_factory=set)
    """NVLinks (indices into ``links``) reported inactive."""
    links: list[str] = field(default_factory=list)
    """Remote PCI bus id per active NVLink."""
    mig: int = 0
    retired_sbe: int = 0
    """Pages retired for multiple single-bit ECC errors."""
    retired_dbe: int = 0
    """Pages retired for a double-bit ECC error."""
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False
    gis: list[FakeGi] = field(default_factory=list)
    """MIG GPU instances (with their compute instances) while ``mig`` is 1."""
    processes: list[int] = field(default_factory=list)
    """Compute processes on the whole GPU (pids)."""


class FakeNvml:
    NVMLError: Any = NVMLError
    NVMLError_NotSupported: Any = NVMLError_NotSupported
    NVML_NVLINK_MAX_LINKS = 18
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
    nvmlEventTypeXidCriticalError = 8
    nvmlClocksThrottleReasonGpuIdle = 0x1
    nvmlClocksThrottleReasonSwPowerCap = 0x4
    nvmlClocksThrottleReasonHwThermalSlowdown = 0x40
    NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12
    NVML_COMPUTE_INSTANCE_PROFILE_COUNT = 0x9
    c_nvmlGpuInstance_t = ctypes.c_void_p  # handles in arrays: ints here, pointers in pynvml
    c_nvmlComputeInstance_t = ctypes.c_void_p
    c_nvmlGpuInstancePlacement_t = c_nvmlGpuInstancePlacement_t

    def __init__(self, gpus: list[FakeGpu], *, init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.xids: list[tuple[int, int]] = []
        self.shut_down = False
        self._refs: dict[int, tuple[int, Any]] = {}
        """Handle (an int, as a ``c_void_p`` array holds it) -> (GPU index, FakeGi or FakeCi)."""
        self.fail: dict[str, int] = {}
        """NVML function name -> the error code it raises (e.g. NO_PERMISSION)."""
        self.log: list[tuple[str, ...]] = []
        """MIG changes in order: ("destroy_ci", uuid), ("destroy_gi", gi id), ("create_gi", name, start)."""
        self.reset_needed = False
        """``nvmlDeviceSetMigMode`` answers "pending a reset" (as most drivers do) when True."""
        self.driver = "550.54.15"
        """What ``nvmlSystemGetDriverVersion`` says (a test upgrades it)."""
        self.inits = 0

    def _gpu(self, h: Any, what: str) -> FakeGpu:
        if isinstance(h, MigHandle):
            h = h.gpu
        g: FakeGpu = self.gpus[h]
        if g.lost:
            raise self.NVMLError(GPU_IS_LOST)
        if what in g.unsupported:
            raise self.NVMLError_NotSupported()
        return g

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.NVMLError(self.init_error)
        self.inits += 1
        self.shut_down = False

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return self.driver.encode()

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetIndex(self, h: int) -> int:
        return h

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=self._gpu(h, "pci").bus_id)

    def nvmlDeviceGetUUID(self, h: Any) -> str | bytes:
        g = self._gpu(h, "uuid")
        return self._mig(h)[1].uuid.encode() if isinstance(h, MigHandle) else g.uuid

    def nvmlDeviceGetName(self, h: Any) -> str | bytes:
        g = self._gpu(h, "name")
        if isinstance(h, MigHandle):
            return f"{g.name.decode() if isinstance(g.name, bytes) else g.name} MIG {self._mig(h)[0].name}"
        return g.name

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> Any:
        g = self._gpu(h, "memory")
        if isinstance(h, MigHandle):  # the GPU instance's memory, shared by its compute instances
            gi = self._mig(h)[0]
            return SimpleNamespace(total=gi.memory_mb * 1024 * 1024, used=gi.used_mb * 1024 * 1024)
        return SimpleNamespace(total=g.total_mb * 1024 * 1024, used=g.used_mb * 1024 * 1024)

    def nvmlDeviceGetMigMode(self, h: int) -> list[int]:
        return [self._gpu(h, "mig").mig, 0]

    def nvmlDeviceSetMigMode(self, h: int, mode: int) -> int:
        """The activation status: 0 when the mode took effect, else (``reset_needed``) a
        non-zero code and the mode stays as it was until a reset."""
        g = self._gpu(h, "set_mig")
        if self.reset_needed:
            return 1
        g.mig = mode
        return 0

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return self._gpu(h, "pcie").pcie[0]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return self._gpu(h, "pcie").pcie[1]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return self._gpu(h, "pcie").pcie_max[0]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return self._gpu(h, "pcie").pcie_max[1]

    def nvmlDeviceGetEccMode(self, h: int) -> list[int]:
        return list(self._gpu(h, "ecc_mode").ecc)

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        g = self._gpu(h, "nvlink")
        if link >= len(g.links):
            raise self.NVMLError_NotSupported()
        return 0 if link in g.links_down else 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> Any:
        return SimpleNamespace(busId=self._gpu(h, "nvlink").links[link])

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=self._gpu(h, "util").util, memory=0)

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return self._gpu(h, "temp").temp

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return self._gpu(h, "power").power_mw

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        g = self._gpu(h, "clocks")
        return g.sm_clock if kind == self.NVML_CLOCK_SM else g.mem_clock

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> int:
        return self._gpu(h, "throttle").throttle

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        g = self._gpu(h, "ecc")
        return g.dbe if kind == self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else g.sbe

    def nvmlDeviceGetPcieReplayCounter(self, h: int) -> int:
        return self._gpu(h, "replay").replay

    def nvmlDeviceGetRetiredPages(self, h: int, cause: int) -> list[int]:
        """Like pynvml's: the retired pages' addresses for one cause (NOT_SUPPORTED on GPUs
        that remap rows instead, e.g. A100 and H100)."""
        g = self._gpu(h, "retired_pages")
        if cause == self.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS:
            n, base = g.retired_sbe, 0x1000_0000
        elif cause == self.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR:
            n, base = g.retired_dbe, 0x2000_0000
        else:
            raise self.NVMLError(INVALID_ARGUMENT)
        return [base + 0x1000 * i for i in range(n)]

    def nvmlEventSetCreate(self) -> str:
        return "events"

    def nvmlDeviceRegisterEvents(self, h: int, kind: int, events: str) -> None:
        self._gpu(h, "events")

    def nvmlEventSetWait(self, events: str, timeout_ms: int) -> Any:
        if not self.xids:
            raise self.NVMLError(TIMEOUT)
        index, xid = self.xids.pop(0)
        return SimpleNamespace(device=index, eventData=xid, eventType=8)

    def nvmlEventSetFree(self, events: str) -> None:
        pass

    # -- MIG ------------------------------------------------------------------------------------
    def _check(self, fn: str) -> None:
        if fn in self.fail:
            raise self.NVMLError(self.fail[fn])

    def _mig(self, h: MigHandle) -> tuple[FakeGi, FakeCi]:
        gi = next(x for x in self.gpus[h.gpu].gis if x.id == h.gi)
        return gi, next(c for c in gi.cis if c.id == h.ci)

    def _model(self, g: FakeGpu) -> mig.GpuModel:
        model = mig.model_for(g.name.decode() if isinstance(g.name, bytes) else g.name)
        if model is None:
            raise self.NVMLError_NotSupported()
        return model

    def _ref(self, obj: FakeGi | FakeCi, gpu: int) -> int:
        """A handle as an int (what a ``c_void_p`` array holds)."""
        key = id(obj)
        self._refs[key] = (gpu, obj)
        return key

    def _gi(self, ref: int) -> tuple[int, FakeGi]:
        gpu, gi = self._refs[ref]
        if gi not in self.gpus[gpu].gis:
            raise self.NVMLError(INVALID_ARGUMENT)
        return gpu, gi

    def _mig_devices(self, g: FakeGpu) -> list[tuple[FakeGi, FakeCi]]:
        return [(gi, ci) for gi in g.gis for ci in gi.cis]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: int) -> int:
        self._check("nvmlDeviceGetMaxMigDeviceCount")
        self._gpu(h, "mig_devices")
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: int, index: int) -> MigHandle:
        devices = self._mig_devices(self._gpu(h, "mig_devices"))
        if index >= len(devices):
            raise self.NVMLError(NOT_FOUND)
        gi, ci = devices[index]
        return MigHandle(h, gi.id, ci.id)

    def nvmlDeviceGetGpuInstanceId(self, m: MigHandle) -> int:
        return m.gi

    def nvmlDeviceGetComputeInstanceId(self, m: MigHandle) -> int:
        return m.ci

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:
        gpu = self._gpu(h, "processes")
        if not isinstance(h, MigHandle):
            return [SimpleNamespace(pid=p, usedGpuMemory=1 << 30) for p in gpu.processes]
        return [SimpleNamespace(pid=p, usedGpuMemory=1 << 30) for p in self._mig(h)[1].processes]

    def nvmlDeviceGetGpuInstanceById(self, h: int, gi_id: int) -> int:
        g = self._gpu(h, "gpu_instances")
        gi = next((x for x in g.gis if x.id == gi_id), None)
        if gi is None:
            raise self.NVMLError(NOT_FOUND)
        return self._ref(gi, h)

    def nvmlGpuInstanceGetInfo(self, ref: int) -> Any:
        gpu, gi = self._gi(ref)
        self._gpu(gpu, "gpu_instance_info")
        placement = SimpleNamespace(start=gi.start, size=gi.size)
        return SimpleNamespace(device=gpu, id=gi.id, profileId=gi.profile_id, placement=placement)

    def nvmlDeviceGetGpuInstanceProfileInfo(self, h: int, index: int) -> Any:
        self._check("nvmlDeviceGetGpuInstanceProfileInfo")
        g = self._gpu(h, "gpu_instances")
        p = self._model(g).by_nvml_id(index)
        if p is None or index not in PROFILE_IDS:
            raise self.NVMLError(INVALID_ARGUMENT)
        return SimpleNamespace(
            id=PROFILE_IDS[index],
            sliceCount=p.compute_slices,
            instanceCount=p.max_instances,
            memorySizeMB=p.memory_mib,
        )

    def _profile(self, g: FakeGpu, profile_id: int) -> mig.Profile:
        for index, pid in PROFILE_IDS.items():
            if pid == profile_id and (p := self._model(g).by_nvml_id(index)) is not None:
                return p
        raise self.NVMLError(INVALID_ARGUMENT)

    def nvmlDeviceGetGpuInstances(self, h: int, profile_id: int, out: Any, count: Any) -> None:
        self._check("nvmlDeviceGetGpuInstances")
        gis = [gi for gi in self._gpu(h, "gpu_instances").gis if gi.profile_id == profile_id]
        if len(gis) > len(out):
            raise self.NVMLError(INSUFFICIENT_RESOURCES)  # pynvml: INSUFFICIENT_SIZE; unused here
        for k, gi in enumerate(gis):
            out[k] = self._ref(gi, h)
        count.contents.value = len(gis)

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, h: int, profile_id: int, placement: Any) -> int:
        self._check("nvmlDeviceCreateGpuInstanceWithPlacement")
        g = self._gpu(h, "gpu_instances")
        if not g.mig:
            raise self.NVMLError_NotSupported()
        p = self._profile(g, profile_id)
        start, size = placement.contents.start, placement.contents.size
        if size != p.size or start not in p.starts:
            raise self.NVMLError(INVALID_ARGUMENT)
        taken = {s for gi in g.gis for s in range(gi.start, gi.start + gi.size)}
        if taken & set(range(start, start + size)) or sum(gi.slices for gi in g.gis) + p.compute_slices > 7:
            raise self.NVMLError(INSUFFICIENT_RESOURCES)
        gi = FakeGi(
            id=max((x.id for x in g.gis), default=0) + 1,
            profile_id=profile_id,
            start=start,
            size=size,
            slices=p.compute_slices,
            memory_mb=p.memory_mib - 256,
            name=p.name,
        )
        g.gis.append(gi)
        self.log.append(("create_gi", p.name, str(start)))
        return self._ref(gi, h)

    def nvmlGpuInstanceDestroy(self, ref: int) -> None:
        self._check("nvmlGpuInstanceDestroy")
        gpu, gi = self._gi(ref)
        if gi.cis:
            raise self.NVMLError(IN_USE)
        self.gpus[gpu].gis.remove(gi)
        self.log.append(("destroy_gi", str(gi.id)))

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, ref: int, index: int, engine: int) -> Any:
        _, gi = self._gi(ref)
        slices = {v: k for k, v in CI_PROFILES.items()}.get(index)
        if slices is None or slices > gi.slices or engine != 0:
            raise self.NVMLError_NotSupported()
        return SimpleNamespace(id=index, sliceCount=slices, instanceCount=gi.slices // slices)

    def nvmlGpuInstanceGetComputeInstances(self, ref: int, ci_profile: int, out: Any, count: Any) -> None:
        _, gi = self._gi(ref)
        cis = [ci for ci in gi.cis if ci_profile == CI_PROFILES[gi.slices]]
        for k, ci in enumerate(cis):
            out[k] = self._ref(ci, self._gi(ref)[0])
        count.contents.value = len(cis)

    def nvmlGpuInstanceCreateComputeInstance(self, ref: int, ci_profile: int) -> int:
        self._check("nvmlGpuInstanceCreateComputeInstance")
        gpu, gi = self._gi(ref)
        if ci_profile != CI_PROFILES[gi.slices] or gi.cis:
            raise self.NVMLError(INSUFFICIENT_RESOURCES)
        ci = FakeCi(id=0, uuid=f"MIG-{gpu}-{gi.id}-0-{len(self.log)}")
        gi.cis.append(ci)
        return self._ref(ci, gpu)

    def nvmlComputeInstanceDestroy(self, ref: int) -> None:
        self._check("nvmlComputeInstanceDestroy")
        gpu, ci = self._refs[ref]
        for gi in self.gpus[gpu].gis:
            if ci in gi.cis:
                if ci.processes:
                    raise self.NVMLError(IN_USE)
                gi.cis.remove(ci)
                self.log.append(("destroy_ci", ci.uuid))
                return
        raise self.NVMLError(INVALID_ARGUMENT)


def mig_gpu(model: str, layout: list[tuple[str, int]], *, index: int = 0) -> list[FakeGi]:
    """GPU instances (each with one compute instance) for ``FakeGpu.gis``: (profile, start)
    pairs on ``model`` (a ``gpufleet.mig`` name)."""
    m = mig.model_for(model)
    assert m is not None
    out = []
    for n, (name, start) in enumerate(layout, start=1):
        p = m.profile(name)
        out.append(
            FakeGi(
                id=n,
                profile_id=PROFILE_IDS[p.nvml_profile_id],
                start=start,
                size=p.size,
                slices=p.compute_slices,
                memory_mb=p.memory_mib - 256,
                name=p.name,
                cis=[FakeCi(id=0, uuid=f"MIG-{index}-{n}-old")],
            )
        )
    return out
