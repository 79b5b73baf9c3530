"""SLA search against vLLM's ``auto_tune.sh`` linear descent, on the simulator. SIMULATED.

``python -m benchmarks.search.sla [--surfaces all|NAME,...] [--configs 4] [--seeds 10] [--runs 3]``

For each surface of :mod:`benchmarks.search.surfaces`, the surface's load point becomes an open-loop
Poisson load point (``request_rate`` set per probe, ``num_requests`` = N, enough requests to confirm
the SLOs' percentiles: ``max(400, requests_to_confirm(p))``), its lengths, dataset and SLOs kept.
``--configs`` engine configs that start are drawn per surface with a seeded rng.

Truths per config, both from the same K=6 noisy draws of N requests per rate (noise seeds and
load-point seeds 10_000 + j; each draw's own percentile per SLO and the pooled percentile are cached):

- ``r*_med``, the typical run's boundary (primary): at rate r, per SLO the median over the K draws
  of each draw's own percentile; the config meets at r when every SLO's median is within its bound.
- ``r*_pool``, the pooled-percentile boundary (secondary): per SLO the percentile of the latencies
  of all K draws pooled.

Each is the highest rate meeting, found by doubling or halving from 1 req/s to a bracket, then
geometric bisection to 0.5% relative. A config whose bracket cannot be found between 1e-3 and 1e5
req/s for either truth (e.g. a TPOT-only SLO that queueing never breaks) is skipped; the next config
of the draw takes its place.

Methods, each probe one noisy simulated trial, metrics by :func:`servetune.metrics.summary_dict`:

- ``sla-search``: ``--runs`` R independent runs per (config, seed), each its own search (own seeds,
  own server starts) by :mod:`servetune.sla` as :mod:`coordinator.sla_search` drives it: round 0 =
  ``first_rates(0.5, 64, 3)``, then ``next_rates`` (3 rates per round, ``rel_tol`` 0.05, at most 8
  rounds, ``floor, ceiling = search_range(0.5, 64)``), each probe judged by
  :func:`servetune.sla.verdict`, one server start per round. The runs are combined by
  :func:`servetune.sla.combine_runs`: ``estimate`` (the typical run's boundary), the 95% t-interval
  ``[low, high]`` on it (checked against ``r*_med``), and ``met_in_every_run`` (the conservative
  answer, checked against ``r*_pool``). Run 1's own bracket ``[lo, hi]`` is reported for comparison.
- ``auto_tune``: vLLM's ``benchmarks/auto_tune/auto_tune.sh`` method as described in its docs (no
  code of it here): one server start; a run of 1000 prompts at request rate inf (all at once) gives
  the throughput; if it meets the SLOs the answer is inf; else from ``int(throughput) + 1`` req/s down
  by 1 req/s, a run of 100 prompts per step and a 5 s sleep (GPU held), until a step's measured
  percentile is within the bound or the rate reaches 0. Its answer is that rate (a point).

GPU-seconds follow :mod:`benchmarks.search.truth`: per server start ``truth.start_s``, per trial its
simulated span and ``TRIAL_OVERHEAD_S``, times ``tensor_parallel_size``; ours summed over the R runs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from benchmarks.search.surfaces import SURFACES, surface_spec
from benchmarks.search.truth import start_s
from coordinator.preview import TRIAL_OVERHEAD_S
from daemon.sim_backend import sim_server, simulate_trial
from servetune.manifest import EngineConfig
from servetune.metrics import per_request_latencies, quantile, summary_dict
from servetune.result import RequestSample
from servetune.sim.engine import SimServer, SimStartError
from servetune.sla import SlaOutcome, Verdict, combine_runs, first_rates, next_rates, search_range, verdict
from servetune.spec import ExperimentSpec, LoadPoint, requests_to_confirm

#: pooled noisy draws per truth evaluation
TRUTH_DRAWS = 6
#: truth bisection's relative precision
TRUTH_REL = 0.005
#: bracket limits of the truth (req/s): beyond them the config has no finite boundary here
TRUTH_MIN_RPS = 1e-3
TRUTH_MAX_RPS = 1e5
#: our search's settings (the same for every surface and config: nothing of the truth goes in)
MIN_RPS, MAX_RPS, PER_ROUND, REL_TOL, MAX_ROUNDS = 0.5, 64.0, 3, 0.05, 8
#: auto_tune.sh's settings
AT_INF_PROMPTS, AT_STEP_PROMPTS, AT_SLEEP_S = 1000, 100, 5.0
#: simulated trials are never cut by a deadline here (a slow rate takes long; that is its GPU time)
DEADLINE_S = 1e9
WITHIN = 0.05
DEFAULT_CACHE = Path.home() / ".cache" / "servetune-slabench"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:4], "big")


@dataclass
class Surface:
    name: str
    spec: ExperimentSpec
    base: dict[str, Any]  # the open-loop load point's fields, request_rate left to set
    n_requests: int


def open_loop_surface(name: str) -> Surface:
    spec = surface_spec(name)
    lp = spec.load_points[0]
    n = max(400, *(requests_to_confirm(s.percentile) for s in spec.slos))
    base = lp.model_dump(exclude={"max_concurrency", "request_rate", "num_requests", "seed"})
    base.update(name=f"{lp.name}-open", num_requests=n)
    return Surface(name, spec, base, n)


def _lp(surface: Surface, *, rate: float | None, n: int, seed: int, max_concurrency: int | None = None) -> LoadPoint:
    return LoadPoint.model_validate({**surface.base, "request_rate": rate, "num_requests": n, "seed": seed,
                                     "max_concurrency": max_concurrency})


@dataclass
class Trial:
    metrics: dict[str, Any]
    samples: list[RequestSample]
    span_s: float


def run_trial(surface: Surface, server: SimServer, lp: LoadPoint, noise_seed: int) -> Trial:
    """One noisy simulated trial, its metrics exactly as :mod:`benchmarks.search.truth` makes them."""
    backend = surface.spec.backend.model_copy(update={"noise": True})
    trial = simulate_trial(server, backend, lp, seed=noise_seed, deadline_s=DEADLINE_S,
                           vocab_size=server.shape.vocab_size)
    metrics = summary_dict(trial.samples, trial.window_s, surface.spec.slos, offered_rate=trial.offered_rate,
                           concurrency_capped=lp.max_concurrency is not None)
    s = trial.samples
    span = (max(x.end_ns for x in s) - min(x.send_ns for x in s)) / 1e9 if s else 0.0
    return Trial(metrics, s, span)


# --- truth -------------------------------------------------------------------------------------------

#: truth cache format: per rate, each draw's own percentile per SLO and the pooled percentile per SLO
TRUTH_VERSION = "med-pool-v2"
TruthKind = Literal["med", "pool"]


class Truth:
    """The two truths of one config from the same K noisy draws per rate (memoized, cached on disk):
    ``med``, the typical run's boundary (per SLO the median over the draws of each draw's own
    percentile), and ``pool``, the pooled-percentile boundary (the percentile of all draws' latencies)."""

    def __init__(self, surface: Surface, config: EngineConfig, server: SimServer, cache: Path | None,
                 draws: int = TRUTH_DRAWS):
        self.surface, self.config, self.server, self.draws = surface, config, server, draws
        self.per_draw: dict[float, list[list[float]]] = {}  # rate -> per draw -> that draw's percentile per SLO
        self.pooled_at: dict[float, list[float]] = {}  # rate -> pooled percentile per SLO
        self.r_star: dict[str, float | None] = {}
        self.bracket: dict[str, tuple[float | None, float | None]] = {}
        spec_key = hashlib.sha256(json.dumps(surface.spec.model_dump(mode="json"), sort_keys=True).encode())
        self.file = None if cache is None else cache / (
            f"{surface.name}-{config.config_id[:16]}-N{surface.n_requests}-K{draws}-"
            f"{spec_key.hexdigest()[:8]}-{TRUTH_VERSION}.json")
        if self.file is not None and self.file.exists():
            d = json.loads(self.file.read_text())
            self.per_draw = {float(k): v for k, v in d["per_draw"].items()}
            self.pooled_at = {float(k): v for k, v in d["pooled"].items()}
            self.r_star = d["r_star"]
            self.bracket = {k: (v[0], v[1]) for k, v in d["bracket"].items()}

    def _eval(self, rate: float) -> None:
        if rate in self.pooled_at:
            return
        slos = self.surface.spec.slos
        pools: list[list[float]] = [[] for _ in slos]
        draws: list[list[float]] = []
        for j in range(self.draws):
            lp = _lp(self.surface, rate=rate, n=self.surface.n_requests, seed=10_000 + j)
            t = run_trial(self.surface, self.server, lp, 10_000 + j)
            own: list[list[float]] = [[] for _ in slos]
            for x in t.samples:
                if x.warmup:
                    continue
                lat = per_request_latencies(x) if x.error is None else {}
                for i, slo in enumerate(slos):
                    v = lat.get(slo.metric) if x.error is None else math.inf  # a failed request: above any bound
                    if v is not None:
                        own[i].append(v)
                        pools[i].append(v)
            draws.append([quantile(o, slo.percentile / 100) if o else math.inf for o, slo in zip(own, slos)])
        self.per_draw[rate] = draws
        self.pooled_at[rate] = [quantile(p, slo.percentile / 100) if p else math.inf for p, slo in zip(pools, slos)]

    def values(self, rate: float, kind: TruthKind) -> list[float]:
        """Per SLO, the percentile the truth of ``kind`` judges at ``rate``."""
        self._eval(rate)
        if kind == "pool":
            return self.pooled_at[rate]
        return [statistics.median(d[i] for d in self.per_draw[rate]) for i in range(len(self.surface.spec.slos))]

    def meets(self, rate: float, kind: TruthKind) -> bool:
        return all(v <= slo.max_ms for v, slo in zip(self.values(rate, kind), self.surface.spec.slos))

    def _solve(self, kind: TruthKind) -> tuple[float | None, tuple[float | None, float | None]]:
        lo: float | None = None
        hi: float | None = None
        r = 1.0
        if self.meets(r, kind):
            lo = r
            while hi is None and r < TRUTH_MAX_RPS:
                r *= 2
                if self.meets(r, kind):
                    lo = r
                else:
                    hi = r
        else:
            hi = r
            while lo is None and r > TRUTH_MIN_RPS:
                r /= 2
                if self.meets(r, kind):
                    lo = r
                else:
                    hi = r
        if lo is None or hi is None:
            return None, (lo, hi)
        while hi / lo - 1 > TRUTH_REL:
            mid = math.sqrt(lo * hi)
            if self.meets(mid, kind):
                lo = mid
            else:
                hi = mid
        return lo, (lo, hi)

    def solve(self) -> tuple[float | None, float | None]:
        """``(r*_med, r*_pool)`` (None: no finite positive boundary between the bracket limits)."""
        if not (self.file is not None and self.file.exists()):
            kinds: tuple[TruthKind, ...] = ("med", "pool")
            for kind in kinds:
                self.r_star[kind], self.bracket[kind] = self._solve(kind)
            if self.file is not None:
                self.file.parent.mkdir(parents=True, exist_ok=True)
                self.file.write_text(json.dumps({
                    "version": TRUTH_VERSION, "r_star": self.r_star,
                    "bracket": {k: list(v) for k, v in self.bracket.items()},
                    "per_draw": {repr(k): v for k, v in self.per_draw.items()},
                    "pooled": {repr(k): v for k, v in self.pooled_at.items()}}))
        return self.r_star["med"], self.r_star["pool"]


# --- the two methods ----------------------------------------------------------------------------------

@dataclass
class Result:
    method: str
    config_id: str
    seed: int
    r_med: float
    r_pool: float
    trials: int  # summed over the runs
    starts: int
    gpu_s: float
    answer: float | None  # ours: combine_runs' estimate; auto_tune: its rate (inf when the rate-inf run met)
    within5_med: bool = False
    within5_pool: bool = False
    # ours only
    runs: int = 0
    bracketed: int = 0
    low: float | None = None
    high: float | None = None
    met_every: float | None = None
    covered_med: bool | None = None
    covered_pool: bool | None = None
    rel_width: float | None = None
    safe_pool: bool | None = None  # met_in_every_run <= r*_pool (None: some run met no rate)
    run1_lo: float | None = None
    run1_hi: float | None = None
    run1_covered_med: bool | None = None
    reasons: list[str] = field(default_factory=list)
    non_monotone: int = 0
    probes: list[list[tuple[float, str]]] = field(default_factory=list)


def _within(x: float | None, r: float) -> bool:
    return x is not None and math.isfinite(x) and abs(x - r) / r <= WITHIN


def one_search(surface: Surface, config: EngineConfig, server: SimServer, seed: int, run: int
               ) -> tuple[SlaOutcome, int, int, float]:
    """One run's search, as :mod:`coordinator.sla_search` drives it: (outcome, trials, starts, GPU-s / tp)."""
    probes: dict[float, Verdict] = {}
    rates = first_rates(MIN_RPS, MAX_RPS, PER_ROUND)
    floor, ceiling = search_range(MIN_RPS, MAX_RPS)
    rounds = trials = 0
    gpu = 0.0
    while True:
        rounds += 1
        gpu += start_s(surface.spec, config)
        for rate in rates:
            s = _seed("slabench", seed, run, config.config_id, repr(rate))
            t = run_trial(surface, server, _lp(surface, rate=rate, n=surface.n_requests, seed=s), s)
            probes[rate] = verdict("ok", t.metrics)
            trials += 1
            gpu += t.span_s + TRIAL_OVERHEAD_S
        rates, out = next_rates(probes, per_round=PER_ROUND, rel_tol=REL_TOL, rounds_done=rounds,
                                max_rounds=MAX_ROUNDS, floor=floor, ceiling=ceiling)
        if not rates:
            return out, trials, rounds, gpu


def sla_search(surface: Surface, config: EngineConfig, server: SimServer, seed: int, r_med: float,
               r_pool: float, runs: int) -> Result:
    """``runs`` independent searches of one config, combined by :func:`servetune.sla.combine_runs`."""
    tp = config.args.tensor_parallel_size or 1
    outs: list[SlaOutcome] = []
    trials = starts = 0
    gpu = 0.0
    for run in range(runs):
        o, n, st, g = one_search(surface, config, server, seed, run)
        outs.append(o)
        trials, starts, gpu = trials + n, starts + st, gpu + g
    c = combine_runs(outs)
    low, high, est = c.low, c.high, c.estimate
    lo1, hi1 = outs[0].lo, outs[0].hi
    return Result(
        "sla-search", config.config_id, seed, r_med, r_pool, trials, starts, gpu * tp, est,
        within5_med=_within(est, r_med), within5_pool=_within(est, r_pool),
        runs=c.runs, bracketed=c.bracketed, low=low, high=high, met_every=c.met_in_every_run,
        covered_med=low is not None and high is not None and low <= r_med <= high,
        covered_pool=low is not None and high is not None and low <= r_pool <= high,
        rel_width=(high - low) / est if low is not None and high is not None and est else math.inf,
        safe_pool=None if c.met_in_every_run is None else c.met_in_every_run <= r_pool,
        run1_lo=lo1, run1_hi=hi1,
        run1_covered_med=(lo1 or 0.0) <= r_med <= (hi1 if hi1 is not None else math.inf),
        reasons=[str(o.reason) for o in outs], non_monotone=sum(o.non_monotone for o in outs),
        probes=[[(r, v) for r, v in o.probes] for o in outs])


def _measured_meets(surface: Surface, metrics: dict[str, Any]) -> bool:
    """auto_tune's judgement: the measured percentile within the bound (no interval, errors not looked at)."""
    for s in metrics.get("slos") or []:
        if s.get("value_ms") is None or s["value_ms"] > s["max_ms"]:
            return False
    return bool(metrics.get("slos"))


def auto_tune(surface: Surface, config: EngineConfig, server: SimServer, seed: int, r_med: float,
              r_pool: float) -> Result:
    tp = config.args.tensor_parallel_size or 1
    gpu = start_s(surface.spec, config)
    s = _seed("autotune", seed, config.config_id, "inf")
    t = run_trial(surface, server, _lp(surface, rate=None, n=AT_INF_PROMPTS, seed=s,
                                       max_concurrency=AT_INF_PROMPTS), s)
    trials = 1
    gpu += t.span_s + TRIAL_OVERHEAD_S
    probes: list[tuple[float, str]] = []
    answer: float | None
    if _measured_meets(surface, t.metrics):
        answer = math.inf
        probes.append((math.inf, "meets"))
    else:
        probes.append((math.inf, "misses"))
        rate = int(float(t.metrics.get("request_throughput") or 0.0)) + 1
        answer = 0.0
        while rate > 0:
            s = _seed("autotune", seed, config.config_id, rate)
            t = run_trial(surface, server, _lp(surface, rate=float(rate), n=AT_STEP_PROMPTS, seed=s), s)
            trials += 1
            gpu += t.span_s + TRIAL_OVERHEAD_S + AT_SLEEP_S
            ok = _measured_meets(surface, t.metrics)
            probes.append((float(rate), "meets" if ok else "misses"))
            if ok:
                answer = float(rate)
                break
            rate -= 1
    return Result("auto_tune", config.config_id, seed, r_med, r_pool, trials, 1, gpu * tp, answer,
                  within5_med=_within(answer, r_med), within5_pool=_within(answer, r_pool), probes=[probes])


# --- the verdict's interval, checked -----------------------------------------------------------------

def ci_check(surface: Surface, config: EngineConfig, server: SimServer, r_star: float, trials: int,
             factors: Sequence[float] = (0.9, 1.0, 1.05, 1.1)) -> list[dict[str, Any]]:
    """At ``factor x r*``, ``trials`` noisy trials: per SLO, how often a trial's 95% interval on its
    percentile (``rank_low_ms``..``rank_high_ms``, what :func:`servetune.sla.verdict` reads) holds the
    percentile of the latencies pooled over all the trials, the trial-to-trial sd of the percentile
    against the interval's mean half-width, and the verdicts."""
    rows = []
    for f in factors:
        rate = r_star * f
        pools: list[list[float]] = [[] for _ in surface.spec.slos]
        ms: list[dict[str, Any]] = []
        verdicts: dict[str, int] = {}
        for k in range(trials):
            sd = _seed("ci-check", k, config.config_id, repr(rate))
            t = run_trial(surface, server, _lp(surface, rate=rate, n=surface.n_requests, seed=sd), sd)
            ms.append(t.metrics)
            v = verdict("ok", t.metrics)
            verdicts[v] = verdicts.get(v, 0) + 1
            for x in t.samples:
                if x.warmup:
                    continue
                lat = per_request_latencies(x) if x.error is None else {}
                for i, slo in enumerate(surface.spec.slos):
                    val = lat.get(slo.metric) if x.error is None else math.inf
                    if val is not None:
                        pools[i].append(val)
        for i, slo in enumerate(surface.spec.slos):
            pooled = quantile(pools[i], slo.percentile / 100)
            res = [m["slos"][i] for m in ms]
            pairs = [(r["rank_low_ms"], r["rank_high_ms"]) for r in res
                     if r["rank_low_ms"] is not None and r["rank_high_ms"] is not None]
            rows.append({
                "factor": f, "rate": rate, "slo": f"{slo.metric} p{slo.percentile:g} <= {slo.max_ms:g} ms",
                "pooled_ms": pooled, "trials": trials,
                "ci_covers": sum(a <= pooled <= b for a, b in pairs),
                "sd_ms": statistics.stdev([r["value_ms"] for r in res]) if trials > 1 else None,
                "ci_half_width_ms": statistics.mean((b - a) / 2 for a, b in pairs) if pairs else None,
                "verdicts": verdicts})
    return rows


# --- driver -------------------------------------------------------------------------------------------

@dataclass
class Picked:
    config: EngineConfig
    server: SimServer
    r_med: float
    r_pool: float


def pick_configs(surface: Surface, k: int, cache: Path | None, draws: int = TRUTH_DRAWS
                 ) -> tuple[list[Picked], list[dict[str, Any]]]:
    """``k`` configs that start and have finite boundaries (both truths), in a seeded random order of
    the grid; the configs skipped on the way (no start, or no finite boundary)."""
    configs = [EngineConfig(args=a, env=e) for a, e in surface.spec.engine.expand()]
    random.Random(f"slabench:{surface.name}").shuffle(configs)
    backend = surface.spec.backend.model_copy(update={"noise": True})
    picked: list[Picked] = []
    skipped: list[dict[str, Any]] = []
    for c in configs:
        if len(picked) >= k:
            break
        try:
            server = sim_server(backend, c)
        except SimStartError:
            skipped.append({"config_id": c.config_id, "why": "does not start"})
            continue
        t0 = time.perf_counter()
        truth = Truth(surface, c, server, cache, draws)
        r_med, r_pool = truth.solve()
        if r_med is None or r_pool is None:
            kind = "med" if r_med is None else "pool"
            hi = truth.bracket[kind][1]
            why = (f"{kind}: every rate up to 1e5 req/s meets" if hi is None else
                   f"{kind}: no rate down to 1e-3 req/s meets")
            skipped.append({"config_id": c.config_id, "label": c.label(), "why": why})
            log(f"  {surface.name}: skip {c.label()} ({why}) [{time.perf_counter() - t0:.1f}s]")
            continue
        log(f"  {surface.name}: truth r*_med={r_med:.4g} r*_pool={r_pool:.4g} req/s for {c.label()} "
            f"({len(truth.pooled_at)} rates x {draws} draws) [{time.perf_counter() - t0:.1f}s]")
        picked.append(Picked(c, server, r_med, r_pool))
    return picked, skipped


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _pct(n: int, d: int) -> float | None:
    return 100.0 * n / d if d else None


def summarize(results: list[Result]) -> dict[str, Any]:
    out: dict[str, Any] = {"cases": len(results)}
    if not results:
        return out
    n = len(results)
    out["trials_median"] = _median([r.trials for r in results])
    out["starts_median"] = _median([r.starts for r in results])
    out["gpu_s_median"] = _median([r.gpu_s for r in results])
    out["within5_med_pct"] = _pct(sum(r.within5_med for r in results), n)
    out["within5_pool_pct"] = _pct(sum(r.within5_pool for r in results), n)
    out["answer_over_rmed_median"] = _median([r.answer / r.r_med for r in results if r.answer is not None])
    if results[0].method == "sla-search":
        out["coverage_med_pct"] = _pct(sum(bool(r.covered_med) for r in results), n)
        out["coverage_pool_pct"] = _pct(sum(bool(r.covered_pool) for r in results), n)
        out["low_above_rmed"] = sum(r.low is not None and r.low > r.r_med for r in results)
        out["high_below_rmed"] = sum(r.high is not None and r.high < r.r_med for r in results)
        out["no_interval"] = sum(r.low is None or r.high is None for r in results)
        out["low_above_rpool"] = sum(r.low is not None and r.low > r.r_pool for r in results)
        out["high_below_rpool"] = sum(r.high is not None and r.high < r.r_pool for r in results)
        out["rel_width_median"] = _median([r.rel_width if r.rel_width is not None else math.inf for r in results])
        out["safe_pool_pct"] = _pct(sum(bool(r.safe_pool) for r in results), n)
        out["met_every_none"] = sum(r.met_every is None for r in results)
        out["met_every_over_rpool_median"] = _median([r.met_every / r.r_pool for r in results
                                                      if r.met_every is not None])
        out["run1_coverage_med_pct"] = _pct(sum(bool(r.run1_covered_med) for r in results), n)
        out["run1_lo_above_rmed"] = sum(r.run1_lo is not None and r.run1_lo > r.r_med for r in results)
        out["run1_hi_below_rmed"] = sum(r.run1_hi is not None and r.run1_hi < r.r_med for r in results)
        reasons: dict[str, int] = {}
        for r in results:
            for why in r.reasons:
                reasons[why] = reasons.get(why, 0) + 1
        out["reasons"] = reasons
        out["non_monotone_runs"] = sum(r.non_monotone for r in results)
    else:
        out["answers_inf"] = sum(r.answer is not None and math.isinf(r.answer) for r in results)
        out["answers_zero"] = sum(r.answer == 0 for r in results)
        out["rmed_under_20"] = sum(r.r_med < 20 for r in results)
    return out


def _f(x: Any, fmt: str = "{:.0f}") -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return fmt.format(x)


def markdown(report: dict[str, Any]) -> str:
    runs = report["runs"]
    lines = ["# SLA search (repeats, combine_runs) vs auto_tune.sh linear descent (SIMULATED)", "",
             f"Per surface: {report['configs']} engine configs x {report['seeds']} seeds; open-loop Poisson probes of "
             f"N requests. Truths from the same {report['truth_draws']} noisy draws per rate (0.5% bisection): "
             "r*_med = typical run's boundary (per SLO, the median over draws of each draw's own percentile), "
             "r*_pool = pooled-percentile boundary (secondary). "
             f"Ours: {runs} independent runs per case (each its own search: servetune.sla, first round 0.5..64 req/s, "
             "floor/ceiling = search_range(0.5, 64), 3 rates/round, rel_tol 0.05, <= 8 rounds), combined by "
             "servetune.sla.combine_runs: estimate, 95% t-interval [low, high], met_in_every_run. Trials, starts "
             "and GPU-s are summed over the runs. auto_tune: 1 start, rate-inf run of 1000 prompts, then "
             "int(throughput)+1 down by 1 req/s, 100 prompts + 5 s sleep per step. Medians over configs x seeds.", "",
             "| surface (N) | method | cases | median trials | median starts | median GPU-s | % within 5% of r*_med "
             "| % within 5% of r*_pool | coverage of [low, high] on r*_med | on r*_pool | median (high-low)/estimate "
             "| % met_in_every_run <= r*_pool | run 1's [lo, hi] coverage on r*_med |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for s in report["surfaces"]:
        for m in ("sla-search", "auto_tune"):
            x = s["summary"][m]
            if m == "sla-search":
                extra = (f"{_f(x.get('coverage_med_pct'), '{:.0f}%')} | {_f(x.get('coverage_pool_pct'), '{:.0f}%')} | "
                         f"{_f(x.get('rel_width_median'), '{:.3f}')} | {_f(x.get('safe_pool_pct'), '{:.0f}%')} | "
                         f"{_f(x.get('run1_coverage_med_pct'), '{:.0f}%')}")
                label = f"sla-search x{runs}"
            else:
                extra = "n/a (point) | n/a | n/a | n/a | n/a"
                label = m
            lines.append(f"| {s['surface']} ({s['n_requests']}) | {label} | {x['cases']} | {_f(x.get('trials_median'))} | "
                         f"{_f(x.get('starts_median'))} | {_f(x.get('gpu_s_median'))} | "
                         f"{_f(x.get('within5_med_pct'), '{:.0f}%')} | {_f(x.get('within5_pool_pct'), '{:.0f}%')} | "
                         f"{extra} |")
    tot = report.get("totals")
    if tot:
        lines.append(f"| **all** | sla-search x{runs} | {tot['cases']} | | | | {_f(tot['within5_med_pct'], '{:.0f}%')} | "
                     f"{_f(tot['within5_pool_pct'], '{:.0f}%')} | {_f(tot['coverage_med_pct'], '{:.0f}%')} | "
                     f"{_f(tot['coverage_pool_pct'], '{:.0f}%')} | | {_f(tot['safe_pool_pct'], '{:.0f}%')} | "
                     f"{_f(tot['run1_coverage_med_pct'], '{:.0f}%')} |")
    lines += ["", "Details per surface:", ""]
    for s in report["surfaces"]:
        o, a = s["summary"]["sla-search"], s["summary"]["auto_tune"]
        rs = ", ".join(f"{m:.3g}/{p:.3g}" for m, p in zip(s["r_med"], s["r_pool"]))
        lines.append(
            f"- **{s['surface']}**: r*_med/r*_pool = {rs} req/s; skipped configs: {len(s['skipped'])}. "
            f"Ours: median estimate / r*_med {_f(o.get('answer_over_rmed_median'), '{:.3f}')}; on r*_med low > r* in "
            f"{o.get('low_above_rmed')}, high < r* in {o.get('high_below_rmed')}, no interval in {o.get('no_interval')} "
            f"cases; on r*_pool low > r* in {o.get('low_above_rpool')}, high < r* in {o.get('high_below_rpool')}; "
            f"median met_in_every_run / r*_pool {_f(o.get('met_every_over_rpool_median'), '{:.3f}')} "
            f"(none met in some run: {o.get('met_every_none')}); run 1's bracket lo > r*_med in "
            f"{o.get('run1_lo_above_rmed')}, hi < r*_med in {o.get('run1_hi_below_rmed')}; runs stopped "
            f"{o.get('reasons')}, non-monotone runs {o.get('non_monotone_runs')}. auto_tune: median answer / r*_med "
            f"{_f(a.get('answer_over_rmed_median'), '{:.3f}')}, answered inf {a.get('answers_inf')}, "
            f"0 {a.get('answers_zero')} times; cases with r*_med < 20 req/s: {a.get('rmed_under_20')}.")
    checks = [(s["surface"], c) for s in report["surfaces"] for c in s.get("ci_check") or []]
    if checks:
        lines += ["", "The verdict's per-trial rank bounds on a percentile, checked (each surface's first config, "
                  "noisy trials at factor x r*_pool; pooled = the percentile of all their latencies together):", "",
                  "| surface | rate / r* | SLO | pooled | trial-to-trial sd | mean rank-bound half-width | bounds hold "
                  "pooled | verdicts |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for name, c in checks:
            v = ", ".join(f"{k} {n}" for k, n in sorted(c["verdicts"].items()))
            lines.append(f"| {name} | {c['factor']:.2f} | {c['slo']} | {c['pooled_ms']:.4g} | {_f(c['sd_ms'], '{:.3g}')} | "
                         f"{_f(c['ci_half_width_ms'], '{:.3g}')} | {c['ci_covers']}/{c['trials']} | {v} |")
    return "\n".join(lines) + "\n"


def totals(results: list[Result]) -> dict[str, Any]:
    n = len(results)
    return {"cases": n, "within5_med_pct": _pct(sum(r.within5_med for r in results), n),
            "within5_pool_pct": _pct(sum(r.within5_pool for r in results), n),
            "coverage_med_pct": _pct(sum(bool(r.covered_med) for r in results), n),
            "coverage_pool_pct": _pct(sum(bool(r.covered_pool) for r in results), n),
            "safe_pool_pct": _pct(sum(bool(r.safe_pool) for r in results), n),
            "run1_coverage_med_pct": _pct(sum(bool(r.run1_covered_med) for r in results), n)}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.search.sla", description=__doc__.split("\n\n")[0])
    ap.add_argument("--surfaces", default="all", help="all, or comma-separated names: " + ", ".join(SURFACES))
    ap.add_argument("--configs", type=int, default=4, help="engine configs per surface")
    ap.add_argument("--seeds", type=int, default=10, help="noise seeds per config and method")
    ap.add_argument("--runs", type=int, default=3, help="R: independent searches per (config, seed), combined")
    ap.add_argument("--truth-draws", type=int, default=TRUTH_DRAWS, help="K: noisy draws per truth rate")
    ap.add_argument("--ci-check", type=int, default=0, metavar="TRIALS",
                    help="also check the verdict's rank bounds: TRIALS trials at 0.9..1.1 x r*_pool of each "
                         "surface's first config")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="truth cache folder")
    ap.add_argument("--no-cache", action="store_true")
    ap.add_argument("--out", type=Path, help="write every case and the summary as JSON")
    ap.add_argument("--markdown", type=Path, help="write the table as Markdown")
    args = ap.parse_args(argv)
    names = list(SURFACES) if args.surfaces == "all" else args.surfaces.split(",")
    for n in names:
        if n not in SURFACES:
            ap.error(f"unknown surface {n!r}")
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    cache = None if args.no_cache else args.cache
    t_all = time.perf_counter()
    report: dict[str, Any] = {"configs": args.configs, "seeds": args.seeds, "runs": args.runs,
                              "truth_draws": args.truth_draws, "surfaces": []}
    all_ours: list[Result] = []
    for name in names:
        t0 = time.perf_counter()
        surface = open_loop_surface(name)
        picked, skipped = pick_configs(surface, args.configs, cache, args.truth_draws)
        results: dict[str, list[Result]] = {"sla-search": [], "auto_tune": []}
        for p in picked:
            t1 = time.perf_counter()
            for seed in range(args.seeds):
                results["sla-search"].append(sla_search(surface, p.config, p.server, seed, p.r_med, p.r_pool,
                                                        args.runs))
                results["auto_tune"].append(auto_tune(surface, p.config, p.server, seed, p.r_med, p.r_pool))
            ours, at = results["sla-search"][-args.seeds:], results["auto_tune"][-args.seeds:]
            log(f"{name}: {p.config.label()} r*_med={p.r_med:.4g} r*_pool={p.r_pool:.4g}: ours within5 "
                f"{sum(r.within5_med for r in ours)}/{args.seeds} covered_med "
                f"{sum(bool(r.covered_med) for r in ours)}/{args.seeds} trials~{_median([r.trials for r in ours])}"
                f"; auto_tune within5 {sum(r.within5_med for r in at)}/{args.seeds} "
                f"trials~{_median([r.trials for r in at])} [{time.perf_counter() - t1:.1f}s]")
        all_ours += results["sla-search"]
        checks = ci_check(surface, picked[0].config, picked[0].server, picked[0].r_pool, args.ci_check) \
            if args.ci_check and picked else []
        report["surfaces"].append({
            "surface": name, "n_requests": surface.n_requests, "skipped": skipped,
            "r_med": [p.r_med for p in picked], "r_pool": [p.r_pool for p in picked],
            "configs": [p.config.label() for p in picked],
            "summary": {m: summarize(rs) for m, rs in results.items()},
            "cases": {m: [asdict(r) for r in rs] for m, rs in results.items()},
            "ci_check": checks, "wall_s": time.perf_counter() - t0})
        log(f"{name}: done in {time.perf_counter() - t0:.1f}s")
    report["totals"] = totals(all_ours)
    report["wall_s"] = time.perf_counter() - t_all
    md = markdown(report)
    print(md)
    if args.markdown:
        args.markdown.write_text(md)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1, default=str))
    log(f"total {report['wall_s']:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
