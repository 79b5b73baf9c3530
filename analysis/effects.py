"""Partial dependence (PD) with ICE curves and bootstrap bands, over the sampled range only.

:func:`partial_dependence` evaluates the surrogate (:mod:`analysis.surrogate`) with one or two
parameters set to each grid value and every other feature left as observed, averaged over a row
sample: the PD. The grid is the parameter's observed levels, or for a numeric parameter with more
than ``grid_points`` levels an even grid (log2 spacing for log-scaled parameters) between its
observed minimum and maximum; nothing is extrapolated beyond the sampled range.

Values are reported on the metric's scale: with a log target the PD is ``exp`` of the mean log
prediction, i.e. a geometric mean of the metric. ICE curves (one per sampled trial, same scale)
show whether the average hides opposite movements (they come from the primary fit). Bands are 95%
percentile intervals over the PDs of the bootstrap refits (which resample configs when repeats
exist, else trials), and the reported PD is the median of those PDs, so the band always holds it
(the primary fit's PD sits close to it but, being one fit, can fall just outside a percentile band;
with ``n_boot=0`` it is reported, without bands). The 1-D
result also carries the change from the lowest to the highest grid value (relative when the target
is a log) with its bootstrap interval, and a sentence worded as an effect or as an association
according to the design (:func:`analysis.common.claim_for`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from analysis.common import (
    Caveat,
    Claim,
    Interval,
    Notes,
    Subsample,
    claim_for,
    context_of,
    effect_sentence,
    percentile_interval,
)
from analysis.frame import AnalysisInputError
from analysis.surrogate import (
    DEFAULT_MAX_ROWS,
    DEFAULT_TREES,
    Surrogate,
    fit_surrogate,
    fit_warnings,
    grid_codes,
    grid_values,
    pd_curve,
    sample_rows,
)

__all__ = ["PDResult", "claim_for", "effect_sentence", "partial_dependence", "partial_dependence_all"]


@dataclass(frozen=True)
class PDResult:
    """Partial dependence of ``metric`` on ``params`` (one or two names).

    ``grid`` holds each parameter's grid values. For one parameter ``estimate``/``low``/``high``
    are lists over the grid and ``ice`` is one curve per sampled trial; for two they are matrices
    (first parameter's values down, second's across) and ``ice`` is empty. ``estimate`` is the
    median and ``low``/``high`` the 95% percentile band of the refits' PDs (the primary fit's PD
    and NaN bands when ``n_boot`` is 0). ``scale`` says what the numbers are (a geometric mean when
    the surrogate's target is a log). ``change`` (1-D only) is the change from the first to the
    last grid value with its bootstrap interval, ``relative`` when it is a ratio minus one;
    ``sentence`` words it as the ``claim`` allows.
    """

    metric: str
    params: list[str]
    grid: list[list[Any]]
    estimate: list[Any]
    low: list[Any]
    high: list[Any]
    ice: list[list[float]]
    scale: str
    n_boot: int
    claim: Claim
    change: Interval | None
    relative: bool
    sentence: str | None
    load_point: str | None
    hardware_class: str | None
    warnings: list[Caveat] = field(default_factory=list)
    subsampled: list[Subsample] = field(default_factory=list)


def _claim(sur: Surrogate, ds: xr.Dataset, names: Sequence[str]) -> Claim:
    observed = [n for n in names if n == "hardware_class"]
    return claim_for(ds, tool_set=not observed)


def partial_dependence(ds: xr.Dataset, params: str | Sequence[str], metric: str | None = None,
                       load_point: str | None = None, n_boot: int = 50, grid_points: int = 12, ice: bool = True,
                       seed: int = 0, hardware_class: str | None = None, max_rows: int = DEFAULT_MAX_ROWS,
                       pd_rows: int = 256, ice_rows: int = 50, n_trees: int = DEFAULT_TREES) -> PDResult:
    """Partial dependence of ``metric`` on one or two parameters, with ICE and bootstrap bands.

    Args:
        ds: an experiment dataset.
        params: a parameter name or a sequence of one or two names.
        metric: default the ranking objective.
        load_point, hardware_class: analyse within one scenario (otherwise pooled; see
            :mod:`analysis.surrogate`).
        n_boot: bootstrap refits for the bands (0: no bands, NaN bounds).
        grid_points: most grid values for a many-valued numeric parameter.
        ice: return ICE curves (1-D only) for at most ``ice_rows`` trials.
        seed: seeds the surrogate, the row samples and the refits.
        max_rows: trials used to fit (whole configs).
        pd_rows: trials averaged over for each PD value (a subsampling note says when that cut).
        n_trees: trees per forest.

    Returns:
        a :class:`PDResult`; :class:`AnalysisInputError` for an unknown or constant parameter or
        more than two names.
    """
    sur = fit_surrogate(ds, metric, load_point, hardware_class, seed, max_rows, n_trees)
    return partial_dependence_from(sur, ds, params, n_boot=n_boot, grid_points=grid_points, ice=ice,
                                   pd_rows=pd_rows, ice_rows=ice_rows)


def partial_dependence_all(ds: xr.Dataset, metric: str | None = None, load_point: str | None = None,
                           n_boot: int = 50, grid_points: int = 12, ice: bool = True, seed: int = 0,
                           hardware_class: str | None = None, max_rows: int = DEFAULT_MAX_ROWS,
                           pd_rows: int = 256, ice_rows: int = 50, n_trees: int = DEFAULT_TREES) -> list[PDResult]:
    """1-D partial dependence of every varying feature (one shared surrogate and set of refits)."""
    sur = fit_surrogate(ds, metric, load_point, hardware_class, seed, max_rows, n_trees)
    return [partial_dependence_from(sur, ds, f.name, n_boot=n_boot, grid_points=grid_points, ice=ice,
                                    pd_rows=pd_rows, ice_rows=ice_rows) for f in sur.features]


def partial_dependence_from(sur: Surrogate, ds: xr.Dataset, params: str | Sequence[str], n_boot: int = 50,
                            grid_points: int = 12, ice: bool = True, pd_rows: int = 256,
                            ice_rows: int = 50) -> PDResult:
    """:func:`partial_dependence` on an already fitted surrogate (reuses its bootstrap refits)."""
    names = [params] if isinstance(params, str) else list(params)
    if not 1 <= len(names) <= 2 or len(set(names)) != len(names):
        raise AnalysisInputError(f"partial dependence takes one or two distinct parameters, got {names!r}")
    cols = [sur.index(n) for n in names]
    feats = [sur.features[c] for c in cols]
    notes = Notes(list(sur.warnings), list(sur.subsampled))
    notes.warnings.extend(fit_warnings(sur))
    rng = np.random.default_rng([sur.seed, 3])
    rows = sample_rows(len(sur.y), pd_rows, rng)
    notes.subsample("trials averaged over per partial-dependence value", len(rows), len(sur.y))
    Xr = sur.X[rows]
    axes = [grid_codes(f, grid_points) for f in feats]
    for f, g in zip(feats, axes):
        if len(g) < len(f.codes):
            notes.subsample(f"grid values of {f.name} (even grid within the sampled range)", len(g), len(f.codes))
    if len(cols) == 1:
        grid = axes[0][:, None]
    else:
        grid = np.array([(a, b) for a in axes[0] for b in axes[1]], dtype=float)
        _unobserved(sur, cols, axes, notes)

    def curve(model: Any) -> tuple[np.ndarray, np.ndarray]:
        preds = pd_curve(model, Xr, cols, grid)
        return preds.mean(axis=1), preds

    est_t, preds = curve(sur.model)
    boots = np.array([curve(fit.model)[0] for fit in sur.boot_fits(max(0, int(n_boot)))]) if n_boot > 0 else \
        np.empty((0, len(grid)))
    boot_m = sur.to_metric(boots)
    if len(boot_m):
        est = np.median(boot_m, axis=0)
        low = np.quantile(boot_m, 0.025, axis=0)
        high = np.quantile(boot_m, 0.975, axis=0)
    else:
        est = sur.to_metric(est_t)
        low = high = np.full(len(grid), np.nan)
    ice_curves: list[list[float]] = []
    if ice and len(cols) == 1:
        pick = sample_rows(len(rows), ice_rows, np.random.default_rng([sur.seed, 4]))
        notes.subsample("ICE curves (one per sampled trial)", len(pick), len(sur.y))
        ice_curves = sur.to_metric(preds[:, pick]).T.tolist()
    values = [grid_values(f, g) for f, g in zip(feats, axes)]
    claim = _claim(sur, ds, names)
    scale = f"geometric mean of {sur.metric} (surrogate fitted on its log)" if sur.log_target else \
        f"mean of {sur.metric}"
    change: Interval | None = None
    sentence: str | None = None
    if len(cols) == 1:
        shape: tuple[int, ...] = (len(axes[0]),)
        if len(est) >= 2:
            change = _change(sur, est, boot_m)
            ctx = context_of(ds, sur.load_point)
            if sur.hardware_class is not None:
                ctx = dataclasses.replace(ctx, hardware=sur.hardware_class)
            sentence = effect_sentence(claim, ctx, names[0], values[0][0], values[0][-1], sur.metric, change,
                                       relative=sur.log_target)
    else:
        shape = (len(axes[0]), len(axes[1]))
    return PDResult(
        metric=sur.metric, params=names, grid=values, estimate=est.reshape(shape).tolist(),
        low=low.reshape(shape).tolist(), high=high.reshape(shape).tolist(), ice=ice_curves, scale=scale,
        n_boot=int(len(boot_m)), claim=claim, change=change, relative=sur.log_target, sentence=sentence,
        load_point=sur.load_point, hardware_class=sur.hardware_class, warnings=notes.warnings,
        subsampled=notes.subsampled)


def _change(sur: Surrogate, est: np.ndarray, boot_m: np.ndarray) -> Interval:
    """Last minus first grid value (ratio minus one with a log target): the median and 95%
    percentile interval over the refits, or the primary fit's value without refits."""
    if sur.log_target:
        point = float(est[-1] / est[0] - 1.0)
        samples = boot_m[:, -1] / boot_m[:, 0] - 1.0 if len(boot_m) else np.empty(0)
    else:
        point = float(est[-1] - est[0])
        samples = boot_m[:, -1] - boot_m[:, 0] if len(boot_m) else np.empty(0)
    if len(samples) == 0:
        return Interval(point, float("nan"), float("nan"))
    return percentile_interval(samples)


def _unobserved(sur: Surrogate, cols: list[int], axes: list[np.ndarray], notes: Notes) -> None:
    """Warn when grid cells of a 2-D PD (both on observed levels) hold no trial: PD there rests on
    the model's additivity, not on data."""
    if any(len(a) < len(sur.features[c].codes) for a, c in zip(axes, cols)):
        return
    seen = pd.MultiIndex.from_arrays([sur.X[:, cols[0]], sur.X[:, cols[1]]]).unique()
    empty = len(axes[0]) * len(axes[1]) - len(set(seen.tolist()) & {(a, b) for a in axes[0] for b in axes[1]})
    if empty > 0:
        names = f"{sur.features[cols[0]].name},{sur.features[cols[1]].name}"
        notes.warn("unobserved_cells", f"{empty} of {len(axes[0]) * len(axes[1])} level combinations of "
                   f"{names.replace(',', ' x ')} were never run; the PD there is the model's extrapolation", names)
