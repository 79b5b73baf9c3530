"""Fit a sim profile's overheads to real runs, with a leave-one-out check of its prediction error.

``python -m benchmarks.sim_calibrate [RUNS.json] [--out FILE]`` reads real trials (the format of
``tests/data/sim-calibration/quickstart-real.json``: ``runs`` of ``engine``, ``load_point`` and
``metrics``), simulates each noiselessly (:func:`daemon.sim_backend.expected_trial`) and fits the
profile's per-step costs that the step-time model (:mod:`servetune.sim.steptime`) adds to the
roofline: ``step_overhead_s``, ``per_seq_overhead_s``, ``per_token_overhead_s``.

The fit is :func:`scipy.optimize.least_squares` (robust loss :data:`LOSS`) on the log ratios predicted / measured of
:data:`FIT_METRICS` (request throughput, p50 TTFT, p50 TPOT), over the logs of the parameters
(each kept in :data:`BOUNDS`), from the best of a coarse grid (:data:`START_GRID`) and the defaults. The leave-one-out check refits without each run in turn and
predicts it: its median absolute % error, per metric and over all, against the profile's
defaults ("before"). The file written (``--out``) holds the fitted parameters and that check; the
simulator uses it when ``SERVETUNE_SIM_CALIBRATION`` names it (:func:`servetune.sim.profiles.get_profile`).
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

PARAMS: tuple[str, ...] = ("step_overhead_s", "per_seq_overhead_s", "per_token_overhead_s")
#: seconds: each parameter's search range
BOUNDS: dict[str, tuple[float, float]] = {"step_overhead_s": (1e-5, 0.5), "per_seq_overhead_s": (1e-7, 0.05),
                                          "per_token_overhead_s": (1e-7, 0.05)}
#: seconds: the coarse grid the fit starts from (with the profile's own values)
START_GRID: dict[str, tuple[float, ...]] = {"step_overhead_s": (1e-3, 1e-2), "per_seq_overhead_s": (1e-4, 1e-3),
                                            "per_token_overhead_s": (1e-5, 1e-4)}
#: robust loss (scipy's soft_l1) and its scale in log-ratio units: a run whose queue the noisy machine
#: tipped into saturation (TTFT seconds instead of tens of ms) must not drag every other prediction
LOSS, F_SCALE = "soft_l1", 0.3
#: (metric, index into the quantile list or None for a scalar)
FIT_METRICS: tuple[tuple[str, int | None], ...] = (("request_throughput", None), ("ttft_ms", 0), ("tpot_ms", 0))
DEFAULT_RUNS = Path(__file__).resolve().parents[1] / "tests" / "data" / "sim-calibration" / "quickstart-real.json"


@dataclass(frozen=True)
class Run:
    engine: dict[str, Any]
    load_point: dict[str, Any]
    #: metric name -> value, as :data:`FIT_METRICS` names them
    observed: dict[str, float]


def _metric(metrics: dict[str, Any], name: str, index: int | None) -> float:
    v = metrics[name]
    return float(v if index is None else v[index])


def _key(name: str, index: int | None) -> str:
    return name if index is None else f"{name}_p50"


def load_runs(path: Path) -> list[Run]:
    doc = json.loads(path.read_text())
    return [Run(engine=r["engine"], load_point=r["load_point"],
                observed={_key(n, i): _metric(r["metrics"], n, i) for n, i in FIT_METRICS}) for r in doc["runs"]]


def with_params(profile: HardwareProfile, theta: Sequence[float] | np.ndarray) -> HardwareProfile:
    """``profile`` with the overheads ``theta`` (seconds, in :data:`PARAMS` order)."""
    step, seq, token = (float(t) for t in theta)
    return dataclasses.replace(profile, step_overhead_s=step, per_seq_overhead_s=seq, per_token_overhead_s=token)


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
    doc = metrics.model_dump()
    return {_key(n, i): _metric(doc, n, i) for n, i in FIT_METRICS}


def _residuals(runs: Sequence[Run], profile: HardwareProfile, shape: str) -> Callable[[np.ndarray], np.ndarray]:
    def f(log_theta: np.ndarray) -> np.ndarray:
        p = with_params(profile, np.exp(log_theta))
        out = []
        for r in runs:
            pred = predict(r, p, shape)
            out += [math.log(max(pred[k], 1e-12) / r.observed[k]) for k in r.observed]
        return np.asarray(out)
    return f


def fit(runs: Sequence[Run], profile: HardwareProfile, shape: str = "tiny",
        start: Sequence[float] | None = None) -> np.ndarray:
    """The overheads (seconds, in :data:`PARAMS` order) that best predict ``runs`` (least squares on log ratios)."""
    f = _residuals(runs, profile, shape)
    lo = np.log([BOUNDS[p][0] for p in PARAMS])
    hi = np.log([BOUNDS[p][1] for p in PARAMS])
    # the scheduler's events make the objective a staircase at small scales: start from the best of
    # the defaults and a coarse grid, and difference over a few % of each log parameter
    starts = [np.log(np.asarray(start if start is not None else [getattr(profile, p) for p in PARAMS], dtype=float))]
    starts += [np.log(np.asarray(g)) for g in itertools.product(*(START_GRID[p] for p in PARAMS))]
    x0 = min((np.clip(x, lo + 1e-9, hi - 1e-9) for x in starts), key=lambda x: float(np.sum(f(x) ** 2)))
    res = least_squares(f, x0, bounds=(lo, hi), diff_step=0.03, xtol=1e-8, ftol=1e-8, gtol=1e-8, loss=LOSS,
                        f_scale=F_SCALE)
    return np.exp(res.x)


def abs_pct_errors(run: Run, profile: HardwareProfile, shape: str = "tiny") -> dict[str, float]:
    pred = predict(run, profile, shape)
    return {k: abs(pred[k] / v - 1.0) * 100.0 for k, v in run.observed.items()}


def leave_one_out(runs: Sequence[Run], profile: HardwareProfile, shape: str = "tiny") -> dict[str, Any]:
    """Median absolute % error of each held-out run, predicted by a fit to the others (after) and by
    ``profile`` as it is (before); per metric and over every metric."""
    before: list[dict[str, float]] = [abs_pct_errors(r, profile, shape) for r in runs]
    after: list[dict[str, float]] = []
    for i, r in enumerate(runs):
        theta = fit([x for j, x in enumerate(runs) if j != i], profile, shape)
        after.append(abs_pct_errors(r, with_params(profile, theta), shape))

    def med(rows: list[dict[str, float]]) -> dict[str, float]:
        keys = list(rows[0])
        out = {k: float(np.median([row[k] for row in rows])) for k in keys}
        out["all"] = float(np.median([row[k] for row in rows for k in keys]))
        return out
    return {"before": med(before), "after": med(after), "n_runs": len(runs)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.sim_calibrate", description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="?", type=Path, default=DEFAULT_RUNS, help="real runs (JSON)")
    ap.add_argument("--profile", default="cpu-tiny")
    ap.add_argument("--model-shape", default="tiny")
    ap.add_argument("--out", type=Path, default=Path("sim-calibration.json"), help="calibration file to write")
    ap.add_argument("--no-loo", action="store_true", help="skip the leave-one-out check")
    args = ap.parse_args(argv)
    runs = load_runs(args.runs)
    base = get_profile(args.profile, calibrated=False)
    theta = fit(runs, base, args.model_shape)
    loo = None if args.no_loo else leave_one_out(runs, base, args.model_shape)
    doc: dict[str, Any] = {
        "profile": args.profile, "model_shape": args.model_shape, "runs": args.runs.name, "n_runs": len(runs),
        "fitted": dict(zip(PARAMS, (float(t) for t in theta), strict=True)),
        "defaults": {p: getattr(base, p) for p in PARAMS},
        "metrics": [_key(n, i) for n, i in FIT_METRICS],
        "leave_one_out_median_abs_pct_error": loo,
    }
    text = (f"fitted to {len(runs)} real runs ({args.runs.name}) by python -m benchmarks.sim_calibrate"
            + (f"; leave-one-out median abs error {loo['after']['all']:.0f}%" if loo else ""))
    doc["calibration"] = text
    args.out.write_text(json.dumps({args.profile: doc}, indent=1) + "\n")
    print(f"{args.profile}: " + ", ".join(f"{p} {t:.3g}" for p, t in zip(PARAMS, theta, strict=True)))
    if loo:
        for when in ("before", "after"):
            print(f"leave-one-out median abs % error {when}: "
                  + ", ".join(f"{k} {v:.1f}%" for k, v in loo[when].items()))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
