"""Metric math checked against hand-computed records."""

from __future__ import annotations

import math

import pytest

from servetune.metrics import quantile, server_summary, summarize
from servetune.result import LoopLag, RequestSample
from servetune.spec import SLO

MS = 1_000_000


def req(i: int, send_ms: float, first_ms: float | None, end_ms: float, out: int | None, tokens_ms: list[float],
        warmup: bool = False, error: str | None = None, lag_ms: float = 0.0) -> RequestSample:
    return RequestSample(
        index=i, warmup=warmup, scheduled_ns=int((send_ms - lag_ms) * MS), send_ns=int(send_ms * MS),
        first_token_ns=int(first_ms * MS) if first_ms is not None else None, end_ns=int(end_ms * MS),
        token_ns=[int(t * MS) for t in tokens_ms], prompt_tokens=10 if out else None, output_tokens=out, error=error,
    )


def test_quantile_matches_linear_interpolation() -> None:
    assert quantile([1, 2, 3, 4], 0.5) == 2.5
    assert quantile([10], 0.99) == 10
    assert quantile([0, 10], 0.9) == pytest.approx(9.0)
    assert math.isnan(quantile([], 0.5))


def test_summary_by_hand() -> None:
    samples = [
        # warm-up: excluded everywhere
        req(0, 0, 5, 50, 3, [5, 25, 50], warmup=True),
        # TTFT 100, TPOT (400-100)/3 = 100, ITLs 100,100,100, E2EL 400
        req(1, 1000, 1100, 1400, 4, [1100, 1200, 1300, 1400]),
        # TTFT 300, TPOT (1500-1300)/1 = 200, ITL 200, E2EL 500
        req(2, 1000, 1300, 1500, 2, [1300, 1500], lag_ms=2.0),
        # error: counted, never meets an SLO, no latency
        req(3, 1200, None, 1250, None, [], error="HTTP 500"),
    ]
    m = summarize(samples, window_s=2.0, slos=[SLO(metric="ttft_ms", percentile=50, max_ms=150)], quantiles=[0.5, 1.0])
    assert (m.n_requests, m.n_completed, m.n_errors) == (3, 2, 1)
    assert m.total_output_tokens == 6 and m.total_input_tokens == 20
    assert m.request_throughput == pytest.approx(1.0)
    assert m.output_throughput == pytest.approx(3.0)
    assert m.total_token_throughput == pytest.approx(13.0)
    assert m.ttft_ms == pytest.approx([200.0, 300.0])
    assert m.tpot_ms == pytest.approx([150.0, 200.0])
    assert m.itl_ms == pytest.approx([100.0, 200.0])
    assert m.e2el_ms == pytest.approx([450.0, 500.0])
    assert m.mean_itl_ms == pytest.approx(125.0)
    # Only request 1 meets TTFT <= 150 ms: goodput 1 / 2 s, attainment 1 of 3 measured.
    assert m.request_goodput == pytest.approx(0.5)
    assert m.slo_attainment == pytest.approx(1 / 3)
    assert m.slos[0].value_ms == pytest.approx(200.0) and m.slos_met is False
    assert m.sched_lag_p99_ms == pytest.approx(1.96)


def test_achieved_rate_and_client_fell_behind() -> None:
    samples = [req(i, i * 100.0, i * 100.0 + 1, i * 100.0 + 2, 1, [i * 100.0 + 1]) for i in range(30)]
    m = summarize(samples, window_s=3.0, offered_rate=10.0)
    assert m.achieved_rate == pytest.approx(10.0) and m.scheduled_rate == pytest.approx(10.0)
    assert not m.client_fell_behind
    # a schedule that asked for 10/s under a nominal 20/s (an unlucky seed): the client kept up with it
    unlucky = summarize(samples, window_s=3.0, offered_rate=20.0)
    assert unlucky.offered_rate == 20.0 and unlucky.scheduled_rate == pytest.approx(10.0)
    assert not unlucky.client_fell_behind
    # 300 sends 10 ms apart, the last 200 ms late: the p99 lag is 0, the rate 6% under the schedule's
    late = [req(i, i * 10.0 + (200 if i == 299 else 0), i * 10.0 + 201, i * 10.0 + 202, 1, [],
                lag_ms=200 if i == 299 else 0) for i in range(300)]
    slow = summarize(late, window_s=3.2, offered_rate=100.0)
    assert slow.sched_lag_p99_ms == pytest.approx(0.0) and slow.achieved_rate < 0.95 * slow.scheduled_rate
    assert slow.client_fell_behind
    # with a concurrency cap, a low achieved rate is the server saturating, not the client
    capped = summarize(late, window_s=3.2, offered_rate=100.0, concurrency_capped=True)
    assert capped.scheduled_rate is None and not capped.client_fell_behind
    lagging = [req(i, i * 100.0, i * 100.0 + 1, i * 100.0 + 2, 1, [], lag_ms=50) for i in range(30)]
    assert summarize(lagging, window_s=3.0).client_fell_behind


