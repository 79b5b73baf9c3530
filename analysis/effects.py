"""Partial dependence (PD) with ICE curves and bootstrap bands, over the sampled range only.

:func:`partial_dependence` evaluates the surrogate (:mod:`analysis.surrogate`) with one or two
parameters set to each grid value and every other feature left as observed, averaged over a row
sample: the PD. The grid is the parameter's observed levels, or for a numeric parameter with more
than ``grid_points`` levels an even grid (log2 spacing for log-scaled parameters) between its
observed minimum and maximum; nothing is extrapolated beyond the sampled range.

Values are reported on the metric's scale: with a log target the PD is ``exp`` of the mean log
prediction, i.e. a geometric mean of the metric. ICE curves (one per sampled trial, same scale)
show whether the average hides opposite movements (they come from the primary fit).

Intervals (``bands`` says which): forests shrink small effects towards zero, so the spread of
the forest's refits does not cover a small true effect. For one parameter, whenever the
main-effects regression (:mod:`analysis.main_effects`: OLS with config-clustered standard errors,
the same rows and target) can be fitted, the reported curve and its 95% bands are that
regression's partial dependence at each grid value (``bands="regression"``), the headline
``change`` from the first to the last grid value (relative when the target is a log) is its
average marginal effect with its interval, and ``surrogate_estimate`` keeps the forest's PD (the
shape, which can show interactions and curvature the additive model averages out). Otherwise
(too few configs) the curve is the forest's and its bands are built around that estimate from
``n_boot`` refits (which resample configs when repeats exist): estimate +- the 95th percentile of
|refit - estimate|, so they hold the estimate, with a ``forest_bands`` caveat saying they can miss
small effects; the ``change`` then has the forest's estimate with NaN bounds and a ``no_interval``
caveat, as has a two-parameter PD the regression with the pair's products cannot give (its bands
NaN): the refits' spread of a change or of a 2-D surface under-covers (about 80% at 10 configs, on
planted data), so no interval is stated for them. Each stated interval holds its estimate. The 1-D result carries the
parameter's one verdict (:func:`analysis.verdict.parameter_verdicts`, the same as importance
reports), and a sentence worded as an effect or as an association according to the design
(:func:`analysis.common.claim_for`) that states the change and the verdict.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from analysis.common import (
    NO_FOREST_INTERVAL,
    Caveat,
    Claim,
    Interval,
    Notes,
    Subsample,
    claim_for,
    context_of,
    effect_sentence,
)
from analysis.frame import AnalysisInputError
from analysis.main_effects import main_effects_from, pair_pd
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
from analysis.verdict import parameter_verdicts

__all__ = ["PDResult", "claim_for", "effect_sentence", "partial_dependence", "partial_dependence_all"]


@dataclass(frozen=True)
class PDResult:
    """Partial dependence of ``metric`` on ``params`` (one or two names).

    ``grid`` holds each parameter's grid values. For one parameter ``estimate``/``low``/``high``
    are lists over the grid and ``ice`` is one curve per sampled trial; for two they are matrices
    (first parameter's values down, second's across) and ``ice`` is empty. ``bands`` says where
    ``estimate``/``low``/``high`` come from: ``regression`` (the main-effects regression's PD and
    95% intervals; for two parameters the regression with the pair's product columns,
    :func:`analysis.main_effects.pair_pd`) or ``forest`` (the forest's PD with 95% bands around it from its refits, NaN when
    ``n_boot`` is 0 and always for two parameters: caveat ``no_interval``); ``surrogate_estimate`` is always the forest's PD. ``scale`` says what the
    numbers are (a geometric mean when the target is a log). ``change`` (1-D only) is the change
    from the first to the last grid value with its 95% interval, ``relative`` when it is a ratio
    minus one, and ``p_value`` the regression's joint test of no main effect (None for forest
    bands); ``verdict`` and ``why`` are the parameter's one verdict and its evidence; ``sentence``
    words the change as the ``claim`` allows and states the verdict.
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
    surrogate_estimate: list[Any] = field(default_factory=list)
    bands: str = "forest"
    verdict: str | None = None
    why: str | None = None
    p_value: float | None = None
    #: 1-D: the measured median's change between the first and last grid value (ratio minus one with a
    #: log target), beside the model's ``change``; it also carries the other parameters' differences
    measured_change: float | None = None


def _claim(sur: Surrogate, ds: xr.Dataset, names: Sequence[str]) -> Claim:
    observed = [n for n in names if n == "hardware_class"]
    return claim_for(ds, tool_set=not observed)


