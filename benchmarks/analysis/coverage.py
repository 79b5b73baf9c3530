"""Coverage of the analysis' 95% intervals on planted surfaces (SYNTHETIC data with known truth).

``python -m benchmarks.analysis.coverage [--seeds N] [--small-seeds M] [--quick] [--no-write]``

Each seed draws one :func:`analysis.synthetic.planted` experiment on :data:`SURFACE` (7 parameters:
a large, two medium and a small (+3%) effect, an interaction, two no-effect parameters and one
that only drives an OOM region; 3 repeats per config) at two sizes (about 30 and 400 trials),
runs the analyses the report runs (one shared surrogate: the main-effects regression, the 1-D
partial dependence of every parameter, the interactions, the verdicts) and checks every stated
interval against the truth computed from the planted formula on the same analysed rows:

- **main effect** and **PD change**: the change from the first to the last grid value, averaged
  over the other parameters as observed (``mean_r f(hi, x_r) - f(lo, x_r)`` on the log scale,
  reported as a ratio minus one);
- **PD bands**: the geometric-mean metric at each grid value (``exp(mean_r f(v, x_r))``);
- **interaction strength** and **H²**: Friedman's statistics of the planted formula itself on the
  same row sample the analysis uses (:func:`analysis.interactions.h2_statistics`);
- **false "important"**: how often a no-effect parameter's one verdict is ``important``.

An interval the analysis declines to state (NaN bounds with a ``no_interval`` caveat: at 10 configs
the regressions cannot be fitted and the forest's refits under-cover a change, a 2-D surface and an
interaction) is counted in the "not stated" column, never as covered. Each coverage comes with its
Monte-Carlo error (a 95% Wilson interval of the observed share; intervals of one seed are
correlated, so the real error is somewhat larger) beside the range a calibrated interval shows.

Progress goes to stderr; the table goes to the "coverage" section of ``benchmarks/RESULTS.md``
(``--no-write`` prints it instead). Nothing here is a measurement of a server.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from analysis.effects import partial_dependence_from
from analysis.interactions import h2_statistics, interactions_from
from analysis.main_effects import main_effects_from
from analysis.surrogate import Surrogate, clear_cache, fit_surrogate, grid_codes, sample_rows
from analysis.synthetic import Truth, planted
from analysis.verdict import parameter_verdicts

PARAMS = ("max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill", "gpu_memory_utilization",
          "enable_prefix_caching", "enforce_eager", "dtype")
SURFACE: dict[str, float] = {"max_num_seqs": 1.0, "max_num_batched_tokens": 0.4, "enable_chunked_prefill": 0.15,
                             "enable_prefix_caching": math.log(1.03)}
ROLE = {"max_num_seqs": "large", "max_num_batched_tokens": "medium (+ interaction)",
        "enable_chunked_prefill": "medium (+ interaction)", "enable_prefix_caching": "small (+3%)",
        "gpu_memory_utilization": "none (drives failures)", "enforce_eager": "none", "dtype": "none"}
NULLS = ("enforce_eager", "dtype", "gpu_memory_utilization")
SIZES = {"small": (10, 3), "large": (133, 3)}  # configs, repeats -> about 30 and 400 trials
NOISE = 0.05
H_ROWS = 80
BEGIN = "<!-- coverage:begin (written by `python -m benchmarks.analysis.coverage`; edits inside are overwritten) -->"
END = "<!-- coverage:end -->"
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Tally:
    """Counts of intervals that covered the truth, by (size, kind), and verdicts by (size, parameter)."""

    covered: dict[tuple[str, str], list[bool]] = field(default_factory=lambda: defaultdict(list))
    #: (size, kind) -> how many intervals the analysis declined to state (NaN bounds: caveat no_interval)
    refused: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    important: dict[tuple[str, str], list[bool]] = field(default_factory=lambda: defaultdict(list))
    warned: dict[tuple[str, str], list[bool]] = field(default_factory=lambda: defaultdict(list))
    seeds: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    contains_estimate: list[bool] = field(default_factory=list)

    def merge(self, other: Tally) -> None:
        for mine, theirs in ((self.covered, other.covered), (self.important, other.important),
                             (self.warned, other.warned)):
            for key, xs in theirs.items():
                mine[key].extend(xs)
        for size, n in other.seeds.items():
            self.seeds[size] += n
        for key, n in other.refused.items():
            self.refused[key] += n
        self.contains_estimate.extend(other.contains_estimate)

    def add(self, size: str, kind: str, low: float, high: float, truth: float, estimate: float) -> None:
        if not (math.isfinite(low) and math.isfinite(high)):
            self.refused[(size, kind)] += 1
            return
        self.covered[(size, kind)].append(bool(low <= truth <= high))
        self.contains_estimate.append(bool(low <= estimate <= high))


def dataset(size: str, seed: int) -> tuple[Any, Truth]:
    configs, repeats = SIZES[size]
    return planted(n_configs=configs, params=PARAMS, repeats=repeats, effects=SURFACE, noise=NOISE, seed=seed)


class TrueModel:
    """The planted formula behind a ``predict`` on the surrogate's encoded rows (the probe is ignored)."""

    def __init__(self, sur: Surrogate, truth: Truth) -> None:
        self.sur, self.truth = sur, truth

    def predict(self, X: np.ndarray) -> np.ndarray:
        cols = []
        for j, f in enumerate(self.sur.features):
            uniq, inv = np.unique(X[:, j], return_inverse=True)
            vals = [f.param.decode(float(c)) for c in uniq]
            cols.append([vals[i] for i in np.asarray(inv).reshape(-1)])
        names = [f.name for f in self.sur.features]
        return np.array([self.truth.log_throughput(dict(zip(names, row))) for row in zip(*cols)])


