"""Stop conditions of a load point, decided from the client's own view (pure: no I/O, no clock).

Two reasons to end a measurement early, both fed by the load generator about every
:data:`CHECK_INTERVAL_S` and testable with synthetic inputs and an injected clock:

- **Error budget** (:class:`ErrorBudget`): more than ``max_errors`` failed requests, or, once
  ``min_requests_for_rate`` requests finished, a share of failed ones above ``max_error_rate``.
  Requests the load generator cancelled itself are not failures and are not counted.
- **Over-saturation** (:class:`SaturationDetector`): under an open-loop rate, the server no longer
  keeps up, so the queue grows without bound and every later request waits longer. It needs no
  server metrics (it works for any backend, a server servetune did not start included) and fires
  only when *both* signals agree over the last ``window_s`` seconds, at ``confirm_fraction`` of
  the checks of the last ``confirm_s`` seconds (one more window by default, so the earliest stop
  comes two windows into the measurement):

  1. *Outstanding requests keep rising*: requests whose arrival time has passed and that have not
     finished (sent minus finished, plus the arrivals a concurrency cap holds back in the client).
     Sampled at each check; the window is cut into :attr:`SaturationPolicy.segments` equal time
     segments whose medians must not decrease, the last median must exceed the first by at least
     ``max(min_outstanding_rise, noise_sigmas * sqrt(level))``, and the least-squares slope must be
     significant (t >= ``min_t``). In a stable open-loop system the number in flight is roughly
     Poisson, so its noise grows like the square root of its level; ``level`` is the smaller of
     the first segment's median and the median of the measurement's first window, so that a
     backlog that has already built up does not raise the floor and hide itself.
  2. *TTFT trends up*: over the requests whose first token arrived in the window, the
     least-squares slope of TTFT against send time is significant (t >= ``min_t``), the rise it
     implies over ``window_s`` of send time is at least ``max(min_ttft_rise_ms, ttft_rise_ratio *
     reference TTFT)``, and the medians of the thirds (by send time) increase. The reference is the
     smaller of the first third's median and the median TTFT of the measurement's first window
     (again so that a backlog already built up does not hide itself). At least ``min_requests``
     TTFTs are needed; when the window has fewer (a server that serves few requests per window),
     the latest ``min_requests`` first tokens of the last ``ttft_lookback_windows`` windows are
     used. Selecting by first-token time rather than send time matters under heavy overload: once
     TTFT exceeds the window, no request *sent* in the window has a first token yet, while first
     tokens keep arriving at the rate the server serves.

  Least-squares t-statistics assume independent noise, which queue lengths sampled every 100 ms
  are not: the medians, the magnitude floors and the confirmation period are what keep noise
  from triggering it, the t-test only rejects flat or falling windows. A closed loop (no
  ``request_rate``) cannot over-saturate, since its concurrency bounds the queue; the detector is
  not used there.

  What the defaults do (``tests/test_saturation.py``'s simulation: Poisson arrivals into 8 slots,
  0.4 s lognormal service, 60 s, 5 s window, 40 seeds each): utilisation 0.8 and 0.9 never
  stopped, 0.95 stopped 2 times in 40 (a stable queue that close to capacity has long real
  excursions), 1.2 stopped 36 times (median 24 s in), 1.3 and above always (median 14 s in). A
  window is a trade-off: overload of a fraction ``x`` adds ``x * rate * window`` requests per
  window against noise of about ``sqrt(rate * window)``, so a longer window catches milder
  overload, later.

Reasons are short sentences that never contain the word "deadline" (the daemon treats a reason
with that word as a trial timeout, a failure; an early stop is a result).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from servetune.spec import StopConditions

#: How often the load generator evaluates the stop conditions (seconds).
CHECK_INTERVAL_S = 0.1
#: A window is looked at no more than this many times (a long window is checked less often), and
#: a regression uses at most :data:`MAX_TTFT_POINTS` TTFTs (an even subsample by send time), so the
#: cost of a check stays bounded whatever the window (collecting the TTFTs is one pass over the
#: requests of the last few windows, and only when the outstanding-request test passed).
CHECKS_PER_WINDOW = 100
MAX_TTFT_POINTS = 2000

#: ``since_ns -> (send_ns, first_token_ns)`` of the requests whose first token arrived at or after
#: ``since_ns`` (more may be returned; they are filtered). Called only when the cheaper
#: outstanding-request test already passed.
TTFTSource = Callable[[int], Iterable[tuple[int, int]]]


# --------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class LinearFit:
    """Least-squares line ``y = intercept + slope * x`` with the slope's standard error."""

    slope: float
    intercept: float
    stderr: float
    n: int

    @property
    def t(self) -> float:
        """The slope's t-statistic (inf for a perfect non-flat fit, 0 for a flat one)."""
        if self.stderr > 0:
            return self.slope / self.stderr
        return math.copysign(math.inf, self.slope) if self.slope else 0.0


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> LinearFit | None:
    """Ordinary least squares of ``ys`` on ``xs``; None with fewer than 3 points or constant ``xs``."""
    n = len(xs)
    if n != len(ys):
        raise ValueError(f"xs and ys differ in length ({n} != {len(ys)})")
    if n < 3:
        return None
    mx = math.fsum(xs) / n
    my = math.fsum(ys) / n
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return None
    sxy = math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys))
    slope = sxy / sxx
    intercept = my - slope * mx
    ssr = math.fsum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys))
    stderr = math.sqrt(max(ssr, 0.0) / (n - 2) / sxx)
    return LinearFit(slope=slope, intercept=intercept, stderr=stderr, n=n)


