"""Fit a sim profile's overheads to real runs, and measure its prediction error on real runs it was not fitted to.

``python -m benchmarks.sim_calibrate --train RUNS.json [--test RUNS.json] [--out FIT.json]`` reads real
trials (the format of ``tests/data/sim-calibration/*-real.json``: ``runs`` of ``engine``,
``load_point`` and ``metrics``), simulates each noiselessly (:func:`daemon.sim_backend.expected_trial`)
and fits the profile's per-step costs that the step-time model (:mod:`servetune.sim.steptime`) adds to
the roofline: ``step_overhead_s``, ``per_seq_overhead_s``, ``per_token_overhead_s`` (:data:`FITTED`).
It also fits the candidates of :data:`CANDIDATES`, each those plus one more physical parameter
(``request_overhead_s``, the fixed latency per request outside the engine's steps,
:mod:`servetune.sim.engine`; ``flops_efficiency``, the CPU's achieved compute rate), reported next to
the fit; neither predicted better held-out on every latency metric in both directions, so the stored
fit leaves them as the profile has them (RESULTS.md).

The fit is :func:`scipy.optimize.least_squares` (robust loss :data:`LOSS`) on the log ratios predicted /
measured of :data:`FIT_METRICS` (request throughput, p50 TTFT, p50 TPOT) of the ``--train`` runs, over the
logs of the parameters (each kept in :data:`BOUNDS`), from the best of a coarse grid
(:data:`START_GRID`) and the defaults. The check predicts the ``--test`` runs (another sweep: other
engine configs and load points) with the fit and with the profile's defaults, and reports per metric of
:data:`REPORT_METRICS` (throughput; TTFT and TPOT at p50 and p99) the median absolute % error with a
95% interval (bootstrap over the test runs' engine configs, :func:`summary`), for the defaults, the
fit and each candidate. ``--cross`` also fits on
the test runs and predicts the train runs (two folds, every run held out once).

``--collect FOLDER --out-runs FILE`` writes the ok real trials of an experiment folder in that format.
The file written by ``--out`` holds the fitted parameters and the check; the simulator uses it when
``SERVETUNE_SIM_CALIBRATION`` names it (:func:`servetune.sim.profiles.get_profile`).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from servetune.sim.profiles import HardwareProfile, get_profile, get_shape

#: the engine's per-step costs, and ``request_overhead_s``: the fixed latency per request outside the
#: engine core's steps (HTTP, tokenization, detokenization, streaming: the CPU build's API server shares
#: the 2 cores with the engine core), which adds to TTFT only (see :mod:`servetune.sim.engine`)
PARAMS: tuple[str, ...] = ("step_overhead_s", "per_seq_overhead_s", "per_token_overhead_s", "request_overhead_s")
#: what the stored fit (``--out``) fits: the per-step costs only. Fitting one more parameter too
#: (:data:`CANDIDATES`) was tried and did not predict the held-out latencies better on every metric in
#: both directions (RESULTS.md, "Sim calibration"), so the fit leaves them as the profile has them
FITTED: tuple[str, ...] = PARAMS[:3]
#: the candidates ``--cross`` reports next to the fit (key in the fit file: the table's column):
#: ``request_overhead_s`` (see :data:`PARAMS`); ``flops_efficiency``, the fraction of the profile's
#: guessed peak FLOP/s the CPU build achieves, which sets the step cost that grows with prefill tokens
#: and with the context every sequence's attention reads (bf16 on a 2-core AVX2 CPU without native bf16
#: matmuls: the peak is an order-of-magnitude guess, profiles.py)
CANDIDATES: dict[str, tuple[tuple[str, ...], str]] = {
    "candidate": (PARAMS, "fit + request overhead"),
    "candidate_compute": ((*FITTED, "flops_efficiency"), "fit + compute rate"),
}
#: seconds: each parameter's search range
BOUNDS: dict[str, tuple[float, float]] = {"step_overhead_s": (1e-5, 0.5), "per_seq_overhead_s": (1e-7, 0.05),
                                          "per_token_overhead_s": (1e-7, 0.05), "request_overhead_s": (1e-5, 1.0),
                                          "flops_efficiency": (1e-3, 1.0)}
#: seconds: the coarse grid the fit starts from (with the profile's own values)
START_GRID: dict[str, tuple[float, ...]] = {"step_overhead_s": (1e-3, 1e-2), "per_seq_overhead_s": (1e-4, 1e-3),
                                            "per_token_overhead_s": (1e-5, 1e-4), "request_overhead_s": (1e-3, 3e-2),
                                            "flops_efficiency": (0.05, 0.5)}
#: robust loss (scipy's soft_l1) and its scale in log-ratio units: a run whose queue the noisy machine
#: tipped into saturation (TTFT seconds instead of tens of ms) must not drag every other prediction
LOSS, F_SCALE = "soft_l1", 0.3
#: (metric, quantile or None for a scalar): what the prediction error is reported for
REPORT_METRICS: tuple[tuple[str, float | None], ...] = (
    ("request_throughput", None), ("ttft_ms", 0.5), ("ttft_ms", 0.99), ("tpot_ms", 0.5), ("tpot_ms", 0.99))
#: what the fit minimises (chosen before any held-out error was seen: the tails are reported, not fitted)
FIT_METRICS: tuple[str, ...] = ("request_throughput", "ttft_ms_p50", "tpot_ms_p50")
DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "sim-calibration"
DEFAULT_RUNS = DATA / "quickstart-real.json"
#: bootstrap resamples of the test runs' engine configs for the interval of a median error
N_BOOT, BOOT_SEED = 4000, 0


@dataclass(frozen=True)
class Run:
    engine: dict[str, Any]
    load_point: dict[str, Any]
    #: metric key (:func:`key`) -> value, for every metric of :data:`REPORT_METRICS` the run has
    observed: dict[str, float]
    source: str = ""

    @property
    def group(self) -> str:
        """The run's engine config: its server (runs of one config share it)."""
        return json.dumps(self.engine, sort_keys=True)


