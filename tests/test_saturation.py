"""Stop conditions (daemon.saturation): pure, synthetic inputs, an injected clock.

The over-saturation detector is fed by a small simulation of an open-loop server: Poisson
arrivals at a rate into ``slots`` parallel slots (first come, first served), each request taking a
noisy service time; TTFT is the wait for a slot plus a noisy prefill. Below capacity it must never
fire (many seeds); above capacity it must fire within a few windows.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass

import pytest

from daemon.saturation import (
    CHECK_INTERVAL_S,
    ErrorBudget,
    SaturationDetector,
    SaturationPolicy,
    TTFTSource,
    evaluate,
    linear_fit,
)
from servetune.spec import StopConditions

S = 1_000_000_000


@dataclass
class Sim:
    arrivals: list[int]  # send_ns, sorted
    first_token: list[int]  # by arrival index
    finishes: list[int]  # sorted

    def outstanding(self, now: int) -> int:
        return bisect.bisect_right(self.arrivals, now) - bisect.bisect_right(self.finishes, now)

    def ttfts(self, now: int) -> TTFTSource:
        """What the load generator knows at ``now``: first tokens that arrived since ``since``."""

        def source(since: int) -> Iterable[tuple[int, int]]:
            hi = bisect.bisect_right(self.arrivals, now)
            lo = bisect.bisect_left(self.arrivals, since - 120 * S)  # no TTFT here exceeds 2 min
            return [(self.arrivals[i], self.first_token[i]) for i in range(lo, hi) if since <= self.first_token[i] <= now]

        return source


def simulate(seed: int, rate: float, slots: int, service_s: float, prefill_s: float, duration_s: float) -> Sim:
    rng = random.Random(seed)
    free = [0] * slots  # when each slot frees (a heap)
    arrivals: list[int] = []
    first: list[int] = []
    finishes: list[int] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t > duration_s:
            break
        arrive = int(t * S)
        start = max(arrive, heapq.heappop(free))
        prefill = int(prefill_s * rng.lognormvariate(0, 0.3) * S)
        service = int(service_s * rng.lognormvariate(0, 0.3) * S)
        arrivals.append(arrive)
        first.append(start + prefill)
        finishes.append(start + max(service, prefill))
        heapq.heappush(free, start + max(service, prefill))
    return Sim(arrivals, first, sorted(finishes))


def run_detector(sim: Sim, policy: SaturationPolicy, duration_s: float) -> tuple[float | None, str | None]:
    det = SaturationDetector(policy, start_ns=0)
    step = int(CHECK_INTERVAL_S * S)
    now = step
    while now <= duration_s * S:
        reason = det.check(now, sim.outstanding(now), sim.ttfts(now))
        if reason is not None:
            return now / S, reason
        now += step
    return None, None


# --------------------------------------------------------------------------- statistics


def test_linear_fit_by_hand() -> None:
    fit = linear_fit([0, 1, 2, 3], [1, 3, 5, 7])
    assert fit is not None and fit.slope == pytest.approx(2.0) and fit.intercept == pytest.approx(1.0)
    assert fit.stderr == pytest.approx(0.0) and fit.t == math.inf
    noisy = linear_fit([0, 1, 2, 3, 4], [0, 2, 1, 3, 2])
    # slope = Sxy / Sxx = 5 / 10, intercept 0.6; residuals -0.6, 0.9, -0.6, 0.9, -0.6: SS 2.7 -> se = sqrt(2.7 / 3 / 10)
    assert noisy is not None and noisy.slope == pytest.approx(0.5)
    assert noisy.stderr == pytest.approx(0.3) and noisy.t == pytest.approx(0.5 / 0.3)
    assert linear_fit([1, 1, 1], [1, 2, 3]) is None and linear_fit([1, 2], [1, 2]) is None
    flat = linear_fit([0, 1, 2], [5, 5, 5])
    assert flat is not None and flat.t == 0.0


# --------------------------------------------------------------------------- over-saturation


@pytest.mark.parametrize("utilisation", [0.5, 0.8])
def test_steady_load_below_capacity_never_triggers(utilisation: float) -> None:
    slots, service = 8, 0.4
    rate = utilisation * slots / service
    policy = SaturationPolicy(window_s=5.0)
    for seed in range(40):
        sim = simulate(seed, rate, slots, service, 0.02, duration_s=60)
        at, reason = run_detector(sim, policy, 60)
        assert reason is None, (seed, at, reason)


def test_noise_alone_never_triggers() -> None:
    """Outstanding requests and TTFTs as independent noise around fixed levels, heavy tails included."""
    policy = SaturationPolicy(window_s=3.0, confirm_s=0.5)
    for seed in range(100):
        rng = random.Random(seed)
        det = SaturationDetector(policy, start_ns=0)
        sends: list[tuple[int, int]] = []
        t = 0.0
        now = 0
        while now < 40 * S:
            now += int(CHECK_INTERVAL_S * S)
            while t * S < now:
                t += rng.expovariate(30.0)
                ttft = 0.05 * rng.lognormvariate(0, 0.8)
                sends.append((int(t * S), int((t + ttft) * S)))
            level = rng.gauss(12, math.sqrt(12))
            snapshot = [(s, f) for s, f in sends if f <= now]
            reason = det.check(now, max(0.0, level), lambda since, snap=snapshot: [p for p in snap if p[0] >= since])
            assert reason is None, (seed, now / S, reason)
            sends = [p for p in sends if p[0] > now - 10 * S]


def test_overload_triggers_with_a_readable_reason() -> None:
    slots, service = 8, 0.4
    rate = 1.5 * slots / service  # half again what the server can take
    policy = SaturationPolicy(window_s=5.0)
    for seed in range(20):
        sim = simulate(seed, rate, slots, service, 0.02, duration_s=60)
        at, reason = run_detector(sim, policy, 60)
        assert at is not None and reason is not None, seed
        # a full window, a confirming one, and a little slack
        assert 10.0 <= at <= 16.0, (seed, at)
        assert reason.startswith("over-saturation: in-flight grew from ") and " ms/s " in reason, reason
        assert "over 5 s" in reason and "deadline" not in reason


def test_mild_overload_is_caught_as_the_backlog_builds() -> None:
    """15% over capacity: too little per window at first, but the floors stay at the measurement's
    early levels, so the growing backlog does not hide itself."""
    slots, service = 8, 0.4
    rate = 1.15 * slots / service
    hits = 0
    for seed in range(10):
        sim = simulate(seed, rate, slots, service, 0.02, duration_s=90)
        at, _ = run_detector(sim, SaturationPolicy(window_s=5.0), 90)
        hits += at is not None
    assert hits >= 8


def test_needs_a_full_window_and_enough_requests() -> None:
    policy = SaturationPolicy(window_s=5.0, confirm_s=0.0, min_requests=20, noise_sigmas=3.0)
    step = int(CHECK_INTERVAL_S * S)

    def rising(n_per_s: float) -> tuple[float | None, list[str]]:
        """A queue that grows by 2 per second and TTFT that grows 100 ms per second, exactly."""
        det = SaturationDetector(policy, start_ns=0)
        sends = [int(i / n_per_s * S) for i in range(int(20 * n_per_s))]
        notes = []
        for k in range(1, 200):
            now = k * step
            pts = [(s, s + int((0.05 + 0.1 * s / S) * S)) for s in sends if s + int((0.05 + 0.1 * s / S) * S) <= now]
            reason = det.check(now, 2.0 * now / S, lambda since, p=pts: [x for x in p if x[0] >= since])
            if det.last is not None:
                notes.append(det.last.why_not)
            if reason is not None:
                return now / S, notes
        return None, notes

    at, _ = rising(10.0)  # 50 requests per window: enough
    assert at is not None and at == pytest.approx(5.0, abs=0.15)  # not before a full window
    # 0.8 requests per second: 4 per window, 16 in the 4 windows looked back at: never enough
    at, notes = rising(0.8)
    assert at is None and any("TTFTs in the window" in n for n in notes)


def test_a_slow_server_is_judged_on_its_latest_first_tokens() -> None:
    """2 slots, 0.6 s per request: about 17 first tokens per 5 s window, fewer than min_requests."""
    slots, service = 2, 0.6
    policy = SaturationPolicy(window_s=5.0)
    hits = 0
    for seed in range(10):
        over = simulate(seed, 3.0 * slots / service, slots, service, 0.02, duration_s=60)
        at, _ = run_detector(over, policy, 60)
        hits += at is not None
        calm = simulate(seed, 0.6 * slots / service, slots, service, 0.02, duration_s=60)
        assert run_detector(calm, policy, 60)[1] is None, seed
    assert hits >= 9, hits


def test_falling_or_flat_queue_never_triggers() -> None:
    policy = SaturationPolicy(window_s=2.0)
    ttfts = [(int(i * 0.05 * S), int((i * 0.05 + 0.01 * i) * S)) for i in range(40)]  # TTFT rises
    for level in (lambda t: 30 - 10 * t, lambda t: 5.0):
        samples = [(int(t * 0.1 * S), level(t * 0.1)) for t in range(21)]
        ev = evaluate(policy, 2 * S, samples, lambda since: ttfts)
        assert not ev.saturated and "outstanding" in ev.why_not


def test_queue_growth_without_ttft_trend_does_not_trigger() -> None:
    """Requests pile up but TTFT stays flat (e.g. long decodes at a fine prefill rate): not enough."""
    policy = SaturationPolicy(window_s=2.0)
    samples = [(int(t * 0.1 * S), 2.0 + 3 * t) for t in range(21)]
    rng = random.Random(1)
    ttfts = [(int(i * 0.04 * S), int((i * 0.04 + 0.05 + rng.uniform(0, 0.002)) * S)) for i in range(50)]
    ev = evaluate(policy, 2 * S, samples, lambda since: ttfts)
    assert not ev.saturated and "TTFT" in ev.why_not


# --------------------------------------------------------------------------- error budget


def test_error_budget_count() -> None:
    budget = ErrorBudget(StopConditions(max_errors=10))
    for i in range(30):
        budget.record(failed=i % 2 == 0)
        if budget.errors <= 10:
            assert budget.exceeded() is None
    assert budget.exceeded() == "error budget: 15 errors > max_errors 10"
    assert not ErrorBudget(StopConditions()).active


def test_error_budget_rate_waits_for_enough_requests() -> None:
    budget = ErrorBudget(StopConditions(max_error_rate=0.2, min_requests_for_rate=20))
    for _ in range(10):
        budget.record(failed=True)
    assert budget.exceeded() is None  # 10 of 10 failed, but only 10 finished
    for _ in range(9):
        budget.record(failed=False)
    assert budget.exceeded() is None
    budget.record(failed=False)
    reason = budget.exceeded()
    assert reason == "error budget: 10 of 20 requests failed (50% > max_error_rate 20%)"
    ok = ErrorBudget(StopConditions(max_error_rate=0.5, min_requests_for_rate=4))
    for failed in (True, False, True, False):
        ok.record(failed)
    assert ok.exceeded() is None  # exactly at the rate is within budget


def test_long_windows_are_checked_less_often_and_on_a_subsample() -> None:
    policy = SaturationPolicy(window_s=60.0, confirm_s=3.0, confirm_fraction=1.0, min_requests=20)
    det = SaturationDetector(policy, start_ns=0)
    step = int(CHECK_INTERVAL_S * S)
    # a backlog growing 10 per second; 1000 req/s whose TTFT grows 100 ms per second of send time
    sends = [i * 1_000_000 for i in range(61_000)]
    points = [(s, s + int((0.01 + 0.1 * s / S) * S)) for s in sends]
    evaluations = 0
    reason = None
    for k in range(1, 700):
        now = k * step
        before = det.last
        reason = det.check(now, 10.0 * now / S, lambda since, now=now: [p for p in points if since <= p[1] <= now])
        evaluations += det.last is not before
        if reason is not None:
            break
    assert reason is not None and reason.endswith("over 60 s")
    # a 60 s window is looked at every 0.6 s, not every 0.1 s: at 60.0, 60.6, ... 63.0 s
    assert evaluations == 6, evaluations
    assert det.last is not None and det.last.n_ttft > 50_000  # counted in full, fitted on a subsample
