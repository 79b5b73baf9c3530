"""Metric math over raw per-request samples (standard library only).

Names follow ``vllm bench serve``: request/output/total-token throughput, goodput, TTFT, TPOT,
ITL and end-to-end latency (ms) at quantiles. Percentiles use linear interpolation between order
statistics (numpy's default), computed from raw samples, never averaged across trials.

Definitions, per successful measured request (warm-up excluded):

- TTFT = first streamed chunk - send; E2EL = end - send;
- TPOT = (end - first chunk) / (output tokens - 1), for requests with more than one output token;
- ITL = gaps between successive streamed chunks;
- goodput = requests meeting every per-request SLO threshold / window;
- SLO attainment = those requests / all measured requests (an error never meets an SLO).

Cancelled requests (``error`` starting with ``"cancelled"``: the load generator ended them itself,
at the end of a ``duration_s`` window or when a stop condition stopped the load point early) are
neither requests nor errors here: the server did not fail them, the measurement ran out. They are
counted apart as ``n_cancelled`` and left out of ``n_requests``, ``n_errors``, throughput, latency
and SLO attainment, but they were sent, so the client self-check (achieved rate, scheduling lag)
still counts them. A cancelled request that never went out (its ``send_ns`` is after its
``end_ns``) is left out of the self-check too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from servetune.result import LoopLag, RequestSample
from servetune.sla import quantile_ci_ranks
from servetune.spec import SLO

DEFAULT_QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.95, 0.99)
#: Errors starting with this were cancellations by the load generator, not server failures.
CANCELLED_PREFIX = "cancelled"
LATENCY_METRICS: tuple[str, ...] = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile ``q`` in [0, 1] of ``values``; NaN when empty."""
    return quantiles_of(values, (q,))[0]


def quantiles_of(values: Sequence[float], qs: Sequence[float]) -> list[float]:
    """:func:`quantile` at each of ``qs``, sorting ``values`` once."""
    for q in qs:
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be in [0, 1], got {q}")
    if not values:
        return [math.nan] * len(qs)
    xs = sorted(values)
    last = len(xs) - 1
    out = []
    for q in qs:
        pos = q * last
        lo = math.floor(pos)
        hi = min(lo + 1, last)
        out.append(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))
    return out


class SLOResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    metric: str
    percentile: float
    max_ms: float
    value_ms: float | None
    met: bool
    rank_low_ms: float | None = Field(None, description="this trial's sampling error on the percentile, low end: "
                                      "the latency at the binomial rank that would bound it from below 97.5% of the "
                                      "time if requests were independent draws. Sampling error only, NOT an interval "
                                      "on what another run would measure: run-to-run speed, the realised arrival "
                                      "rate and queueing correlation are not in it (on the simulator, trial-to-trial "
                                      "spread was 10-30x its half-width). None: too few requests, or recorded "
                                      "before it existed")
    rank_high_ms: float | None = Field(None, description="its high end (None: too few requests, e.g. p99 under 368)")


