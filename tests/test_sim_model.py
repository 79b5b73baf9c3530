"""Behaviour the simulated vLLM (servetune.sim) must show; each test fails on a broken model."""

from __future__ import annotations

import itertools
import statistics

import pytest

from daemon.sim_backend import expected_metrics, sim_server, simulate_trial
from servetune.manifest import EngineConfig
from servetune.metrics import summarize
from servetune.sim.engine import SimStartError
from servetune.spec import BackendSpec, EngineArgs, LoadPoint, SharedPrefixDataset

TINY = BackendSpec(kind="sim")
H100_8B = BackendSpec(kind="sim", profile="H100-80G", model_shape="llama-3-8b")


def _cfg(**args: object) -> EngineConfig:
    return EngineConfig(args=EngineArgs(**args))  # type: ignore[arg-type]


def _lp(**kw: object) -> LoadPoint:
    base: dict[str, object] = {"name": "lp", "max_concurrency": 64, "num_requests": 256, "input_len": 128,
                               "output_len": 64}
    base.update(kw)
    return LoadPoint(**base)  # type: ignore[arg-type]


def test_more_max_num_seqs_raises_throughput_until_compute_or_kv_binds() -> None:
    lp = _lp(max_concurrency=512, num_requests=1024, input_len=512, output_len=32)
    thr, tpot = [], []
    for mns in (4, 16, 64, 256, 512):
        m = expected_metrics(H100_8B, _cfg(max_num_seqs=mns), lp)
        thr.append(m.output_throughput)
        tpot.append(m.mean_tpot_ms)
    assert all(a < b for a, b in zip(thr, thr[1:])), thr
    assert thr[4] / thr[3] < 1.2 < thr[1] / thr[0], f"gains shrink once compute binds: {thr}"
    assert tpot[4] > 4 * tpot[0], f"per-token latency rises with the batch: {tpot}"
    # the KV cache binds: a short cache caps what more seats can add
    short = {"gpu_memory_utilization": 0.3, "max_model_len": 1024}
    m64 = expected_metrics(H100_8B, _cfg(max_num_seqs=64, **short), lp)
    m512 = expected_metrics(H100_8B, _cfg(max_num_seqs=512, **short), lp)
    assert m512.output_throughput < 1.2 * m64.output_throughput < thr[4], (m64.output_throughput, m512.output_throughput)
    # past the KV bind more seats only buy preemptions (recomputed prompts; 0, 25, 39 at 64, 128, 512 seats
    # here) and take their sampling memory from the KV cache: TTFT rises, throughput does not
    m128 = expected_metrics(H100_8B, _cfg(max_num_seqs=128, **short), lp)
    assert m512.mean_ttft_ms > m128.mean_ttft_ms and m512.output_throughput <= m128.output_throughput, (
        m128.mean_ttft_ms, m512.mean_ttft_ms)
    preempted = {}
    quiet = H100_8B.model_copy(update={"noise": False})
    for mns in (64, 512):
        trial = simulate_trial(sim_server(quiet, _cfg(max_num_seqs=mns, **short)), quiet, lp, seed=0, deadline_s=1e9,
                               vocab_size=128256)
        preempted[mns] = trial.counters["num_preemptions_total"]
    assert preempted[64] == 0 < preempted[512], preempted


def test_chunked_prefill_trades_ttft_for_tpot() -> None:
    lp = _lp(request_rate=10.0, max_concurrency=None, num_requests=150, input_len=2048, output_len=128)
    on = expected_metrics(H100_8B, _cfg(enable_chunked_prefill=True, max_num_batched_tokens=512, max_num_seqs=256), lp)
    off = expected_metrics(H100_8B, _cfg(enable_chunked_prefill=False, max_num_seqs=256), lp)
    assert on.mean_tpot_ms < off.mean_tpot_ms, (on.mean_tpot_ms, off.mean_tpot_ms)
    assert on.mean_ttft_ms > off.mean_ttft_ms, (on.mean_ttft_ms, off.mean_ttft_ms)
    assert on.itl_ms[-1] < off.itl_ms[-1], "decodes never stall behind a whole prompt with chunking on"


