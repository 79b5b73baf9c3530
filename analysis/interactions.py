"""Pairwise interactions: observed cells, Friedman's H² and SHAP interaction values.

For each pair of parameters :func:`interactions` reports

- **observed cells**: the median of the metric and the trial count in each cell of the two
  parameters' levels (a numeric parameter with more than 4 levels is cut into at most 4 quantile
  bins), from all analysed trials; cells with fewer than 3 trials are flagged (``thin_cells``);
- **Friedman's H²** from the surrogate (:mod:`analysis.surrogate`), computed here: on a sample of
  ``h_rows`` trials, with ``PD_j``, ``PD_k`` and ``PD_jk`` the partial dependences (averaged over
  the same sample) evaluated at each sampled trial's own values and centred over the sample,
  ``H² = sum((PD_jk - PD_j - PD_k)²) / sum(PD_jk²)``: the share of the pair's joint effect that
  is not the sum of the two main effects (0 = additive). Forests shrink interactions (a planted
  strength of 0.057 came out 0.010), so whenever the main-effects regression
  (:mod:`analysis.main_effects`) can also carry the pair's product columns, the reported H² and
  strength are that regression's (:func:`analysis.main_effects.pair_strength`: the same formulas
  on the fitted linear model, intervals from its config-clustered covariance) and the forest's
  values are kept beside them (``source`` says which). Where it cannot (too few configs), H² and
  strength are the forest's estimates with NaN bounds and a ``no_interval`` caveat: the spread of
  the forest's bootstrap refits is no 95% interval of an interaction (on planted surfaces with 10
  configs it covered a real interaction in 0 of 20 experiments). H² is relative: for two parameters that
  barely matter, the joint PD is the model's noise and H² a ratio of two tiny numbers that can
  come out anywhere in [0, 1]. So each pair also gets its **strength**: the same numerator divided
  by the variance of the surrogate's predictions over the sample (the share of all predicted
  variation that is this pair's interaction), pairs are sorted by strength, and a pair whose joint
  effect is under 1% of the predicted variation gets a ``weak_joint_effect`` caveat;
- **SHAP interaction value**: mean over ``shap_rows`` trials of the pair's total |SHAP interaction|
  (``2 |phi_jk|``, TreeExplainer splits it evenly between ``jk`` and ``kj``), in target units.

Pairs whose two parameters are correlated in the sample (|Spearman| > 0.5) get a ``correlated``
caveat: the model cannot tell their joint effect from either alone. When there are more than
``max_pairs`` pairs, the pairs of the most important features (by the forest's impurity
importance) are computed and a subsampling note says how many.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from analysis.common import NO_FOREST_INTERVAL, Caveat, Claim, Interval, Notes, Subsample, claim_for
from analysis.frame import AnalysisInputError
from analysis.main_effects import pair_strength
from analysis.surrogate import (
    DEFAULT_MAX_ROWS,
    DEFAULT_TREES,
    Feature,
    Surrogate,
    analysed_trials,
    fit_surrogate,
    fit_warnings,
    pd_curve,
    predict,
    sample_rows,
)

__all__ = ["Cell", "InteractionResult", "PairInteraction", "claim_for", "interactions"]

THIN = 3
CORRELATED = 0.5
MAX_BINS = 4
WEAK_JOINT = 0.01


@dataclass(frozen=True)
class Cell:
    """One observed cell: levels (or bins) ``a`` and ``b`` of the pair, the trials in it and
    their median metric (NaN when empty)."""

    a: str
    b: str
    count: int
    median: float


@dataclass(frozen=True)
class PairInteraction:
    """One pair: ``h2`` (Friedman's H²) and ``strength`` (the interaction's share of all predicted
    variation), each with a 95% interval that holds its estimate, from ``source``: ``regression``
    (:func:`analysis.main_effects.pair_strength`, calibrated) or ``forest`` (the surrogate, interval
    from its refits); ``surrogate_h2``/``surrogate_strength`` are always the forest's values and
    ``p_value`` the regression's test of no interaction (None for ``forest``);
    ``joint_share`` (the pair's whole joint PD's share of it), ``shap_interaction`` (mean total |SHAP interaction| in target units), the observed ``cells``,
    the pair's Spearman correlation in the sample, and its caveats."""

    params: tuple[str, str]
    h2: Interval
    strength: Interval
    joint_share: float
    shap_interaction: float
    spearman: float
    cells: list[Cell]
    warnings: list[Caveat] = field(default_factory=list)
    source: str = "forest"
    surrogate_h2: float = math.nan
    surrogate_strength: float = math.nan
    p_value: float | None = None