def test_event_loop_lag_flags_the_client() -> None:
    """The loop probe's p99 over the lag tolerance flags the client in a closed loop too, where the
    send lag is 0 (the stall delayed the ends the sends are scheduled from)."""
    samples = [req(i, i * 100.0, i * 100.0 + 1, i * 100.0 + 2000, 1, [i * 100.0 + 1]) for i in range(30)]
    calm = summarize(samples, window_s=3.0, loop_lag=LoopLag(interval_ms=10, n=300, p50_ms=0.1, p99_ms=2.0, max_ms=40))
    assert (calm.loop_lag_p50_ms, calm.loop_lag_p99_ms, calm.loop_lag_max_ms) == (0.1, 2.0, 40.0)
    assert not calm.client_fell_behind
    stalled = summarize(samples, window_s=3.0,
                        loop_lag=LoopLag(interval_ms=10, n=300, p50_ms=0.1, p99_ms=25.0, max_ms=40))
    assert stalled.sched_lag_p99_ms == 0.0 and stalled.client_fell_behind
    unmeasured = summarize(samples, window_s=3.0)
    assert unmeasured.loop_lag_p99_ms is None and not unmeasured.client_fell_behind


def test_closed_loop_lag_tolerance_scales_with_request_latency() -> None:
    """15 ms of p99 lag: too much for an arrival process (it moves arrivals), and for a closed loop of
    0.5 s requests (10 ms floor), but 0.5% of the load in a closed loop of 3 s requests (tolerance
    1% of the median latency, 30 ms)."""
    def run(latency_ms: float) -> list[RequestSample]:
        return [req(i, i * 100.0, i * 100.0 + 1, i * 100.0 + latency_ms, 1, [i * 100.0 + 1], lag_ms=15)
                for i in range(30)]

    assert summarize(run(3000), window_s=3.0, offered_rate=10.0).client_fell_behind
    assert summarize(run(500), window_s=3.0).client_fell_behind
    long = summarize(run(3000), window_s=3.0)
    assert long.sched_lag_p99_ms == pytest.approx(15.0) and not long.client_fell_behind
    assert summarize(run(3000), window_s=3.0, closed_loop_lag_fraction=0.001).client_fell_behind


def test_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="window_s"):
        summarize([], window_s=0)


def test_cancelled_requests_are_counted_apart() -> None:
    """Cancelled by the load generator (early stop, end of window): not requests, not errors, but sent."""
    samples = [
        req(0, 0, 100, 200, 2, [100, 200]),  # TTFT 100
        req(1, 100, 400, 500, 2, [400, 500], error=None),  # TTFT 300
        req(2, 200, None, 250, None, [], error="HTTP 500"),
        req(3, 300, 320, 600, None, [320], error="cancelled: stopped early (over-saturation)"),
        req(4, 400, None, 600, None, [], error="cancelled at end of window"),
        # never went out: its send time is when the sample was taken, after the cancellation
        req(5, 700, None, 600, None, [], error="cancelled: stopped early (over-saturation)", lag_ms=200),
    ]
    m = summarize(samples, window_s=0.6, slos=[SLO(metric="ttft_ms", percentile=50, max_ms=150)],
                  quantiles=[0.5], offered_rate=10.0)
    assert (m.n_requests, m.n_completed, m.n_errors, m.n_cancelled) == (3, 2, 1, 3)
    assert m.total_output_tokens == 4 and m.request_throughput == pytest.approx(2 / 0.6)
    assert m.ttft_ms == pytest.approx([200.0])  # the cancelled request's first token is not a TTFT
    assert m.slo_attainment == pytest.approx(1 / 3)  # 1 of the 3 measured requests
    # the self-check counts the 5 requests that went out: sends 0..400 ms -> 4 gaps in 0.4 s
    assert m.achieved_rate == pytest.approx(10.0)
    assert m.sched_lag_p99_ms == pytest.approx(0.0)


def test_server_summary() -> None:
    series = [
        {"t_ns": 0.0, "num_requests_running": 0, "num_requests_waiting": 0, "kv_cache_usage_perc": 0.0,
         "num_preemptions_total": 3, "prefix_cache_hits_total": 10, "prefix_cache_queries_total": 100},
        {"t_ns": 5e8, "num_requests_running": 4, "num_requests_waiting": 7, "kv_cache_usage_perc": 0.6,
         "num_preemptions_total": 5, "prefix_cache_hits_total": 40, "prefix_cache_queries_total": 200},
        {"t_ns": 1e9, "num_requests_running": 2, "num_requests_waiting": 0, "kv_cache_usage_perc": 0.2,
         "num_preemptions_total": 6, "prefix_cache_hits_total": 70, "prefix_cache_queries_total": 300},
    ]
    s = server_summary(series, {})
    assert s == {"server_max_running": 4, "server_max_waiting": 7, "server_max_kv_cache_usage": 0.6,
                 "server_preemptions_delta": 3, "server_prefix_cache_hit_rate": pytest.approx(0.3)}
    # counter readings before and after the window win over the series' ends
    assert server_summary(series, {"num_preemptions_total": 9.0})["server_preemptions_delta"] == 9.0
    assert server_summary([], {}) == dict.fromkeys(s)