def test_prefix_caching_helps_only_with_shared_prefixes() -> None:
    shared = _lp(input_len=1024, dataset=SharedPrefixDataset(kind="shared_prefix", num_prefixes=4,
                                                             suffixes_per_prefix=64, prefix_len=896))
    plain = _lp(input_len=1024)
    for lp, helps in ((shared, True), (plain, False)):
        on = expected_metrics(H100_8B, _cfg(enable_prefix_caching=True), lp)
        off = expected_metrics(H100_8B, _cfg(enable_prefix_caching=False), lp)
        if helps:
            assert on.mean_ttft_ms < 0.7 * off.mean_ttft_ms, (on.mean_ttft_ms, off.mean_ttft_ms)
            assert on.output_throughput > off.output_throughput
        else:
            assert on.mean_ttft_ms == pytest.approx(off.mean_ttft_ms, rel=1e-9)
    server = sim_server(H100_8B.model_copy(update={"noise": False}), _cfg())
    trial = simulate_trial(server, H100_8B, shared, seed=1, deadline_s=1e9, vocab_size=128256)
    c = trial.counters
    assert 0.6 < c["prefix_cache_hits_total"] / c["prefix_cache_queries_total"] < 896 / 1024 + 0.01


@pytest.mark.parametrize(("backend", "args", "wording"), [
    (BackendSpec(kind="sim", profile="L40S", model_shape="llama-3-70b"), {}, "No available memory for the cache blocks"),
    (BackendSpec(kind="sim", profile="A100-80G", model_shape="llama-3-8b"),
     {"gpu_memory_utilization": 0.235, "max_model_len": 8192},
     "To serve at least one request with the model's max seq len (8192)"),
    (TINY, {"max_num_seqs": 64, "max_num_batched_tokens": 32}, "must be greater than or equal to max_num_seqs"),
])
def test_a_config_that_does_not_fit_fails_with_vllms_wording(backend: BackendSpec, args: dict[str, object],
                                                             wording: str) -> None:
    with pytest.raises(SimStartError, match=wording.replace("(", r"\(").replace(")", r"\)")):
        sim_server(backend, _cfg(**args))
    if "max seq len" in wording:
        with pytest.raises(SimStartError, match="the estimated maximum model length is"):
            sim_server(backend, _cfg(**args))
    # tensor parallelism splits the weights: the 70B fits on 2 x H100 only with tp
    with pytest.raises(SimStartError):
        sim_server(BackendSpec(kind="sim", profile="H100-80G", model_shape="llama-3-70b"), _cfg())
    assert sim_server(BackendSpec(kind="sim", profile="H100-80G", model_shape="llama-3-70b"),
                      _cfg(tensor_parallel_size=4)).kv_cache_tokens > 100_000


def test_preemption_appears_when_the_kv_cache_is_short() -> None:
    backend = BackendSpec(kind="sim", profile="A100-80G", model_shape="llama-3-8b", noise=False)
    lp = _lp(max_concurrency=128, num_requests=256, input_len=256, output_len=512)
    counts = {}
    for util in (0.9, 0.26):
        server = sim_server(backend, _cfg(gpu_memory_utilization=util, max_model_len=1024))
        trial = simulate_trial(server, backend, lp, seed=0, deadline_s=1e9, vocab_size=128256)
        counts[util] = trial.counters["num_preemptions_total"]
        ok = [s for s in trial.samples if s.error is None]
        assert len(ok) == 256 and all(len(s.token_ns) == 512 for s in ok), "preempted requests still stream every token once"
        assert all(b >= a for s in ok for a, b in zip(s.token_ns, s.token_ns[1:]))
    assert counts[0.9] == 0 and counts[0.26] > 0, counts