class TrialMetrics(BaseModel):
    """Aggregates of one trial; every latency list is aligned with ``quantiles`` (NaN: no data)."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    quantiles: list[float]
    n_requests: int
    n_completed: int
    n_errors: int
    n_cancelled: int = Field(0, description="cancelled by the load generator (end of window, early stop); not in n_requests")
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    request_goodput: float | None
    slo_attainment: float | None
    slos: list[SLOResult] = Field(default_factory=list)
    slos_met: bool | None
    ttft_ms: list[float]
    tpot_ms: list[float]
    itl_ms: list[float]
    e2el_ms: list[float]
    mean_ttft_ms: float
    mean_tpot_ms: float
    mean_itl_ms: float
    mean_e2el_ms: float
    offered_rate: float | None = Field(description="the load point's nominal request_rate (None: closed loop)")
    scheduled_rate: float | None = Field(
        None, description="the rate the seeded arrival schedule actually asked for over the requests sent: "
        "(n - 1) / (last - first scheduled arrival); a Poisson schedule of 20 requests at a nominal 60/s asks for "
        "40 to 98/s in 95% of seeds. None in a closed loop, with a concurrency cap, or under 2 sends")
    achieved_rate: float | None
    sched_lag_p99_ms: float | None
    loop_lag_p50_ms: float | None = Field(None, description="the client's event-loop lag (daemon.looplag); None: not measured")
    loop_lag_p99_ms: float | None = None
    loop_lag_max_ms: float | None = None
    client_fell_behind: bool


def per_request_latencies(s: RequestSample) -> dict[str, float | None]:
    """TTFT, TPOT and E2EL (ms) of one successful request; None where undefined."""
    ttft = (s.first_token_ns - s.send_ns) / 1e6 if s.first_token_ns is not None else None
    e2el = (s.end_ns - s.send_ns) / 1e6
    tpot = None
    if s.first_token_ns is not None and s.output_tokens is not None and s.output_tokens > 1:
        tpot = (s.end_ns - s.first_token_ns) / 1e6 / (s.output_tokens - 1)
    return {"ttft_ms": ttft, "tpot_ms": tpot, "e2el_ms": e2el}


def is_cancelled(s: RequestSample) -> bool:
    """The load generator cancelled this request itself (see the module docstring)."""
    return s.error is not None and s.error.startswith(CANCELLED_PREFIX)


def meets_slos(lat: dict[str, float | None], slos: Sequence[SLO]) -> bool:
    for slo in slos:
        value = lat.get(slo.metric)
        if value is not None and value > slo.max_ms:
            return False
    return True


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def summarize(
    samples: Sequence[RequestSample],
    window_s: float,
    slos: Sequence[SLO] = (),
    quantiles: Sequence[float] = DEFAULT_QUANTILES,
    offered_rate: float | None = None,
    lag_tolerance_ms: float = 10.0,
    concurrency_capped: bool = False,
    closed_loop_lag_fraction: float = 0.01,
    loop_lag: LoopLag | None = None,
) -> TrialMetrics:
    """Aggregate raw samples of one trial into :class:`TrialMetrics`.

    The client self-check flags ``client_fell_behind`` when its p99 scheduling lag (send minus the
    time the arrival process, or a freed concurrency slot, allowed the send) exceeds its tolerance,
    or when the achieved send rate is under 95% of ``scheduled_rate``, the rate the seeded schedule
    itself asked for over the same requests (its sends' scheduled times). It is never judged
    against the nominal ``offered_rate``: a Poisson schedule is not normalised, and a perfect
    client sending 20 requests at a nominal rate falls under 95% of it in about 39% of seeds.
    With ``concurrency_capped`` (a rate plus a concurrency cap) a send also waits for a free slot,
    so the scheduled times are not the schedule's arrivals, a low achieved rate means the server is
    saturated, and only the lag counts (``scheduled_rate`` is None).

    The tolerance is ``lag_tolerance_ms`` for an arrival process (``offered_rate`` set: the lag
    moves arrivals). In a closed loop (no ``offered_rate``) a slot that waits L ms before its next
    send lowers the load by L / (L + request latency), so the tolerance there is the larger of
    ``lag_tolerance_ms`` and ``closed_loop_lag_fraction`` (1%) of the median end-to-end latency:
    32 streams whose tokens land in one engine step delay the next send by a few milliseconds,
    which is no distortion for requests that take seconds.

    ``loop_lag`` (the client's event-loop lag over the window, :mod:`daemon.looplag`) sees the
    receive side too: a p99 over ``lag_tolerance_ms`` means at least 1% of the time the client
    stamped sends and chunk arrivals that much late, so it flags ``client_fell_behind`` as well,
    closed loop or not (a TTFT error is absolute, however long the requests take).
    """
    return TrialMetrics.model_validate(summary_dict(
        samples, window_s, slos, quantiles, offered_rate=offered_rate, lag_tolerance_ms=lag_tolerance_ms,
        concurrency_capped=concurrency_capped, closed_loop_lag_fraction=closed_loop_lag_fraction, loop_lag=loop_lag))


def summary_dict(
    samples: Sequence[RequestSample],
    window_s: float,
    slos: Sequence[SLO] = (),
    quantiles: Sequence[float] = DEFAULT_QUANTILES,
    offered_rate: float | None = None,
    lag_tolerance_ms: float = 10.0,
    concurrency_capped: bool = False,
    closed_loop_lag_fraction: float = 0.01,
    loop_lag: LoopLag | None = None,
) -> dict[str, Any]:
    """:func:`summarize`'s :class:`TrialMetrics` as ``model_dump(mode="json")`` gives it (same keys,
    order, types and values), built directly: no model is validated then dumped (the coordinator
    summarizes every result on its loop)."""
    if window_s <= 0:
        raise ValueError(f"window_s must be positive, got {window_s}")
    sent = [s for s in samples if not s.warmup]
    measured = [s for s in sent if not is_cancelled(s)]
    n_cancelled = len(sent) - len(measured)
    sent = [s for s in sent if not (is_cancelled(s) and s.send_ns > s.end_ns)]  # never went out
    ok = [s for s in measured if s.error is None]
    lats = [per_request_latencies(s) for s in ok]
    series: dict[str, list[float]] = {m: [] for m in LATENCY_METRICS}
    for s, lat in zip(ok, lats):
        for m in ("ttft_ms", "tpot_ms", "e2el_ms"):
            v = lat[m]
            if v is not None:
                series[m].append(v)
        series["itl_ms"] += [(b - a) / 1e6 for a, b in zip(s.token_ns, s.token_ns[1:])]
    out_tokens = sum(s.output_tokens or 0 for s in ok)
    in_tokens = sum(s.prompt_tokens or 0 for s in ok)
    good = sum(1 for lat in lats if meets_slos(lat, slos)) if slos else None
    slo_results = [_slo_result(slo, series[slo.metric]) for slo in slos]
    sends = sorted(s.send_ns for s in sent)
    achieved = _rate(sends)
    scheduled = _rate(sorted(s.scheduled_ns for s in sent)) if offered_rate is not None and not concurrency_capped else None
    lags = [(s.send_ns - s.scheduled_ns) / 1e6 for s in sent]
    lag_p99 = _finite(quantile(lags, 0.99)) if lags else None
    tolerance = lag_tolerance_ms
    if offered_rate is None and series["e2el_ms"]:
        tolerance = max(lag_tolerance_ms, closed_loop_lag_fraction * quantile(series["e2el_ms"], 0.5))
    fell_behind = bool(
        (lag_p99 is not None and lag_p99 > tolerance)
        or (scheduled is not None and achieved is not None and achieved < 0.95 * scheduled and len(sends) >= 20)
        or (loop_lag is not None and loop_lag.p99_ms > lag_tolerance_ms)
    )
    # TrialMetrics' fields in their order, each of its type (a float field never holds an int; the
    # series are floats already: every value is a difference of ns over 1e6)
    return {
        "quantiles": [float(q) for q in quantiles],
        "n_requests": len(measured),
        "n_completed": len(ok),
        "n_errors": len(measured) - len(ok),
        "n_cancelled": n_cancelled,
        "duration_s": float(window_s),
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / window_s,
        "output_throughput": out_tokens / window_s,
        "total_token_throughput": (in_tokens + out_tokens) / window_s,
        "request_goodput": (good / window_s) if good is not None else None,
        "slo_attainment": (good / len(measured) if measured else None) if good is not None else None,
        "slos": slo_results,
        "slos_met": all(r["met"] for r in slo_results) if slo_results else None,
        "ttft_ms": quantiles_of(series["ttft_ms"], quantiles),
        "tpot_ms": quantiles_of(series["tpot_ms"], quantiles),
        "itl_ms": quantiles_of(series["itl_ms"], quantiles),
        "e2el_ms": quantiles_of(series["e2el_ms"], quantiles),
        "mean_ttft_ms": float(_mean(series["ttft_ms"])),
        "mean_tpot_ms": float(_mean(series["tpot_ms"])),
        "mean_itl_ms": float(_mean(series["itl_ms"])),
        "mean_e2el_ms": float(_mean(series["e2el_ms"])),
        "offered_rate": _float_or_none(offered_rate),
        "scheduled_rate": scheduled,
        "achieved_rate": achieved,
        "sched_lag_p99_ms": _float_or_none(lag_p99),
        "loop_lag_p50_ms": float(loop_lag.p50_ms) if loop_lag is not None else None,
        "loop_lag_p99_ms": float(loop_lag.p99_ms) if loop_lag is not None else None,
        "loop_lag_max_ms": float(loop_lag.max_ms) if loop_lag is not None else None,
        "client_fell_behind": fell_behind,
    }


def _slo_result(slo: SLO, values: Sequence[float]) -> dict[str, Any]:
    """One SLO's :class:`SLOResult` fields, as ``model_dump(mode="json")``."""
    xs = sorted(values)
    q = slo.percentile / 100.0
    value = quantiles_of(xs, (q,))[0] if xs else math.nan
    lo, hi = quantile_ci_ranks(len(xs), q)
    return {
        "metric": slo.metric,
        "percentile": float(slo.percentile),
        "max_ms": float(slo.max_ms),
        "value_ms": _float_or_none(_finite(value)),
        "met": bool(xs) and value <= slo.max_ms,
        "rank_low_ms": _finite(xs[lo - 1]) if lo is not None else None,
        "rank_high_ms": _finite(xs[hi - 1]) if hi is not None else None,
    }


def _float_or_none(x: float | None) -> float | None:
    return None if x is None else float(x)


def _rate(times_ns: Sequence[int]) -> float | None:
    """Events per second over sorted monotonic times: (n - 1) / (last - first); None under 2 or a zero span."""
    if len(times_ns) < 2 or times_ns[-1] <= times_ns[0]:
        return None
    return (len(times_ns) - 1) / ((times_ns[-1] - times_ns[0]) / 1e9)


def _finite(x: float) -> float | None:
    return None if math.isnan(x) else x


def server_summary(series: Sequence[Mapping[str, float]], counter_deltas: Mapping[str, float]) -> dict[str, float | None]:
    """A few numbers from a trial's server-side metrics (None where the server did not say).

    ``server_max_running`` / ``server_max_waiting``: the most requests vLLM ran / queued at any
    scrape; ``server_max_kv_cache_usage``: the highest KV-cache usage (a fraction, 0-1);
    ``server_preemptions_delta``: preemptions over the measurement and drain;
    ``server_prefix_cache_hit_rate``: prefix-cache hits / queries (tokens) over the same span.
    Deltas come from ``counter_deltas`` (the readings before and after), else from the first and
    last points of ``series``.
    """

    def peak(key: str) -> float | None:
        values = [p[key] for p in series if key in p and not math.isnan(p[key])]
        return max(values) if values else None

    def delta(key: str) -> float | None:
        if key in counter_deltas:
            return float(counter_deltas[key])
        points = [p[key] for p in series if key in p]
        return points[-1] - points[0] if len(points) > 1 else None

    hits, queries = delta("prefix_cache_hits_total"), delta("prefix_cache_queries_total")
    return {
        "server_max_running": peak("num_requests_running"),
        "server_max_waiting": peak("num_requests_waiting"),
        "server_max_kv_cache_usage": peak("kv_cache_usage_perc"),
        "server_preemptions_delta": delta("num_preemptions_total"),
        "server_prefix_cache_hit_rate": hits / queries if hits is not None and queries else None,
    }
