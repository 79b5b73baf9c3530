"""Drive the real planners (:mod:`coordinator.planning`) ask/tell on simulated surfaces and judge
each one on the simulator's noiseless truth. SIMULATED.

The benchmark plays the coordinator: it asks a planner, "runs" each asked config (a seeded noisy
draw of the simulator, the metrics the sweep would record), tells the planner the config's trial,
and after every trial names the planner's current best config the way the product ranks
(:func:`servetune.ranking.rank`: SLO tier, then the objective, on the noisy results). A run hits
at the first trial after which that config's TRUE SLO-constrained objective is within 2% of the
grid's true optimum; a run that never hits within its budget is censored.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.search.surfaces import surface_spec
from benchmarks.search.truth import Cache, summary, true_value
from coordinator.planning import Planner, create_planner
from coordinator.planning.adaptive import OptunaPlanner
from coordinator.planning.halving import HalvingPlanner
from servetune.manifest import EngineConfig
from servetune.ranking import TrialSummary, rank
from servetune.spec import ExperimentSpec

TOLERANCE = 0.02
#: the quasi-random design's size, as a fraction of the grid (the target's budget)
QUASI_FRACTION = 0.15


class TPEStartup5(OptunaPlanner):
    """Benchmark-only variant: the optuna planner with TPE's ``n_startup_trials=5`` (default 10); the
    product's ``sampler: tpe`` cannot set it. Everything else is the product planner."""

    def _sampler(self, seed: int) -> Any:
        import optuna

        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=5)


class PlainOptunaTPE(OptunaPlanner):
    """Benchmark-only baseline: Optuna's TPE with its default settings over every config of the grid,
    as Optuna alone gives it: the product planner with servetune's start check turned off, so a
    config vLLM would refuse to start is asked, started and paid for like any other."""

    def cannot_run(self, config: EngineConfig) -> bool:
        return False


@dataclass(frozen=True)
class PlannerCase:
    """One planner of the benchmark: its ``planner`` section (per seed and grid size) and, for a
    benchmark-only variant, the class that replaces the registered one."""

    name: str
    section: Callable[[int, int], dict[str, Any]]
    cls: type[Planner] | None = None
    note: str = ""


PLANNERS: dict[str, PlannerCase] = {c.name: c for c in [
    PlannerCase("grid", lambda seed, n: {"kind": "grid", "randomize": False, "seed": seed},
                note="every config in the engine space's order"),
    PlannerCase("random", lambda seed, n: {"kind": "random", "n_configs": n, "randomize": True, "seed": seed},
                note="every config, in a seeded random order"),
    PlannerCase("quasi-random", lambda seed, n: {"kind": "quasi-random", "n_configs": math.ceil(QUASI_FRACTION * n),
                                                  "randomize": True, "seed": seed},
                note=f"{QUASI_FRACTION:.0%} of the grid by scrambled Sobol, run in a seeded random order"),
    PlannerCase("tpe", lambda seed, n: {"kind": "optuna", "sampler": "tpe", "n_trials": n, "batch": 1, "seed": seed},
                note="sampler: tpe, Optuna's TPESampler with its default settings (seed only), never asking a "
                     "config that cannot run (servetune's start check)"),
    PlannerCase("tpe-plain", lambda seed, n: {"kind": "optuna", "sampler": "tpe", "n_trials": n, "batch": 1,
                                               "seed": seed}, cls=PlainOptunaTPE,
                note="benchmark-only baseline: Optuna's TPESampler, default settings, every grid config askable "
                     "(no start check: configs vLLM refuses are started and paid for)"),
    PlannerCase("tpe-startup5", lambda seed, n: {"kind": "optuna", "sampler": "tpe", "n_trials": n, "batch": 1,
                                                  "seed": seed}, cls=TPEStartup5,
                note="benchmark-only: TPESampler(n_startup_trials=5)"),
    PlannerCase("tpe-batch4", lambda seed, n: {"kind": "optuna", "sampler": "tpe", "n_trials": n, "batch": 4,
                                                "seed": seed},
                note="sampler: tpe, batch: 4 (four daemons asking at once: 4 configs per ask, constant liar)"),
    PlannerCase("halving", lambda seed, n: {"kind": "halving", "n_configs": math.ceil(QUASI_FRACTION * n), "eta": 3,
                                             "seed": seed},
                note=f"successive halving: {QUASI_FRACTION:.0%} of the grid drawn at random at 1/9 of the load point, "
                     "the best third at 1/3, the best third of those in full"),
    PlannerCase("gp", lambda seed, n: {"kind": "optuna", "sampler": "gp", "n_trials": n, "batch": 1, "seed": seed},
                note="sampler: gp, Optuna's GPSampler, default settings"),
    PlannerCase("nsga2", lambda seed, n: {"kind": "optuna", "sampler": "nsga2", "n_trials": n, "batch": 1, "seed": seed},
                note="sampler: nsga2 (objective and SLO latency), population 2 as the planner sets it at batch 1"),
]}