def true_levels(sur: Surrogate, truth: Truth, j: int, codes: np.ndarray) -> np.ndarray:
    """Mean planted log metric over the analysed rows with feature ``j`` set to each code."""
    model = TrueModel(sur, truth)
    X = sur.X[:, :len(sur.features)]
    out = []
    for c in codes:
        Xv = X.copy()
        Xv[:, j] = c
        out.append(float(model.predict(Xv).mean()))
    return np.array(out)


def run_seed(size: str, seed: int, tally: Tally, n_boot: int = 50, full: bool = True) -> None:
    """Analyse one seeded dataset and add its intervals and verdicts to ``tally`` (``full=False``:
    the verdicts only)."""
    ds, truth = dataset(size, seed)
    clear_cache()
    sur = fit_surrogate(ds, seed=seed)
    tally.seeds[size] += 1
    verdicts = parameter_verdicts(sur)
    for f in sur.features:
        tally.important[(size, f.name)].append(verdicts[f.name].verdict == "important")
    if not full:
        return
    me = main_effects_from(sur)
    for j, f in enumerate(sur.features):
        codes = grid_codes(f, 12)
        lv = true_levels(sur, truth, j, codes)
        true_change = math.exp(lv[-1] - lv[0]) - 1.0
        eff = me.get(f.name)
        if eff is not None:
            tally.add(size, "main effect (regression): change first -> last level", eff.change.low,
                      eff.change.high, true_change, eff.change.estimate)
        pdr = partial_dependence_from(sur, ds, f.name, n_boot=n_boot, ice=False)
        if pdr.change is not None:
            tally.add(size, f"PD change ({pdr.bands} intervals)", pdr.change.low, pdr.change.high, true_change,
                      pdr.change.estimate)
        for v, e, lo, hi in zip(lv, pdr.estimate, pdr.low, pdr.high):
            tally.add(size, f"PD bands per grid value ({pdr.bands})", lo, hi, math.exp(v), e)
    fired = {w.code for w in me.warnings} | {w.code for w in pdr.warnings}
    from analysis.surrogate import fit_warnings

    fired |= {w.code for w in fit_warnings(sur)}
    for code in ("too_few_trials", "too_few_configs", "poor_fit", "forest_bands", "no_interval"):
        tally.warned[(size, code)].append(code in fired)
    if truth.interaction is not None and all(n in [f.name for f in sur.features] for n in truth.interaction):
        pair_pd(sur, ds, truth, size, tally, n_boot)
    inter = interactions_from(sur, ds, h_rows=H_ROWS)
    rows = sample_rows(len(sur.y), H_ROWS, np.random.default_rng([sur.seed, 5]))
    chosen = [(sur.index(p.params[0]), sur.index(p.params[1])) for p in inter.pairs]
    true_h2, true_strength, _ = h2_statistics(TrueModel(sur, truth), sur.X[rows], chosen)
    tally.warned[(size, "no_interval (interactions)")].append(any(w.code == "no_interval" for p in inter.pairs
                                                                   for w in p.warnings))
    for p, th, ts in zip(inter.pairs, true_h2, true_strength):
        planted_pair = truth.interaction is not None and set(p.params) == set(truth.interaction)
        tag = "planted pair" if planted_pair else "pairs without interaction"
        tally.add(size, f"interaction strength, {tag}", p.strength.low, p.strength.high, float(ts),
                  p.strength.estimate)
        if planted_pair and math.isfinite(th):
            tally.add(size, "H², planted pair", p.h2.low, p.h2.high, float(th), p.h2.estimate)


