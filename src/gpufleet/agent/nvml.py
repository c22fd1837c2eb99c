"""``NvmlProbe``: real GPUs through NVML, in-process (``nvidia-ml-py``'s ``pynvml``),
never by running ``nvidia-smi``.

The library is passed in (``NvmlProbe(nvml=...)``) or imported lazily on first use, so
importing gpufleet needs no driver and tests drive the translation layer with a fake
module. NVML errors are translated at the boundary (``nvmllib.py``): a field the GPU does
not support (or this driver does not know) is ``None``; a GPU that fell off the bus is a
sample with ``lost=True``; anything else is a ``ProbeError``. Here: the inventory (GPUs,
NVLink domains), telemetry and XID events; MIG devices and layouts are ``nvmlmig.py``'s.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from gpufleet.agent.nvmllib import TIMEOUT, GpuLost, call, code, field, load_nvml, text
from gpufleet.agent.nvmlmig import NvmlMig
from gpufleet.agent.probe import (
    GpuInfo,
    GpuSample,
    MigError,
    MigInstance,
    NodeInventory,
    ProbeError,
    host_resources,
    nvlink_domains,
)

log = logging.getLogger(__name__)

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


class NvmlProbe:
    """``nvml`` is the ``pynvml`` module or anything with the same functions, constants
    and ``NVMLError`` (with ``.value``)."""

    def __init__(self, nvml: Any = None) -> None:
        self.lib = nvml if nvml is not None else load_nvml()
        self._handles: list[Any] = []
        self._events: Any = None
        self._mig = NvmlMig(self.lib)
        self._open()

    def reload(self) -> None:
        """NVML closed and opened again: after a driver upgrade without a reboot (the
        upgrade's verification, ``upgrade.py``), the driver, CUDA version and devices are
        read from the new driver, not from what the old library handle cached."""
        self.close()
        self._open()

    def _open(self) -> None:
        call(self.lib, self.lib.nvmlInit, what="initialise NVML (is the NVIDIA driver installed?)")
        try:
            count = int(call(self.lib, self.lib.nvmlDeviceGetCount, what="count GPUs"))
            self._handles = [
                call(self.lib, self.lib.nvmlDeviceGetHandleByIndex, i, what=f"open GPU {i}")
                for i in range(count)
            ]
            self._events = self._register_xid_events()
        except ProbeError:
            self.close()
            raise

    # -- inventory --------------------------------------------------------------------------
    def inventory(self) -> NodeInventory:
        lib = self.lib
        driver = field(lib, lib.nvmlSystemGetDriverVersion)
        cuda = field(lib, lib.nvmlSystemGetCudaDriverVersion)
        bus_ids: dict[str, int] = {}
        for i, h in enumerate(self._handles):
            try:
                pci = field(lib, lib.nvmlDeviceGetPciInfo, h)
            except GpuLost:
                continue
            if pci is not None:
                bus_ids[text(pci.busId).lower()] = i
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
            except GpuLost:
                continue
        cpus, memory_mb = host_resources()
        return NodeInventory(
            gpus=tuple(gpus),
            driver_version=None if driver is None else text(driver),
            cuda_version=None if cuda is None else f"{int(cuda) // 1000}.{int(cuda) % 1000 // 10}",
            cpus=cpus,
            memory_mb=memory_mb,
        )

    def _gpu_info(self, i: int, h: Any, peers: tuple[int, ...], domain: int) -> GpuInfo:
        lib = self.lib
        mem = field(lib, lib.nvmlDeviceGetMemoryInfo, h)
        mig = field(lib, lib.nvmlDeviceGetMigMode, h)
        uuid = field(lib, lib.nvmlDeviceGetUUID, h)
        name = field(lib, lib.nvmlDeviceGetName, h)
        return GpuInfo(
            index=i,
            uuid="" if uuid is None else text(uuid),
            model="unknown" if name is None else text(name),
            memory_mb=0 if mem is None else int(mem.total) // (1024 * 1024),
            pcie_gen=field(lib, lib.nvmlDeviceGetCurrPcieLinkGeneration, h),
            pcie_width=field(lib, lib.nvmlDeviceGetCurrPcieLinkWidth, h),
            nvlink_peers=peers,
            nvlink_domain=domain,
            mig_enabled=None if mig is None else bool(mig[0]),
            mig_instances=self._mig.instances(i, h, name) if mig is not None and mig[0] else (),
        )

    def _nvlink_peers(self, h: Any, bus_ids: dict[str, int]) -> tuple[list[int], bool]:
        """(local GPUs linked directly, whether any link goes to something else: an NVSwitch)."""
        lib = self.lib
        direct: list[int] = []
        via_switch = False
        for link in range(int(getattr(lib, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                state = field(lib, lib.nvmlDeviceGetNvLinkState, h, link)
                if not state:
                    if state is None:
                        break
                    continue
                remote = field(lib, lib.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
            except GpuLost:
                break
            if remote is None:
                continue
            peer = bus_ids.get(text(remote.busId).lower())
            if peer is None:
                via_switch = True
            else:
                direct.append(peer)
        return direct, via_switch

    # -- MIG --------------------------------------------------------------------------------
    def apply_mig_layout(self, gpu_index: int, profiles: Sequence[str]) -> tuple[MigInstance, ...]:
        """Replace GPU ``gpu_index``'s MIG instances by ``profiles`` (``NvmlMig.apply_layout``);
        its MIG devices afterwards."""
        return self._mig.apply_layout(gpu_index, self._handle(gpu_index), profiles)

    def set_mig_mode(self, gpu_index: int, enabled: bool) -> None:
        """Turn MIG mode on or off (``NvmlMig.set_mode``)."""
        self._mig.set_mode(gpu_index, self._handle(gpu_index), enabled)

    def _handle(self, gpu_index: int) -> Any:
        if not 0 <= gpu_index < len(self._handles):
            raise MigError(f"no GPU {gpu_index} on this node ({len(self._handles)} GPUs)")
        return self._handles[gpu_index]

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

    # -- telemetry --------------------------------------------------------------------------
    def sample(self) -> tuple[GpuSample, ...]:
        xids = self._drain_xids()
        out = []
        for i, h in enumerate(self._handles):
            try:
                out.append(self._sample(i, h, tuple(xids.get(i, ()))))
            except GpuLost:
                out.append(GpuSample(index=i, lost=True, xid_events=tuple(xids.get(i, ()))))
        return tuple(out)

    def _sample(self, i: int, h: Any, xids: tuple[int, ...]) -> GpuSample:
        lib = self.lib
        util = field(lib, lib.nvmlDeviceGetUtilizationRates, h)
        mem = field(lib, lib.nvmlDeviceGetMemoryInfo, h)
        power_mw = field(lib, lib.nvmlDeviceGetPowerUsage, h)
        mask = field(lib, lib.nvmlDeviceGetCurrentClocksThrottleReasons, h)
        corrected = getattr(lib, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0)
        uncorrected = getattr(lib, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
        volatile = getattr(lib, "NVML_VOLATILE_ECC", 0)
        temp = field(lib, lib.nvmlDeviceGetTemperature, h, getattr(lib, "NVML_TEMPERATURE_GPU", 0))
        ecc_mode = field(lib, lib.nvmlDeviceGetEccMode, h)  # [current, pending]
        return GpuSample(
            index=i,
            utilization_pct=None if util is None else float(util.gpu),
            memory_used_mb=None if mem is None else int(mem.used) // (1024 * 1024),
            temperature_c=None if temp is None else float(temp),
            power_w=None if power_mw is None else power_mw / 1000.0,
            sm_clock_mhz=field(lib, lib.nvmlDeviceGetClockInfo, h, getattr(lib, "NVML_CLOCK_SM", 1)),
            mem_clock_mhz=field(lib, lib.nvmlDeviceGetClockInfo, h, getattr(lib, "NVML_CLOCK_MEM", 2)),
            throttle_reasons=() if mask is None else self._throttle_names(int(mask)),
            ecc_sbe=field(lib, lib.nvmlDeviceGetTotalEccErrors, h, corrected, volatile),
            ecc_dbe=field(lib, lib.nvmlDeviceGetTotalEccErrors, h, uncorrected, volatile),
            xid_events=xids,
            pcie_replay=field(lib, lib.nvmlDeviceGetPcieReplayCounter, h),
            retired_pages=self._retired_pages(h),
            mig_instances=self._mig.samples(i, h),
            pcie_gen=field(lib, lib.nvmlDeviceGetCurrPcieLinkGeneration, h),
            pcie_width=field(lib, lib.nvmlDeviceGetCurrPcieLinkWidth, h),
            pcie_max_gen=field(lib, lib.nvmlDeviceGetMaxPcieLinkGeneration, h),
            pcie_max_width=field(lib, lib.nvmlDeviceGetMaxPcieLinkWidth, h),
            nvlink_down=self._nvlink_down(h),
            ecc_enabled=None if ecc_mode is None else bool(ecc_mode[0]),
            ecc_pending=None if ecc_mode is None else bool(ecc_mode[1]),
        )

    def _nvlink_down(self, h: Any) -> tuple[int, ...]:
        """Links NVML supports on this GPU but reports inactive (DCGM's "Down"; a link it
        does not support is "Disabled" and ends the list, as in ``_nvlink_peers``).
        Written against NVML's documented API; not run on a GPU here."""
        lib = self.lib
        down: list[int] = []
        for link in range(int(getattr(lib, "NVML_NVLINK_MAX_LINKS", 18))):
            state = field(lib, lib.nvmlDeviceGetNvLinkState, h, link)
            if state is None:
                break
            if not state:
                down.append(link)
        return tuple(down)

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
            pages = field(self.lib, fn, h, getattr(self.lib, name, default))
            if pages is None:
                return None
            total += len(pages)
        return total

    def _throttle_names(self, mask: int) -> tuple[str, ...]:
        return tuple(label for attr, label in _THROTTLE_NAMES if mask & int(getattr(self.lib, attr, 0) or 0))

    # -- XID events -------------------------------------------------------------------------
    def _register_xid_events(self) -> Any:
        lib = self.lib
        events = field(lib, lib.nvmlEventSetCreate)
        if events is None:
            return None
        kind = getattr(lib, "nvmlEventTypeXidCriticalError", 8)
        for h in self._handles:
            try:
                field(lib, lib.nvmlDeviceRegisterEvents, h, kind, events)
            except GpuLost:
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
                if code(exc) == TIMEOUT:
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