@dataclass
class RunResult:
    planner: str
    seed: int
    budget: int
    hit: int | None  # trials until the current best was within 2% on the truth (None: censored)
    gpu_s_to_hit: float | None
    gpu_s_total: float
    trials_run: int
    wall_s: float


@dataclass
class SurfaceTruth:
    spec: ExperimentSpec
    configs: list[EngineConfig]
    values: dict[str, float]  # config_id -> true SLO-constrained objective (-inf: infeasible or no start)
    optimum: float
    optimum_ids: list[str]
    within: int  # configs within 2% of the optimum
    n_start_fail: int
    wall_s: float
    grid_gpu_s: float = field(default=0.0)


def thin(spec: ExperimentSpec, stride: int) -> ExperimentSpec:
    """``spec`` with every ``stride``-th value of each grid axis (quick mode and tests: a small grid)."""
    grid = spec.engine.model_dump(mode="json", exclude_none=True)["grid"]
    engine = spec.engine.model_validate({"grid": {k: v[::stride] for k, v in grid.items()}})
    return spec.model_copy(update={"engine": engine})


def surface_truth(name: str, cache: Cache) -> SurfaceTruth:
    """The truth of every config of surface ``name``."""
    t0 = time.process_time()
    spec = cache.spec
    configs = [EngineConfig(args=a, env=e) for a, e in spec.engine.expand()]
    outcomes = {c.config_id: cache.get(c, None) for c in configs}
    values = {k: true_value(spec, o) for k, o in outcomes.items()}
    opt = max(values.values())
    if not opt > 0:
        raise ValueError(f"surface {name}: no config meets the SLOs on the truth")
    return SurfaceTruth(spec, configs, values, opt, [k for k, v in values.items() if v == opt],
                        sum(1 for v in values.values() if v >= (1 - TOLERANCE) * opt),
                        sum(1 for o in outcomes.values() if o.metrics is None), time.process_time() - t0,
                        sum(o.gpu_s for o in outcomes.values()))


def drive(truth: SurfaceTruth, cache: Cache, case: PlannerCase, seed: int) -> RunResult:
    """One run of ``case`` under ``seed`` on the surface: ask, simulate, tell, judge, until it hits or is done."""
    t0 = time.process_time()
    base = truth.spec
    n = len(truth.configs)
    spec = base.model_copy(update={"planner": base.planner.model_validate(case.section(seed, n))})
    planner = case.cls(spec) if case.cls is not None else create_planner(spec)
    target = (1 - TOLERANCE) * truth.optimum
    best: list[TrialSummary] = []
    gpu = 0.0
    trials = 0
    hit: int | None = None
    gpu_hit: float | None = None
    first = True
    budget = 0
    fidelity: dict[str, float] = {}
    while not planner.done:
        if first and not planner.adaptive:  # the sweep's order of a fixed design: pruned and randomised as planned
            asked = [b.config for b in planner.plan().batches if not b.is_baseline]
            budget = len(asked)
        else:
            at = planner.ask_at()
            asked = [c for c, _ in at]
            fidelity = {c.config_id: f for c, f in at}
        first = False
        if not asked:
            break
        for config in asked:
            f = fidelity.get(config.config_id, 1.0) if planner.adaptive else 1.0
            outcome = cache.get(config, seed, f)
            told = summary(spec, config, outcome)
            trials += 1
            gpu += outcome.gpu_s
            if planner.adaptive:
                planner.tell_at(config, f, [told])
            if f < 1.0:
                continue  # a screening trial: never a result (the product ranks full-fidelity trials only)
            rows = rank(best + [told], spec.ranking)[told.load_point]
            if rows[0].config_id == told.config_id:
                best = [told]
            # a fixed design runs one config after another (judged after each); an adaptive batch's
            # configs run at once, one per daemon: judged when the whole batch is in, every trial paid
            if not planner.adaptive and truth.values.get(best[0].config_id, -math.inf) >= target:
                hit, gpu_hit = trials, gpu
                break
        if planner.adaptive and best and truth.values.get(best[0].config_id, -math.inf) >= target:
            hit, gpu_hit = trials, gpu
        if hit is not None:
            break
    if planner.adaptive:
        budget = planner.n_trials if isinstance(planner, OptunaPlanner) else \
            sum(planner.sizes) if isinstance(planner, HalvingPlanner) else trials
    return RunResult(case.name, seed, budget, hit, gpu_hit, gpu, trials, time.process_time() - t0)


