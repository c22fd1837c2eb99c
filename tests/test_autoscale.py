"""The autoscaler's decisions (``server/decide/autoscale.py``) on a fake clock: metrics in,
replica counts out."""

from __future__ import annotations

import random

import pytest

from gpufleet.server.decide.autoscale import Observation, ScalePolicy, ScaleState, recommend, step

POLICY = ScalePolicy(min_replicas=1, max_replicas=10, metric="gpu_util", target=70.0)


def obs(current: int, value: float | None, ready: int | None = None) -> Observation:
    return Observation(current=current, ready=current if ready is None else ready, value=value)


@pytest.mark.parametrize(
    ("o", "want"),
    [
        pytest.param(obs(2, 70.0), 2, id="at-target"),
        pytest.param(obs(2, 76.0), 2, id="inside-tolerance-up"),
        pytest.param(obs(2, 64.0), 2, id="inside-tolerance-down"),
        pytest.param(obs(2, 100.0), 3, id="hpa-rule-ceil"),
        pytest.param(obs(4, 35.0), 2, id="halves"),
        pytest.param(obs(2, None), 2, id="no-reading-no-change"),
        pytest.param(obs(2, 90.0, ready=0), 2, id="nothing-ready-no-change"),
        pytest.param(obs(9, 100.0), 10, id="clamped-to-max"),
        pytest.param(obs(1, 1.0), 1, id="clamped-to-min"),
        pytest.param(obs(3, 100.0, ready=2), 3, id="uses-ready-replicas"),
    ],
)
def test_recommend(o: Observation, want: int) -> None:
    assert recommend(POLICY, o) == want


def test_inflight_scales_in_one_step() -> None:
    p = ScalePolicy(min_replicas=1, max_replicas=20, metric="inflight", target=4.0)
    d = step(p, ScaleState(), obs(2, 20.0), now=0.0)
    assert d.desired == 10 and "scale up 2 -> 10" in d.reason and "20.0 in flight per replica" in d.reason


def test_scale_up_is_immediate_then_waits_for_its_replicas() -> None:
    p = ScalePolicy(min_replicas=1, max_replicas=20, metric="inflight", target=2.0)
    state = ScaleState()
    assert step(p, state, obs(2, 4.0), now=0.0).desired == 4
    held = step(p, state, obs(4, 8.0, ready=2), now=10.0)  # two of the new ones are not ready yet
    assert held.desired == 4 and "stabilising 20s" in held.reason
    assert step(p, state, obs(4, 8.0, ready=2), now=30.0).desired == 8  # the window is over
    state = ScaleState()
    assert step(p, state, obs(2, 4.0), now=0.0).desired == 4
    assert step(p, state, obs(4, 8.0, ready=4), now=1.0).desired == 16  # all ready: the load still asks


def test_a_ready_scale_up_may_scale_again_at_once() -> None:
    """A warm replica is ready the moment it is promoted: the next reading counts."""
    p = ScalePolicy(min_replicas=1, max_replicas=8, metric="inflight", target=2.0)
    state = ScaleState()
    assert step(p, state, obs(1, 3.0), now=0.0).desired == 2
    assert step(p, state, obs(2, 40.0), now=1.0).desired == 8


def test_scale_down_waits_out_the_cooldown() -> None:
    state = ScaleState()
    assert step(POLICY, state, obs(4, 35.0), now=0.0).desired == 4  # no history yet
    for t in range(10, 300, 10):
        d = step(POLICY, state, obs(4, 35.0), now=float(t))
        assert d.desired == 4, (t, d.reason)
    d = step(POLICY, state, obs(4, 35.0), now=300.0)
    assert d.desired == 2 and "scale down 4 -> 2" in d.reason and "lower for 300s" in d.reason


def test_scale_down_takes_the_highest_recent_recommendation() -> None:
    state = ScaleState()
    step(POLICY, state, obs(6, 70.0), now=0.0)
    step(POLICY, state, obs(6, 50.0), now=100.0)  # would be 5
    step(POLICY, state, obs(6, 20.0), now=200.0)  # would be 2
    assert step(POLICY, state, obs(6, 20.0), now=300.0).desired == 6  # 6 at t=0 is in the window
    assert step(POLICY, state, obs(6, 20.0), now=399.0).desired == 5  # t=100's 5 is the highest left
    assert step(POLICY, state, obs(5, 20.0), now=450.0).desired == 5  # cooling down after that change


