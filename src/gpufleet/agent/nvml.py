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
import importlib
from collections.abc import Callable
from typing import Any, TypeVar

from gpufleet.agent.probe import GpuInfo, GpuSample, NodeInventory, ProbeError, host_resources, nvlink_domains

T = TypeVar("T")

# NVML return codes (nvml.h); kept here so a fake library need not define them all.
NOT_SUPPORTED = 3
NO_PERMISSION = 4
TIMEOUT = 10
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
INVALID_ARGUMENT = 2
_UNSUPPORTED = frozenset({NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND})

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

    def _field(self, fn: Callable[..., T], *args: Any) -> T | None:
        """One optional field: None when unsupported; _Lost when the GPU is gone."""
        try:
            return fn(*args)
        except self.lib.NVMLError as exc:
            code = self._code(exc)
            if code in _UNSUPPORTED or code == INVALID_ARGUMENT:
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
        )

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
