"""The scheduling loop in a child process, off the API process's GIL (``ChildLoop``).

A pass over thousands of pending jobs is tens to hundreds of milliseconds of CPU-bound
Python. Run in a thread of the API process it held the GIL the event loop needs: with
8 clients submitting back to back, 380 jobs/s while the queue was long against 800
while it was short. ``gpufleet server`` therefore runs the scheduling pass on its
runner in a child (``python -m gpufleet.server.loops.child``); it needs only the
database and a wake-up. In the API process a ``ChildLoop`` stands for it (the same
``runner.Runner`` as a thread's loop: routers wake it, ``/metrics`` reads its counters):

- *wake*: one byte on the child's stdin (non-blocking; a full pipe already means
  "wake up"). The first stdin line is the ``LoopSpec`` (JSON; the database URL may
  hold a password, so it is not on the command line).
- *reports*: the child writes one JSON line per committed pass (``PassReport``) on a
  pipe; a thread of the parent sets the ``ChildLoop``'s ``passes``/``failures``, the
  ``PassObserver``'s ``skipped_nodes``, and calls the observer with a *summary*
  snapshot and plan: the pass's time, the jobs it started
  (with their pool and queue time) and its fragmentation, which is what the metrics
  read. Counters also travel when only a failure changed them.
- *rings*: the nodes a committed pass touched (``dispatch.py``), as a ``{"ring": [...]}``
  line on the same pipe, sent at its commit: the parent rings them on its ``NodeBell``.
- *lifetime*: stdin's EOF ends the child, so it never outlives the API process, even
  one killed by SIGKILL. A stopping parent also sends SIGTERM, which the child takes
  like EOF (the pass in flight finishes) and which ends a child still importing at
  once. A child that dies is logged, counted as a failed pass and started again after
  ``restart_after_s``. Ctrl-C reaches the whole process group: the child ignores
  SIGINT and lets the parent stop it.

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
from typing import IO, Any

from gpufleet.clock import Clock, SystemClock
from gpufleet.scheduler import Fleet, JobRequest, NodeGpus, Plan, Snapshot, Start, make_policy
from gpufleet.server.loops.scheduling import PassObserver, SchedulingPass, scheduling_loop
from gpufleet.server.runner import Loop
from gpufleet.server.store.db import Database
from gpufleet.server.store.leader import PgFence

log = logging.getLogger("gpufleet.scheduling")


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopSpec:
    """What the child needs to build its scheduling loop (system clock)."""

    database_url: str
    policy: str
    node_timeout_s: float
    interval_s: float
    reservation_idle_release_s: float
    max_preempt_grace_s: float = 120.0
    fence_holder: str | None = None
    """A leader's term (``leader.PgFence``): the child's writes are fenced with it."""
    fence_epoch: int | None = None

    def step(self, db: Database, clock: Clock, observer: PassObserver) -> SchedulingPass:
        """The pass this spec describes (a thread's, or the child's own)."""
        return SchedulingPass(
            db=db,
            policy=make_policy(self.policy),
            clock=clock,
            node_timeout_s=self.node_timeout_s,
            observer=observer,
            reservation_idle_release_s=self.reservation_idle_release_s,
            max_preempt_grace_s=self.max_preempt_grace_s,
            interval_s=self.interval_s,
        )

    def loop(self, db: Database, clock: Clock, observer: PassObserver) -> Loop:
        """The scheduling loop in a thread of this process."""
        return scheduling_loop(self.step(db, clock, observer), interval_s=self.interval_s)


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


class ChildLoop:
    """The scheduling loop run and supervised in a child process (a ``runner.Runner``).

    Its thread is not a ``runner.Loop``, on purpose (nor is ``store/writer.py``'s group
    commit, a batcher of the requests' writes): it runs no steps, it *is* the runner of
    a loop that runs elsewhere. The steps run on ``runner.Loop`` in the child, with the
    runner's guarantees, and their counters are what this object shows; the thread only
    reads the child's reports until the pipe ends, for the child's whole life, and
    restarts a child that died (counted as a failed pass). As a ``Loop`` step it would
    be one step per child lifetime: its pass counter would say nothing and a second
    failure counter would sit beside the child's. It starts and stops in order with the
    other loops (it is in the term's ``Loops``)."""

    def __init__(
        self,
        *,
        spec: LoopSpec,
        observer: PassObserver,
        restart_after_s: float = 1.0,
        on_ring: Callable[[set[str]], None] | None = None,
    ) -> None:
        """``on_ring``: called with the nodes a committed pass touched (``dispatch.py``)."""
        self.name = "scheduling"
        self.spec = spec
        self.observer = observer
        self.on_ring = on_ring
        self.restart_after_s = restart_after_s
        self.passes = 0
        self.failures = 0
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
            # SIGTERM too: it ends the child the same way (its handler) and, while it is
            # still starting (seconds of imports), at once instead of after its first pass
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
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
            base = (self.passes, self.failures)
            try:
                proc, reports = self._spawn()
            except OSError:
                log.exception("cannot start the scheduler process")
            else:
                with reports:
                    for line in reports:
                        report = json.loads(line)
                        if "ring" in report:
                            if self.on_ring is not None:
                                self.on_ring(set(report["ring"]))
                            continue
                        self._observe(report, base)
                rc = proc.wait()
                if self._stopping.is_set():
                    return
                log.error("scheduler process exited (status %s); restarting it", rc)
            self.failures += 1
            self._stopping.wait(self.restart_after_s)

    def _spawn(self) -> tuple[subprocess.Popen[bytes], IO[bytes]]:
        read_fd, write_fd = os.pipe()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpufleet.server.loops.child", str(write_fd)],
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
        self.passes = base[0] + report["passes"]
        self.failures = base[1] + report["failures"]
        self.observer.skipped_nodes = int(report.get("skipped_nodes", 0))
        args = summary(report)
        if args is not None:
            self.observer.passed(*args)


# -- child side ------------------------------------------------------------------------------


class _Reporter:
    """Writes reports on the pipe; called from the loop's thread (passes) and the main
    thread (counters)."""

    def __init__(self, out: IO[bytes], loop: Loop, observer: PassObserver) -> None:
        self.out = out
        self.loop = loop
        self.observer = observer
        self._lock = threading.RLock()
        self._sent = (0, 0, 0)

    def on_pass(self, snapshot: Snapshot, plan: Plan, seconds: float) -> None:
        with self._lock:  # read and sent in one step: a report never overtakes a fresher one
            self._send(
                pass_report(
                    passes=self.loop.passes + 1,  # the runner counts this pass when it returns
                    failures=self.loop.failures,
                    snapshot=snapshot,
                    plan=plan,
                    seconds=seconds,
                    skipped_nodes=self.observer.skipped_nodes,
                )
            )

    def ring(self, nodes: set[str]) -> None:
        """The nodes a committed pass touched, for the parent's agents (``dispatch.py``)."""
        self._send({"ring": sorted(nodes)})

    def counters(self) -> None:
        with self._lock:  # else a skipped count read before a pass could follow that pass's report
            loop, skipped = self.loop, self.observer.skipped_nodes
            if (loop.passes, loop.failures, skipped) != self._sent:
                self._send(pass_report(passes=loop.passes, failures=loop.failures, skipped_nodes=skipped))

    def _send(self, report: dict[str, Any]) -> None:
        with self._lock:  # re-entrant: on_pass and counters hold it already
            if "passes" in report:
                self._sent = (report["passes"], report["failures"], report.get("skipped_nodes", 0))
            try:
                self.out.write(json.dumps(report, separators=(",", ":")).encode() + b"\n")
                self.out.flush()
            except BrokenPipeError:
                pass  # the parent is gone: stdin's EOF ends us


def _stop_on_term(signum: int, frame: object) -> None:
    raise SystemExit(0)  # unwinds main: the pass in flight finishes, then the loop stops


def main(argv: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us (stdin EOF, SIGTERM)
    signal.signal(signal.SIGTERM, _stop_on_term)
    stdin = sys.stdin.fileno()
    line = b""
    while not line.endswith(b"\n"):
        got = os.read(stdin, 1)  # byte by byte: what follows are wake-ups
        if not got:
            return
        line += got
    spec = LoopSpec(**json.loads(line))
    db = Database.connect(spec.database_url)
    if spec.fence_holder is not None and spec.fence_epoch is not None:
        db = db.fenced(PgFence(spec.fence_holder, spec.fence_epoch))
    observer = PassObserver()
    loop = spec.loop(db, SystemClock(), observer)
    reporter = _Reporter(os.fdopen(int(argv[0]), "wb"), loop, observer)
    observer.on_pass = reporter.on_pass
    db.on_ring(reporter.ring)
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