def test_no_scale_down_within_the_cooldown_after_a_scale_up() -> None:
    state = ScaleState()
    for t in range(0, 400, 10):
        step(POLICY, state, obs(3, 40.0), now=float(t))
    assert step(POLICY, state, obs(3, 100.0), now=400.0).desired == 5
    for t in range(410, 700, 10):
        assert step(POLICY, state, obs(5, 10.0), now=float(t)).desired == 5


def test_bounds_changed_under_it() -> None:
    d = step(ScalePolicy(min_replicas=2, max_replicas=3), ScaleState(), obs(5, 70.0), now=0.0)
    assert d.desired == 3 and "outside 2..3" in d.reason


@pytest.mark.parametrize("seed", range(20))
def test_twenty_minutes_of_noisy_steady_load_never_flaps(seed: int) -> None:
    """A steady load worth 4 replicas at the target, +-25 % noise on every reading (every
    15 s for 20 minutes; each replica's share shrinks as replicas are added): the count
    may step up, and never reverses (no flap)."""
    rng = random.Random(seed)
    state, current, changes = ScaleState(), 4, []
    for i in range(80):
        value = 70.0 * 4 / current * (1 + rng.uniform(-0.25, 0.25))
        d = step(POLICY, state, obs(current, value), now=i * 15.0)
        if d.desired != current:
            changes.append((i * 15.0, current, d.desired))
            current = d.desired
    downs = [c for c in changes if c[2] < c[1]]
    ups = [c for c in changes if c[2] > c[1]]
    assert not downs, changes
    assert len(ups) <= 1, changes


def seen(current: int, util: float, inflight: float, ready: int | None = None) -> Observation:
    return Observation(
        current=current, ready=current if ready is None else ready, value=util, inflight=inflight
    )


def test_a_saturated_replica_panics_to_the_demand_in_one_step() -> None:
    """40 -> 200 req/s on one replica: utilisation reads at most 100 % (HPA: x1.43 a step),
    but the gateways' in-flight requests show the demand; capacity learned while calm."""
    state = ScaleState()
    for t in range(5):  # calm: 40 % GPU with 0.6 in flight -> 1.05 in flight at the 70 % target
        assert step(POLICY, state, seen(1, 40.0, 0.6), now=float(t)).kind == "steady"
    assert state.per_replica == pytest.approx(1.05)
    d = step(POLICY, state, seen(1, 100.0, 5.5), now=5.0)
    assert d.kind == "panic" and d.desired == 6, d  # ceil(5.5 / 1.05); HPA alone: 2
    assert "5.5 in flight at the gateways" in d.reason
    # new replicas not ready yet, demand still high: no second panic past the count
    assert step(POLICY, state, seen(6, 100.0, 5.5, ready=1), now=6.0).desired == 6


def test_the_panic_threshold_is_on_the_unrounded_demand() -> None:
    """1.5 in flight where a replica holds 1.26 at the target: 1.19 replicas' worth, which
    rounds up to 2 = twice the one ready replica; seen before a step in bench_autoscale
    (a panic at a calm load). The HPA rule still decides (here: within its tolerance)."""
    state = ScaleState(per_replica=1.26)
    d = step(POLICY, state, seen(1, 38.9, 1.5), now=0.0)
    assert d.kind != "panic" and d.desired == 1, d
    assert step(POLICY, ScaleState(per_replica=1.26), seen(1, 38.9, 2.52), now=0.0).kind == "panic"


def test_below_twice_the_ready_replicas_is_no_panic() -> None:
    state = ScaleState(per_replica=1.0)
    d = step(POLICY, state, seen(2, 80.0, 3.0), now=0.0)  # needs 3 < 2 x 2
    assert d.kind == "up" and d.desired == 3  # the HPA rule: ceil(2 x 80 / 70)


def test_panic_is_capped_by_max_and_holds_scale_down() -> None:
    p = ScalePolicy(min_replicas=1, max_replicas=4, scale_down_cooldown_s=100.0, panic_hold_s=60.0)
    state = ScaleState(per_replica=1.0)
    assert step(p, state, seen(1, 100.0, 50.0), now=0.0).desired == 4
    assert step(p, state, seen(4, 100.0, 50.0), now=90.0).desired == 4  # at max, still panicking
    for t in (120.0, 140.0):  # past the cooldown, load gone: held by the last panic reading
        d = step(p, state, seen(4, 10.0, 0.1), now=t)
        assert d.desired == 4 and d.kind == "held-down" and "panic" in d.reason
    d = step(p, state, seen(4, 10.0, 0.1), now=151.0)  # panic over; t=90's reading is in the window
    assert d.kind == "held-down" and "panic" not in d.reason
    assert step(p, state, seen(4, 10.0, 0.1), now=191.0).kind == "down"