def test_pooled_percentiles_come_from_pooled_samples_not_averaged_percentiles() -> None:
    from analysis import pooled_latencies

    a = [req(i, 0, 10, 20, 2, [10, 20]) for i in range(4)]  # TTFT 10 ms x4
    b = [req(9, 0, 100, 110, 2, [100, 110])]  # TTFT 100 ms
    pooled = pooled_latencies([a, b], quantiles=[0.5, 1.0])
    assert pooled["ttft_ms"] == pytest.approx([10.0, 100.0])
    assert pooled["n"] == [5.0]
    per_trial_p50 = [summarize(x, window_s=1.0, quantiles=[0.5]).ttft_ms[0] for x in (a, b)]
    assert sum(per_trial_p50) / 2 == pytest.approx(55.0)  # what averaging would wrongly report
    cancelled = req(10, 0, None, 5, None, [], error="cancelled at end of window")
    assert pooled_latencies([a, [cancelled]])["n"] == [4.0]


def test_the_coordinator_summarizes_the_clients_loop_lag(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The sweep's own summary of a RESULT (SweepRunner._metrics) passes the outcome's loop lag on,
    so a stalled client is flagged in a sweep, not only in a direct summarize() call."""
    from coordinator.sweep import SweepOptions, SweepRunner
    from servetune.result import TrialOutcome
    from servetune.spec import parse_spec

    text = """
name: lag
engine: {grid: {max_num_seqs: [2]}, fixed: {max_model_len: 256}}
load_points:
  - {name: a, max_concurrency: 4, num_requests: 30, input_len: 8, output_len: 8}
"""
    spec = parse_spec(text)
    runner = SweepRunner(spec, text, SweepOptions(results_root=tmp_path, local_daemon=False))
    samples = [req(i, i * 100.0, i * 100.0 + 1, i * 100.0 + 2000, 1, [i * 100.0 + 1]) for i in range(30)]
    outcome = TrialOutcome(status="ok", samples=samples, window_s=3.0, started_at_us=1, finished_at_us=2,
                           client_loop_lag=LoopLag(interval_ms=10, n=300, p50_ms=0.1, p99_ms=25.0, max_ms=40))
    m = runner._metrics(outcome, spec.load_points[0])
    assert m["loop_lag_p99_ms"] == 25.0 and m["client_fell_behind"] is True


def test_summary_dict_is_the_models_json_dump() -> None:
    """The coordinator stores summary_dict() (built without a model) where it stored
    summarize().model_dump(mode="json"): same keys in the same order, same types (an int window or
    rate is a float in the model), NaN for no data, SLO results as dicts; compared as JSON text."""
    import json

    from servetune.metrics import summary_dict

    samples = [
        req(0, 0, 5, 50, 3, [5, 25, 50], warmup=True),
        req(1, 1000, 1100, 1400, 4, [1100, 1200, 1300, 1400]),
        req(2, 1000, 1300, 1500, 2, [1300, 1500], lag_ms=2.0),
        req(3, 1200, None, 1250, None, [], error="HTTP 500"),
        req(4, 1300, None, 1350, None, [], error="cancelled: window ended"),
    ]
    errors_only = [req(1, 1000, None, 1250, None, [], error="HTTP 500")]
    lag = LoopLag(interval_ms=10, n=300, p50_ms=0.1, p99_ms=25.0, max_ms=40)
    slos = [SLO(metric="ttft_ms", percentile=50, max_ms=150), SLO(metric="tpot_ms", percentile=99, max_ms=1000)]
    cases: list[dict] = [  # type: ignore[type-arg]
        dict(samples=samples, window_s=2),
        dict(samples=samples, window_s=2.0, slos=slos, quantiles=[0, 1], offered_rate=10),
        dict(samples=samples, window_s=3.0, offered_rate=20.0, concurrency_capped=True, loop_lag=lag),
        dict(samples=errors_only, window_s=1, slos=slos),
        dict(samples=[], window_s=1.0, offered_rate=5.0),
    ]
    for kw in cases:
        assert json.dumps(summary_dict(**kw)) == json.dumps(summarize(**kw).model_dump(mode="json"))
