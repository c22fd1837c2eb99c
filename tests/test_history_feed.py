"""The scheduling pass's predictor fed from the server's history (``loops/history.py``):
which ended jobs teach, the bounded warm start, the watermark that reads only what
ended since (and what ended late), and a job's prediction made once; and the pass's
rule for rewriting a waiting job's estimated start (predicted ends move it)."""

from __future__ import annotations

import pytest

from gpufleet.scheduler.predict import DurationPredictor, Prediction
from gpufleet.server.loops.history import Ended, EndedFeed, Predictions, run_time, traits
from gpufleet.server.loops.plancommit import same_eta

USER, TEAM, NAME = 7, 3, "train"
T = traits(user_id=USER, team_id=TEAM, name=NAME, gpus=1, time_limit_s=None)


def ended(
    jid: int,
    at: float,
    ran: float = 100.0,
    *,
    state: str = "COMPLETED",
    kind: str = "batch",
    name: str = NAME,
    started_at: float | None = None,
) -> Ended:
    return Ended(
        id=jid,
        state=state,
        kind=kind,
        ended_at=at,
        started_at=started_at,
        executed_s=ran,
        user_id=USER,
        team_id=TEAM,
        name=name,
        gpus=1,
        time_limit_s=None,
    )


def predicted(feed: EndedFeed) -> float | None:
    got = feed.predictor.predict(T)
    return None if got is None else round(got.duration_s, 6)


@pytest.mark.parametrize(
    ("state", "kind", "teaches"),
    [
        ("COMPLETED", "batch", True),
        ("FAILED", "batch", True),
        ("TIMEOUT", "batch", True),
        ("CANCELLED", "batch", False),
        ("PENDING", "batch", False),  # requeued: its attempt's ``ended_at``, not its end
        ("RUNNING", "batch", False),
        ("COMPLETED", "service", False),
    ],
    ids=["completed", "failed", "timeout", "cancelled", "requeued", "running", "replica"],
)
def test_which_ended_jobs_teach(state: str, kind: str, teaches: bool) -> None:
    feed = EndedFeed()
    feed.warm([], now=0.0)
    assert feed.learn([ended(i, float(i), 50.0, state=state, kind=kind) for i in range(1, 4)]) == (
        3 if teaches else 0
    )
    assert predicted(feed) == (50.0 if teaches else None)


def test_run_time_is_all_attempts_else_the_last() -> None:
    assert run_time(ended(1, 500.0, 120.0, started_at=450.0)) == 120.0  # executed_s: the sum
    assert run_time(ended(1, 500.0, 0.0, started_at=450.0)) == 50.0
    assert run_time(ended(1, 500.0, 0.0)) == 0.0


def test_warm_start_learns_only_the_most_recent() -> None:
    feed = EndedFeed(warm_limit=3)
    # given out of order; the three that ended last ran 10, 20 and 30 s
    rows = [
        ended(5, 50.0, 30.0),
        ended(1, 10.0, 9000.0),
        ended(4, 40.0, 20.0),
        ended(2, 20.0, 9000.0),
        ended(3, 30.0, 10.0),
    ]
    rows.append(ended(6, 60.0, 9000.0, state="CANCELLED"))  # the latest, but it does not teach
    assert feed.warm(rows, now=100.0) == 3
    assert predicted(feed) == 20.0
    assert feed.window() == 100.0 - feed.lag_s


def test_watermark_takes_each_end_once_late_commits_included() -> None:
    feed = EndedFeed(lag_s=30.0)
    assert feed.window() is None  # warm first
    feed.warm([ended(1, 95.0)], now=100.0)
    assert feed.window() == 70.0
    # a pass reads from the window: job 1 again (taken at the warm start), two new ends
    assert feed.fresh([(1, 95.0), (2, 101.0), (3, 110.0)]) == {(2, 101.0), (3, 110.0)}
    assert feed.window() == 80.0
    # the next pass: job 4's end committed late, stamped before job 3's but in the lag
    assert feed.fresh([(2, 101.0), (3, 110.0), (4, 105.0)]) == {(4, 105.0)}
    # a job requeued, then ended: a new end of the same id is new
    assert feed.fresh([(4, 105.0), (2, 101.0), (3, 110.0), (8, 106.0), (8, 112.0)]) == {
        (8, 106.0),
        (8, 112.0),
    }
    assert feed.fresh([(3, 110.0), (8, 112.0)]) == set()
    assert feed.watermark == 112.0


def test_learning_is_incremental() -> None:
    feed = EndedFeed()
    feed.warm([ended(1, 1.0, 100.0), ended(2, 2.0, 100.0)], now=10.0)
    assert predicted(feed) is None  # two jobs: not enough history yet
    assert (
        feed.learn([ended(3, 11.0, 400.0), ended(4, 12.0, 400.0), ended(5, 13.0, 400.0, name="other")]) == 3
    )
    assert predicted(feed) == 200.0  # the median of the log-durations of 100, 100, 400, 400
    assert feed.learnt == 5


def test_a_jobs_prediction_is_made_once() -> None:
    history = DurationPredictor()
    for _ in range(3):
        history.observe(T, 60.0)
    cache = Predictions()
    none: tuple[float | None, float | None, str | None] = (None, None, None)
    first = cache.of(history, job_id=10, job=T, stored=none)
    assert first is not None and round(first.duration_s) == 60
    assert cache.new == {10: first}  # the pass's commit writes it
    for _ in range(10):
        history.observe(T, 5000.0)  # what ends later does not change it
    assert cache.of(history, job_id=10, job=T, stored=none) is first
    # a job whose row has one (a restarted scheduler): the row's, nothing to write
    kept = cache.of(history, job_id=11, job=T, stored=(77.0, 0.5, "user+name (3 jobs)"))
    assert kept == Prediction(duration_s=77.0, confidence=0.5, basis="user+name (3 jobs)")
    assert set(cache.new) == {10}
    cache.written()
    assert cache.new == {}
    # a job first seen with no history keeps none
    other = traits(user_id=1, team_id=1, name="x", gpus=2, time_limit_s=None)
    assert cache.of(history, job_id=12, job=other, stored=none) is None
    assert 12 in cache.rows


def test_the_cache_forgets_jobs_that_left() -> None:
    history = DurationPredictor()
    cache = Predictions()
    for jid in range(3000):
        cache.of(history, job_id=jid, job=T, stored=(60.0, 1.0, "b"))
    cache.keep(2, lambda: {1, 2})
    assert set(cache.rows) == {1, 2}


@pytest.mark.parametrize(
    ("old", "new", "same"),
    [
        (None, None, True),
        (None, 1010.0, False),
        (1010.0, None, False),
        (1010.0, 1014.0, True),  # within 5 s
        (1010.0, 1016.0, False),
        (4600.0, 4660.0, True),  # within 2 % of the hour it announced
        (4600.0, 4700.0, False),
        (990.0, 994.0, True),  # an estimate already past: 5 s
    ],
    ids=["none", "appears", "goes", "5s", "6s", "1min-of-1h", "100s-of-1h", "past"],
)
def test_a_waiting_jobs_estimate_is_rewritten_only_when_it_moved(
    old: float | None, new: float | None, same: bool
) -> None:
    """Estimates behind a running job past its predicted end move with the clock: the
    pass rewrites them only when they moved enough to tell (``plancommit.same_eta``)."""
    assert same_eta(old, new, now=1000.0) is same