def key(name: str, q: float | None) -> str:
    return name if q is None else f"{name}_p{round(q * 100):d}"


def _values(metrics: dict[str, Any]) -> dict[str, float]:
    qs = [float(q) for q in metrics.get("quantiles", [])]
    out: dict[str, float] = {}
    for name, q in REPORT_METRICS:
        v = metrics.get(name)
        if v is None:
            continue
        if q is None:
            out[key(name, q)] = float(v)
        elif q in qs:
            out[key(name, q)] = float(v[qs.index(q)])
    return out


def load_runs(paths: Path | Sequence[Path]) -> list[Run]:
    """The runs of one or more runs files."""
    out: list[Run] = []
    for path in [paths] if isinstance(paths, Path) else paths:
        doc = json.loads(path.read_text())
        out += [Run(engine=r["engine"], load_point=r["load_point"], observed=_values(r["metrics"]), source=path.name)
                for r in doc["runs"]]
    return out


def collect(folder: Path, source: str) -> dict[str, Any]:
    """The ok trials of real vLLM in experiment ``folder`` (its ``results/*/attempt-*.json``), as a runs file."""
    runs = []
    for path in sorted(folder.glob("results/*/attempt-*.json")):
        rec = json.loads(path.read_text())
        man = rec.get("manifest") or {}
        if (rec.get("outcome") or {}).get("status") != "ok" or man.get("backend") != "vllm" or not rec.get("metrics"):
            continue
        m = rec["metrics"]
        runs.append({"trial_id": man.get("trial_id") or path.parent.name, "engine": man["engine"],
                     "load_point": man["load_point"],
                     "metrics": {k: m[k] for k in ("request_throughput", "output_throughput", "quantiles", "ttft_ms",
                                                  "tpot_ms", "n_requests", "n_errors") if k in m}})
    if not runs:
        raise SystemExit(f"{folder}: no ok real-vLLM trials under results/")
    return {"source": source, "runs": runs}


def with_params(profile: HardwareProfile, theta: Sequence[float] | np.ndarray,
                params: Sequence[str] = PARAMS) -> HardwareProfile:
    """``profile`` with the overheads ``theta`` (seconds, in ``params`` order; the others as ``profile`` has them)."""
    return dataclasses.replace(profile, **{p: float(t) for p, t in zip(params, theta, strict=True)})


