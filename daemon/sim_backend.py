"""The ``sim`` backend: play a load point against the simulated vLLM (:mod:`servetune.sim`). SIMULATED.

No server starts and no request is sent. The load point's requests (lengths and shared-prefix
groups) and its arrival schedule are planned by the same :mod:`daemon.workload` functions the load
generator uses, so a simulated trial sees the requests a real one would; the simulator's times
become :class:`~servetune.result.RequestSample` records exactly like the load generator's (one
``token_ns`` per streamed token, warm-up samples first), so the coordinator computes the same
metrics from them. Differences a reader must know:

- times are simulated nanoseconds offset from ``base_ns``, not a clock reading;
- the client is ideal (no scheduling lag); the load point's stop conditions (error budget,
  over-saturation) are not applied; the server series has a point at step boundaries at least
  0.5 s apart, none inside a run of decode steps summed in closed form;
- chat prompts count the drawn length (no chat template); file datasets count prompt tokens with
  the model's tokenizer where the node has one, else about 4 characters per token;
- every result says what it is: ``ServerInfo.argv`` starts with ``servetune-sim`` and names the
  profile, shape and calibration, and the fingerprint's hardware class is ``sim-<tp>x<profile>``.

:func:`expected_metrics` is the noiseless truth: the metrics of the same trial with the noise off
(every step at its expected time).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from daemon.datasets import load_prompts, load_tokenizer
from daemon.loadgen import ERROR_END_OF_WINDOW, REASON_DEADLINE
from daemon.workload import DatasetPrompt, arrival_gaps, derived_seed, draw_length, iter_requests, length_stream
from servetune.bounds import MAX_SERIES_POINTS
from servetune.manifest import EngineConfig
from servetune.metrics import TrialMetrics, summarize
from servetune.result import Fingerprint, RequestSample, ServerInfo
from servetune.sim.engine import (
    CANCEL_DEADLINE,
    CANCEL_WINDOW,
    REFUSED_TOO_LONG,
    NoiseModel,
    SimLoad,
    SimRequest,
    SimRun,
    SimServer,
    start,
)
from servetune.sim.profiles import DEFAULT_SIM_PROFILE, DEFAULT_SIM_SHAPE, get_profile, get_shape
from servetune.spec import SLO, BackendSpec, FileDataset, LoadPoint, SharedPrefixDataset

SIM_COMMAND = "servetune-sim"
#: the simulated server's answer to a request longer than max_model_len (vLLM's HTTP 400 wording)
TOO_LONG_ERROR = ("HTTP 400: This model's maximum context length is {limit} tokens. However, you requested "
                  "{total} tokens ({prompt} in the messages, {output} in the completion). Please reduce the "
                  "length of the messages or completion.")


@dataclass
class SimTrial:
    """One simulated trial: samples (warm-up first), the measurement window, the server's counter deltas."""

    samples: list[RequestSample]
    window_s: float
    stopped_early: str | None
    counters: dict[str, float]
    offered_rate: float | None
    #: the measurement's server gauges and counters, points as :mod:`daemon.scrape` makes them (``t_ns``)
    series: list[dict[str, float]]


def sim_server(backend: BackendSpec, config: EngineConfig) -> SimServer:
    """Start the simulated server of ``config``; :class:`~servetune.sim.engine.SimStartError` when vLLM would not."""
    profile = get_profile(backend.profile or DEFAULT_SIM_PROFILE)
    shape = get_shape(backend.model_shape or DEFAULT_SIM_SHAPE)
    return start(config.args.model_dump(exclude_none=True), config.env, profile, shape)


def server_info(backend: BackendSpec, config: EngineConfig, server: SimServer | None = None) -> ServerInfo:
    """What every simulated result records as its server: ``servetune-sim``, profile, shape, calibration."""
    p = get_profile(backend.profile or DEFAULT_SIM_PROFILE)
    argv = [SIM_COMMAND, "--profile", p.name, "--model-shape", backend.model_shape or DEFAULT_SIM_SHAPE,
            "--calibration", p.calibration, *config.args.cli_args()]
    if server is None:
        return ServerInfo(argv=argv, exit_code=1)
    return ServerInfo(argv=argv, startup_s=0.0, kv_cache_tokens=server.kv_cache_tokens,
                      reported_max_concurrency=server.kv_cache_tokens / server.cfg.max_model_len)


def sim_fingerprint(fp: Fingerprint, backend: BackendSpec, config: EngineConfig) -> Fingerprint:
    """The node's fingerprint with the simulated hardware as its class (``sim-<tp>x<profile>``) and no vLLM claimed."""
    hw = f"sim-{config.args.tensor_parallel_size or 1}x{backend.profile or DEFAULT_SIM_PROFILE}"
    return fp.model_copy(update={"hardware_class": hw, "vllm_version": None})