def test_the_panic_hold_is_never_longer_than_the_services_cooldown() -> None:
    """A service that asks to scale down after 10 s of calm gets that after a panic too,
    not the 60-s hold (the e2e test's 4-s cooldown once waited a minute)."""
    p = ScalePolicy(min_replicas=1, max_replicas=4, scale_down_cooldown_s=10.0, panic_hold_s=60.0)
    state = ScaleState(per_replica=1.0)
    assert step(p, state, seen(1, 100.0, 50.0), now=0.0).desired == 4
    assert step(p, state, seen(4, 100.0, 50.0), now=5.0).desired == 4  # panics again at max: held to 15
    d = step(p, state, seen(4, 10.0, 0.1), now=12.0)
    assert d.kind == "held-down" and "panic" in d.reason
    assert step(p, state, seen(4, 10.0, 0.1), now=16.0).kind == "down"


def test_inflight_metric_panics_on_its_own_target() -> None:
    p = ScalePolicy(min_replicas=1, max_replicas=20, metric="inflight", target=2.0)
    d = step(p, ScaleState(), Observation(current=2, ready=2, value=3.0, inflight=12.0), now=0.0)
    assert d.kind == "panic" and d.desired == 6


def test_no_demand_reading_or_no_capacity_learned_is_no_panic() -> None:
    assert step(POLICY, ScaleState(), seen(1, 100.0, 50.0), now=0.0).kind == "up"  # nothing learned
    d = step(POLICY, ScaleState(per_replica=1.0), obs(1, 100.0), now=0.0)  # no gateway reading
    assert d.kind == "up" and d.desired == 2


def test_held_decisions_say_so_as_values() -> None:
    p = ScalePolicy(min_replicas=1, max_replicas=20, metric="inflight", target=2.0)
    state = ScaleState()
    step(p, state, obs(2, 4.0), now=0.0)
    assert step(p, state, obs(4, 8.0, ready=2), now=10.0).kind == "held-up"
    assert step(p, state, obs(4, 0.5), now=20.0).kind == "held-down"


def test_traffic_rates_and_quantiles_from_gateway_reports() -> None:
    """Two gateways, cumulative counters; the first report of one has no histogram yet
    (no answer then); a restarted gateway (counters went down) starts over."""
    from gpufleet.api.services import LatencyIn, ServiceCounters
    from gpufleet.server.decide.traffic import TrafficStore

    le = [0.01, 0.1, 1.0, 1e9]

    def counters(ok: int, errors: int, fast: int, slow: int) -> ServiceCounters:
        cum = [fast, fast + slow, fast + slow, fast + slow]
        return ServiceCounters(
            codes={"200": ok, "503": errors},
            inflight=3,
            latency=LatencyIn(le=le, counts=cum, sum=0.0, count=fast + slow),
        )

    t = TrafficStore()
    t.put("g1", 100.0, {"svc": ServiceCounters(codes={}, inflight=0)})
    t.put("g2", 100.0, {"svc": counters(50, 0, 50, 0)})
    t.put("g1", 110.0, {"svc": counters(99, 1, 90, 10)})
    t.put("g2", 110.0, {"svc": counters(150, 0, 150, 0)})
    got = t.stats("svc", now=110.0, window_s=30.0)
    assert got is not None
    assert (got.qps, got.error_rate, got.inflight, got.gateways) == (20.0, 0.005, 6, 2)
    assert got.p50_ms is not None and got.p50_ms <= 10.0
    assert got.p99_ms is not None and 10.0 < got.p99_ms <= 100.0
    t.put("g2", 120.0, {"svc": counters(5, 0, 5, 0)})  # g2 restarted
    after = t.stats("svc", now=120.0, window_s=30.0)
    assert after is not None and after.qps >= 0
    assert t.stats("other", now=120.0) is None
    assert t.stats("svc", now=500.0) is None  # every gateway went quiet: forgotten


