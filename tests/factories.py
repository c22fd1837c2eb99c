"""Small builders for hand-made snapshots: factories over literals."""

from __future__ import annotations

from gpufleet.scheduler import (
    Fleet,
    Gpu,
    JobRequest,
    Node,
    NodeGpus,
    Quota,
    Reservation,
    RunningJob,
    Snapshot,
)


def node(
    name: str,
    *,
    gpus: int = 8,
    model: str = "H100",
    leaf: str = "leaf-0",
    rack: str = "rack-0",
    pool: str = "default",
    domains: int = 1,
    unhealthy: tuple[int, ...] = (),
    schedulable: bool = True,
) -> Node:
    per = max(1, gpus // domains)
    return Node(
        name=name,
        gpus=tuple(
            Gpu(index=i, model=model, nvlink_domain=i // per, healthy=i not in unhealthy) for i in range(gpus)
        ),
        leaf=leaf,
        rack=rack,
        pool=pool,
        schedulable=schedulable,
    )


def fleet(*nodes: Node) -> Fleet:
    return Fleet(nodes=nodes)


def uniform_fleet(n: int, *, per_leaf: int = 2, leaves_per_rack: int = 2, gpus: int = 8) -> Fleet:
    return Fleet(
        nodes=tuple(
            node(
                f"n{i}",
                gpus=gpus,
                leaf=f"leaf-{i // per_leaf}",
                rack=f"rack-{i // (per_leaf * leaves_per_rack)}",
            )
            for i in range(n)
        )
    )


def job(job_id: str, gpus: int = 1, *, submit: float = 0.0, **kw: object) -> JobRequest:
    return JobRequest(id=job_id, gpus=gpus, submit_time=submit, **kw)  # type: ignore[arg-type]


def running(
    job_id: str, placement: dict[str, tuple[int, ...]], *, started: float = 0.0, **kw: object
) -> RunningJob:
    gpus = sum(len(g) for g in placement.values())
    return RunningJob(
        job=job(job_id, gpus, submit=started, **kw),
        placement=tuple(NodeGpus(node=n, gpus=g) for n, g in placement.items()),
        started_at=started,
    )


def snapshot(
    f: Fleet,
    *,
    now: float = 100.0,
    running_jobs: tuple[RunningJob, ...] = (),
    pending: tuple[JobRequest, ...] = (),
    quotas: tuple[Quota, ...] = (),
    reservations: tuple[Reservation, ...] = (),
) -> Snapshot:
    return Snapshot(
        now=now, fleet=f, running=running_jobs, pending=pending, quotas=quotas, reservations=reservations
    )


def placed(plan_starts: object) -> dict[str, dict[str, tuple[int, ...]]]:
    """{job: {node: gpus}} from a Plan's starts, for compact assertions."""
    return {s.job_id: {p.node: p.gpus for p in s.placement} for s in plan_starts}  # type: ignore[attr-defined]
