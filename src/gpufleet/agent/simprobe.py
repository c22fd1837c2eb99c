"""A GPU probe for machines without GPUs (the demo, tests, benchmarks).

Telemetry follows the load the agent places on each GPU (``set_load``: utilisation
0..1 per GPU index): utilisation and memory follow at once, power with the utilisation,
temperature approaches its steady state (idle 32 C, ~80 C at full load) with a time
constant of ``thermal_tau_s``, read from the injected clock. Faults are injected by
hand: ``overheat``, ``xid``, ``ecc_double_bit``, ``retire_pages``, ``lose``,
``downtrain`` (a PCIe link below its max), ``nvlink_fail`` (links down), ``ecc_off``;
``clear`` removes them (and lets the temperature fall back). Like a real GPU, an idle
one reports its PCIe link at Gen1 (power saving) and at its max generation under load.

MIG: ``mig`` gives GPU index -> a layout (``gpufleet.mig`` profile names; empty: MIG
mode on, no instances). Those GPUs report MIG mode on and their instances, placed as
``mig.place_layout`` places them, with UUIDs derived from node, GPU and placement;
``apply_mig_layout`` replaces a layout as ``NvmlProbe.apply_mig_layout`` does. Their
samples carry each instance's memory, used in the share the whole GPU's memory is (so it
follows the GPU's load: the load is per GPU, a held slice loads its GPU); no utilisation
per instance, as NVML gives none (``probe.MigSample``).
"""

from __future__ import annotations

import math
import random
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpufleet import mig as migtable
from gpufleet.agent.probe import GpuInfo, GpuSample, MigError, MigInstance, MigSample, NodeInventory
from gpufleet.clock import Clock, SystemClock

IDLE_C = 32.0
FULL_LOAD_C = 80.0
OVERHEAT_C = 97.0
MAX_PCIE_GEN = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class SimSpec:
    gpus: int = 8
    model: str = "H100-80GB"
    memory_mb: int = 81_559
    idle_w: float = 70.0
    max_w: float = 700.0
    nvlink: bool = True
    """All GPUs on one NVSwitch domain (an HGX board) when True."""
    cpus: int | None = None
    """The node's CPUs; None: 8 per GPU (64 on an 8-GPU node; 8 without GPUs)."""
    node_memory_mb: int | None = None
    """The node's memory in MiB (``memory_mb`` is a GPU's); None: 64 GiB per GPU (512 GiB
    on an 8-GPU node; 64 GiB without GPUs)."""


@dataclass(slots=True)
class _GpuState:
    temp: float = IDLE_C
    load: float = 0.0
    overheat: bool = False
    lost: bool = False
    dbe: int = 0
    sbe: int = 0
    replay: int = 0
    retired: int = 0
    xids: list[int] = field(default_factory=list)
    link: tuple[int | None, int] = (None, 16)
    """PCIe (generation forced, None: as the load says; width) of a downtrained link."""
    links_down: tuple[int, ...] = ()
    ecc_off: bool = False