def pair_pd(sur: Surrogate, ds: Any, truth: Truth, size: str, tally: Tally, n_boot: int) -> None:
    """The 2-D partial dependence of the planted pair (the forest's PD with bands from its refits):
    each grid cell's band against the planted geometric-mean metric over the analysed rows with
    both features set to the cell's values."""
    a, b = truth.interaction  # type: ignore[misc]
    j, k = sur.index(a), sur.index(b)
    pdr = partial_dependence_from(sur, ds, [a, b], n_boot=n_boot, ice=False)
    model = TrueModel(sur, truth)
    X = sur.X[:, :len(sur.features)]
    for u, cu in enumerate(grid_codes(sur.features[j], 12)):
        for v, cv in enumerate(grid_codes(sur.features[k], 12)):
            Xv = X.copy()
            Xv[:, j], Xv[:, k] = cu, cv
            tally.add(size, f"2-D PD bands per grid cell ({pdr.bands}), planted pair", pdr.low[u][v], pdr.high[u][v],
                      math.exp(float(model.predict(Xv).mean())), pdr.estimate[u][v])


def _one(job: tuple[str, int, bool]) -> Tally:
    tally = Tally()
    run_seed(job[0], job[1], tally, full=job[2])
    return tally


def wilson(k: int, n: int) -> str:
    """The Monte-Carlo error of an observed coverage k / n: its 95% Wilson interval (intervals of one
    seed are correlated, so the real error is somewhat larger)."""
    from statsmodels.stats.proportion import proportion_confint

    lo, hi = proportion_confint(k, n, alpha=0.05, method="wilson")
    return f"{lo:.1%} - {hi:.1%}"


def binomial_range(n: int, p: float = 0.95) -> str:
    """The central 95% range of a binomial(n, p) count, as rates (what a calibrated interval shows)."""
    from scipy import stats

    lo, hi = stats.binom.ppf([0.025, 0.975], n, p)
    return f"{lo / n:.0%} - {hi / n:.0%}"