def _segment_medians(points: Sequence[tuple[float, float]], start: float, end: float, k: int) -> list[float] | None:
    """Medians of ``y`` over ``k`` equal segments of ``[start, end]`` by ``x``; None if one is empty."""
    buckets: list[list[float]] = [[] for _ in range(k)]
    width = (end - start) / k
    for x, y in points:
        i = min(k - 1, max(0, int((x - start) / width))) if width > 0 else 0
        buckets[i].append(y)
    if any(not b for b in buckets):
        return None
    return [statistics.median(b) for b in buckets]


def _thirds_medians(ys: Sequence[float]) -> list[float]:
    """Medians of the first, middle and last third of ``ys`` (in the given order)."""
    n = len(ys)
    cuts = [0, n // 3, (2 * n) // 3, n]
    return [statistics.median(ys[cuts[i] : cuts[i + 1]]) for i in range(3)]


# --------------------------------------------------------------------------- over-saturation


@dataclass(frozen=True)
class SaturationPolicy:
    """Thresholds of :class:`SaturationDetector` (see the module docstring for what each guards)."""

    window_s: float = 5.0
    confirm_s: float = 5.0
    confirm_fraction: float = 0.9
    min_requests: int = 20
    ttft_lookback_windows: int = 4
    min_outstanding_samples: int = 10
    segments: int = 4
    min_outstanding_rise: float = 4.0
    noise_sigmas: float = 4.0
    min_ttft_rise_ms: float = 5.0
    ttft_rise_ratio: float = 0.5
    min_t: float = 3.0

    def __post_init__(self) -> None:
        if self.window_s <= 0 or self.confirm_s < 0 or not 0 < self.confirm_fraction <= 1:
            raise ValueError("window_s must be positive, confirm_s not negative, confirm_fraction in (0, 1]")
        if self.min_requests < 3 or self.segments < 2 or self.min_outstanding_samples < self.segments:
            raise ValueError("min_requests >= 3, segments >= 2 and min_outstanding_samples >= segments")
        if self.ttft_lookback_windows < 1:
            raise ValueError("ttft_lookback_windows >= 1")

    @classmethod
    def from_stop(cls, stop: StopConditions) -> SaturationPolicy:
        """The load point's window, confirmed over one more window."""
        return cls(window_s=stop.saturation_window_s, confirm_s=stop.saturation_window_s)


@dataclass(frozen=True)
class Evaluation:
    """One look at the last window. ``saturated`` when both signals agree; ``why_not`` otherwise."""

    saturated: bool
    why_not: str = ""
    outstanding_from: float = math.nan
    outstanding_to: float = math.nan
    ttft_slope_ms_per_s: float = math.nan
    ttft_from_ms: float = math.nan
    ttft_to_ms: float = math.nan
    n_ttft: int = 0


def evaluate(
    policy: SaturationPolicy,
    now_ns: int,
    outstanding: Sequence[tuple[int, float]],
    ttfts: TTFTSource,
    baseline: float | None = None,
    baseline_ttft_ms: float | None = None,
) -> Evaluation:
    """Whether the window ending at ``now_ns`` shows over-saturation.

    Args:
        outstanding: ``(t_ns, outstanding requests)`` samples; those before the window are ignored.
        ttfts: see :data:`TTFTSource`; called at most once, only if the queue test passes.
        baseline: the typical number outstanding early in the measurement (the median of its first
            window); the noise floor is scaled by the smaller of it and the window's first segment.
        baseline_ttft_ms: the median TTFT of the measurement's first window; the TTFT rise needed
            is relative to the smaller of it and the median of the window's first third.
    """
    window_ns = int(policy.window_s * 1e9)
    start_ns = now_ns - window_ns
    pts = [((t - start_ns) / 1e9, q) for t, q in outstanding if start_ns <= t <= now_ns]
    if len(pts) < policy.min_outstanding_samples:
        return Evaluation(False, f"{len(pts)} outstanding-request samples in the window")
    medians = _segment_medians(pts, 0.0, policy.window_s, policy.segments)
    if medians is None:
        return Evaluation(False, "the window is not covered by outstanding-request samples")
    first, last = medians[0], medians[-1]
    if any(b < a for a, b in zip(medians, medians[1:])):
        return Evaluation(False, "outstanding requests did not keep rising", first, last)
    level = first if baseline is None else min(first, baseline)
    floor = max(policy.min_outstanding_rise, policy.noise_sigmas * math.sqrt(max(level, 1.0)))
    if last - first < floor:
        return Evaluation(False, f"outstanding requests rose by {last - first:g} < {floor:.1f}", first, last)
    fit = linear_fit([x for x, _ in pts], [y for _, y in pts])
    if fit is None or fit.t < policy.min_t:
        return Evaluation(False, "outstanding-request slope not significant", first, last)

    look_ns = now_ns - window_ns * policy.ttft_lookback_windows
    seen = sorted((f, s) for s, f in ttfts(look_ns) if look_ns <= f <= now_ns)  # by first-token time
    recent = [p for p in seen if p[0] >= start_ns]
    if len(recent) < policy.min_requests:  # a slow server: its latest first tokens, further back
        recent = seen[-policy.min_requests :]
    points = sorted(((s - start_ns) / 1e9, (f - s) / 1e6) for f, s in recent)
    n = len(points)
    if n < policy.min_requests:
        return Evaluation(False, f"{n} TTFTs in the window (< {policy.min_requests})", first, last, n_ttft=n)
    if n > MAX_TTFT_POINTS:
        points = points[:: math.ceil(n / MAX_TTFT_POINTS)]
    ys = [y for _, y in points]
    thirds = _thirds_medians(ys)
    tfit = linear_fit([x for x, _ in points], ys)
    slope = tfit.slope if tfit is not None else math.nan
    base = Evaluation(False, "", first, last, slope, thirds[0], thirds[-1], n)
    if tfit is None or tfit.t < policy.min_t:
        return replace(base, why_not="TTFT slope not significant")
    rise = tfit.slope * policy.window_s
    ref = thirds[0] if baseline_ttft_ms is None or math.isnan(baseline_ttft_ms) else min(thirds[0], baseline_ttft_ms)
    need = max(policy.min_ttft_rise_ms, policy.ttft_rise_ratio * ref)
    if rise < need:
        return replace(base, why_not=f"TTFT rose {rise:.1f} ms < {need:.1f} ms over the window")
    if not thirds[0] < thirds[1] < thirds[2]:
        return replace(base, why_not="TTFT medians of the window's thirds do not increase")
    return replace(base, saturated=True)


class SaturationDetector:
    """Feeds :func:`evaluate` from periodic checks; stops once the window has looked saturated at
    ``confirm_fraction`` of the checks of the last ``confirm_s`` seconds, the current one included.

    Not thread-safe: one caller (the load generator's event loop). Times are monotonic ns.
    """

    def __init__(self, policy: SaturationPolicy, start_ns: int) -> None:
        self.policy = policy
        self.start_ns = start_ns
        # samples older than the window are dropped as new ones come in
        self._outstanding: deque[tuple[int, float]] = deque()
        self._verdicts: deque[tuple[int, bool]] = deque()
        self._baseline: float | None = None
        self._baseline_ttft_ms: float | None = None
        self._step_ns = int(max(CHECK_INTERVAL_S, policy.window_s / CHECKS_PER_WINDOW) * 1e9)
        self._last_check_ns: int | None = None
        self.last: Evaluation | None = None

    def check(self, now_ns: int, outstanding: float, ttfts: TTFTSource) -> str | None:
        """Record the current number of outstanding requests; the stop reason once confirmed.
        Calls closer together than ``max(CHECK_INTERVAL_S, window_s / CHECKS_PER_WINDOW)`` are ignored."""
        if self._last_check_ns is not None and now_ns - self._last_check_ns < self._step_ns * 0.9:
            return None
        self._last_check_ns = now_ns
        policy = self.policy
        window_ns = int(policy.window_s * 1e9)
        self._outstanding.append((now_ns, float(outstanding)))
        while self._outstanding and self._outstanding[0][0] < now_ns - window_ns:
            self._outstanding.popleft()
        if now_ns - self.start_ns < window_ns:
            return None
        if self._baseline is None:  # the first full window: the measurement's typical levels
            self._baseline = statistics.median(q for _, q in self._outstanding)
            first = [(f - s) / 1e6 for s, f in ttfts(self.start_ns) if f <= now_ns]
            self._baseline_ttft_ms = statistics.median(first) if first else math.nan
        ev = evaluate(policy, now_ns, self._outstanding, ttfts, self._baseline, self._baseline_ttft_ms)
        self.last = ev
        confirm_ns = int(policy.confirm_s * 1e9)
        self._verdicts.append((now_ns, ev.saturated))
        while self._verdicts and self._verdicts[0][0] < now_ns - confirm_ns:
            self._verdicts.popleft()
        if not ev.saturated or now_ns - self.start_ns < window_ns + confirm_ns:
            return None
        positive = sum(1 for _, v in self._verdicts if v)
        if positive < policy.confirm_fraction * len(self._verdicts):
            return None
        return saturation_reason(ev, policy.window_s)


def saturation_reason(ev: Evaluation, window_s: float) -> str:
    return (
        f"over-saturation: in-flight grew from {ev.outstanding_from:.0f} to {ev.outstanding_to:.0f} and TTFT rose "
        f"{ev.ttft_slope_ms_per_s:.0f} ms/s (median {ev.ttft_from_ms:.0f} -> {ev.ttft_to_ms:.0f} ms) over {window_s:g} s"
    )


# --------------------------------------------------------------------------- error budget


class ErrorBudget:
    """Counts finished measured requests and says when the load point's error budget is spent."""

    def __init__(self, stop: StopConditions) -> None:
        self.max_errors = stop.max_errors
        self.max_error_rate = stop.max_error_rate
        self.min_requests_for_rate = stop.min_requests_for_rate
        self.finished = 0
        self.errors = 0

    @property
    def active(self) -> bool:
        return self.max_errors is not None or self.max_error_rate is not None

    def record(self, failed: bool) -> None:
        self.finished += 1
        if failed:
            self.errors += 1

    def exceeded(self) -> str | None:
        """The stop reason when the budget is spent, else None."""
        if self.max_errors is not None and self.errors > self.max_errors:
            return f"error budget: {self.errors} errors > max_errors {self.max_errors}"
        if (
            self.max_error_rate is not None
            and self.finished >= self.min_requests_for_rate
            and self.errors > self.max_error_rate * self.finished
        ):
            return (
                f"error budget: {self.errors} of {self.finished} requests failed "
                f"({100 * self.errors / self.finished:.3g}% > max_error_rate {100 * self.max_error_rate:g}%)"
            )
        return None
