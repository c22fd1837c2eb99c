"""Driver upgrades the server orders (``SyncReply.upgrade``), carried out and verified
by the agent: run the named upgrade hook, then check the node (driver version, NVML's
health of every GPU, a smoke kernel on each) and report the facts (``NodeSync.upgrade``)
until the server stops asking. The server judges them (``decide/upgrade.py``).

**Security.** The server must never be able to make an agent run a string of its
choosing as root: an order names a hook, and the agent runs only hooks its own operator
configured on the node (``gpufleet agent --upgrade-hook NAME=/path``), checked at start
and again before each run (``check_hook``): an absolute path to a regular file owned by
root (or by the agent's own user when it does not run as root), executable, not
writable by group or others, in directories likewise (as sudo and ssh's StrictModes
check what they trust). An unknown name is refused and reported as the hook's error.
The hook gets the expected driver version as its one argument (a word: ``api.upgrades
.DRIVER_VERSION``), no shell, an environment of ``PATH``/``LANG`` and
``GPUFLEET_EXPECT_DRIVER`` only, ``/`` as its directory, no stdin; its output is
captured (the last ``OUTPUT_BYTES``) and it is killed (its whole process group) after
``timeout_s``.

Once per order: an order (rollout, attempt) is carried out once while the server asks
for it; that it ran its hook is written to the work dir first (``upgrade.json``), so an
agent restarted by the hook (a reboot) verifies instead of running it again. A hook
should still be idempotent: one killed before it could finish is not retried until the
operator resumes the rollout.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from gpufleet.agent.config import AgentConfig
from gpufleet.agent.probe import GpuProbe, NodeInventory, ProbeError, gpu_health
from gpufleet.agent.smoke import CudaSmoke
from gpufleet.api.upgrades import DRIVER_VERSION, HOOK_NAME, OUTPUT_CHARS, UpgradeOrder

log = logging.getLogger("gpufleet.agent")
OUTPUT_BYTES = 64 * 1024
"""The hook's output kept (its tail); the report carries the last ``OUTPUT_CHARS``."""
HOOK_TIMEOUT_S = 3600.0
HOOK_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
KILL_GRACE_S = 5.0


class HookError(ValueError):
    """An ``--upgrade-hook`` the agent refuses to trust (the message says why)."""


