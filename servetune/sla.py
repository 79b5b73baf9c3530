"""SLA search: the highest request rate at which one engine config meets the spec's SLOs, found by
bracketing and bisection, with an interval on the boundary instead of a point.

Pure logic, no I/O: :func:`verdict` reads one probe (a trial at one rate) from its status and
metrics; :func:`next_rates` takes every probe's verdict so far (rate -> verdict) and returns the
rates of the next round, or none with the search's :class:`SlaOutcome`. The sweep
(``coordinator.sla_search.expand_sla_searches``) runs each round's rates as trials against one more
server start; the benchmark (``benchmarks/search/sla.py``) drives the same functions.

Verdicts. A probe **meets** the SLOs when, for every SLO, even the high end of its percentile's
sampling error (``SLOResult.rank_high_ms``: the latency at the binomial rank that would bound the
percentile 97.5% of the time if the trial's requests were independent draws) is within the bound;
it **misses** them when, for some SLO, the low end is above the bound, more requests failed than the
percentile allows, or the trial failed as a measurement (a server that falls over under load has no
rate to offer). Otherwise the probe is **unsure**: the bound lies inside this trial's sampling
error. A probe whose load generator fell behind (it did not offer the rate) is **invalid** and caps
the search. The sampling error is a floor on the uncertainty, not a confidence level: run-to-run
speed, the realised arrival rate and queueing correlation move a trial's percentile by far more
(10-30x its half-width on the simulator), so one run's verdicts, and its bracket, say nothing
about another run. :func:`combine_runs` puts an interval on the boundary from independent runs.

One run's bracket is ``[lo, hi]``: ``lo`` the highest rate that met the SLOs below every rate that
missed them (that run's trial-backed "max rate at SLO"), ``hi`` the lowest rate that missed them.
Unsure probes lie between. The search stops when ``hi / lo - 1 <= rel_tol`` (``resolved``), when
every gap left between probed rates inside the interval is that narrow but unsure probes keep it
wide (``noise``: more requests per probe would narrow it), when the round budget is spent
(``budget``), when no rate down to the search's floor is shown to meet the SLOs (``none_meets``), or
every rate up to its ceiling meets them (``all_meet``): the floor and ceiling are the first round's
range widened :data:`WIDEN` times each way (within :data:`MIN_RPS` and :data:`MAX_RPS`), so a search
never schedules a rate (and a trial length) far from what its spec asked for.

Assumptions, stated where they bite: latency percentiles rise with the offered rate (a probe that
meets the SLOs above one that misses them is reported as ``non_monotone``), and independent runs
scatter around a typical one (what :func:`combine_runs`' t-interval covers): ``benchmarks/search/sla.py``
measures how often it covers the simulator's truth.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

#: No search goes below this rate (requests/s): below it the SLOs are called unmeetable.
MIN_RPS = 0.001
#: Nor above this one.
MAX_RPS = 1_000_000.0
#: Bracketing goes at most this factor below ``min_rps`` and above ``max_rps``.
WIDEN = 16.0
#: Each side's error rate of the interval on a percentile (two-sided 95%).
CI_TAIL = 0.025

Verdict = Literal["meets", "misses", "unsure", "invalid"]
Reason = Literal["resolved", "noise", "budget", "none_meets", "all_meet", "client_limit"]


def _binom_cdf_window(n: int, q: float) -> tuple[int, list[float]]:
    """``(k0, cdf)`` with ``cdf[i] = P(K <= k0 + i)`` for K ~ Binomial(n, q), over the window of k
    holding all but ~1e-30 of the mass (log-space pmf; the mass below the window is taken as 0)."""
    sd = math.sqrt(n * q * (1 - q))
    k0 = max(0, math.floor(n * q - 12 * sd - 2))
    k1 = min(n, math.ceil(n * q + 12 * sd + 2))
    lq, l1q = math.log(q), math.log1p(-q)
    lg = math.lgamma(n + 1)
    cdf, acc = [], 0.0
    for k in range(k0, k1 + 1):
        acc += math.exp(lg - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * lq + (n - k) * l1q)
        cdf.append(min(acc, 1.0))
    return k0, cdf


@functools.lru_cache(maxsize=4096)
def quantile_ci_ranks(n: int, q: float, tail: float = CI_TAIL) -> tuple[int | None, int | None]:
    """1-based ranks ``(l, u)`` of the sorted values bounding the ``q`` quantile with at least
    ``1 - 2 * tail`` coverage (``P(X(l) <= Q) >= 1 - tail`` and ``P(X(u) >= Q) >= 1 - tail``, for
    independent draws of a continuous distribution). ``None`` for a side the ``n`` values cannot
    bound (e.g. the upper side of p99 under 368 values). Exact binomial ranks, O(sqrt(n)) time."""
    if n <= 0 or not 0.0 < q < 1.0:
        return None, None
    k0, cdf = _binom_cdf_window(n, q)

    def at(k: int) -> float:  # P(K <= k)
        return 0.0 if k < k0 else (1.0 if k - k0 >= len(cdf) else cdf[k - k0])

    # X(l) <= Q  <=>  K >= l (K: how many values lie below Q): need P(K <= l - 1) <= tail
    lo = None
    for rank in range(min(n, k0 + len(cdf)), 0, -1):
        if at(rank - 1) <= tail:
            lo = rank
            break
    # X(u) >= Q  <=>  K <= u - 1: need P(K <= u - 1) >= 1 - tail
    hi = None
    for rank in range(max(1, k0 + 1), n + 1):
        if at(rank - 1) >= 1 - tail:
            hi = rank
            break
    return lo, hi


def quantile_ci(values: Sequence[float], q: float, tail: float = CI_TAIL) -> tuple[float | None, float | None]:
    """The distribution-free interval on the ``q`` quantile of ``values`` (see :func:`quantile_ci_ranks`)."""
    xs = sorted(values)
    lo, hi = quantile_ci_ranks(len(xs), q, tail)
    return (xs[lo - 1] if lo is not None else None), (xs[hi - 1] if hi is not None else None)


def verdict(status: str, metrics: Mapping[str, Any] | None) -> Verdict:
    """Whether one probe (a trial's status and metrics) meets, misses or is unsure of the SLOs."""
    if status != "ok" or not metrics:
        return "misses"
    if metrics.get("client_fell_behind"):
        return "invalid"
    if str(metrics.get("stopped_early") or "").startswith(("over-saturation", "error budget")):
        return "misses"  # the queue kept growing, or requests kept failing: no steady state at this rate
    slos = metrics.get("slos") or []
    if not slos:
        return "unsure"  # no SLO was evaluated on this trial: nothing is shown either way
    n_req = int(metrics.get("n_requests") or 0)
    n_err = int(metrics.get("n_errors") or 0)
    if n_req == 0:
        return "misses"
    unsure = False
    for s in slos:
        allowed = (1.0 - float(s["percentile"]) / 100.0) * n_req
        if n_err > allowed:
            return "misses"
        if n_err:
            unsure = True  # failed requests sit above the bound: the percentile of all requests is higher
        low, high = s.get("rank_low_ms"), s.get("rank_high_ms")
        if low is not None and low > s["max_ms"]:
            return "misses"
        if high is None or high > s["max_ms"]:
            unsure = True
    return "unsure" if unsure else "meets"


@dataclass(frozen=True)
class SlaOutcome:
    """Where one config's search stands: the boundary interval and why it stopped (None: still running)."""

    lo: float | None  # highest rate meeting the SLOs below every miss (None: none met)
    hi: float | None  # lowest rate missing them (None: none missed)
    reason: Reason | None
    probes: tuple[tuple[float, Verdict], ...] = field(default=())
    non_monotone: bool = False
    floor: float = MIN_RPS
    ceiling: float = MAX_RPS

    @property
    def max_rate_rps(self) -> float | None:
        """The trial-backed max rate at SLO: the highest rate measured meeting them (conservative)."""
        return self.lo

    def describe(self) -> str:
        lo = f"{self.lo:g}" if self.lo is not None else "0"
        hi = f"{self.hi:g}" if self.hi is not None else "inf"
        why = {"resolved": "resolved", "noise": "narrowest the request count resolves",
               "budget": "round budget spent", "none_meets": f"no rate down to {self.floor:g} req/s shown to meet the SLOs",
               "all_meet": f"every rate up to {self.ceiling:g} req/s meets the SLOs",
               "client_limit": "the load generator could not offer a higher rate", None: "searching"}[self.reason]
        text = f"max rate at SLO {self.lo:g} req/s" if self.lo is not None else "no rate shown to meet the SLOs"
        text += f", boundary in [{lo}, {hi}] req/s ({why})"
        if self.non_monotone:
            text += "; a rate above a miss met the SLOs (latency not monotone in rate, or noise)"
        return text


def _round(rate: float) -> float:
    return float(f"{rate:.3g}")


def first_rates(min_rps: float, max_rps: float, per_round: int) -> list[float]:
    """Round 0: ``max(2, per_round)`` rates spaced evenly in log from ``min_rps`` to ``max_rps``."""
    k = max(2, per_round)
    if max_rps <= min_rps:
        return [_round(min_rps)]
    ratio = math.log(max_rps / min_rps)
    return sorted({_round(min_rps * math.exp(ratio * i / (k - 1))) for i in range(k)})


def boundary(probes: Sequence[tuple[float, Verdict]]) -> SlaOutcome:
    """The interval the probes so far put on the boundary (``reason`` None)."""
    ps = sorted(probes)
    misses = [r for r, v in ps if v == "misses"]
    hi = misses[0] if misses else None
    meets = [r for r, v in ps if v == "meets" and (hi is None or r < hi)]
    lo = meets[-1] if meets else None
    non_mono = hi is not None and any(v == "meets" and r > hi for r, v in ps)
    return SlaOutcome(lo=lo, hi=hi, reason=None, probes=tuple(ps), non_monotone=non_mono)


def search_range(min_rps: float, max_rps: float) -> tuple[float, float]:
    """The floor and ceiling of a search whose first round spans ``[min_rps, max_rps]``."""
    return max(MIN_RPS, min_rps / WIDEN), min(MAX_RPS, max_rps * WIDEN)


def next_rates(probes: Mapping[float, Verdict], *, per_round: int, rel_tol: float, rounds_done: int,
               max_rounds: int, floor: float = MIN_RPS, ceiling: float = MAX_RPS) -> tuple[list[float], SlaOutcome]:
    """The next round's rates (new, sorted, within ``[floor, ceiling]``) given every probe so far,
    with the boundary; an empty list means the search is over and the outcome says why."""
    state = boundary(list(probes.items()))
    state = SlaOutcome(state.lo, state.hi, None, state.probes, state.non_monotone, floor, ceiling)

    def done(reason: Reason) -> tuple[list[float], SlaOutcome]:
        return [], SlaOutcome(state.lo, state.hi, reason, state.probes, state.non_monotone, floor, ceiling)

    invalid = [r for r, v in probes.items() if v == "invalid"]
    cap = min(invalid) if invalid else None
    lo, hi = state.lo, state.hi
    if lo is not None and hi is not None and hi <= lo * (1 + rel_tol):
        return done("resolved")
    if rounds_done >= max_rounds:
        return done("budget")
    k = max(1, per_round)
    if hi is None:  # every valid probe met (or was unsure): bracket upward, doubling
        top = max((r for r, v in probes.items() if v != "invalid"), default=floor)
        if cap is not None:
            if lo is not None and cap <= lo * (1 + rel_tol):
                return done("client_limit")
            return _fresh(_between(lo or floor, cap, k), probes, done, "client_limit", state)
        if top >= ceiling:
            return done("all_meet")
        return _fresh([min(ceiling, top * 2 ** (i + 1)) for i in range(k)], probes, done, "all_meet", state)
    if lo is None:  # every probe missed or was unsure: bracket downward, halving
        bottom = min(r for r, v in probes.items() if v in ("misses", "unsure"))
        if bottom <= floor:
            return done("none_meets")
        return _fresh([max(floor, bottom / 2 ** (i + 1)) for i in range(k)], probes, done, "none_meets", state)
    # bisect inside (lo, hi): split the widest gap between probed rates (unsure ones lie in it)
    inside = sorted({lo, hi, *(r for r, v in probes.items() if lo < r < hi and v != "invalid")})
    gaps = [(math.log(b / a), a, b) for a, b in zip(inside, inside[1:]) if b > a * (1 + rel_tol)]
    if not gaps:
        return done("noise")
    _, a, b = max(gaps)
    return _fresh(_between(a, b, k), probes, done, "noise", state)


def _between(a: float, b: float, k: int) -> list[float]:
    """``k`` rates strictly between ``a`` and ``b``, evenly in log."""
    ratio = math.log(b / a)
    return [a * math.exp(ratio * (i + 1) / (k + 1)) for i in range(k)]


def _fresh(rates: Sequence[float], probes: Mapping[float, Verdict],
           done: Callable[[Reason], tuple[list[float], SlaOutcome]], reason: Reason,
           state: SlaOutcome) -> tuple[list[float], SlaOutcome]:
    new = sorted({_round(r) for r in rates} - set(probes))
    if not new:  # 3 significant digits cannot split it further
        return done(reason)
    return new, state


#: Student t quantiles t(0.975, df) for df = 1..30 (above: 2.0, a little above the normal's 1.96).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom (``df >= 1``)."""
    return _T975[df - 1] if df <= len(_T975) else 2.0


@dataclass(frozen=True)
class RunsSummary:
    """One engine config's SLA searches over independent runs (the spec's ``repeats``: each repeat its
    own server starts, its own search), combined.

    One run's bracket ``[lo, hi]`` holds only that run's boundary: a server start's own speed (clocks,
    placement, warm state) moves it from run to run, and no interval from one run can see that.
    Over two or more runs whose searches bracketed the boundary, ``low``/``high`` is a 95% t-interval
    on the typical run's boundary (the geometric mean of the brackets' midpoints, in log rate), its
    spread the runs' scatter plus each bracket's own width (uniform within it, added: conservative).
    ``met_in_every_run`` is the lowest ``lo``: a rate some trial of every run met."""

    runs: int
    bracketed: int
    estimate: float | None
    low: float | None
    high: float | None
    met_in_every_run: float | None

    def describe(self) -> str:
        if self.low is None or self.high is None or self.estimate is None:
            why = ("one run: its bracket holds that run's boundary only (run-to-run variation is not measured; "
                   "repeats >= 2 give an interval on the boundary)" if self.runs == 1 else
                   f"{self.bracketed} of {self.runs} runs bracketed the boundary: no interval over runs")
            return why
        return (f"typical run's boundary {self.estimate:.3g} req/s, 95% interval [{self.low:.3g}, {self.high:.3g}] "
                f"over {self.bracketed} runs")


def combine_runs(outcomes: Sequence[SlaOutcome]) -> RunsSummary:
    """:class:`RunsSummary` of the searches of one config over independent runs."""
    both = [(o.lo, o.hi) for o in outcomes if o.lo is not None and o.hi is not None]
    los = [o.lo for o in outcomes]
    every = min(x for x in los if x is not None) if los and all(x is not None for x in los) else None
    if len(both) < 2:
        return RunsSummary(len(outcomes), len(both), None, None, None, every)
    mids = [0.5 * (math.log(lo) + math.log(hi)) for lo, hi in both]
    widths = [math.log(hi) - math.log(lo) for lo, hi in both]
    r = len(mids)
    mean = sum(mids) / r
    var = sum((m - mean) ** 2 for m in mids) / (r - 1) + sum(w * w for w in widths) / (12 * r)
    half = t975(r - 1) * math.sqrt(var / r)
    return RunsSummary(len(outcomes), r, math.exp(mean), math.exp(mean - half), math.exp(mean + half), every)