def test_mean_util_of_a_replicas_gpus() -> None:
    """Across nodes; stale readings, unknown GPUs and GPUs without a reading left out."""
    from gpufleet.api.nodes import GpuTelemetry
    from gpufleet.server.store.agentstate import TelemetryStore

    t = TelemetryStore()
    t.put("a", at=100.0, gpus=[GpuTelemetry(index=0, utilization_pct=40.0), GpuTelemetry(index=1)],
          driver_version=None, cuda_version=None)  # fmt: skip
    t.put(
        "b",
        at=100.0,
        gpus=[GpuTelemetry(index=0, utilization_pct=80.0)],
        driver_version=None,
        cuda_version=None,
    )
    t.put(
        "old",
        at=10.0,
        gpus=[GpuTelemetry(index=0, utilization_pct=0.0)],
        driver_version=None,
        cuda_version=None,
    )
    gpus = [("a", 0), ("a", 1), ("a", 7), ("b", 0), ("old", 0), ("nowhere", 0)]
    assert t.mean_util(gpus, now=105.0, max_age_s=30.0) == 60.0
    assert t.mean_util([("old", 0)], now=105.0, max_age_s=30.0) is None
    assert t.mean_util([], now=105.0, max_age_s=30.0) is None


@pytest.mark.parametrize("metric", ["inflight", "qps", "gpu_util"])
def test_the_panic_demand_is_the_gateways_in_flight_whatever_the_metric(metric: str) -> None:
    """The panic rule reads the demand in flight at the gateways for every metric (it once
    read ``metric == "inflight"``, a bool, for the gateway metrics: 1.0 or 0.0 in flight,
    so ``qps`` never panicked and ``inflight`` never learnt of a step)."""
    from gpufleet.api.services import ServiceCounters
    from gpufleet.server.services.autoscaling import Autoscaler
    from gpufleet.server.store.agentstate import AgentState

    hot = AgentState()
    for i, (served, inflight) in enumerate([(0, 30), (100, 34), (200, 38)]):
        hot.traffic.put("g1", 100.0 + i, {"svc": ServiceCounters(codes={"200": served}, inflight=inflight)})
    auto = Autoscaler(hot=hot)
    value, demand = auto.gateway_readings("svc", metric, 2, now=102.0)
    assert demand == 34.0  # the reports inside the 2-s panic window
    want = {"inflight": (30 + 34 + 38) / 3 / 2, "qps": 100.0 / 2, "gpu_util": None}[metric]
    assert value == pytest.approx(want) if want is not None else value is None
    assert auto.gateway_readings("other", metric, 2, now=102.0) == (None, None)
    assert auto.gateway_readings("svc", metric, 0, now=102.0) == (None, 34.0)  # nothing ready: no metric


@pytest.mark.parametrize(
    ("before", "now", "surge"),
    [
        pytest.param(0, 0, False, id="idle"),
        pytest.param(0, 3, False, id="light-load-below-the-floor"),
        pytest.param(0, 4, True, id="a-step-from-nothing"),
        pytest.param(5, 9, False, id="below-twice"),
        pytest.param(5, 10, True, id="twice-and-the-floor"),
        pytest.param(40, 20, False, id="falling"),
    ],
)
def test_a_surge_in_a_gateway_report(before: int, now: int, surge: bool) -> None:
    from gpufleet.api.services import ServiceCounters
    from gpufleet.server.decide.traffic import TrafficStore, surged

    assert surged(before, now) is surge
    t = TrafficStore()
    first = t.put("g1", 1.0, {"svc": ServiceCounters(codes={}, inflight=before)})
    assert first == (["svc"] if surged(0, before) else [])
    awake = surge or surged(0, before)  # a surge a second before still wakes
    assert t.put("g1", 2.0, {"svc": ServiceCounters(codes={}, inflight=now)}) == (["svc"] if awake else [])
    assert t.put("g2", 2.0, {"svc": ServiceCounters(codes={}, inflight=0)}) == []  # per gateway


def test_a_step_keeps_waking_until_the_panic_windows_mean_caught_up() -> None:
    """The panic rule reads the mean over its window: a gateway reporting every 0.2 s
    shows a step in one report but moves that mean only a tenth of the way; each report
    of the step wakes the autoscaler again while the step stands out (at least twice the
    mean) and for the window after, until the mean has all of it; then no more."""
    from gpufleet.api.services import ServiceCounters
    from gpufleet.server.decide.traffic import TrafficStore

    t = TrafficStore()
    at = 0.0
    for _ in range(10):
        at += 0.2
        assert t.put("g1", at, {"svc": ServiceCounters(codes={}, inflight=1)}) == []
    woken = []
    for _ in range(25):
        at += 0.2
        woken.append(bool(t.put("g1", at, {"svc": ServiceCounters(codes={}, inflight=12)})))
    awake = woken.index(False)
    assert 10 <= awake <= 16 and not any(woken[awake:]), woken  # the window's 10 reports and more
