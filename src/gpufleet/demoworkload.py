"""What ``gpufleet demo`` puts on its fleet once the fleet is up (``demo.py`` runs the
server, the agents and the console; ``demoservice.py`` the inference service): the
demo's teams, users and budgets, a few bookings for the page's calendar, and the
background workload, the bundled Philly sample replayed through the API by the demo's
users (``TraceReplay``). Everything here is a client of the API, nothing more.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

import httpx

from gpufleet.agent.jobs import SIMULATE_ENV, SIMULATE_UTIL_ENV
from gpufleet.sim.trace import TraceJob

TEAMS = {"vision": ("alice", "bob"), "language": ("carol", "dave"), "speech": ("erin",)}
ADMIN_TEAM = "demo"
BUDGETS = {"speech": (25.0, 60.0)}
"""Monthly budgets: a few minutes into the demo team speech passes its soft budget (the
page and ``gpufleet admin teams`` show it) and later its hard one (its new jobs wait)."""


def setup_accounts(c: httpx.Client) -> dict[str, tuple[str, str]]:
    """Teams and users (idempotent on a reused data dir), made with the admin's client
    ``c``; {user: (team, token)}."""
    users: dict[str, tuple[str, str]] = {}
    me = c.get("/users/me")
    if me.status_code != 200:
        raise RuntimeError(
            f"the admin token is refused ({me.status_code}); with a reused --data-dir "
            "set GPUFLEET_ADMIN_TOKEN to the token of its first start"
        )
    for team in (ADMIN_TEAM, *TEAMS):
        c.post("/teams", json={"name": team})
    c.post(f"/teams/{ADMIN_TEAM}/members", json={"user": "admin"})
    for team, (soft, hard) in BUDGETS.items():
        c.put(f"/teams/{team}/budget", json={"soft": soft, "hard": hard})
    for team, names in TEAMS.items():
        for name in names:
            made = c.post("/users", json={"name": name, "role": "user", "teams": [team]})
            if made.status_code == 201:
                users[name] = (team, made.json()["token"])
            else:
                tok = c.post("/tokens", json={"name": "demo", "user": name})
                users[name] = (team, tok.json()["token"])
    return users


def book_reservations(c: httpx.Client, *, nodes: int, gpus_per_node: int, stop: threading.Event) -> None:
    """A few bookings for the page's calendar, once the nodes have registered (a booking
    is admitted against registered GPUs): team vision's daily 09:00-13:00 window for 16
    GPUs on 2 nodes this week, an evaluation run of team language in two hours, and a
    maintenance window on the last node tomorrow. Skipped on a reused data dir that has
    them already.

    A small fleet gets only the bookings that leave three quarters of its nodes free
    (``fits_fleet``): a booking keeps off its nodes every job whose time limit (4 h by
    default, a service replica's too) reaches into its window, so two windows on a
    4-node demo left a service's 3 replicas one node to share (issue 30)."""
    from gpufleet.cli.reservation_cmds import local_zone

    deadline = time.monotonic() + 60
    while not stop.is_set() and time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            if c.get("/fleet/summary").json()["nodes"] >= nodes:
                break
        stop.wait(0.5)
    with contextlib.suppress(httpx.HTTPError, ValueError):
        booked = {  # a repeat's windows are named name#1, name#2, ...
            r["name"].split("#")[0]
            for r in c.get("/reservations", params={"limit": 1000}).json()["items"]
            if r["state"] != "CANCELLED"
        }
        now = time.time()
        nine = datetime.now().astimezone().replace(hour=9, minute=0, second=0, microsecond=0)
        if nine.timestamp() <= now:
            nine += timedelta(days=1)
        tz = local_zone()  # a repeat keeps 09:00 on this machine's wall clock
        wants = [
            {
                "name": "vision-sprint",
                "team": "vision",
                "gpus": 2 * gpus_per_node,
                "nodes": 2,
                "start": nine.timestamp(),
                "duration_s": 4 * 3600,
                "repeat": "daily",
                "count": 5,
                "timezone": tz,
            },
            {
                "name": "eval-run",
                "team": "language",
                "gpus": gpus_per_node,
                "start": now + 2 * 3600,
                "duration_s": 3 * 3600,
            },
            {
                "name": "driver upgrade",
                "node_names": [f"node-{nodes - 1:03d}"],
                "maintenance": True,
                "start": now + 26 * 3600,
                "duration_s": 2 * 3600,
            },
        ]
        for spec in wants:
            if spec["name"] not in booked and fits_fleet(spec, nodes=nodes, gpus_per_node=gpus_per_node):
                c.post("/reservations", json=spec)


def fits_fleet(spec: dict[str, Any], *, nodes: int, gpus_per_node: int) -> bool:
    """Whether a demo booking leaves at least three quarters of the ``nodes`` unbooked;
    the maintenance window (one node, tomorrow) is always booked."""
    if spec.get("maintenance"):
        return True
    booked = spec.get("nodes") or -(-int(spec["gpus"]) // gpus_per_node)
    return 4 * int(booked) <= nodes


class TraceReplay:
    """The background workload: the bundled Philly sample replayed ``speed`` times faster
    (durations also divided by it, clamped to 2..``max_job_s`` s), lap after lap, each
    job submitted by one of the demo's users. Trace jobs are simulated
    (``GPUFLEET_SIMULATE_S``): they hold their GPUs and drive the simulated telemetry,
    nothing runs. A job is skipped while more than twice the fleet's GPUs of jobs wait
    (``pending``, the fleet summary's count)."""

    def __init__(
        self,
        *,
        api: Callable[[str], httpx.Client],
        stop: threading.Event,
        pending: Callable[[], int],
        nodes: int,
        gpus_per_node: int,
        speed: float,
        max_job_s: float,
    ) -> None:
        self.api = api
        """A client of the API with a user's token."""
        self.stop = stop
        self.pending = pending
        self.nodes = nodes
        self.gpus_per_node = gpus_per_node
        self.speed = speed
        self.max_job_s = max_job_s
        self.submitted = 0
        """Jobs the API took so far."""

    def run(self, users: dict[str, tuple[str, str]]) -> None:
        """Submit until ``stop`` is set, as ``users`` ({user: (team, token)})."""
        trace = _trace()
        if not trace:
            return
        rng = random.Random(7)
        names = sorted(users)
        clients = {n: self.api(users[n][1]) for n in names}
        span = trace[-1].submit_s / self.speed + 5.0
        cap = 2 * self.nodes * self.gpus_per_node
        try:
            for lap in range(1_000_000):
                t0 = time.monotonic()
                for job in trace:
                    at = t0 + job.submit_s / self.speed
                    while not self.stop.is_set() and time.monotonic() < at:
                        self.stop.wait(min(0.5, at - time.monotonic()))
                    if self.stop.is_set():
                        return
                    if self.pending() > cap:
                        continue  # the queue is long enough: skip rather than pile up
                    user = names[hash((job.user, lap)) % len(names)]
                    with contextlib.suppress(httpx.HTTPError):
                        if clients[user].post("/jobs", json=self._spec(job, users[user][0], rng)).is_success:
                            self.submitted += 1
                rest = t0 + span - time.monotonic()
                if rest > 0 and self.stop.wait(rest):
                    return
        finally:
            for c in clients.values():
                c.close()

    def _spec(self, job: TraceJob, team: str, rng: random.Random) -> dict[str, Any]:
        dur = min(self.max_job_s, max(2.0, job.duration_s / self.speed))
        spec: dict[str, Any] = {
            "command": ["sleep", f"{dur:.0f}"],
            "name": job.job_id,
            "gpus": job.gpus,
            "team": team,
            "priority": -1,
            "env": {SIMULATE_ENV: f"{dur:.1f}", SIMULATE_UTIL_ENV: f"{rng.uniform(0.55, 1.0):.2f}"},
        }
        if job.gpus > self.gpus_per_node and job.gpus % self.gpus_per_node == 0:
            spec["gpus_per_node"] = self.gpus_per_node
        return spec


def _trace() -> list[TraceJob]:
    from gpufleet.sim.loaders import load_trace

    path = Path(str(resources.files("gpufleet") / "data" / "philly-sample.csv"))
    return load_trace(path, "philly").jobs