def median_ci(xs: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Median and the distribution-free order-statistic interval for it (``inf`` stands for a censored
    run, which is larger than any budget: a median or bound that lands on one is reported as censored)."""
    s = sorted(xs)
    n = len(s)
    med = s[(n - 1) // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
    # largest j with P(Bin(n, 1/2) < j) <= (1 - level) / 2: [x_(j), x_(n+1-j)] covers the median
    alpha = (1 - level) / 2
    cum, j = 0.0, 0
    while True:
        p = math.comb(n, j) / 2**n
        if cum + p > alpha:
            break
        cum += p
        j += 1
    lo, hi = (s[j - 1], s[n - j]) if j >= 1 else (-math.inf, math.inf)
    return med, lo, hi


def summarize_runs(runs: Sequence[RunResult], grid_size: int) -> dict[str, Any]:
    hits = [r.hit if r.hit is not None else math.inf for r in runs]
    med, lo, hi = median_ci(hits)
    gpu = [r.gpu_s_to_hit if r.gpu_s_to_hit is not None else math.inf for r in runs]
    gmed, _, _ = median_ci(gpu)
    return {"median": med, "lo": lo, "hi": hi, "median_pct": 100 * med / grid_size, "lo_pct": 100 * lo / grid_size,
            "hi_pct": 100 * hi / grid_size, "gpu_s_median": gmed, "censored": sum(r.hit is None for r in runs),
            "n": len(runs), "budget": max(r.budget for r in runs),
            "gpu_s_spent_median": statistics.median(r.gpu_s_total for r in runs),
            "cpu_s": sum(r.wall_s for r in runs)}


def run_surface(name: str, planners: Sequence[str], seeds: Sequence[int], cache_dir: Path | None,
                stride: int | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    spec = thin(surface_spec(name), stride) if stride else surface_spec(name)
    cache = Cache(cache_dir, spec)
    truth = surface_truth(name, cache)
    cache.save()
    n = len(truth.configs)
    log(f"{name}: {n} configs, {truth.n_start_fail} would not start, optimum {truth.optimum:.4g} "
        f"({spec.ranking.objective}), {truth.within} within 2%; truth in {truth.wall_s:.1f} s CPU")
    out: dict[str, Any] = {"surface": name, "grid": n, "start_fail": truth.n_start_fail, "optimum": truth.optimum,
                           "objective": spec.ranking.objective, "within": truth.within,
                           "feasible": sum(1 for v in truth.values.values() if v > -math.inf),
                           "grid_gpu_s": truth.grid_gpu_s, "truth_cpu_s": truth.wall_s, "planners": {}, "runs": []}
    for p in planners:
        runs = [drive(truth, cache, PLANNERS[p], s) for s in seeds]
        cache.save()
        stats = summarize_runs(runs, n)
        out["planners"][p] = stats
        out["runs"] += [r.__dict__ for r in runs]
        log(f"  {p:13s} median {stats['median']:.1f} trials ({stats['median_pct']:.1f}% of grid) "
            f"[{stats['lo']:.0f}, {stats['hi']:.0f}], censored {stats['censored']}/{stats['n']}, "
            f"GPU-s to hit {stats['gpu_s_median']:.0f}; {stats['cpu_s']:.1f} s CPU")
    return out
