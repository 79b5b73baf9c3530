"""Parameter importance with honest uncertainty.

:func:`importance` refits the surrogate (:mod:`analysis.surrogate`) on ``n_boot`` bootstrap
resamples (of configs when repeats exist, else of trials; the result says which) and, per fit,
measures:

- **permutation importance** on the fit's held-out rows (the units the resample left out): the
  drop in R² of the target (log metric where positive) when one column is shuffled, i.e. the
  increase in held-out squared error divided by the target's variance (at most ``perm_rows``
  held-out rows per fit; a subsampling note says so when that cut anything);
- **mean |SHAP|** (``shap.TreeExplainer``) on at most ``shap_rows`` held-out rows per fit, in
  target units (a subsampling note says how many).

Each parameter gets the median and 95% percentile interval of both over the fits. The random
probe column (fresh noise each fit) gets the same. The forest's evidence compares each parameter
with the probe *within each fit* (paired, so the fit-to-fit variation both share cancels):
``vs_probe`` is the 95% interval of (parameter's permutation importance - probe's) over the first
:data:`~analysis.verdict.VERDICT_BOOT` fits; above zero means the parameter beat the noise column
in at least 97.5% of them. (A stricter rule, "the parameter's interval lies above the probe's upper
bound", wastes power: the unpaired intervals both carry the shared fit-to-fit variation.) The
``verdict`` is the parameter's one verdict from :func:`analysis.verdict.parameter_verdicts`, which
also counts the main-effects regression (:mod:`analysis.main_effects`): forests shrink small
effects, a regression with config-clustered intervals does not. The partial dependence reports the
same verdicts.

Minimum-data caveats: ``too_few_trials`` (fewer than 10 trials per parameter), ``poor_fit``
(R² held out by config below 0.5, value stated; :func:`analysis.surrogate.grouped_r2`), ``aliased``
(two parameters determining each other or correlated beyond |r| = 0.95 in the sample, or a
parameter constant within the filter), ``too_few_configs`` / ``linear_main_effects`` (the
regression could not be fitted, or only with linear main effects).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xarray as xr

from analysis.common import Caveat, Claim, Interval, Notes, Subsample, claim_for, percentile_interval
from analysis.main_effects import main_effects_from
from analysis.surrogate import DEFAULT_MAX_ROWS, DEFAULT_TREES, PROBE, Surrogate, fit_surrogate, fit_warnings
from analysis.verdict import VERDICT_BOOT, Verdict, parameter_verdicts, permutation_matrix

__all__ = ["ImportanceResult", "ParameterImportance", "claim_for", "importance"]


@dataclass(frozen=True)
class ParameterImportance:
    """One parameter's importance: ``permutation`` (drop in held-out R² of the target when
    shuffled) and ``shap`` (mean |SHAP| in target units), each median [95% interval] over the
    bootstrap fits; ``vs_probe`` is the interval of its permutation importance minus the probe's
    (paired by fit, over the first :data:`~analysis.verdict.VERDICT_BOOT` refits). ``verdict`` is the
    parameter's one verdict (:func:`analysis.verdict.parameter_verdicts`: important when that
    interval lies above zero or the main-effects regression's interval excludes no change),
    ``why`` its evidence in words and ``main_effect`` the regression's change from the first to
    the last level (None when it could not be estimated)."""

    name: str
    permutation: Interval
    shap: Interval
    verdict: Verdict
    vs_probe: Interval
    rank: int = 0
    why: str = ""
    main_effect: Interval | None = None


@dataclass(frozen=True)
class ImportanceResult:
    """What :func:`importance` returns. ``parameters`` are sorted by median permutation
    importance (rank 1 first); ``probe`` is the noise yardstick."""

    metric: str
    target: str
    load_point: str | None
    hardware_class: str | None
    n_trials: int
    n_boot: int
    resampled: str
    oob_r2: float
    heldout_r2: Interval
    parameters: list[ParameterImportance]
    probe: ParameterImportance
    claim: Claim
    method: str
    warnings: list[Caveat] = field(default_factory=list)
    subsampled: list[Subsample] = field(default_factory=list)

    def get(self, name: str) -> ParameterImportance:
        """The entry for ``name`` (KeyError naming it when absent)."""
        for p in self.parameters:
            if p.name == name:
                return p
        if name == PROBE:
            return self.probe
        raise KeyError(f"no importance for {name!r}; have: {', '.join(p.name for p in self.parameters)}")

    @property
    def important(self) -> list[str]:
        return [p.name for p in self.parameters if p.verdict == "important"]


def _mean_abs_shap(model: Any, X: np.ndarray) -> np.ndarray:
    import shap

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        values = shap.TreeExplainer(model).shap_values(X, check_additivity=False)
    return np.abs(np.asarray(values, dtype=float)).mean(axis=0)


def importance(ds: xr.Dataset, metric: str | None = None, load_point: str | None = None, n_boot: int = 100,
               seed: int = 0, max_rows: int = DEFAULT_MAX_ROWS, shap_rows: int = 32, perm_rows: int = 800,
               hardware_class: str | None = None, n_trees: int = DEFAULT_TREES,
               include_failover: bool = True) -> ImportanceResult:
    """Bootstrapped permutation and SHAP importance of every swept parameter, against a noise probe.

    Args:
        ds: an experiment dataset.
        metric: the metric explained; default the ranking objective (``ds.attrs["ranking"]``).
        load_point, hardware_class: analyse within one scenario (load points otherwise pooled; see
            :mod:`analysis.surrogate`). With trials of several hardware classes ``hardware_class``
            is required: classes never share a fit.
        n_boot: bootstrap refits of the surrogate.
        seed: seeds everything (same seed, same answer).
        max_rows: trials used for fitting (whole configs), above which a subsample is taken.
        shap_rows: held-out rows per fit explained with SHAP.
        perm_rows: held-out rows per fit used for permutation importance.
        n_trees: trees per forest.
        include_failover: keep failover trials (tag ``failover-from:...``, with a caveat) or leave
            them out (:mod:`analysis.hardware`).

    Returns:
        an :class:`ImportanceResult` with the claim (effect or association), caveats and
        subsampling notes.
    """
    sur = fit_surrogate(ds, metric, load_point, hardware_class, seed, max_rows, n_trees, include_failover)
    return importance_from(sur, ds, n_boot=n_boot, shap_rows=shap_rows, perm_rows=perm_rows)


def importance_from(sur: Surrogate, ds: xr.Dataset, n_boot: int = 100, shap_rows: int = 32,
                    perm_rows: int = 800) -> ImportanceResult:
    """:func:`importance` on an already fitted surrogate (reuses its cached bootstrap fits)."""
    notes = Notes(list(sur.warnings), list(sur.subsampled))
    notes.warnings.extend(fit_warnings(sur))
    n_boot = max(1, int(n_boot))
    fits = sur.boot_fits(n_boot)
    k = sur.X.shape[1]
    perm, r2 = permutation_matrix(sur, n_boot, perm_rows)
    shp = np.full((n_boot, k), np.nan)
    max_held, max_perm, max_shap = 0, 0, 0
    for i, fit in enumerate(fits):
        _, _, n_held, n_perm = sur._permutations[(i, perm_rows)]
        if n_held < 2:
            continue
        max_held, max_perm = max(max_held, n_held), max(max_perm, n_perm)
        rng = np.random.default_rng([sur.seed, 7, i])
        held = fit.heldout
        srows = held if len(held) <= shap_rows else np.sort(rng.choice(held, shap_rows, replace=False))
        max_shap = max(max_shap, len(srows))
        Xs = sur.X[srows].copy()
        Xs[:, sur.probe_index] = fit.probe[srows]
        shp[i] = _mean_abs_shap(fit.model, Xs)
    if max_perm < max_held:
        notes.subsample("held-out rows per fit for permutation importance", max_perm, max_held)
    if max_shap < max_held:
        notes.subsample("held-out rows per fit explained with SHAP", max_shap, max_held)
    valid = np.isfinite(perm[:, 0])
    if valid.sum() < n_boot:
        notes.warn("few_heldout", f"{int(n_boot - valid.sum())} of {n_boot} bootstrap fits left fewer than 2 "
                   "units out and were skipped")
    verdicts = parameter_verdicts(sur)
    notes.warnings.extend(main_effects_from(sur).warnings)
    probe_perm = percentile_interval(perm[valid, sur.probe_index])
    zero = percentile_interval(np.zeros(int(valid.sum())))
    probe = ParameterImportance(PROBE, probe_perm, percentile_interval(shp[valid, sur.probe_index]), "probe", zero)
    entries: list[ParameterImportance] = []
    for j, feat in enumerate(sur.features):
        v = verdicts[feat.name]
        entries.append(ParameterImportance(feat.name, percentile_interval(perm[valid, j]),
                                           percentile_interval(shp[valid, j]), v.verdict, v.vs_probe,
                                           why=v.why, main_effect=v.main_effect.change if v.main_effect else None))
    entries.sort(key=lambda e: -e.permutation.estimate if math.isfinite(e.permutation.estimate) else math.inf)
    entries = [dataclasses.replace(e, rank=r + 1) for r, e in enumerate(entries)]
    method = (f"random forest ({sur.n_trees} trees) on {sur.target}; {n_boot} bootstrap refits resampling "
              f"{sur.resampled}; permutation importance = drop in held-out R² when a column is shuffled; "
              "SHAP = mean |SHAP value| (TreeExplainer) on held-out rows; 'important' when the 95% interval of "
              f"(permutation importance - the random probe's, paired by fit, over {VERDICT_BOOT} refits) lies above "
              "zero or the main-effects regression's 95% interval (config-clustered) excludes no change")
    return ImportanceResult(
        metric=sur.metric, target=sur.target, load_point=sur.load_point, hardware_class=sur.hardware_class,
        n_trials=sur.n_trials, n_boot=n_boot, resampled=sur.resampled, oob_r2=sur.oob_r2,
        heldout_r2=percentile_interval(r2[valid]), parameters=entries, probe=probe, claim=sur.claim,
        method=method, warnings=notes.warnings, subsampled=notes.subsampled)