def predict(run: Run, profile: HardwareProfile, shape: str = "tiny") -> dict[str, float]:
    """The noiseless simulated metrics of ``run`` on ``profile``."""
    from daemon.sim_backend import expected_trial
    from servetune.manifest import EngineConfig
    from servetune.sim.engine import start
    from servetune.spec import BackendSpec, LoadPoint

    config = EngineConfig.model_validate(run.engine)
    backend = BackendSpec(kind="sim", profile=profile.name, model_shape=shape, noise=False)
    server = start(config.args.model_dump(exclude_none=True), config.env, profile, get_shape(shape))
    metrics, _ = expected_trial(server, backend, LoadPoint.model_validate(run.load_point))
    return _values(metrics.model_dump())


def _residuals(runs: Sequence[Run], profile: HardwareProfile, shape: str,
               params: Sequence[str] = PARAMS) -> Callable[[np.ndarray], np.ndarray]:
    def f(log_theta: np.ndarray) -> np.ndarray:
        p = with_params(profile, np.exp(log_theta), params)
        out = []
        for r in runs:
            pred = predict(r, p, shape)
            out += [math.log(max(pred[k], 1e-12) / r.observed[k]) for k in FIT_METRICS if k in r.observed]
        return np.asarray(out)
    return f


def fit(runs: Sequence[Run], profile: HardwareProfile, shape: str = "tiny",
        start: Sequence[float] | None = None, params: Sequence[str] = FITTED) -> np.ndarray:
    """The overheads (seconds, in ``params`` order) that best predict ``runs`` (least squares on log
    ratios); the profile's other parameters stay as it has them."""
    f = _residuals(runs, profile, shape, params)
    lo = np.log([BOUNDS[p][0] for p in params])
    hi = np.log([BOUNDS[p][1] for p in params])
    # the scheduler's events make the objective a staircase at small scales: start from the best of
    # the defaults (a parameter the profile leaves at 0 from its lower bound) and a coarse grid, and
    # difference over a few % of each log parameter
    first = start if start is not None else [max(getattr(profile, p), BOUNDS[p][0]) for p in params]
    starts = [np.log(np.asarray(first, dtype=float))]
    starts += [np.log(np.asarray(g)) for g in itertools.product(*(START_GRID[p] for p in params))]
    x0 = min((np.clip(x, lo + 1e-9, hi - 1e-9) for x in starts), key=lambda x: float(np.sum(f(x) ** 2)))
    res = least_squares(f, x0, bounds=(lo, hi), diff_step=0.03, xtol=1e-8, ftol=1e-8, gtol=1e-8, loss=LOSS,
                        f_scale=F_SCALE)
    return np.exp(res.x)


def errors(run: Run, profile: HardwareProfile, shape: str = "tiny") -> dict[str, float]:
    """Signed % error (predicted / measured - 1) of each metric the run has."""
    pred = predict(run, profile, shape)
    return {k: (pred[k] / v - 1.0) * 100.0 for k, v in run.observed.items() if k in pred}


def summary(rows: Sequence[dict[str, float]], groups: Sequence[str]) -> dict[str, dict[str, float]]:
    """Per metric: the median absolute % error over ``rows`` (one per held-out run), its 95% interval
    (percentile bootstrap resampling the runs' engine configs ``groups`` with replacement, since runs
    of one config share a server and are not independent) and the median signed error (the bias).
    With few configs the bootstrap interval is approximate and can be too narrow."""
    rng = np.random.default_rng(BOOT_SEED)
    names = sorted({g for g in groups})
    idx = {g: [i for i, x in enumerate(groups) if x == g] for g in names}
    out: dict[str, dict[str, float]] = {}
    for m, _q in [(key(n, q), q) for n, q in REPORT_METRICS]:
        vals = [(i, abs(r[m])) for i, r in enumerate(rows) if m in r]
        if not vals:
            continue
        by = {i: v for i, v in vals}
        med = float(np.median([v for _, v in vals]))
        boots = []
        for _ in range(N_BOOT):
            pick = rng.integers(0, len(names), len(names))
            sample = [by[i] for g in pick for i in idx[names[g]] if i in by]
            if sample:
                boots.append(float(np.median(sample)))
        lo, hi = (float(x) for x in np.percentile(boots, [2.5, 97.5]))
        out[m] = {"median_abs_pct": med, "lo": lo, "hi": hi,
                  "median_signed_pct": float(np.median([r[m] for r in rows if m in r])),
                  "n_runs": len(vals), "n_configs": len({groups[i] for i, _ in vals})}
    return out