@dataclass(frozen=True)
class InteractionResult:
    """What :func:`interactions` returns; ``pairs`` sorted by interaction strength (largest first)."""

    metric: str
    target: str
    load_point: str | None
    hardware_class: str | None
    n_trials: int
    pairs: list[PairInteraction]
    n_pairs_total: int
    n_pairs_computed: int
    n_boot: int
    h_rows: int
    shap_rows: int
    claim: Claim
    method: str
    warnings: list[Caveat] = field(default_factory=list)
    subsampled: list[Subsample] = field(default_factory=list)

    def get(self, a: str, b: str) -> PairInteraction:
        """The entry for the pair (either order); KeyError naming it when absent."""
        for p in self.pairs:
            if set(p.params) == {a, b}:
                return p
        raise KeyError(f"no interaction computed for {a!r} x {b!r}")


def interactions(ds: xr.Dataset, metric: str | None = None, load_point: str | None = None,
                 pairs: Sequence[tuple[str, str]] | None = None, max_pairs: int = 100, seed: int = 0,
                 n_boot: int = 10, h_rows: int = 80, shap_rows: int = 24, hardware_class: str | None = None,
                 max_rows: int = DEFAULT_MAX_ROWS, n_trees: int = DEFAULT_TREES,
                 include_failover: bool = True) -> InteractionResult:
    """Pairwise interactions of the swept parameters on ``metric``.

    Args:
        ds: an experiment dataset.
        metric: default the ranking objective.
        load_point, hardware_class: analyse within one scenario (load points otherwise pooled; see
            :mod:`analysis.surrogate`). With trials of several hardware classes ``hardware_class``
            is required: classes never share a fit.
        pairs: the pairs to compute (default all pairs of varying features).
        max_pairs: compute at most this many pairs (those of the most important features).
        seed: seeds everything.
        n_boot: kept for callers; no longer used: the intervals come from the regression, and a pair it
            cannot fit gets none (the forest's refits shrink interactions, so their spread under-covered).
        h_rows: trials in the H² sample (PD evaluated at and averaged over them).
        shap_rows: trials explained with SHAP interaction values.
        max_rows: trials used to fit (whole configs).
        n_trees: trees per forest.
        include_failover: keep failover trials (tag ``failover-from:...``, with a caveat) or leave
            them out (:mod:`analysis.hardware`).

    Returns:
        an :class:`InteractionResult`; :class:`AnalysisInputError` for an unknown or constant
        parameter in ``pairs``.
    """
    sur = fit_surrogate(ds, metric, load_point, hardware_class, seed, max_rows, n_trees, include_failover)
    return interactions_from(sur, ds, pairs=pairs, max_pairs=max_pairs, h_rows=h_rows,
                             shap_rows=shap_rows)