def check_hook(path: Path, *, euid: int | None = None) -> None:
    """Raise ``HookError`` unless ``path`` may be run as an upgrade hook (see the module)."""
    euid = os.geteuid() if euid is None else euid
    owners = {0, euid}
    if not path.is_absolute():
        raise HookError(f"{path}: give an absolute path")
    try:
        real = Path(os.path.realpath(path))
        st = real.stat()
    except OSError as exc:
        raise HookError(f"{path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise HookError(f"{path}: not a regular file")
    if st.st_uid not in owners:
        raise HookError(f"{path}: owned by uid {st.st_uid}, not root")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise HookError(f"{path}: writable by group or others (chmod go-w)")
    if not st.st_mode & stat.S_IXUSR:
        raise HookError(f"{path}: not executable (chmod u+x)")
    for parent in real.parents:
        pst = parent.stat()
        if pst.st_uid not in owners or (pst.st_mode & stat.S_IWOTH and not pst.st_mode & stat.S_ISVTX):
            raise HookError(f"{path}: its directory {parent} may be changed by others")
        if pst.st_mode & stat.S_IWGRP and pst.st_gid != 0:
            raise HookError(f"{path}: its directory {parent} is writable by group {pst.st_gid}")


def parse_hooks(specs: Sequence[str], *, euid: int | None = None) -> dict[str, Path]:
    """``NAME=/path`` values of ``--upgrade-hook``, each checked (``HookError``)."""
    import re

    out: dict[str, Path] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not re.fullmatch(HOOK_NAME.strip("^$"), name):
            raise HookError(f"--upgrade-hook {spec!r}: expected NAME=/path (NAME: letters, digits, _.-)")
        if name in out:
            raise HookError(f"--upgrade-hook {name}: given twice")
        check_hook(Path(path), euid=euid)
        out[name] = Path(path)
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class HookRun:
    error: str | None
    """None: it exited 0."""
    output: str


def run_hook(path: Path, expect_driver: str, *, timeout_s: float = HOOK_TIMEOUT_S) -> HookRun:
    """Run one hook as the module says (checked again first: the file may have changed)."""
    import re

    if not re.fullmatch(DRIVER_VERSION.strip("^$"), expect_driver):
        return HookRun(error=f"refused driver version {expect_driver[:64]!r}", output="")
    try:
        check_hook(path)
    except HookError as exc:
        return HookRun(error=str(exc), output="")
    env = {"PATH": HOOK_PATH, "LANG": "C", "GPUFLEET_EXPECT_DRIVER": expect_driver}
    try:
        proc = subprocess.Popen(
            [str(path), expect_driver],
            env=env,
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        return HookRun(error=f"could not start {path}: {exc.strerror or exc}", output="")
    tail = bytearray()

    def _read() -> None:
        assert proc.stdout is not None
        for chunk in iter(lambda: proc.stdout.read(4096), b""):  # type: ignore[union-attr]
            tail.extend(chunk)
            del tail[:-OUTPUT_BYTES]

    reader = threading.Thread(target=_read, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout_s)
        error = None if code == 0 else f"exit code {code}"
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        error = f"timed out after {timeout_s:g}s (killed)"
    reader.join(5.0)
    return HookRun(error=error, output=tail.decode(errors="replace")[-OUTPUT_CHARS:])


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, KILL_GRACE_S)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


@runtime_checkable
class SimulatedUpgrades(Protocol):
    """A probe that simulates what a hook does (``SimulatedProbe``): its driver changes
    when a hook succeeds, and it answers the smoke check itself."""

    def upgraded(self, expect_driver: str) -> None: ...

    def smoke(self, index: int) -> str | None: ...


class Smoke(Protocol):
    def check(self, index: int, uuid: str) -> str | None: ...


Key = tuple[int, int]


class Upgrades:
    """The upgrade order under way or done on one node. ``step`` and ``report`` are
    called with the agent's lock held; the worker never takes it (it only sets fields a
    report reads, under its own lock)."""

    def __init__(
        self,
        *,
        node: str,
        work_dir: Path,
        probe: GpuProbe,
        hooks: Mapping[str, Path],
        timeout_s: float = HOOK_TIMEOUT_S,
        smoke: Smoke | None = None,
        done: Callable[[NodeInventory | None], None] = lambda inventory: None,
    ) -> None:
        self.node = node
        self.state_file = Path(work_dir) / "upgrade.json"
        self.probe = probe
        self.hooks = dict(hooks)
        self.timeout_s = timeout_s
        self.smoke = smoke or CudaSmoke()
        self._done = done
        """Called by the worker at each new stage (the agent syncs soon), with the
        inventory read afresh once verified (None before, or where it cannot be read)."""
        self._lock = threading.Lock()
        self._key: Key | None = None
        self._report: dict[str, Any] | None = None
        self._worker: threading.Thread | None = None

    @classmethod
    def of(
        cls, config: AgentConfig, probe: GpuProbe, *, done: Callable[[NodeInventory | None], None]
    ) -> Upgrades:
        """An agent's, as its flags configure it."""
        return cls(
            node=config.node,
            work_dir=Path(config.work_dir),
            probe=probe,
            hooks=config.upgrade_hooks,
            timeout_s=config.upgrade_timeout_s,
            smoke=CudaSmoke(user=config.smoke_user),
            done=done,
        )

    def step(self, order: UpgradeOrder | None) -> bool:
        """Act on the reply's order: none (or another one) forgets the last; a new one
        starts the worker. True when there is news for the next sync."""
        with self._lock:
            key = None if order is None else (order.rollout, order.attempt)
            if key == self._key:
                return False
            if self._worker is not None and self._worker.is_alive():
                return False  # a hook still runs (an abort lets it finish): then the new order
            self._key, self._report = key, None
            if order is None:
                return False
            self._report = self._stage(order, "running_hook" if order.hook else "verifying")
        self._worker = threading.Thread(
            target=self._carry_out, args=(order,), name=f"gpufleet-upgrade-{self.node}", daemon=True
        )
        self._worker.start()
        return True

    def report(self) -> dict[str, Any] | None:
        """The ``UpgradeReport`` to send with a sync (None: no order)."""
        with self._lock:
            return None if self._report is None else dict(self._report)

    def settle(self, timeout_s: float = 10.0) -> bool:
        worker = self._worker
        if worker is not None:
            worker.join(timeout_s)
        return worker is None or not worker.is_alive()

    # -- the worker ---------------------------------------------------------------------------
    @staticmethod
    def _stage(order: UpgradeOrder, stage: str, **facts: Any) -> dict[str, Any]:
        return {"rollout": order.rollout, "attempt": order.attempt, "stage": stage, **facts}

    def _set(self, order: UpgradeOrder, report: dict[str, Any]) -> None:
        with self._lock:
            if self._key != (order.rollout, order.attempt):
                return
            self._report = report
        inventory = None
        if report["stage"] == "done":
            try:
                inventory = self.probe.inventory()
            except ProbeError as exc:
                log.warning("node %s: inventory after an upgrade: %s", self.node, exc)
        self._done(inventory)

    def _carry_out(self, order: UpgradeOrder) -> None:
        try:
            report = self._run(order)
        except Exception as exc:  # never the worker's end: the server hears why
            log.exception("node %s: upgrade %d/%d failed", self.node, order.rollout, order.attempt)
            report = self._stage(order, "done", error=f"{type(exc).__name__}: {exc}"[:512])
        self._set(order, report)

    def _run(self, order: UpgradeOrder) -> dict[str, Any]:
        if order.hook is not None and not self._ran(order):
            path = self.hooks.get(order.hook)
            if path is None:
                have = ", ".join(sorted(self.hooks)) or "none"
                why = f"no upgrade hook named {order.hook} on node {self.node} (configured: {have})"
                return self._stage(order, "done", hook_error=why[:512])
            self._remember(order)
            log.info("node %s: running upgrade hook %s (%s)", self.node, order.hook, order.expect_driver)
            run = run_hook(path, order.expect_driver, timeout_s=self.timeout_s)
            if run.error is not None:
                return self._stage(order, "done", hook_error=run.error[:512], output=run.output)
            if isinstance(self.probe, SimulatedUpgrades):
                self.probe.upgraded(order.expect_driver)
            self._set(order, self._stage(order, "verifying", output=run.output))
        return self.verify(order)

    def verify(self, order: UpgradeOrder) -> dict[str, Any]:
        """The facts after an upgrade: the driver, each GPU's health and smoke check."""
        reload = getattr(self.probe, "reload", None)
        if callable(reload):  # a real driver changed under NVML: read it afresh
            reload()
        try:
            inv = self.probe.inventory()
            samples = {s.index: s for s in self.probe.sample()}
        except ProbeError as exc:
            return self._stage(order, "done", error=f"cannot read the GPUs: {exc}"[:512])
        gpus = []
        for g in inv.gpus:
            sample = samples.get(g.index)
            verdict = gpu_health(sample) if sample is not None else None
            healthy = verdict is not None and verdict.healthy
            detail = "no reading" if verdict is None else "; ".join(verdict.reasons)
            smoke_error: str | None = "not run: the GPU is unhealthy"
            if healthy:
                if isinstance(self.probe, SimulatedUpgrades):
                    smoke_error = self.probe.smoke(g.index)
                else:
                    smoke_error = self.smoke.check(g.index, g.uuid)
            gpus.append(
                {
                    "index": g.index,
                    "healthy": healthy,
                    "smoke_ok": smoke_error is None,
                    "detail": (detail or smoke_error or "")[:512],
                }
            )
        return self._stage(
            order,
            "done",
            driver_version=(inv.driver_version or "")[:64] or None,
            cuda_version=(inv.cuda_version or "")[:32] or None,
            gpus=gpus,
        )

    # -- what survives a restart ---------------------------------------------------------------
    def _ran(self, order: UpgradeOrder) -> bool:
        try:
            seen = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return False
        return bool(seen.get("rollout") == order.rollout and seen.get("attempt") == order.attempt)

    def _remember(self, order: UpgradeOrder) -> None:
        """Written before the hook runs: a hook that reboots the node is not run again."""
        data = {"rollout": order.rollout, "attempt": order.attempt, "hook": order.hook, "at": time.time()}
        try:
            self.state_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.state_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self.state_file)
        except OSError as exc:
            log.warning("node %s: cannot record the upgrade in %s: %s", self.node, self.state_file, exc)
