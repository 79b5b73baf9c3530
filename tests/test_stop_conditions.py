"""Stop conditions and server-side metrics in the running load generator and daemon.

Against the canned streaming server of tests/test_loadgen.py (its own process): ``slow=X`` makes
every request's TTFT X ms longer than the previous one's (a server falling further behind an
open-loop rate), ``fail=N`` answers every N-th request with HTTP 500, and ``/metrics`` reports its
requests in flight as vLLM's gauges. One test runs on the session's shared real vLLM server.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from daemon.batch import BatchContext, BatchRunner
from daemon.loadgen import run_load_point
from daemon.scrape import MetricsScraper
from servetune.manifest import EngineConfig, TrialManifest
from servetune.messages import Grant, GrantedTrial, Result
from servetune.metrics import server_summary, summarize
from servetune.result import Fingerprint, TrialOutcome
from servetune.spec import BackendSpec, Budgets, LoadPoint, ModelSpec
from tests.test_loadgen import VOCAB, Canned, canned, lp_, measure, server  # noqa: F401 (fixtures used below)

if TYPE_CHECKING:
    from daemon.server import VLLMServer

SATURATION_ERROR = "cancelled: stopped early (over-saturation)"
BUDGET_ERROR = "cancelled: stopped early (error budget)"


@pytest.fixture()
def target(canned: Canned) -> Canned:  # noqa: F811 (the canned server of tests/test_loadgen.py, reset)
    return canned


# --------------------------------------------------------------------------- over-saturation


@pytest.mark.timeout(60)
def test_over_saturation_stops_a_server_falling_behind(target: Canned) -> None:
    # 50 req/s; each TTFT 8 ms longer than the last: TTFT rises 400 ms/s, in flight about 20 more per s
    lp = lp_(request_rate=50.0, arrival="constant", num_requests=1000, output_len=4,
             stop={"over_saturation": True, "saturation_window_s": 1.5})
    t0 = time.monotonic()
    res = measure(target.url("ttft=5,itl=1,slow=8"), lp, deadline_s=40)
    elapsed = time.monotonic() - t0
    reason = res.stopped_early
    assert reason is not None and reason.startswith("over-saturation: in-flight grew from "), reason
    assert " ms/s " in reason and reason.endswith("over 1.5 s") and "deadline" not in reason
    # not before a window and its confirmation; well before the 20 s the load point would take
    assert 3.0 <= res.window_s <= 8.0 and elapsed < 10.0, (res.window_s, elapsed)
    assert len(res.samples) < 1000
    cancelled = [s for s in res.samples if s.error is not None]
    assert cancelled and all(s.error == SATURATION_ERROR for s in cancelled), {s.error for s in cancelled}
    assert all(s.end_ns <= res.window_end_ns for s in res.samples)
    m = summarize(res.samples, res.window_s, offered_rate=50.0)
    assert m.n_cancelled == len(cancelled) and m.n_errors == 0
    assert m.n_requests == m.n_completed == len(res.samples) - len(cancelled)
    assert not m.client_fell_behind  # the sends kept to the schedule until the stop
    assert target.wait_idle()["inflight"] == 0  # the cancelled requests were disconnected


@pytest.mark.timeout(60)
def test_over_saturation_quiet_on_a_steady_server(target: Canned) -> None:
    lp = lp_(request_rate=60.0, duration_s=5.0, output_len=4, seed=5,
             stop={"over_saturation": True, "saturation_window_s": 1.0})
    res = measure(target.url("ttft=5,itl=2"), lp)
    assert res.stopped_early is None
    assert len(res.samples) > 200 and all(s.error is None for s in res.samples)


# --------------------------------------------------------------------------- error budget


@pytest.mark.timeout(60)
def test_error_budget_count(target: Canned) -> None:
    lp = lp_(max_concurrency=2, num_requests=200, output_len=4, stop={"max_errors": 5})
    res = measure(target.url("ttft=2,itl=1,fail=2"), lp)
    assert res.stopped_early == "error budget: 6 errors > max_errors 5"
    assert len(res.samples) < 20
    failed = [s for s in res.samples if s.error is not None and s.error.startswith("HTTP 500")]
    others = [s for s in res.samples if s.error is not None and not s.error.startswith("HTTP 500")]
    assert len(failed) >= 6 and all(s.error == BUDGET_ERROR for s in others)
    m = summarize(res.samples, res.window_s)
    assert m.n_errors == len(failed) and m.n_cancelled == len(others)


@pytest.mark.timeout(60)
def test_error_budget_rate_after_enough_requests(target: Canned) -> None:
    lp = lp_(max_concurrency=1, num_requests=100, output_len=4,
             stop={"max_error_rate": 0.3, "min_requests_for_rate": 10})
    res = measure(target.url("ttft=1,itl=1,fail=2"), lp)
    assert res.stopped_early == "error budget: 5 of 10 requests failed (50% > max_error_rate 30%)"
    assert len(res.samples) == 10  # one at a time: the stop comes before the 11th is sent
    assert target.wait_idle()["count"] == 10


@pytest.mark.timeout(60)
def test_error_budget_not_spent_by_a_good_server(target: Canned) -> None:
    lp = lp_(max_concurrency=4, num_requests=40, output_len=4, stop={"max_errors": 1, "max_error_rate": 0.01})
    res = measure(target.url("ttft=1,itl=1"), lp)
    assert res.stopped_early is None and len(res.samples) == 40


# --------------------------------------------------------------------------- through the daemon


def fingerprint() -> Fingerprint:
    return Fingerprint(hostname="test", cpu_model="test", cpu_count=1, cpu_isa="none", ram_gib=1.0, os="linux",
                       kernel="test", python="3", servetune_version="0", hardware_class="cpu-test")


def grant_for(lp: LoadPoint, backend: BackendSpec, model: ModelSpec) -> Grant:
    manifest = TrialManifest(experiment="stops", model={"source": model.source}, backend=backend.kind,
                             target=backend.base_url, config_id=EngineConfig().config_id, engine=EngineConfig(),
                             load_point=lp)
    return Grant(batch_id="b1", epoch=1, ttl_s=600, model=model, backend=backend,
                 budgets=Budgets(trial_timeout_s=60, drain_timeout_s=10), config=EngineConfig(),
                 trials=[GrantedTrial(trial_id=manifest.trial_id, attempt=1, manifest=manifest)])


def run_grant(grant: Grant, workdir: Path) -> TrialOutcome:
    sent: list[object] = []
    BatchRunner(BatchContext(workdir, fingerprint(), None), sent.append, threading.Event()).run(grant)
    results = [m for m in sent if isinstance(m, Result)]
    assert len(results) == 1, sent
    return results[0].outcome


@pytest.mark.timeout(90)
def test_stopped_early_is_an_ok_result_with_server_series(target: Canned, tmp_path: Path) -> None:
    """The daemon's batch runner on an endpoint it did not start (the ``openai`` backend, /metrics on)."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"vocab_size": VOCAB}))
    lp = lp_(request_rate=50.0, arrival="constant", num_requests=1000, output_len=4,
             stop={"over_saturation": True, "saturation_window_s": 1.5})
    backend = BackendSpec(kind="openai", base_url=target.url("ttft=5,itl=1,slow=8"), scrape_metrics=True)
    outcome = run_grant(grant_for(lp, backend, ModelSpec(source="path", path=str(model_dir), served_name="canned")),
                        tmp_path)
    assert outcome.status == "ok" and outcome.failure_kind is None and outcome.error is None
    assert outcome.stopped_early is not None and outcome.stopped_early.startswith("over-saturation: ")
    assert any(s.error == SATURATION_ERROR for s in outcome.samples)
    # the server-side series: from the start of the measurement to the drain, every 0.5 s
    series = outcome.server_series
    sends = [s.send_ns for s in outcome.samples]
    assert len(series) >= 5, series
    assert series[0]["t_ns"] <= min(sends) + 0.3e9 and series[-1]["t_ns"] >= max(s.end_ns for s in outcome.samples)
    gaps = [b["t_ns"] - a["t_ns"] for a, b in zip(series, series[1:])]
    assert all(g > 0.3e9 for g in gaps[:-1]) and gaps[-1] > 0  # the last point is taken when it stops
    assert series[-1]["num_requests_running"] == 0  # after the drain
    assert max(p["num_requests_running"] for p in series) >= 10
    assert {"num_requests_waiting", "kv_cache_usage_perc", "generation_tokens_total"} <= set(series[0])
    summary = server_summary(series, outcome.server_counters)
    assert summary["server_max_running"] == max(p["num_requests_running"] for p in series)
    assert summary["server_preemptions_delta"] == 0
    # what the coordinator derives: cancelled requests apart, the rest measured
    m = summarize(outcome.samples, outcome.window_s or 0.0, offered_rate=outcome.offered_rate)
    assert m.n_cancelled > 0 and m.n_errors == 0