def test_seeds_reproduce_and_differ() -> None:
    server = sim_server(TINY, _cfg(max_num_seqs=8))
    lp = _lp(request_rate=50.0, max_concurrency=None, num_requests=100)
    a = simulate_trial(server, TINY, lp, seed=7, deadline_s=1e9, vocab_size=2048)
    b = simulate_trial(server, TINY, lp, seed=7, deadline_s=1e9, vocab_size=2048)
    c = simulate_trial(server, TINY, lp, seed=8, deadline_s=1e9, vocab_size=2048)
    assert a.samples == b.samples and a.counters == b.counters
    assert [s.token_ns for s in a.samples] != [s.token_ns for s in c.samples]


def test_noiseless_truth_is_the_mean_of_noisy_runs() -> None:
    cfg = _cfg(max_num_seqs=16)
    lp = _lp(max_concurrency=16, num_requests=200)
    truth = expected_metrics(TINY, cfg, lp)
    server = sim_server(TINY, cfg)
    runs = []
    for seed in range(40):
        t = simulate_trial(server, TINY, lp, seed=seed, deadline_s=1e9, vocab_size=2048)
        runs.append(summarize(t.samples, t.window_s))
    for metric in ("output_throughput", "mean_ttft_ms", "mean_tpot_ms"):
        values = [getattr(m, metric) for m in runs]
        mean, sd = statistics.fmean(values), statistics.stdev(values)
        assert sd > 0, f"{metric}: the noise must move it"
        # 40 runs (fixed seeds): the mean is within 3 standard errors of the truth (|z| is 1.4-1.7 here;
        # noise that is 3% slow on average, not mean 1, gives |z| 4.6 and fails)
        assert abs(mean - getattr(truth, metric)) < 3 * sd / 40**0.5, (metric, mean, getattr(truth, metric))


def test_requests_over_max_model_len_are_refused_like_vllm() -> None:
    server = sim_server(TINY, _cfg(max_model_len=256))
    lp = _lp(max_concurrency=4, num_requests=8, input_len=200, output_len=100)
    trial = simulate_trial(server, TINY, lp, seed=0, deadline_s=1e9, vocab_size=2048)
    assert all(s.error and "maximum context length is 256 tokens" in s.error for s in trial.samples)


@pytest.mark.parametrize("dataset", [None, SharedPrefixDataset(kind="shared_prefix", num_prefixes=3,
                                                               suffixes_per_prefix=2, prefix_len=40)])
@pytest.mark.parametrize("warmup", [False, True])
def test_the_simulated_requests_are_the_load_generators(dataset: SharedPrefixDataset | None, warmup: bool) -> None:
    from daemon.sim_backend import _requests
    from daemon.workload import build_requests
    from servetune.spec import LengthDist

    extra = {"dataset": dataset} if dataset is not None else {}
    lp = _lp(input_len=LengthDist(dist="uniform", min=50, max=300), output_len=LengthDist(dist="uniform", min=1, max=90),
             seed=11, **extra)
    planned = build_requests(lp, 2048, None, 30, warmup=warmup)
    simulated = list(itertools.islice(_requests(lp, 2048, None, warmup), 30))
    assert [(r.input_len, r.output_len, -1 if r.group is None else r.group) for r in planned] == [
        (r.prompt_len, r.output_len, r.group) for r in simulated]


def test_duration_window_and_trial_deadline_end_a_load_like_the_load_generator() -> None:
    from daemon.loadgen import ERROR_END_OF_WINDOW, REASON_DEADLINE

    server = sim_server(TINY, _cfg(max_num_seqs=4))
    lp = _lp(request_rate=20.0, max_concurrency=None, num_requests=None, duration_s=5.0, output_len=200)
    trial = simulate_trial(server, TINY, lp, seed=0, deadline_s=1e9, vocab_size=2048, drain_timeout_s=2.0)
    sends = [s.send_ns / 1e9 for s in trial.samples]
    assert max(sends) < 5.0 and 60 < len(sends) < 140, "Poisson arrivals at 20/s for 5 s"
    assert trial.stopped_early is None
    cancelled = [s for s in trial.samples if s.error == ERROR_END_OF_WINDOW]
    assert cancelled and all(s.end_ns / 1e9 == pytest.approx(7.0, abs=0.05) for s in cancelled)
    late = simulate_trial(server, TINY, lp, seed=0, deadline_s=3.0, vocab_size=2048)
    assert late.stopped_early == REASON_DEADLINE
    assert any(s.error == f"cancelled: {REASON_DEADLINE}" for s in late.samples)