def render(tally: Tally, command: str, started: str, wall_s: float, seeds: dict[str, list[int]]) -> str:
    lines = [BEGIN, "## Analysis: coverage of the stated 95% intervals (planted data)", "",
             f"Command (from the repository root): `{command}`", "",
             f"Run on {started} (UTC), wall time {wall_s:.0f} s, `nice -n 10` on the shared 2-core machine. Data are "
             "SYNTHETIC (`analysis.synthetic.planted`), never measurements. Seeds: "
             + "; ".join(f"{s} size {min(v)}..{max(v)} ({len(v)})" for s, v in seeds.items() if v)
             + f"; intervals from the first {len(seeds.get('large', []))} seeds of each size, verdicts from all.", "",
             f"Surface: 7 parameters, 3 repeats per config, noise sd {NOISE} on the log scale, random design in "
             "randomised order: " + ", ".join(f"`{k}` {ROLE[k]}" for k in PARAMS)
             + f"; interaction `max_num_batched_tokens` x `enable_chunked_prefill` ({-0.45:+.2f} on the log scale); "
             "OOM region `gpu_memory_utilization` >= 0.95 with `max_num_seqs` >= 128 (70% fail). Sizes: "
             + ", ".join(f"{s} = {c} configs x {r}" for s, (c, r) in SIZES.items())
             + " trials. Truth = the planted formula on the same analysed rows (see the module docstring). "
             "Intervals are those the analyses state, with their default refits (PD 50, interactions 10, verdicts 50).",
             "", "Not stated: intervals the analysis declined to give (NaN bounds with a `no_interval` caveat: too few "
             "configs for the regression, and the forest's refits under-cover); they are not counted as covered.",
             "", "| size | interval | intervals checked | covered | coverage | Monte-Carlo 95% (Wilson) | "
             "a calibrated 95% interval: | not stated |",
             "| --- | --- | ---: | ---: | ---: | --- | --- | ---: |"]
    for key in sorted(set(tally.covered) | set(tally.refused)):
        size, kind = key
        xs = tally.covered.get(key, [])
        if xs:
            lines.append(f"| {size} | {kind} | {len(xs)} | {sum(xs)} | {sum(xs) / len(xs):.1%} | "
                         f"{wilson(sum(xs), len(xs))} | {binomial_range(len(xs))} | {tally.refused.get(key, 0)} |")
        else:
            lines.append(f"| {size} | {kind} | 0 | - | - | - | - | {tally.refused.get(key, 0)} |")
    share = sum(tally.contains_estimate) / max(1, len(tally.contains_estimate))
    lines += ["", f"Every one of the {len(tally.contains_estimate)} intervals above contains its own estimate: "
              f"{'yes' if share == 1 else f'no ({share:.1%})'}.", "",
              "One verdict per parameter (`analysis.verdict.parameter_verdicts`, what importance, PD and the text "
              "report): share of seeds that called it `important`.", "",
              "| size | parameter | planted effect | seeds | called important |", "| --- | --- | --- | ---: | ---: |"]
    for (size, name), xs in sorted(tally.important.items(), key=lambda kv: (kv[0][0], PARAMS.index(kv[0][1]))):
        lines.append(f"| {size} | `{name}` | {ROLE[name]} | {len(xs)} | {sum(xs) / len(xs):.1%} |")
    for size in SIZES:
        per_seed = [any(tally.important[(size, n)][i] for n in NULLS)
                    for i in range(len(tally.important.get((size, NULLS[0]), [])))]
        if per_seed:
            lines.append(f"\n{size}: seeds in which any of the {len(NULLS)} no-effect parameters was called important: "
                         f"{sum(per_seed)} of {len(per_seed)} ({sum(per_seed) / len(per_seed):.1%}).")
    lines += ["", "Warnings that fired (share of seeds):", "", "| size | warning | seeds | fired |",
              "| --- | --- | ---: | ---: |"]
    for (size, code), xs in sorted(tally.warned.items()):
        lines.append(f"| {size} | `{code}` | {len(xs)} | {sum(xs) / len(xs):.0%} |")
    lines += ["", END, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.analysis.coverage", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=20, help="seeds at the large size (default: %(default)s)")
    ap.add_argument("--small-seeds", type=int, default=100,
                    help="seeds at the small size (default: %(default)s); beyond --seeds of them only the verdicts "
                         "are computed (the false 'important' rate)")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="5 large and 20 small seeds (a smoke run)")
    ap.add_argument("--jobs", type=int, default=1, help="seeds analysed at once, in worker processes")
    ap.add_argument("--results", type=Path, default=REPO / "benchmarks" / "RESULTS.md")
    ap.add_argument("--no-write", action="store_true", help="print the section instead of writing RESULTS.md")
    args = ap.parse_args(argv)
    if args.seeds < 1 or args.small_seeds < 1:
        print("--seeds and --small-seeds must be at least 1", file=sys.stderr)
        return 2
    counts = {"small": 20, "large": 5} if args.quick else {"small": args.small_seeds, "large": args.seeds}
    tally = Tally()
    started = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M")
    t0 = time.monotonic()
    used: dict[str, list[int]] = {}
    jobs: list[tuple[str, int, bool]] = []
    for size, n in counts.items():
        used[size] = list(range(args.first_seed, args.first_seed + n))
        jobs += [(size, seed, i < counts["large"]) for i, seed in enumerate(used[size])]
    jobs.sort(key=lambda j: (not j[2], j[0]))  # the full analyses first
    if args.jobs > 1:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            results = pool.imap_unordered(_one, jobs)
            for i, part in enumerate(results):
                tally.merge(part)
                print(f"[{time.monotonic() - t0:7.1f} s] {i + 1}/{len(jobs)} seeds done", file=sys.stderr, flush=True)
    else:
        for i, job in enumerate(jobs):
            tally.merge(_one(job))
            print(f"[{time.monotonic() - t0:7.1f} s] {job[0]} seed {job[1]} ({i + 1}/{len(jobs)})", file=sys.stderr,
                  flush=True)
    command = "nice -n 10 .venv/bin/python -m benchmarks.analysis.coverage" + (
        " --quick" if args.quick else f" --seeds {args.seeds} --small-seeds {args.small_seeds}") + (
        f" --jobs {args.jobs}" if args.jobs > 1 else "")
    text = render(tally, command, started, time.monotonic() - t0, used)
    if args.no_write:
        print(text)
    else:
        from benchmarks.common import replace_section

        replace_section(args.results, text, BEGIN, END)
        print(f"wrote the coverage section of {args.results}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