# --------------------------------------------------------------------------- real vLLM


@pytest.mark.vllm
@pytest.mark.timeout(300)
def test_real_vllm_scraper_series_during_a_load_point(vllm_server: VLLMServer) -> None:
    """On the session's shared vLLM server: the scraper the daemon runs during a measurement."""
    scraper = MetricsScraper.for_endpoint(vllm_server)
    assert scraper is not None
    # 8 requests in flight against max_num_seqs 4: some run, some wait (48 requests: a window of several
    # 0.5 s scrapes even on a fast host, so at least one lands while 4 requests wait)
    lp = lp_(max_concurrency=8, num_requests=48, input_len=64, output_len=64, warmup_requests=1)
    try:
        warm, res = run_load_point(vllm_server.base_url, "tiny", VOCAB, lp, deadline_s=240,
                                   on_measure_start=scraper.start)
        assert vllm_server.wait_idle(60)
    finally:
        series = scraper.stop()
    assert res.stopped_early is None and all(s.error is None for s in res.samples), [s.error for s in res.samples]
    assert scraper.failures == 0
    assert len(series) >= max(3, int(res.window_s / 0.5) - 1), (len(series), res.window_s)
    keys = {"t_ns", "num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
            "generation_tokens_total", "num_preemptions_total", "prefix_cache_queries_total"}
    assert keys <= set(series[0]), set(series[0])
    during = [p for p in series if res.window_start_ns <= p["t_ns"] <= res.window_end_ns]
    assert during and max(p["num_requests_running"] for p in during) == 4
    assert max(p["num_requests_waiting"] for p in during) >= 1, [(p["num_requests_running"], p["num_requests_waiting"])
                                                                 for p in during]
    assert 0 < max(p["kv_cache_usage_perc"] for p in during) <= 1
    assert series[-1]["num_requests_running"] == 0  # it ran until the server drained
    generated = series[-1]["generation_tokens_total"] - series[0]["generation_tokens_total"]
    assert generated == 48 * 64
    summary: dict[str, Any] = server_summary(series, {})
    assert summary["server_max_running"] == 4 and summary["server_max_kv_cache_usage"] > 0


