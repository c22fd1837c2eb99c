"""The scheduling loop in a child process, off the API process's GIL.

A pass over thousands of pending jobs is tens to hundreds of milliseconds of CPU-bound
Python. Run in a thread of the API process it held the GIL the event loop needs: with
8 clients submitting back to back, 380 jobs/s while the queue was long against 800
while it was short. ``gpufleet server`` therefore runs the ``SchedulerLoop`` in a child
(``python -m gpufleet.server.schedproc``); it needs only the database and a wake-up.

The API process keeps its ``SchedulerLoop`` object (routers, the lifecycle loop and
``/metrics`` use it as before) with ``elsewhere`` set to a ``ChildScheduler``:

- *wake*: one byte on the child's stdin (non-blocking; a full pipe already means
  "wake up"). The first stdin line is the ``LoopSpec`` (JSON; the database URL may
  hold a password, so it is not on the command line).
- *reports*: the child writes one JSON line per committed pass (``PassReport``) on a
  pipe; a thread of the parent sets the loop's ``passes``/``failures``/``skipped_nodes``
  and calls its
  ``on_pass`` with a *summary* snapshot and plan: the pass's time, the jobs it started
  (with their pool and queue time) and its fragmentation, which is what the metrics
  read. Counters also travel when only a failure changed them.
- *lifetime*: stdin's EOF ends the child, so it never outlives the API process, even
  one killed by SIGKILL. A child that dies is logged, counted as a failed pass and
  started again after ``restart_after_s``. Ctrl-C reaches the whole process group: the
  child ignores SIGINT and lets the parent stop it.

Crash safety is the thread's: the API commits accepted jobs before their 201; the
child reads them and commits each pass in one transaction of its own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import IO, TYPE_CHECKING, Any, Protocol

from gpufleet.scheduler import Fleet, JobRequest, NodeGpus, Plan, Snapshot, Start, make_policy
from gpufleet.server.db import Database

if TYPE_CHECKING:
    from gpufleet.server.clock import Clock
    from gpufleet.server.scheduling import SchedulerLoop

log = logging.getLogger("gpufleet.scheduling")


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopSpec:
    """What the child needs to build its ``SchedulerLoop`` (system clock)."""

    database_url: str
    policy: str
    node_timeout_s: float
    interval_s: float
    reservation_idle_release_s: float

    def loop(self, db: Database, clock: Clock) -> SchedulerLoop:
        """The loop this spec describes (the API process's, and the child's own)."""
        from gpufleet.server.scheduling import SchedulerLoop

        return SchedulerLoop(
            db=db,
            policy=make_policy(self.policy),
            clock=clock,
            node_timeout_s=self.node_timeout_s,
            interval_s=self.interval_s,
            reservation_idle_release_s=self.reservation_idle_release_s,
        )


# -- the report of one pass ------------------------------------------------------------------


def pass_report(
    *,
    passes: int,
    failures: int,
    snapshot: Snapshot | None = None,
    plan: Plan | None = None,
    seconds: float = 0.0,
    skipped_nodes: int = 0,
) -> dict[str, Any]:
    """The JSON-able report the child sends: counters, and for a committed pass what
    ``on_pass`` observers read (not the whole snapshot: thousands of pending jobs)."""
    out: dict[str, Any] = {"passes": passes, "failures": failures}
    if skipped_nodes:  # nodes the pass left out (invalid rows); absent: none
        out["skipped_nodes"] = skipped_nodes
    if snapshot is None or plan is None:
        return out
    pending = {j.id: j for j in snapshot.pending}
    starts = []
    for st in plan.starts:
        job = pending.get(st.job_id)
        if job is not None:
            placement = [[p.node, list(p.gpus)] for p in st.placement]
            starts.append([st.job_id, job.gpus, job.pool, job.queued_since, placement])
    out |= {
        "seconds": seconds,
        "now": snapshot.now,
        "policy": plan.policy,
        "fragmentation": plan.fragmentation,
        "free_gpus": plan.free_gpus,
        "starts": starts,
    }
    return out


def summary(report: dict[str, Any]) -> tuple[Snapshot, Plan, float] | None:
    """The ``on_pass`` arguments a report stands for: a snapshot whose ``pending`` holds
    only the started jobs (no fleet, no running jobs) and a plan of starts,
    fragmentation and free GPUs. None for a counters-only report."""
    if "now" not in report:
        return None
    jobs = [
        JobRequest(id=jid, gpus=gpus, submit_time=queued_since, pool=pool)
        for jid, gpus, pool, queued_since, _ in report["starts"]
    ]
    starts = [
        Start(job_id=jid, placement=tuple(NodeGpus(node=n, gpus=tuple(g)) for n, g in placement))
        for jid, _, _, _, placement in report["starts"]
    ]
    snapshot = Snapshot(now=report["now"], fleet=Fleet(nodes=()), pending=tuple(jobs))
    plan = Plan(
        policy=report["policy"],
        starts=tuple(starts),
        fragmentation=report["fragmentation"],
        free_gpus=report["free_gpus"],
    )
    return snapshot, plan, report["seconds"]


# -- parent side -----------------------------------------------------------------------------


class Counted(Protocol):
    """What a report updates: the ``SchedulerLoop``'s counters and observer."""

    passes: int
    failures: int
    skipped_nodes: int
    on_pass: Callable[[Snapshot, Plan, float], None] | None