def interactions_from(sur: Surrogate, ds: xr.Dataset, pairs: Sequence[tuple[str, str]] | None = None,
                      max_pairs: int = 100, h_rows: int = 80,
                      shap_rows: int = 24) -> InteractionResult:
    """:func:`interactions` on an already fitted surrogate (reuses its bootstrap refits)."""
    notes = Notes(list(sur.warnings), list(sur.subsampled))
    notes.warnings.extend(fit_warnings(sur))
    if pairs is None:
        all_pairs = list(itertools.combinations(range(len(sur.features)), 2))
    else:
        all_pairs = []
        for pair in pairs:
            if len(pair) != 2 or pair[0] == pair[1]:
                raise AnalysisInputError(f"an interaction pair needs two distinct parameters, got {pair!r}")
            all_pairs.append((sur.index(pair[0]), sur.index(pair[1])))
    chosen = all_pairs
    if len(all_pairs) > max_pairs:
        imp = np.asarray(sur.model.feature_importances_, dtype=float)
        chosen = sorted(all_pairs, key=lambda p: -imp[p[0]] * imp[p[1]])[:max(0, int(max_pairs))]
        notes.subsample("parameter pairs (those of the most important parameters by forest impurity importance)",
                        len(chosen), len(all_pairs))
    rng = np.random.default_rng([sur.seed, 5])
    rows = sample_rows(len(sur.y), h_rows, rng)
    notes.subsample("trials in the H² sample (PD evaluated at and averaged over them)", len(rows), len(sur.y))
    S = sur.X[rows]
    h_est, s_est, j_est = h2_statistics(sur.model, S, chosen)
    regression = [pair_strength(sur, j, k, S) for j, k in chosen]
    srows = sample_rows(len(sur.y), shap_rows, np.random.default_rng([sur.seed, 6]))
    notes.subsample("trials explained with SHAP interaction values", len(srows), len(sur.y))
    shap_pair = _shap_pairs(sur.model, sur.X[srows], chosen)
    df, _ = analysed_trials(ds, sur.metric, sur.load_point, sur.hardware_class, sur.include_failover)
    y_all = pd.to_numeric(df[sur.metric], errors="coerce").to_numpy(dtype=float)
    out: list[PairInteraction] = []
    for i, (j, k) in enumerate(chosen):
        fj, fk = sur.features[j], sur.features[k]
        pair_notes = Notes()
        rho = _spearman(sur.X[:, j], sur.X[:, k])
        if math.isfinite(rho) and abs(rho) > CORRELATED:
            pair_notes.warn("correlated", f"{fj.name} and {fk.name} are correlated in the sample (Spearman "
                            f"{rho:+.2f}); their interaction cannot be told from either main effect",
                            f"{fj.name},{fk.name}")
        cells = _cells(df, fj, fk, y_all)
        thin = [c for c in cells if c.count < THIN]
        if thin:
            pair_notes.warn("thin_cells", f"{len(thin)} of {len(cells)} cells of {fj.name} x {fk.name} hold fewer "
                            f"than {THIN} trials ({sum(c.count == 0 for c in thin)} none)", f"{fj.name},{fk.name}")
        ps = regression[i]
        if ps is not None:
            h2, strength, share, source = ps.h2, ps.strength, ps.joint_share, "regression"
        else:  # the forest's estimates alone: its refits' spread is no calibrated interval here
            h2 = Interval(float(h_est[i]), math.nan, math.nan)
            strength = Interval(float(s_est[i]), math.nan, math.nan)
            share, source = float(j_est[i]), "forest"
            pair_notes.warn("no_interval", "too few configs for the regression with this pair's product columns: "
                            "H² and strength are the forest's estimates, with no 95% interval, because the "
                            "forest's refits shrink interactions (" + NO_FOREST_INTERVAL + ")", f"{fj.name},{fk.name}")
        if not share >= WEAK_JOINT:
            pair_notes.warn("weak_joint_effect", f"together {fj.name} and {fk.name} move the prediction little "
                            f"({100 * share:.2g}% of its variation), so H² is a ratio of small numbers; read the "
                            "strength instead", f"{fj.name},{fk.name}")
        out.append(PairInteraction((fj.name, fk.name), h2, strength, share, float(shap_pair[i]), rho,
                                   cells, pair_notes.warnings, source, float(h_est[i]), float(s_est[i]),
                                   ps.p_value if ps is not None else None))
    out.sort(key=lambda p: -p.strength.estimate if math.isfinite(p.strength.estimate) else math.inf)
    n_reg = sum(p.source == "regression" for p in out)
    method = (f"pairs sorted by interaction strength (H²'s numerator over the variance of the predictions); "
              f"{n_reg} of {len(out)} pairs from an OLS of {sur.target} on every main effect plus the pair's "
              "products (config-clustered covariance; intervals from 400 draws of its coefficients, around the "
              "estimate), the others from the forest: "
              f"Friedman's H² from a random forest ({sur.n_trees} trees) on {sur.target}, PDs over {len(rows)} "
              "sampled trials, with no interval (the forest's refits shrink interactions; caveat no_interval); SHAP "
              f"interaction = mean 2|phi_jk| on {len(srows)} trials; cells from all {len(df)} analysed trials")
    return InteractionResult(
        metric=sur.metric, target=sur.target, load_point=sur.load_point, hardware_class=sur.hardware_class,
        n_trials=sur.n_trials, pairs=out, n_pairs_total=len(all_pairs), n_pairs_computed=len(chosen),
        n_boot=0, h_rows=len(rows), shap_rows=len(srows), claim=sur.claim, method=method,
        warnings=notes.warnings, subsampled=notes.subsampled)