class SimulatedProbe:
    def __init__(
        self,
        *,
        node: str,
        spec: SimSpec = SimSpec(),
        clock: Clock | None = None,
        seed: int | None = None,
        thermal_tau_s: float = 20.0,
        mig: Mapping[int, Sequence[str]] | None = None,
        driver: str = "550.54.15-sim",
        upgrade_to: str | None = None,
        smoke_fails: Sequence[int] = (),
    ) -> None:
        self.node = node
        self.driver_version = driver
        """What it reports; an upgrade hook that succeeded changes it (``upgraded``)."""
        self.upgrade_to = upgrade_to
        """The driver it reports after an upgrade (None: the version the upgrade expected;
        another: a planted bad node, whose verification then fails)."""
        self.smoke_fails = set(smoke_fails)
        """GPUs whose smoke check fails (``smoke``)."""
        self.spec = spec
        self.clock = clock or SystemClock()
        self.thermal_tau_s = thermal_tau_s
        self._rng = random.Random(seed if seed is not None else node)
        self._gpus = [_GpuState() for _ in range(spec.gpus)]
        self._last = self.clock.now()
        self._lock = threading.Lock()
        self._mig: dict[int, tuple[MigInstance, ...]] = {}
        """GPUs in MIG mode -> their instances."""
        self._mig_model = migtable.model_for(spec.model)
        if mig:
            model = self._mig_model
            if model is None:
                raise ValueError(f"simulated GPU model {spec.model} is not in the MIG table; no MIG layouts")
            for index, profiles in mig.items():
                if not 0 <= index < spec.gpus:
                    raise ValueError(f"MIG layout for GPU {index}, but the node has {spec.gpus} GPUs")
                self._mig[index] = self._instances(index, migtable.place_layout(model, profiles))

    # -- GpuProbe ---------------------------------------------------------------------------
    def inventory(self) -> NodeInventory:
        n = self.spec.gpus
        return NodeInventory(
            driver_version=self.driver_version,
            cuda_version="12.4",
            cpus=self.spec.cpus if self.spec.cpus is not None else 8 * max(1, n),
            memory_mb=self.spec.node_memory_mb
            if self.spec.node_memory_mb is not None
            else 64 * 1024 * max(1, n),
            gpus=tuple(
                GpuInfo(
                    index=i,
                    uuid=f"GPU-sim-{self.node}-{i}",
                    model=self.spec.model,
                    memory_mb=self.spec.memory_mb,
                    pcie_gen=MAX_PCIE_GEN,
                    pcie_width=16,
                    nvlink_peers=tuple(j for j in range(n) if j != i) if self.spec.nvlink else (),
                    nvlink_domain=0 if self.spec.nvlink else i,
                    mig_enabled=i in self._mig,
                    mig_instances=self._mig.get(i, ()),
                )
                for i in range(n)
            ),
        )

    def sample(self) -> tuple[GpuSample, ...]:
        with self._lock:
            now = self.clock.now()
            dt = max(0.0, now - self._last)
            self._last = now
            return tuple(self._sample(i, g, dt) for i, g in enumerate(self._gpus))

    def close(self) -> None:
        pass

    # -- driver upgrades (agent/upgrade.py) -------------------------------------------------
    def upgraded(self, expect_driver: str) -> None:
        """An upgrade hook succeeded: the node now reports ``upgrade_to``, else the driver
        the upgrade expected."""
        self.driver_version = self.upgrade_to or expect_driver

    def smoke(self, index: int) -> str | None:
        """The simulated smoke kernel: None (passed) unless told to fail on this GPU."""
        if index in self.smoke_fails:
            return f"simulated smoke kernel failed on GPU {index}: wrong result at 0"
        return None

    # -- MIG --------------------------------------------------------------------------------
    def apply_mig_layout(self, gpu_index: int, profiles: Sequence[str]) -> tuple[MigInstance, ...]:
        """Replace the GPU's instances; ``MigError`` (nothing changed) when MIG mode is off,
        the layout does not fit, or load is placed on the GPU (``set_load``)."""
        with self._lock:
            if not 0 <= gpu_index < self.spec.gpus:
                raise MigError(f"no GPU {gpu_index} on this node ({self.spec.gpus} GPUs)")
            model = self._mig_model
            if model is None or gpu_index not in self._mig:
                raise MigError(
                    f"MIG mode is off on GPU {gpu_index}: enable it with nvidia-smi -i {gpu_index} -mig 1 "
                    "(needs a GPU reset)"
                )
            try:
                placements = migtable.place_layout(model, profiles)
            except migtable.LayoutError as exc:
                raise MigError(f"GPU {gpu_index}: {exc}") from exc
            if self._gpus[gpu_index].load > 0:
                raise MigError(f"GPU {gpu_index}: MIG devices in use (a job runs there); stop it first")
            self._mig[gpu_index] = self._instances(gpu_index, placements)
            return self._mig[gpu_index]

    def set_mig_mode(self, gpu_index: int, enabled: bool) -> None:
        """MIG mode on (no instances yet) or off (a whole GPU again), at once: a simulated
        GPU needs no reset. Refused while its instances exist (off) or load is placed on it."""
        with self._lock:
            if not 0 <= gpu_index < self.spec.gpus:
                raise MigError(f"no GPU {gpu_index} on this node ({self.spec.gpus} GPUs)")
            if self._gpus[gpu_index].load > 0:
                raise MigError(f"GPU {gpu_index}: a job runs there; stop it first")
            if enabled:
                if self._mig_model is None:
                    raise MigError(
                        f"GPU {gpu_index}: a {self.spec.model} has no MIG profiles in gpufleet's table"
                    )
                self._mig.setdefault(gpu_index, ())
            elif self._mig.get(gpu_index):
                raise MigError(f"GPU {gpu_index}: destroy its MIG instances before turning MIG mode off")
            else:
                self._mig.pop(gpu_index, None)

    def _instances(self, index: int, placements: Sequence[migtable.Placement]) -> tuple[MigInstance, ...]:
        """Memory: the GPU's ``memory_mb`` shared by memory slices (what NVML reports is
        also a little under the nominal size of the name)."""
        slices = migtable.MEMORY_SLICES
        return tuple(
            MigInstance(
                uuid="MIG-"
                + str(
                    uuid.uuid5(uuid.NAMESPACE_URL, f"gpufleet-sim:{self.node}/{index}/{p.profile}@{p.start}")
                ),
                profile=p.profile,
                gpu_instance_id=n,
                compute_instance_id=0,
                start=p.start,
                size=p.size,
                memory_mb=self.spec.memory_mb * p.size // slices,
            )
            for n, p in enumerate(placements, start=1)
        )

    # -- LoadSink ---------------------------------------------------------------------------
    def set_load(self, load: dict[int, float]) -> None:
        with self._lock:
            for i, g in enumerate(self._gpus):
                g.load = min(1.0, max(0.0, load.get(i, 0.0)))

    # -- faults -----------------------------------------------------------------------------
    def overheat(self, index: int) -> None:
        with self._lock:
            self._gpus[index].overheat = True
            self._gpus[index].temp = OVERHEAT_C

    def xid(self, index: int, code: int = 79) -> None:
        with self._lock:
            self._gpus[index].xids.append(code)

    def ecc_double_bit(self, index: int, count: int = 1) -> None:
        with self._lock:
            self._gpus[index].dbe += count

    def retire_pages(self, index: int, count: int = 1) -> None:
        with self._lock:
            self._gpus[index].retired += count

    def lose(self, index: int) -> None:
        with self._lock:
            self._gpus[index].lost = True

    def downtrain(self, index: int, *, width: int = 8, gen: int | None = None) -> None:
        """The GPU's PCIe link trains at ``width`` lanes (and ``gen``, if given, even
        under load) instead of x16 Gen5."""
        with self._lock:
            self._gpus[index].link = (gen, width)

    def nvlink_fail(self, index: int, links: Sequence[int] = (0,)) -> None:
        with self._lock:
            self._gpus[index].links_down = tuple(sorted(set(links)))

    def ecc_disable(self, index: int) -> None:
        """ECC mode off (as ``nvidia-smi -e 0`` and a reboot leave it)."""
        with self._lock:
            self._gpus[index].ecc_off = True

    def clear(self, index: int) -> None:
        with self._lock:
            g = self._gpus[index]
            g.link, g.links_down, g.ecc_off = (None, 16), (), False
            g.overheat = g.lost = False
            g.dbe = g.retired = 0
            g.xids.clear()
            g.temp = min(g.temp, FULL_LOAD_C)

    # -- the model --------------------------------------------------------------------------
    def _sample(self, index: int, g: _GpuState, dt: float) -> GpuSample:
        if g.lost:
            g.xids.clear()
            return GpuSample(index=index, lost=True, xid_events=(79,))
        target = OVERHEAT_C if g.overheat else IDLE_C + (FULL_LOAD_C - IDLE_C) * g.load
        g.temp = target + (g.temp - target) * math.exp(-dt / self.thermal_tau_s)
        if self._rng.random() < 0.001 * dt:
            g.sbe += 1
        jitter = self._rng.uniform(-0.03, 0.03) if g.load > 0 else 0.0
        util = 0.0 if g.load <= 0 else min(1.0, max(0.0, g.load + jitter))
        throttle: tuple[str, ...] = ()
        if g.overheat or g.temp >= 90:
            throttle = ("hw_thermal_slowdown",)
        elif util == 0:
            throttle = ("gpu_idle",)
        xids, g.xids = tuple(g.xids), []
        mem = 0 if util == 0 else int(self.spec.memory_mb * (0.25 + 0.65 * g.load))
        return GpuSample(
            index=index,
            utilization_pct=round(100 * util, 1),
            memory_used_mb=mem,
            temperature_c=round(g.temp, 1),
            power_w=round(self.spec.idle_w + (self.spec.max_w - self.spec.idle_w) * util, 1),
            sm_clock_mhz=1980 if util > 0 and not throttle else 345 if util == 0 else 1200,
            mem_clock_mhz=2619,
            throttle_reasons=throttle,
            ecc_sbe=g.sbe,
            ecc_dbe=g.dbe,
            xid_events=xids,
            pcie_replay=g.replay,
            retired_pages=g.retired,
            pcie_gen=g.link[0] if g.link[0] is not None else (MAX_PCIE_GEN if util > 0 else 1),
            pcie_width=g.link[1],
            pcie_max_gen=MAX_PCIE_GEN,
            pcie_max_width=16,
            nvlink_down=g.links_down if self.spec.nvlink else (),
            ecc_enabled=not g.ecc_off,
            ecc_pending=not g.ecc_off,
            mig_instances=tuple(
                MigSample(
                    gpu_instance_id=m.gpu_instance_id,
                    memory_used_mb=m.memory_mb * mem // self.spec.memory_mb if self.spec.memory_mb else 0,
                    memory_total_mb=m.memory_mb,
                )
                for m in self._mig.get(index, ())
            ),
        )