class ChildScheduler:
    """Runs and supervises the child; ``SchedulerLoop.elsewhere`` in ``gpufleet server``."""

    def __init__(self, *, spec: LoopSpec, loop: Counted, restart_after_s: float = 1.0) -> None:
        self.spec = spec
        self.loop = loop
        self.restart_after_s = restart_after_s
        self._lock = threading.Lock()  # guards _proc's stdin against a concurrent close
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._supervise, name="gpufleet-schedproc", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Called on every submit (on the event loop): one non-blocking write."""
        with self._lock:
            proc = self._proc
            if proc is None or proc.stdin is None or proc.stdin.closed:
                return  # starting: the child runs a pass as soon as it is up
            # Full: a wake-up is already waiting; broken: the supervisor restarts the child.
            with contextlib.suppress(BlockingIOError, BrokenPipeError):
                os.write(proc.stdin.fileno(), b"w")

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stopping.set()
        with self._lock:
            proc = self._proc
            if proc is not None and proc.stdin is not None:
                proc.stdin.close()  # EOF: the child finishes its pass and exits
        if proc is not None:
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("scheduler process %d did not stop in %gs: killed", proc.pid, timeout_s)
                proc.kill()
                proc.wait()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _supervise(self) -> None:
        while not self._stopping.is_set():
            base = (self.loop.passes, self.loop.failures)
            try:
                proc, reports = self._spawn()
            except OSError:
                log.exception("cannot start the scheduler process")
            else:
                with reports:
                    for line in reports:
                        self._observe(json.loads(line), base)
                rc = proc.wait()
                if self._stopping.is_set():
                    return
                log.error("scheduler process exited (status %s); restarting it", rc)
            self.loop.failures += 1
            self._stopping.wait(self.restart_after_s)

    def _spawn(self) -> tuple[subprocess.Popen[bytes], IO[bytes]]:
        read_fd, write_fd = os.pipe()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpufleet.server.schedproc", str(write_fd)],
                stdin=subprocess.PIPE,
                pass_fds=(write_fd,),
            )
        except OSError:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(asdict(self.spec)).encode() + b"\n")
        proc.stdin.flush()
        os.set_blocking(proc.stdin.fileno(), False)
        with self._lock:
            if self._stopping.is_set():  # stop() ran while we started it
                proc.stdin.close()
            self._proc = proc
        return proc, os.fdopen(read_fd, "rb")

    def _observe(self, report: dict[str, Any], base: tuple[int, int]) -> None:
        self.loop.passes = base[0] + report["passes"]
        self.loop.failures = base[1] + report["failures"]
        self.loop.skipped_nodes = int(report.get("skipped_nodes", 0))
        args = summary(report)
        if args is not None and self.loop.on_pass is not None:
            try:
                self.loop.on_pass(*args)
            except Exception:
                log.exception("scheduling pass observer failed")


# -- child side ------------------------------------------------------------------------------


class _Reporter:
    """Writes reports on the pipe; called from the loop's thread (passes) and the main
    thread (counters)."""

    def __init__(self, out: IO[bytes], loop: Counted) -> None:
        self.out = out
        self.loop = loop
        self._lock = threading.Lock()
        self._sent = (0, 0, 0)

    def on_pass(self, snapshot: Snapshot, plan: Plan, seconds: float) -> None:
        self._send(
            pass_report(
                passes=self.loop.passes,
                failures=self.loop.failures,
                snapshot=snapshot,
                plan=plan,
                seconds=seconds,
                skipped_nodes=self.loop.skipped_nodes,
            )
        )

    def counters(self) -> None:
        loop = self.loop
        if (loop.passes, loop.failures, loop.skipped_nodes) != self._sent:
            self._send(
                pass_report(passes=loop.passes, failures=loop.failures, skipped_nodes=loop.skipped_nodes)
            )

    def _send(self, report: dict[str, Any]) -> None:
        with self._lock:
            self._sent = (report["passes"], report["failures"], report.get("skipped_nodes", 0))
            try:
                self.out.write(json.dumps(report, separators=(",", ":")).encode() + b"\n")
                self.out.flush()
            except BrokenPipeError:
                pass  # the parent is gone: stdin's EOF ends us


def main(argv: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us (stdin EOF)
    from gpufleet.server.clock import SystemClock

    stdin = sys.stdin.fileno()
    line = b""
    while not line.endswith(b"\n"):
        got = os.read(stdin, 1)  # byte by byte: what follows are wake-ups
        if not got:
            return
        line += got
    spec = LoopSpec(**json.loads(line))
    db = Database.connect(spec.database_url)
    loop = spec.loop(db, SystemClock())
    reporter = _Reporter(os.fdopen(int(argv[0]), "wb"), loop)
    loop.on_pass = reporter.on_pass
    loop.start()
    loop.wake()  # a first pass at once
    try:
        while True:
            ready, _, _ = select.select([stdin], [], [], spec.interval_s)
            if ready:
                if not os.read(stdin, 65536):
                    return  # EOF: the API process stopped or died
                loop.wake()
            reporter.counters()
    finally:
        loop.stop()
        db.dispose()


if __name__ == "__main__":
    main(sys.argv[1:])