@pytest.mark.parametrize(("profile", "shape", "tp"), [("H100-80G", "llama-3-8b", 1), ("A100-80G", "llama-3-70b", 4),
                                                      ("cpu-tiny", "tiny", 1)])
def test_decode_runs_in_closed_form_equal_step_by_step_sums(profile: str, shape: str, tp: int) -> None:
    import numpy as np

    from servetune.sim.engine import NoiseModel, _Noise
    from servetune.sim.profiles import get_profile, get_shape
    from servetune.sim.steptime import StepModel

    sm = StepModel(get_profile(profile), get_shape(shape), tp)
    batch, ctx, k, s0 = 48, 48 * 700, 300, 17
    line = sm.decode_line(batch, ctx)
    steps = [sm.step(batch, batch, batch, ctx + batch * j + batch, ctx + batch * j) for j in range(k)]
    assert [line.at(j) for j in range(k)] == pytest.approx(steps, rel=1e-9)
    noise = _Noise(NoiseModel(seed=3, step_sigma=0.2))
    noise.ensure(s0 + k + 1)
    eps = np.diff(np.asarray(noise.e1))[s0:s0 + k]
    for n in (1, 7, k):
        assert noise.run_time(s0, n, line) == pytest.approx(float(np.dot(steps[:n], eps[:n])), rel=1e-9)
    # lines that cross inside the run (compute overtakes memory at step 100), both ways round
    from servetune.sim.steptime import DecodeLine

    for crossing in (DecodeLine(ac=1.0, bc=0.01, am=2.0, bm=0.0, k=0.5), DecodeLine(ac=2.0, bc=0.0, am=1.0, bm=0.01, k=0.5)):
        direct = [crossing.at(j) for j in range(k)]
        assert noise.run_time(s0, k, crossing) == pytest.approx(float(np.dot(direct, eps)), rel=1e-9)


def test_tensor_parallelism_pays_an_all_reduce_over_the_interconnect() -> None:
    from servetune.sim.profiles import get_profile, get_shape
    from servetune.sim.steptime import StepModel

    shape = get_shape("llama-3-8b")

    def step(profile: str, tp: int) -> float:
        return StepModel(get_profile(profile), shape, tp).step(2048, 1, 1, 2048 * 1024.5, 0)

    # a 2048-token prefill: splitting it over 2 GPUs helps less over PCIe (L40S) than over NVLink (H100)
    assert step("H100-80G", 2) / step("H100-80G", 1) < step("L40S", 2) / step("L40S", 1) < 1.0
    assert StepModel(get_profile("L40S"), shape, 2).k_token > StepModel(get_profile("H100-80G"), shape, 2).k_token > 0
    assert StepModel(get_profile("H100-80G"), shape, 1).k_token == 0


def test_the_server_series_reads_like_a_scrape() -> None:
    server = sim_server(TINY, _cfg(max_num_seqs=8))
    lp = _lp(request_rate=60.0, max_concurrency=None, num_requests=300)
    trial = simulate_trial(server, TINY, lp, seed=0, deadline_s=1e9, vocab_size=2048, base_ns=10**12)
    pts = trial.series
    assert len(pts) > 5 and all(a["t_ns"] < b["t_ns"] for a, b in zip(pts, pts[1:]))
    assert all(p["num_requests_running"] <= 8 and 0 <= p["kv_cache_usage_perc"] <= 1 for p in pts)
    assert max(p["num_requests_waiting"] for p in pts) > 10, "60 req/s overloads 8 seats: a queue builds"
    assert pts[-1]["request_success_total"] == 300 == trial.counters["request_success_total"]
    assert pts[0]["t_ns"] >= 10**12