def held_out(train: Sequence[Run], test: Sequence[Run], profile: HardwareProfile, shape: str = "tiny",
             say: Callable[[str], None] = print) -> dict[str, Any]:
    """Fit :data:`FITTED` and each of :data:`CANDIDATES` on ``train``; the errors of every fit and of
    the defaults on ``test``."""
    out: dict[str, Any] = {"groups": [r.group for r in test], "defaults": [errors(r, profile, shape) for r in test]}
    for name, params in (("fitted", FITTED), *((k, v[0]) for k, v in CANDIDATES.items())):
        say(f"fitting {', '.join(params)} to {len(train)} runs ...")
        theta = fit(train, profile, shape, params=params)
        say("fitted: " + ", ".join(f"{p} {t:.3g}" for p, t in zip(params, theta, strict=True)))
        out[name] = [errors(r, with_params(profile, theta, params), shape) for r in test]
        out[f"{name}_theta"] = dict(zip(params, (float(t) for t in theta), strict=True))
    return out


def table(label: str, rows: dict[str, Any]) -> list[str]:
    """Markdown rows: per metric, defaults vs fit vs each candidate, median abs % error [95% interval] (bias)."""
    cols = [summary(rows[k], rows["groups"]) for k in ("defaults", "fitted", *CANDIDATES)]
    out = []
    for m in cols[0]:
        def cell(s: dict[str, float]) -> str:
            return f"{s['median_abs_pct']:.1f}% [{s['lo']:.1f}, {s['hi']:.1f}] ({s['median_signed_pct']:+.0f}%)"
        d = cols[0][m]
        out.append(f"| {label} | `{m}` | {d['n_runs']} ({d['n_configs']}) | "
                   + " | ".join(cell(c[m]) for c in cols) + " |")
    return out


