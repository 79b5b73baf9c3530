"""One verdict per parameter, shared by importance, partial dependence, the text and the badges.

A parameter is ``important`` when either of two pieces of evidence says its effect is real, and
``indistinguishable from noise`` otherwise:

- **the main-effects regression** (:mod:`analysis.main_effects`, config-clustered intervals): its
  95% interval of the change from the first to the last grid value excludes no change. This is the
  interval the partial-dependence sentence states, so a sentence can never show an interval that
  excludes zero beside a verdict of noise;
- **the forest against the random probe** (:mod:`analysis.surrogate`): over the first
  :data:`VERDICT_BOOT` bootstrap refits, the 95% interval of (the parameter's held-out permutation
  importance - the probe's, paired by refit) lies above zero, i.e. the parameter beat a column of
  pure noise in at least 97.5% of the refits. The yardstick is the probe, never zero: a column of
  noise the forest splits on has a positive permutation importance too. This catches parameters
  that act through interactions or a non-monotone shape that the change between the end levels
  misses.

:func:`parameter_verdicts` computes both once per surrogate (cached) and says which evidence
decided (``why``); :func:`analysis.importance.importance` and
:func:`analysis.effects.partial_dependence` report exactly these verdicts, and the report and the
dashboard read them from there (``verdict`` in both results).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from analysis.common import Interval, percentile_interval
from analysis.main_effects import MainEffect, main_effects_from
from analysis.surrogate import Surrogate, predict

__all__ = ["VERDICT_BOOT", "ParameterVerdict", "Verdict", "beats_probe", "parameter_verdicts", "permutation_matrix"]

Verdict = Literal["important", "indistinguishable from noise", "probe"]
#: bootstrap refits whose permutation importances decide the forest's half of the verdict
VERDICT_BOOT = 50


@dataclass(frozen=True)
class ParameterVerdict:
    """The verdict on one parameter and its evidence: ``vs_probe`` (permutation importance minus
    the probe's over the first :data:`VERDICT_BOOT` refits, median [95% interval]), the regression's
    ``main_effect`` (None when not estimable) and ``why`` in words."""

    name: str
    verdict: Verdict
    vs_probe: Interval
    main_effect: MainEffect | None
    why: str


def _permutation(model: object, X: np.ndarray, y: np.ndarray, var: float, rng: np.random.Generator) -> np.ndarray:
    """Drop in R² per column when that column alone is shuffled (one batched prediction)."""
    n, k = X.shape
    big = np.tile(X, (k + 1, 1))
    for j in range(k):
        big[(j + 1) * n:(j + 2) * n, j] = X[rng.permutation(n), j]
    pred = predict(model, big).reshape(k + 1, n)
    mse = ((pred - y[None, :]) ** 2).mean(axis=1)
    return np.asarray((mse[1:] - mse[0]) / var, dtype=float)


def permutation_matrix(sur: Surrogate, n_boot: int, perm_rows: int = 800) -> tuple[np.ndarray, np.ndarray]:
    """Per refit ``i < n_boot``: the held-out permutation importance of every column (the probe
    last) and the held-out R² (rows of NaN where a refit left fewer than 2 rows out). Computed once
    per refit and cached on the surrogate (refit ``i``'s row sample and shuffles depend only on the
    seed, ``i`` and ``perm_rows``)."""
    fits = sur.boot_fits(n_boot)
    k = sur.X.shape[1]
    var = float(np.var(sur.y))
    var = var if var > 0 else 1.0
    cache = sur._permutations
    perm = np.full((n_boot, k), np.nan)
    r2 = np.full(n_boot, np.nan)
    for i, fit in enumerate(fits):
        key = (i, perm_rows)
        if key not in cache:
            rng = np.random.default_rng([sur.seed, 2, i])
            held = fit.heldout
            if len(held) < 2:
                cache[key] = (np.full(k, np.nan), math.nan, 0, 0)
            else:
                rows = held if len(held) <= perm_rows else np.sort(rng.choice(held, perm_rows, replace=False))
                Xh = sur.X[rows].copy()
                Xh[:, sur.probe_index] = fit.probe[rows]
                yh = sur.y[rows]
                p = _permutation(fit.model, Xh, yh, var, rng)
                pred = predict(fit.model, Xh)
                cache[key] = (p, 1.0 - float(((pred - yh) ** 2).mean()) / var, len(held), len(rows))
        perm[i], r2[i] = cache[key][0], cache[key][1]
    return perm, r2


def beats_probe(param: np.ndarray, probe: np.ndarray) -> tuple[bool, Interval]:
    """The forest's half of the verdict from paired per-refit permutation importances: the 95%
    interval of (parameter - probe) and whether it lies above zero. Never against zero alone: a
    noise column the forest splits on scores above zero too, which the probe's score shows."""
    diff = percentile_interval(np.asarray(param, dtype=float) - np.asarray(probe, dtype=float))
    return bool(math.isfinite(diff.low) and diff.low > 0), diff


def parameter_verdicts(sur: Surrogate, grid_points: int = 12) -> dict[str, ParameterVerdict]:
    """The verdict on every feature of ``sur`` (cached on it); see the module docstring."""
    if grid_points in sur._verdicts:
        return sur._verdicts[grid_points]  # type: ignore[no-any-return]
    perm, _ = permutation_matrix(sur, VERDICT_BOOT)
    valid = np.isfinite(perm[:, 0])
    me = main_effects_from(sur, grid_points)
    out: dict[str, ParameterVerdict] = {}
    for j, feat in enumerate(sur.features):
        forest, diff = beats_probe(perm[valid, j], perm[valid, sur.probe_index])
        eff = me.get(feat.name)
        regression = eff is not None and eff.change.excludes(0.0)
        reasons = []
        if regression and eff is not None:
            reasons.append(f"its main effect {_pct(eff.change, sur.log_target)} excludes no change")
        if forest:
            reasons.append(f"it beat the random probe in at least 97.5% of {int(valid.sum())} forest refits")
        if reasons:
            verdict: Verdict = "important"
            why = " and ".join(reasons)
        else:
            verdict = "indistinguishable from noise"
            parts = [f"its main effect {_pct(eff.change, sur.log_target)} includes no change"] if eff is not None \
                else ["the regression could not be estimated"]
            parts.append(f"it did not beat the random probe in 97.5% of {int(valid.sum())} forest refits")
            why = " and ".join(parts)
        out[feat.name] = ParameterVerdict(feat.name, verdict, diff, eff, why)
    sur._verdicts[grid_points] = out
    return out


def _pct(iv: Interval, relative: bool) -> str:
    if relative:
        return f"{100 * iv.estimate:+.3g}% [{100 * iv.low:+.3g}%, {100 * iv.high:+.3g}%]"
    return f"{iv.estimate:+.4g} [{iv.low:+.4g}, {iv.high:+.4g}]"