def _centred_pd(model: Any, S: np.ndarray, cols: list[int]) -> np.ndarray:
    """The PD on ``cols`` at each sample row's own values, centred over the sample."""
    uniq, inv = np.unique(S[:, cols], axis=0, return_inverse=True)
    pdv = pd_curve(model, S, cols, uniq).mean(axis=1)[np.asarray(inv).reshape(-1)]
    return pdv - pdv.mean()


def h2_statistics(model: Any, S: np.ndarray, pairs: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For one model on the sample ``S``, per pair: Friedman's H², the interaction's share of the
    predictions' variation (strength) and the joint PD's share of it."""
    mains: dict[int, np.ndarray] = {}
    h2 = np.full(len(pairs), np.nan)
    strength = np.full(len(pairs), np.nan)
    joint_share = np.full(len(pairs), np.nan)
    pred = predict(model, S)
    total = float(((pred - pred.mean()) ** 2).sum())
    for i, (j, k) in enumerate(pairs):
        for c in (j, k):
            if c not in mains:
                mains[c] = _centred_pd(model, S, [c])
        joint = _centred_pd(model, S, [j, k])
        num = float(((joint - mains[j] - mains[k]) ** 2).sum())
        denom = float((joint ** 2).sum())
        if denom > 0:
            h2[i] = num / denom
        if total > 0:
            strength[i] = num / total
            joint_share[i] = denom / total
    return h2, strength, joint_share


def _shap_pairs(model: Any, X: np.ndarray, pairs: list[tuple[int, int]]) -> np.ndarray:
    if not pairs:
        return np.empty(0)
    import shap

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        values = np.asarray(shap.TreeExplainer(model).shap_interaction_values(X), dtype=float)
    mean_abs = np.abs(values).mean(axis=0)
    return np.array([mean_abs[j, k] + mean_abs[k, j] for j, k in pairs])


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra = pd.Series(a).rank().to_numpy()
    rb = pd.Series(b).rank().to_numpy()
    if ra.std() == 0 or rb.std() == 0:
        return math.nan
    return float(np.corrcoef(ra, rb)[0, 1])


def _labels(df: pd.DataFrame, feat: Feature) -> pd.Series:
    """Cell labels of a feature: its level, or a quantile bin ``[lo, hi]`` for a many-valued numeric."""
    col = df[feat.param.column]
    if feat.kind == "numeric" and len(feat.levels) > MAX_BINS:
        num = pd.to_numeric(col, errors="coerce")
        bins = pd.qcut(num.rank(method="dense"), MAX_BINS, labels=False, duplicates="drop")
        lab = pd.Series("unset", index=df.index, dtype=object)
        for b in sorted(bins.dropna().unique()):
            sel = bins == b
            lo, hi = num[sel].min(), num[sel].max()
            lab[sel] = f"{lo:g}" if lo == hi else f"[{lo:g}, {hi:g}]"
        return lab
    return col.map(lambda v: "unset" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v))


def _cells(df: pd.DataFrame, fj: Feature, fk: Feature, y: np.ndarray) -> list[Cell]:
    la, lb = _labels(df, fj), _labels(df, fk)
    frame = pd.DataFrame({"a": la.to_numpy(), "b": lb.to_numpy(), "y": y})
    stats = frame.groupby(["a", "b"], sort=False)["y"].agg(["count", "median"])
    order_a = _ordered(frame["a"])
    order_b = _ordered(frame["b"])
    cells: list[Cell] = []
    for a in order_a:
        for b in order_b:
            if (a, b) in stats.index:
                row = stats.loc[(a, b)]
                cells.append(Cell(a, b, int(row["count"]), float(row["median"])))
            else:
                cells.append(Cell(a, b, 0, math.nan))
    return cells


def _ordered(labels: pd.Series) -> list[str]:
    uniq = [str(v) for v in pd.unique(labels)]

    def key(s: str) -> tuple[int, float, str]:
        t = s.strip("[]").split(",")[0]
        try:
            return (0, float(t), s)
        except ValueError:
            return (1, 0.0, s)

    return sorted(uniq, key=key)