def repeats(runs: Sequence[Run], profiles: Sequence[HardwareProfile], shape: str = "tiny") -> list[str]:
    """Runs the simulator cannot tell apart (the same noiseless prediction on every one of ``profiles``)
    and how much they differ in reality: per group, each metric's measured values and their spread;
    last, the floor: the median abs % error of predicting each run of a group by the group's geometric
    mean (fitted in sample: about the least any model that predicts them alike can err on them)."""
    groups: dict[tuple[float, ...], list[Run]] = {}
    for r in runs:
        k = tuple(round(v, 6) for p in profiles for v in predict(r, p, shape).values())
        groups.setdefault(k, []).append(r)
    lines: list[str] = []
    errs: dict[str, list[float]] = {}
    for g in (g for g in groups.values() if len(g) > 1):
        lines.append("runs: " + "; ".join(
            f"{r.source} max_num_seqs {r.engine['args'].get('max_num_seqs')} "
            f"max_num_batched_tokens {r.engine['args'].get('max_num_batched_tokens')} {r.load_point.get('name')}"
            for r in g))
        for m in g[0].observed:
            vals = [r.observed[m] for r in g]
            gm = math.exp(float(np.mean([math.log(v) for v in vals])))
            errs.setdefault(m, []).extend(abs(v / gm - 1.0) * 100.0 for v in vals)
            lines.append(f"  {m}: " + " / ".join(f"{v:.1f}" for v in vals) + f" (x{max(vals) / min(vals):.2f})")
    for m, e in errs.items():
        lines.append(f"floor {m}: {float(np.median(e)):.1f}% over {len(e)} runs")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.sim_calibrate", description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=Path, nargs="+", default=[DATA / "calibration-real.json"],
                    help="real runs to fit (default: %(default)s)")
    ap.add_argument("--test", type=Path, nargs="*", default=[DEFAULT_RUNS],
                    help="real runs held out from the fit, predicted (default: %(default)s)")
    ap.add_argument("--cross", action="store_true", help="also fit on --test and predict --train (two folds)")
    ap.add_argument("--profile", default="cpu-tiny")
    ap.add_argument("--model-shape", default="tiny")
    ap.add_argument("--out", type=Path, help="calibration file to write (the fit on --train and its check)")
    ap.add_argument("--repeats", action="store_true",
                    help="with --cross: also list the runs every fit predicts alike, and how far apart they measured")
    ap.add_argument("--collect", type=Path, metavar="FOLDER", help="write FOLDER's ok real trials as a runs file")
    ap.add_argument("--out-runs", type=Path, help="with --collect: the runs file to write")
    ap.add_argument("--source", default="", help="with --collect: how the runs were made (machine, load, git)")
    args = ap.parse_args(argv)
    if args.collect:
        if not args.out_runs:
            ap.error("--collect needs --out-runs")
        doc = collect(args.collect, args.source or str(args.collect))
        args.out_runs.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {len(doc['runs'])} runs to {args.out_runs}")
        return 0
    for p in [*args.train, *args.test]:
        if not p.is_file():
            ap.error(f"runs file {p} not found")
    base = get_profile(args.profile, calibrated=False)
    train, test = load_runs(args.train), load_runs(args.test)
    folds = {}
    if test:
        folds["a"] = held_out(train, test, base, args.model_shape)
    if args.cross and test:
        folds["b"] = held_out(test, train, base, args.model_shape)
    theta = (folds["a"]["fitted_theta"] if "a" in folds
             else dict(zip(FITTED, (float(t) for t in fit(train, base, args.model_shape)), strict=True)))
    names = " + ".join(p.name for p in args.train)
    heads = ["defaults", "fit", *(v[1] for v in CANDIDATES.values())]
    print("| held out | metric | runs (configs) | "
          + " | ".join(f"{h}: median abs error [95%] (bias)" for h in heads) + " |")
    print("| --- | --- | ---: | " + " | ".join("---" for _ in heads) + " |")
    if "a" in folds:
        print("\n".join(table(" + ".join(p.name for p in args.test), folds["a"])))
    if "b" in folds:
        print("\n".join(table(names + " (fit on the other)", folds["b"])))
        pooled = {k: folds["a"][k] + folds["b"][k] for k in ("defaults", "fitted", *CANDIDATES, "groups")}
        print("\n".join(table("both, each by a fit on the other", pooled)))
        if args.repeats:
            thetas = [folds[f][f"{k}_theta"] for f in ("a", "b") for k in ("fitted", *CANDIDATES)]
            print("\n".join(repeats([*train, *test], [base, *(with_params(base, list(t.values()), list(t))
                                                              for t in thetas)], args.model_shape)))
    if args.out:
        check = {"test": [p.name for p in args.test],
                 "defaults": summary(folds["a"]["defaults"], folds["a"]["groups"]) if "a" in folds else None,
                 **{k: summary(folds["a"][k], folds["a"]["groups"]) if "a" in folds else None
                    for k in ("fitted", *CANDIDATES)}}
        text = f"fitted to {len(train)} real runs ({names}) by python -m benchmarks.sim_calibrate"
        if check["fitted"]:
            text += "; median abs error on {} held-out runs: {}".format(
                len(test), ", ".join(f"{m} {s['median_abs_pct']:.0f}%" for m, s in check["fitted"].items()))
        doc: dict[str, Any] = {
            "profile": args.profile, "model_shape": args.model_shape, "runs": [p.name for p in args.train],
            "n_runs": len(train), "fitted": theta,
            **{k: folds["a"][f"{k}_theta"] if "a" in folds else None for k in CANDIDATES},
            "defaults": {p: getattr(base, p) for p in PARAMS}, "fit_metrics": list(FIT_METRICS),
            "held_out": check, "calibration": text}
        args.out.write_text(json.dumps({args.profile: doc}, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