def _requests(lp: LoadPoint, vocab_size: int, tokenizer_path: str | None, warmup: bool) -> Iterator[SimRequest]:
    """The load point's requests as the simulator needs them: lengths and prefix group, the very
    ones :func:`daemon.workload.iter_requests` plans (the same seeded streams), without drawing
    the prompt tokens the simulator never reads (that would cost more than simulating)."""
    ds = lp.dataset
    if not isinstance(ds, FileDataset):
        base = derived_seed(lp.seed, "warmup") if warmup else lp.seed
        outputs = length_stream(lp.output_len, derived_seed(base, "output_len"))
        if isinstance(ds, SharedPrefixDataset):
            return _shared_prefix_lengths(lp, ds, outputs, base)
        inputs = length_stream(lp.input_len, derived_seed(base, "input_len"))
        return (SimRequest(prompt_len=i, output_len=o) for i, o in zip(inputs, outputs))
    tok = load_tokenizer(tokenizer_path) if tokenizer_path else None
    prompts = load_prompts(ds, tok)
    counts = tok.count_batch([p.text for p in prompts]) if tok is not None else None
    prompts = [DatasetPrompt(p.text, p.input_len if p.input_len is not None else
                             (counts[i] if counts is not None else max(1, len(p.text) // 4)), p.output_len)
               for i, p in enumerate(prompts)]
    return (SimRequest(prompt_len=int(req.input_len or 1), output_len=req.output_len)
            for req in iter_requests(lp, vocab_size, None, warmup=warmup, prompts=prompts))


def _shared_prefix_lengths(lp: LoadPoint, ds: SharedPrefixDataset, outputs: Iterator[int],
                           base: int) -> Iterator[SimRequest]:
    """:func:`daemon.workload._shared_prefix_requests`'s lengths and groups (its suffix length is the
    first draw of the suffix's own stream)."""
    suffix_lens: dict[tuple[int, int], int] = {}
    for i, output_len in enumerate(outputs):
        p = i % ds.num_prefixes
        s = (i // ds.num_prefixes) % ds.suffixes_per_prefix
        if (p, s) not in suffix_lens:
            rng = random.Random(derived_seed(base, f"suffix:{p}:{s}"))
            suffix_lens[(p, s)] = max(1, draw_length(lp.input_len, rng) - ds.prefix_len)
        yield SimRequest(prompt_len=ds.prefix_len + suffix_lens[(p, s)], output_len=output_len, group=p)


def _arrivals(lp: LoadPoint) -> Iterator[float]:
    if lp.request_rate is None:
        return itertools.repeat(0.0)
    gaps = arrival_gaps(lp)
    return itertools.accumulate(itertools.chain([0.0], gaps))


def _samples(run: SimRun, base_ns: int, warmup: bool, max_model_len: int) -> list[RequestSample]:
    out = []
    for i in range(len(run.send_t)):
        send = base_ns + round(run.send_t[i] * 1e9)
        end = base_ns + round(run.end_t[i] * 1e9)
        ended = run.ended[i]
        error = None
        if ended == REFUSED_TOO_LONG:
            error = TOO_LONG_ERROR.format(limit=max_model_len, total=run.prompt_len[i] + run.output_len[i],
                                          prompt=run.prompt_len[i], output=run.output_len[i])
        elif ended == CANCEL_WINDOW:
            error = ERROR_END_OF_WINDOW
        elif ended == CANCEL_DEADLINE:
            error = f"cancelled: {REASON_DEADLINE}"
        tokens = [base_ns + round(t * 1e9) for t in run.token_times(i)] if ended != REFUSED_TOO_LONG else []
        # model_construct: the values are made here, of the right types and within bounds, and the
        # RESULT carrying them is validated where it is received; validating 30,000 token times per
        # trial here would cost more than simulating it
        out.append(RequestSample.model_construct(
            index=i, warmup=warmup, scheduled_ns=send, send_ns=send,
            first_token_ns=tokens[0] if tokens else None, end_ns=max(end, tokens[-1] if tokens else end),
            token_ns=tokens, prompt_tokens=run.prompt_len[i] if error is None else None,
            output_tokens=run.generated[i] if error is None else None, error=error,
        ))
    return out


def simulate_trial(server: SimServer, backend: BackendSpec, lp: LoadPoint, *, seed: int, deadline_s: float,
                   vocab_size: int, tokenizer_path: str | None = None, base_ns: int = 0,
                   drain_timeout_s: float = 60.0) -> SimTrial:
    """Warm-up then measurement of ``lp`` on ``server``; noise seeded by ``seed`` unless ``backend.noise`` is false."""
    noisy = backend.noise is not False
    warm_samples: list[RequestSample] = []
    t0 = 0.0
    if lp.warmup_requests:
        warm = server.run(SimLoad(
            requests=itertools.islice(_requests(lp, vocab_size, tokenizer_path, True), lp.warmup_requests),
            arrivals=itertools.repeat(0.0), max_concurrency=lp.max_concurrency or 1, deadline_s=deadline_s,
            prefix_len=_prefix_len(lp)), _noise(seed, "warmup") if noisy else None)
        warm_samples = _samples(warm, base_ns, True, server.cfg.max_model_len)
        t0 = max(warm.end_t, default=0.0)
    reqs = _requests(lp, vocab_size, tokenizer_path, False)
    if lp.num_requests is not None:
        reqs = itertools.islice(reqs, lp.num_requests)
    run = server.run(SimLoad(
        requests=reqs, arrivals=_arrivals(lp), max_concurrency=lp.max_concurrency, send_until_s=lp.duration_s,
        drain_timeout_s=drain_timeout_s, deadline_s=max(0.0, deadline_s - t0), prefix_len=_prefix_len(lp),
    ), _noise(seed, "measure") if noisy else None)
    samples = _samples(run, base_ns + round(t0 * 1e9), False, server.cfg.max_model_len)
    if samples:
        start_ns = min(s.send_ns for s in samples)
        window = max(max(s.end_ns for s in samples) - start_ns, 1) / 1e9
    else:
        window = 1e-9
    return SimTrial(samples=warm_samples + samples, window_s=window,
                    stopped_early=REASON_DEADLINE if run.stopped == CANCEL_DEADLINE else None,
                    counters=run.counters, offered_rate=lp.request_rate,
                    series=_series(run, base_ns + round(t0 * 1e9)))


def _series(run: SimRun, base_ns: int) -> list[dict[str, float]]:
    points = [{"t_ns": float(base_ns + round(p["t"] * 1e9)), **{k: v for k, v in p.items() if k != "t"}}
              for p in run.series]
    while len(points) > MAX_SERIES_POINTS:  # as the scraper does: every other point dropped
        points = points[::2]
    return points


def _prefix_len(lp: LoadPoint) -> int:
    return lp.dataset.prefix_len if isinstance(lp.dataset, SharedPrefixDataset) else 0


def _noise(seed: int, label: str) -> NoiseModel:
    return NoiseModel(seed=derived_seed(seed, f"sim-noise:{label}"))


def trial_seed(trial_id: str) -> int:
    """The noise seed of a trial: from its id, so a re-run reproduces it and repeats differ."""
    return int(trial_id[:16], 16)


def expected_metrics(backend: BackendSpec, config: EngineConfig, lp: LoadPoint, slos: Sequence[SLO] = (),
                     vocab_size: int = 2048, deadline_s: float = math.inf) -> TrialMetrics:
    """The noiseless truth: every metric of ``config`` at ``lp`` with the noise off.
    Raises :class:`~servetune.sim.engine.SimStartError` for a config vLLM would not start."""
    quiet = backend.model_copy(update={"noise": False})
    return expected_trial(sim_server(quiet, config), quiet, lp, slos, vocab_size, deadline_s)[0]


def expected_trial(server: SimServer, backend: BackendSpec, lp: LoadPoint, slos: Sequence[SLO] = (),
                   vocab_size: int = 2048, deadline_s: float = math.inf, drain_timeout_s: float = 60.0,
                   tokenizer_path: str | None = None) -> tuple[TrialMetrics, float]:
    """The noiseless truth of ``lp`` on an already started ``server`` (noise off whatever ``backend``
    says), and the simulated seconds the trial took from its first send (warm-up included) to its last token."""
    quiet = backend.model_copy(update={"noise": False})
    trial = simulate_trial(server, quiet, lp, seed=0, deadline_s=deadline_s, vocab_size=vocab_size,
                           drain_timeout_s=drain_timeout_s, tokenizer_path=tokenizer_path)
    metrics = summarize(trial.samples, trial.window_s, slos, offered_rate=trial.offered_rate,
                        concurrency_capped=lp.request_rate is not None and lp.max_concurrency is not None)
    span_ns = (max(s.end_ns for s in trial.samples) - min(s.send_ns for s in trial.samples)) if trial.samples else 0
    return metrics, span_ns / 1e9
