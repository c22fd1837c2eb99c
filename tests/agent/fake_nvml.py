"""A pynvml-shaped fake: the functions, constants and ``NVMLError`` that ``NvmlProbe``
uses, over a list of ``FakeGpu`` s. Passed to ``NvmlProbe(nvml=...)``; nothing patched.
Errors are raised through ``self.NVMLError`` / ``self.NVMLError_NotSupported``, so a test
can swap in pynvml's own exception classes."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
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
    links: list[str] = field(default_factory=list)
    """Remote PCI bus id per active NVLink."""
    mig: int = 0
    retired_sbe: int = 0
    """Pages retired for multiple single-bit ECC errors."""
    retired_dbe: int = 0
    """Pages retired for a double-bit ECC error."""
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False


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

    def __init__(self, gpus: list[FakeGpu], *, init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.xids: list[tuple[int, int]] = []
        self.shut_down = False

    def _gpu(self, h: int, what: str) -> FakeGpu:
        g = self.gpus[h]
        if g.lost:
            raise self.NVMLError(GPU_IS_LOST)
        if what in g.unsupported:
            raise self.NVMLError_NotSupported()
        return g

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"550.54.15"

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

    def nvmlDeviceGetUUID(self, h: int) -> str | bytes:
        return self._gpu(h, "uuid").uuid

    def nvmlDeviceGetName(self, h: int) -> str | bytes:
        return self._gpu(h, "name").name

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        g = self._gpu(h, "memory")
        return SimpleNamespace(total=g.total_mb * 1024 * 1024, used=g.used_mb * 1024 * 1024)

    def nvmlDeviceGetMigMode(self, h: int) -> list[int]:
        return [self._gpu(h, "mig").mig, 0]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return self._gpu(h, "pcie").pcie[0]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return self._gpu(h, "pcie").pcie[1]

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        g = self._gpu(h, "nvlink")
        if link >= len(g.links):
            raise self.NVMLError_NotSupported()
        return 1

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
