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
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from servetune.result import RequestSample
from servetune.spec import SLO

DEFAULT_QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.95, 0.99)
LATENCY_METRICS: tuple[str, ...] = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile ``q`` in [0, 1] of ``values``; NaN when empty."""
    if not values:
        return math.nan
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {q}")
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


class SLOResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    metric: str
    percentile: float
    max_ms: float
    value_ms: float | None
    met: bool


class TrialMetrics(BaseModel):
    """Aggregates of one trial; every latency list is aligned with ``quantiles`` (NaN: no data)."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    quantiles: list[float]
    n_requests: int
    n_completed: int
    n_errors: int
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
    offered_rate: float | None
    achieved_rate: float | None
    sched_lag_p99_ms: float | None
    client_fell_behind: bool


def per_request_latencies(s: RequestSample) -> dict[str, float | None]:
    """TTFT, TPOT and E2EL (ms) of one successful request; None where undefined."""
    ttft = (s.first_token_ns - s.send_ns) / 1e6 if s.first_token_ns is not None else None
    e2el = (s.end_ns - s.send_ns) / 1e6
    tpot = None
    if s.first_token_ns is not None and s.output_tokens is not None and s.output_tokens > 1:
        tpot = (s.end_ns - s.first_token_ns) / 1e6 / (s.output_tokens - 1)
    return {"ttft_ms": ttft, "tpot_ms": tpot, "e2el_ms": e2el}


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
) -> TrialMetrics:
    """Aggregate raw samples of one trial into :class:`TrialMetrics`.

    The client self-check flags ``client_fell_behind`` when its p99 scheduling lag (send minus the
    time the arrival process, or a freed concurrency slot, allowed the send) exceeds
    ``lag_tolerance_ms``, or when the achieved arrival rate is under 95% of the offered one. With
    ``concurrency_capped`` (a rate plus a concurrency cap) a low achieved rate means the server
    is saturated, not that the client fell behind, so only the lag counts.
    """
    if window_s <= 0:
        raise ValueError(f"window_s must be positive, got {window_s}")
    measured = [s for s in samples if not s.warmup]
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
    slo_results = [
        SLOResult(
            metric=slo.metric,
            percentile=slo.percentile,
            max_ms=slo.max_ms,
            value_ms=_finite(quantile(series[slo.metric], slo.percentile / 100.0)),
            met=bool(series[slo.metric]) and quantile(series[slo.metric], slo.percentile / 100.0) <= slo.max_ms,
        )
        for slo in slos
    ]
    sends = sorted(s.send_ns for s in measured)
    achieved = (len(sends) - 1) / ((sends[-1] - sends[0]) / 1e9) if len(sends) > 1 and sends[-1] > sends[0] else None
    lags = [(s.send_ns - s.scheduled_ns) / 1e6 for s in measured]
    lag_p99 = _finite(quantile(lags, 0.99)) if lags else None
    fell_behind = bool(
        (lag_p99 is not None and lag_p99 > lag_tolerance_ms)
        or (
            not concurrency_capped
            and offered_rate is not None
            and achieved is not None
            and achieved < 0.95 * offered_rate
            and len(sends) >= 20
        )
    )
    return TrialMetrics(
        quantiles=list(quantiles),
        n_requests=len(measured),
        n_completed=len(ok),
        n_errors=len(measured) - len(ok),
        duration_s=window_s,
        total_input_tokens=in_tokens,
        total_output_tokens=out_tokens,
        request_throughput=len(ok) / window_s,
        output_throughput=out_tokens / window_s,
        total_token_throughput=(in_tokens + out_tokens) / window_s,
        request_goodput=(good / window_s) if good is not None else None,
        slo_attainment=(good / len(measured) if measured else None) if good is not None else None,
        slos=slo_results,
        slos_met=all(r.met for r in slo_results) if slo_results else None,
        ttft_ms=[quantile(series["ttft_ms"], q) for q in quantiles],
        tpot_ms=[quantile(series["tpot_ms"], q) for q in quantiles],
        itl_ms=[quantile(series["itl_ms"], q) for q in quantiles],
        e2el_ms=[quantile(series["e2el_ms"], q) for q in quantiles],
        mean_ttft_ms=_mean(series["ttft_ms"]),
        mean_tpot_ms=_mean(series["tpot_ms"]),
        mean_itl_ms=_mean(series["itl_ms"]),
        mean_e2el_ms=_mean(series["e2el_ms"]),
        offered_rate=offered_rate,
        achieved_rate=achieved,
        sched_lag_p99_ms=lag_p99,
        client_fell_behind=fell_behind,
    )


def _finite(x: float) -> float | None:
    return None if math.isnan(x) else x
