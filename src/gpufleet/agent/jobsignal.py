"""sbatch's ``--signal=[B:]NAME@SECONDS`` on this node.

The agent's tick sends NAME once the job's time left (to its ``deadline``, which the
server hands out once the job runs, kept up to date on the held attempt) is at most
SECONDS, through the runner (``send_signal``): to the batch shell only with ``B:``, else
to every process of the job. Once per attempt: the record says it was sent before it is
sent, so a restarted agent never sends it again (at most once: an agent killed between
the two does not send it at all).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from gpufleet.agent.jobs import LocalJob
from gpufleet.agent.runners import JobRunner
from gpufleet.slurmopts import signal_parts

log = logging.getLogger("gpufleet.agent")


def signal_due(runner: JobRunner, job: LocalJob, now: float, *, save: Callable[[LocalJob], None]) -> LocalJob:
    """``--signal``: send it once the time left is at most its seconds; the attempt as it
    is now (``save`` records it first; the agent's lock is held)."""
    deadline = job.deadline
    if job.signal is None or deadline is None or job.signal_sent_at is not None:
        return job
    try:
        batch_only, signum, seconds = signal_parts(job.signal)
    except (KeyError, ValueError):  # not parse_signal's form: nothing to send, ever
        log.warning("job %s/%s: unusable --signal %r", job.job_id, job.attempt, job.signal)
        job = dataclasses.replace(job, signal_sent_at=now)
        save(job)
        return job
    if now < deadline - seconds:
        return job
    job = dataclasses.replace(job, signal_sent_at=now)
    save(job)  # first: a restarted agent must not send it a second time
    why = runner.send_signal(job, signum=signum, batch_only=batch_only)
    if why is not None:
        log.info("job %s/%s: --signal=%s not sent: %s", job.job_id, job.attempt, job.signal, why)
    return job