def partial_dependence(ds: xr.Dataset, params: str | Sequence[str], metric: str | None = None,
                       load_point: str | None = None, n_boot: int = 50, grid_points: int = 12, ice: bool = True,
                       seed: int = 0, hardware_class: str | None = None, max_rows: int = DEFAULT_MAX_ROWS,
                       pd_rows: int = 256, ice_rows: int = 50, n_trees: int = DEFAULT_TREES,
                       include_failover: bool = True) -> PDResult:
    """Partial dependence of ``metric`` on one or two parameters, with ICE and bootstrap bands.

    Args:
        ds: an experiment dataset.
        params: a parameter name or a sequence of one or two names.
        metric: default the ranking objective.
        load_point, hardware_class: analyse within one scenario (load points otherwise pooled; see
            :mod:`analysis.surrogate`). With trials of several hardware classes ``hardware_class``
            is required: classes never share a fit.
        n_boot: bootstrap refits for the forest's bands, used only where the regression's intervals
            are not (0: no bands, NaN bounds; the result's ``n_boot`` says how many were used).
        grid_points: most grid values for a many-valued numeric parameter.
        ice: return ICE curves (1-D only) for at most ``ice_rows`` trials.
        seed: seeds the surrogate, the row samples and the refits.
        max_rows: trials used to fit (whole configs).
        pd_rows: trials averaged over for each PD value (a subsampling note says when that cut).
        n_trees: trees per forest.
        include_failover: keep failover trials (tag ``failover-from:...``, with a caveat) or leave
            them out (:mod:`analysis.hardware`).

    Returns:
        a :class:`PDResult`; :class:`AnalysisInputError` for an unknown or constant parameter or
        more than two names.
    """
    sur = fit_surrogate(ds, metric, load_point, hardware_class, seed, max_rows, n_trees, include_failover)
    return partial_dependence_from(sur, ds, params, n_boot=n_boot, grid_points=grid_points, ice=ice,
                                   pd_rows=pd_rows, ice_rows=ice_rows)


def partial_dependence_all(ds: xr.Dataset, metric: str | None = None, load_point: str | None = None,
                           n_boot: int = 50, grid_points: int = 12, ice: bool = True, seed: int = 0,
                           hardware_class: str | None = None, max_rows: int = DEFAULT_MAX_ROWS,
                           pd_rows: int = 256, ice_rows: int = 50, n_trees: int = DEFAULT_TREES,
                           include_failover: bool = True) -> list[PDResult]:
    """1-D partial dependence of every varying feature (one shared surrogate and set of refits)."""
    sur = fit_surrogate(ds, metric, load_point, hardware_class, seed, max_rows, n_trees, include_failover)
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
    verdict_of = parameter_verdicts(sur, grid_points)[names[0]] if len(cols) == 1 else None
    eff = verdict_of.main_effect if verdict_of is not None else None
    regression = eff is not None and len(eff.level_effects) == len(grid)
    pair = pair_pd(sur, cols[0], cols[1], axes[0], axes[1]) if len(cols) == 2 else None
    regression = regression or pair is not None
    # the forest's refits only where they give the bands (they cost most of the time here): 1-D
    # curves the regression cannot give; never a 2-D surface (see NO_FOREST_INTERVAL)
    boots = np.array([curve(fit.model)[0] for fit in sur.boot_fits(max(0, int(n_boot)))]) \
        if n_boot > 0 and not regression and len(cols) == 1 else np.empty((0, len(grid)))
    boot_m = sur.to_metric(boots)
    forest = sur.to_metric(est_t)
    est, low, high = forest, *_around(forest, boot_m)
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
    measured: tuple[float, int, int] | None = None
    sentence: str | None = None
    verdict: str | None = None
    why: str | None = None
    p_value: float | None = None
    bands = "forest"
    if verdict_of is not None:
        shape: tuple[int, ...] = (len(axes[0]),)
        verdict, why = verdict_of.verdict, verdict_of.why
        if regression and eff is not None:
            bands = "regression"
            est = np.array([iv.estimate for iv in eff.level_effects])
            low = np.array([iv.low for iv in eff.level_effects])
            high = np.array([iv.high for iv in eff.level_effects])
            change, p_value = eff.change, eff.p_value
        elif len(est) >= 2:
            change = _change(sur, forest)
            notes.warn("no_interval", f"no 95% interval for the change of {names[0]}: the main-effects regression "
                       "could not be fitted, and the forest's refits shrink effects (" + NO_FOREST_INTERVAL
                       + "); the change is the forest's estimate alone", names[0])
        if change is not None:
            ctx = context_of(ds, sur.load_point)
            if sur.hardware_class is not None:
                ctx = dataclasses.replace(ctx, hardware=sur.hardware_class)
            measured = _measured_change(sur, cols[0], axes[0])
            sentence = effect_sentence(claim, ctx, names[0], values[0][0], values[0][-1], sur.metric, change,
                                       relative=sur.log_target) + _measured_words(
                                           sur, values[0][0], values[0][-1], measured) + f"; verdict: {verdict} ({why})"
        notes.warnings.extend(main_effects_from(sur, grid_points).warnings)
    else:
        shape = (len(axes[0]), len(axes[1]))
        if pair is not None:  # the regression with the pair's products: bands that do not shrink the effect
            bands = "regression"
            est = np.array([iv.estimate for iv in pair])
            low = np.array([iv.low for iv in pair])
            high = np.array([iv.high for iv in pair])
        else:
            notes.warn("no_interval", "no 95% bands for this 2-D partial dependence: the regression with the pair's "
                       "product columns could not be fitted, and the forest's refits shrink interactions ("
                       + NO_FOREST_INTERVAL + "); the surface is the forest's estimate alone", ",".join(names))
    if bands == "forest" and len(boot_m):
        notes.warn("forest_bands", "these intervals are the spread of the forest's bootstrap refits around its "
                   "estimate: forests shrink small effects towards zero, so they can miss a small true effect"
                   + ("" if len(cols) == 2 else " (the main-effects regression, whose intervals do not, could not "
                      "be fitted here)"), ",".join(names))
    return PDResult(
        metric=sur.metric, params=names, grid=values, estimate=est.reshape(shape).tolist(),
        low=low.reshape(shape).tolist(), high=high.reshape(shape).tolist(), ice=ice_curves, scale=scale,
        n_boot=int(len(boot_m)), claim=claim, change=change, relative=sur.log_target, sentence=sentence,
        load_point=sur.load_point, hardware_class=sur.hardware_class, warnings=notes.warnings,
        subsampled=notes.subsampled, surrogate_estimate=forest.reshape(shape).tolist(), bands=bands,
        verdict=verdict, why=why, p_value=p_value, measured_change=None if measured is None else measured[0])