# --------------------------------------------------------------------------- the scraper alone


def test_scraper_keeps_going_through_failures_and_stops_on_time() -> None:
    calls: list[float] = []

    def read(timeout_s: float) -> dict[str, float]:
        calls.append(timeout_s)
        if len(calls) % 3 == 0:
            raise ConnectionError("server busy")
        if len(calls) == 4:
            raise RuntimeError("anything at all")
        return {"num_requests_running": float(len(calls))}

    scraper = MetricsScraper(read, period_s=0.02, timeout_s=0.5)
    scraper.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    series = scraper.stop()
    assert time.monotonic() - t0 < 0.4  # under the 0.5 s read deadline: stop() does not wait for a read
    assert scraper.stop() == series  # idempotent
    assert len(calls) >= 8 and all(t == 0.5 for t in calls)
    assert scraper.failures == sum(1 for i in range(1, len(calls) + 1) if i % 3 == 0 or i == 4)
    assert len(series) == len(calls) - scraper.failures
    assert all(b["t_ns"] > a["t_ns"] for a, b in zip(series, series[1:]))
    assert series[0]["num_requests_running"] == 1.0


def test_scraper_series_is_bounded_by_thinning() -> None:
    scraper = MetricsScraper(lambda timeout_s: {"x": 1.0}, period_s=0.001, max_points=16)
    with scraper:
        deadline = time.monotonic() + 5
        while scraper.thinned < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    series = scraper.series
    assert scraper.thinned >= 3 and 8 <= len(series) <= 16
    assert all(b["t_ns"] > a["t_ns"] for a, b in zip(series, series[1:]))


def test_scraper_ends_by_itself_after_its_lifetime() -> None:
    scraper = MetricsScraper(lambda timeout_s: {}, period_s=0.01, max_lifetime_s=0.1)
    scraper.start()
    deadline = time.monotonic() + 2.0
    while scraper.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not scraper.running
    assert 1 <= len(scraper.stop()) <= 20


def test_parse_samples_of_named_metrics_only() -> None:
    from daemon import promtext
    from tests.test_server import METRICS_TEXT

    names = {"vllm:num_requests_running", "vllm:prefix_cache_queries_total", "vllm:request_success_total"}
    some = promtext.parse_samples(METRICS_TEXT, names=names)
    every = promtext.parse_samples(METRICS_TEXT)
    assert some == [s for s in every if s.name in names]
    assert len(some) == 6  # a name that is a prefix of others (queries_total vs queries_created) kept apart


@pytest.mark.vllm
@pytest.mark.timeout(300)
def test_real_vllm_over_saturation_and_error_budget(vllm_server: VLLMServer) -> None:
    """On the session's shared vLLM server (max_num_seqs 4): an open-loop rate far above what it
    serves stops early for over-saturation; prompts longer than max_model_len spend an error budget."""
    base = vllm_server.base_url
    lp = lp_(request_rate=60.0, num_requests=3000, input_len=32, output_len=64, seed=3,
             stop={"over_saturation": True, "saturation_window_s": 3.0})
    t0 = time.monotonic()
    _, res = run_load_point(base, "tiny", VOCAB, lp, deadline_s=120)
    elapsed = time.monotonic() - t0
    try:
        assert res.stopped_early is not None and res.stopped_early.startswith("over-saturation: "), res.stopped_early
        assert elapsed < 35, elapsed  # windows and slack on a busy machine; well under the 50 s of the whole load point
        m = summarize(res.samples, res.window_s, offered_rate=60.0)
        # (no client self-check here: hundreds of streams on this machine's spare core may lag it)
        assert m.n_cancelled > 10 and m.n_errors == 0 and m.n_completed > 0
    finally:
        assert vllm_server.wait_idle(60), "vLLM did not drop the cancelled requests"
    over = lp_(max_concurrency=2, num_requests=50, input_len=600, output_len=4, stop={"max_errors": 3})
    _, res = run_load_point(base, "tiny", VOCAB, over, deadline_s=60)
    assert res.stopped_early == "error budget: 4 errors > max_errors 3", res.stopped_early
    assert len(res.samples) <= 6 and all(s.error for s in res.samples)
    assert any(s.error is not None and s.error.startswith("HTTP 400") for s in res.samples), res.samples[0].error
