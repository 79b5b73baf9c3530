"""Coverage of the failure-rate intervals of :func:`analysis.failure.failure_probability` on SYNTHETIC
planted data (:func:`analysis.synthetic.planted`: an OOM corner ``gpu_memory_utilization >= 0.95``
with ``max_num_seqs >= 128`` failing at ``--region-rate``, ``--base-rate`` elsewhere; repeats drawn
independently), and how often the ``model_misfit`` and ``clustered`` caveats fire.

A region's truth is the mean planted failure probability over its trials. Per seed, every region's
Wilson interval and, where the logistic model is used, its predicted interval is checked against
that truth; the corner cells (both parameters of the corner at their failing levels) are reported
apart, since that is where a main-effects model used to miss, and so are single-parameter and pair
regions (pairs are shown in order of their observed failure-rate spread, a selection on the outcome).

    python -m benchmarks.analysis.failure_coverage --seeds 40
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from analysis.failure import _factor, failure_probability
from analysis.frame import parameters, trial_table
from analysis.synthetic import _in_region, planted


def _truths(ds: Any, region_rate: float, base_rate: float) -> tuple[dict[str, np.ndarray], np.ndarray, Any]:
    """Per parameter the region label of every analysed trial, and every trial's planted probability."""
    df = trial_table(ds)
    df = df[(df["status"].astype(str) != "hole") & ~df["is_baseline"].astype(bool)]
    cfgs = [json.loads(str(c)[4:]) for c in df["config_id"]]
    p = np.array([region_rate if _in_region(c) else base_rate for c in cfgs])
    labels = {q.name: _factor(q, df[q.column].to_numpy(), 4, None).labels.astype(str) for q in parameters(ds)}
    return labels, p, df


def run(seeds: int, n_configs: int, n_params: int, repeats: int, region_rate: float, base_rate: float) -> dict[str, Any]:
    tally = {k: [0, 0] for k in ("wilson", "model", "wilson_single", "wilson_pair", "wilson_corner",
                                 "model_corner")}
    fired = {"model_misfit": 0, "clustered": 0, "failure_terms": 0}
    logit = 0
    for seed in range(seeds):
        ds, _ = planted(n_configs=n_configs, n_params=n_params, repeats=repeats, fail_rate_region=region_rate,
                        fail_rate_base=base_rate, seed=seed)
        res = failure_probability(ds, seed=seed)
        labels, p, _ = _truths(ds, region_rate, base_rate)
        g = res.groups[0]
        logit += g.model == "logit"
        for code in fired:
            fired[code] += any(w.code == code for w in res.warnings)
        for r in g.regions:
            mask = np.ones(len(p), dtype=bool)
            for name, level in zip(r.params, r.levels):
                mask &= labels[name] == level
            truth = float(p[mask].mean())
            corner = (set(r.params) == {"max_num_seqs", "gpu_memory_utilization"}
                      and bool(np.all(p[mask] == region_rate)))
            for kind, iv in (("wilson", r.rate), ("model", r.predicted)):
                if iv is None:
                    continue
                hit = int(iv.low - 1e-12 <= truth <= iv.high + 1e-12)
                keys = [kind, f"{kind}_corner"] if corner else [kind]
                if kind == "wilson":
                    keys.append("wilson_single" if len(r.params) == 1 else "wilson_pair")
                for key in keys:
                    tally[key][0] += hit
                    tally[key][1] += 1
    return {"seeds": seeds, "trials": n_configs * repeats, "logit_used": logit, "fired": fired,
            "coverage": {k: (h / n if n else float("nan"), n) for k, (h, n) in tally.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--n-configs", type=int, default=143)
    ap.add_argument("--n-params", type=int, default=7)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--region-rate", type=float, default=0.8)
    ap.add_argument("--base-rate", type=float, default=0.03)
    a = ap.parse_args(argv)
    out = run(a.seeds, a.n_configs, a.n_params, a.repeats, a.region_rate, a.base_rate)
    print(f"{out['seeds']} seeds x {out['trials']} trials (region {a.region_rate}, base {a.base_rate}); "
          f"logit used in {out['logit_used']}")
    for k, (cov, n) in out["coverage"].items():
        print(f"  coverage {k:15s} {cov:6.1%} of {n} intervals (nominal 95%)")
    for k, n in out["fired"].items():
        print(f"  {k:20s} fired in {n} of {out['seeds']} seeds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