def _measured_change(sur: Surrogate, col: int, axis: np.ndarray) -> tuple[float, int, int] | None:
    """The change of the measured median of the analysed trials from the first to the last grid
    value (ratio minus one with a log target, else a difference), with how many trials sit at each;
    None when either value has no trial."""
    x = sur.X[:, col]
    y = sur.to_metric(sur.y)
    a, b = y[x == axis[0]], y[x == axis[-1]]
    if not len(a) or not len(b):
        return None
    ma, mb = float(np.median(a)), float(np.median(b))
    return (mb / ma - 1.0 if sur.log_target else mb - ma), int(len(a)), int(len(b))


def _measured_words(sur: Surrogate, a: Any, b: Any, measured: tuple[float, int, int] | None) -> str:
    """What the sentence adds after the model's change: that it is a model estimate, and the change
    of the measured medians beside it (which also carries whatever else differed between those
    trials, so the two can differ)."""
    words = " (modelled: the surrogate's estimate, averaged over the other parameters as the analysed trials ran them)"
    if measured is None:
        return words
    d, n_a, n_b = measured
    change = f"{d * 100:+.3g}%" if sur.log_target else f"{d:+.3g}"
    return (f"{words}; measured: the median {sur.metric} of the analysed trials at {a} vs {b} ({n_a} and {n_b} "
            f"trials) changed by {change}, which also carries whatever else differed between those trials")


def _around(est: np.ndarray, boot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """95% bands built around ``est``: est +- the 95th percentile of |refit - est| per point
    (symmetric, so they always hold the estimate, and widened when the refits sit off it); NaN
    without refits."""
    if not len(boot):
        return np.full(est.shape, np.nan), np.full(est.shape, np.nan)
    half = np.quantile(np.abs(boot - est[None, :]), 0.95, axis=0)
    return est - half, est + half


def _change(sur: Surrogate, est: np.ndarray) -> Interval:
    """Last minus first grid value of the forest's PD (ratio minus one with a log target), with NaN
    bounds: the spread of the forest's refits is no calibrated interval of a change
    (:data:`NO_FOREST_INTERVAL`)."""
    point = float(est[-1] / est[0] - 1.0) if sur.log_target else float(est[-1] - est[0])
    return Interval(point, math.nan, math.nan)


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
