"""Main effects with honest intervals: a regression of the target on the parameters' main effects.

The forest (:mod:`analysis.surrogate`) is good at shape, interactions and ranking, but it shrinks
small effects towards zero, so intervals built from its refits miss small true effects (a planted
+3% effect came out +0.5% [-0.7%, +2.0%]). This module is its complement: an ordinary least-squares
regression (statsmodels ``OLS``) of the same target (the log of the metric when it is positive, so
effects are relative changes) on the same rows, with

- **one column per level** of each parameter beyond its first (a categorical or boolean parameter's
  levels; a numeric parameter's grid values, the points of :func:`analysis.surrogate.grid_codes`,
  as a piecewise-linear basis between them), plus an indicator for "not set" where a flag was
  sometimes left at vLLM's default; when there are too few configs for that many columns
  (fewer than :data:`CONFIGS_PER_COLUMN` configs per column) each numeric or boolean parameter gets
  one linear column instead (in its log2 when the parameter is log-scaled) and the result says
  ``coding="linear"``; with fewer still nothing is estimated (``estimable`` false, caveat
  ``too_few_configs``) rather than a confident number from an over-fitted model;
- **planned pairs** (``pairs=``): products of two parameters' columns, for pairs whose interaction
  the experiment set out to measure (kept out by default: choosing pairs from the same data would
  make their intervals optimistic);
- **standard errors clustered by config** (the repeats of one config are one unit: they share
  whatever that config's server start did), CRV3 (jackknife-like) below :data:`CRV3_BELOW`
  configs, CRV1 above, with Student-t quantiles on (configs - 1) degrees of freedom.

Per parameter it reports the partial dependence of the fitted additive model at each grid value
(``exp`` of the mean prediction over the analysed rows with that parameter set to the value, a
geometric mean of the metric with a log target) and the **change from the first to the last grid
value** averaged over the other parameters as observed (an average marginal effect; a ratio
minus one with a log target), each with a 95% interval that contains its estimate, and the
p-value of the joint (Wald) test that the parameter has no main effect. Under a randomised design
with independent parameter values the main-effects coefficients estimate the average effect even
when interactions exist (the interaction's remainder is uncorrelated with the main-effect columns
and lands in the clustered residuals).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from analysis.common import Caveat, Interval, Notes
from analysis.surrogate import Feature, Surrogate, grid_codes, grid_values

__all__ = ["CONFIGS_PER_COLUMN", "MainEffect", "MainEffectsResult", "main_effects_from"]

#: at least this many configs (clusters) per regression column, else a coarser coding or nothing
CONFIGS_PER_COLUMN = 3.0
#: CRV3 cluster-robust covariance below this many configs (better small-sample coverage), CRV1 above
CRV3_BELOW = 200
Coding = Literal["levels", "linear", "none"]


@dataclass(frozen=True)
class MainEffect:
    """One parameter's main effect: the additive model's PD at each grid value (``levels``;
    ``level_effects`` on the metric's scale, a geometric mean with a log target) and the change
    from the first to the last grid value (``change``: relative when ``relative``), each with its
    95% interval; ``p_value`` of the joint test of no main effect."""

    name: str
    levels: list[Any]
    level_effects: list[Interval]
    change: Interval
    p_value: float


@dataclass(frozen=True)
class MainEffectsResult:
    """What :func:`main_effects_from` returns. ``coding`` is ``levels`` (a column per level or grid
    value), ``linear`` (one column per numeric or boolean parameter) or ``none`` (not estimable:
    ``effects`` empty). ``n_configs`` is the number of clusters."""

    metric: str
    target: str
    relative: bool
    coding: Coding
    n_trials: int
    n_configs: int
    n_columns: int
    r2: float
    pairs: list[tuple[str, str]]
    effects: list[MainEffect]
    method: str
    warnings: list[Caveat] = field(default_factory=list)
    _blocks: list[Any] = field(default_factory=list, repr=False)

    @property
    def estimable(self) -> bool:
        return self.coding != "none"

    def get(self, name: str) -> MainEffect | None:
        for e in self.effects:
            if e.name == name:
                return e
        return None


def _hat_basis(x: np.ndarray, knots: np.ndarray) -> np.ndarray:
    """Piecewise-linear basis on ``knots`` (columns: one per knot); at a knot it is that knot's
    indicator, between knots it interpolates, outside it holds the end knot's."""
    eye = np.eye(len(knots))
    return np.column_stack([np.interp(x, knots, eye[i]) for i in range(len(knots))])


@dataclass(frozen=True)
class _Block:
    """The regression columns of one feature: ``basis(x)`` -> (rows, width)."""

    feature: Feature
    knots: np.ndarray
    linear: bool

    def basis(self, x: np.ndarray) -> np.ndarray:
        missing = np.isfinite(self.feature.missing_code) & (x == self.feature.missing_code)
        if self.linear:
            cols = [np.where(missing, self.knots[0], x) - self.knots[0]]
        else:
            cols = list(_hat_basis(np.where(missing, self.knots[0], x), self.knots)[:, 1:].T)
        if np.isfinite(self.feature.missing_code):
            cols.append(missing.astype(float))
        return np.column_stack(cols) if cols else np.empty((len(x), 0))

    def pair_basis(self, x: np.ndarray) -> np.ndarray:
        """The columns a product with another parameter uses: linear in the (log2) value, or the
        level indicators of a categorical parameter with more than two levels."""
        missing = np.isfinite(self.feature.missing_code) & (x == self.feature.missing_code)
        x = np.where(missing, self.knots[0], x)
        if self.feature.kind == "categorical" and len(self.knots) > 2:
            return _hat_basis(x, self.knots)[:, 1:]
        return (x - self.knots[0])[:, None]


def _one_blas_thread() -> Any:
    """Run the regressions' linear algebra on one BLAS thread. Their matrices are small (thousands
    of rows x tens of columns, 66 pair models in a 12-parameter analysis), where a second BLAS
    thread buys nothing, and OpenBLAS's spinning threads contend with the forests' worker threads:
    on a loaded 2-core machine the interactions section took 5 to 42 s from run to run. The results
    are the same (up to floating-point summation order)."""
    from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

    return threadpool_limits(limits=1, user_api="blas")


def _supported(design: np.ndarray, groups: np.ndarray, n_configs: int) -> bool:
    """Enough configs for ``design``: at least :data:`CONFIGS_PER_COLUMN` per column, full rank,
    and every column non-zero in at least 3 configs (a level seen in one config has a clustered
    standard error of about zero: its own residuals are orthogonal to it)."""
    if n_configs < CONFIGS_PER_COLUMN * design.shape[1] or np.linalg.matrix_rank(design) < design.shape[1]:
        return False
    for c in range(1, design.shape[1]):
        if len(np.unique(groups[design[:, c] != 0])) < 3:
            return False
    return True


def _ols(y: np.ndarray, design: np.ndarray, groups: np.ndarray, n_configs: int) -> Any:
    """OLS with config-clustered covariance: CRV3 below :data:`CRV3_BELOW` configs (CRV1 when a
    leave-one-config-out fit is not identified), CRV1 above; Student-t inference on configs - 1 df."""
    from statsmodels.regression.linear_model import OLS

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if n_configs < CRV3_BELOW:
            try:
                return OLS(y, design).fit(cov_type="cluster-crv3", cov_kwds={"groups": groups}, use_t=True)
            except (ValueError, np.linalg.LinAlgError):
                pass
        return OLS(y, design).fit(cov_type="cluster", cov_kwds={"groups": groups}, use_t=True)


def _joint_p(res: Any, start: int, stop: int) -> float:
    """p-value of the joint Wald test (clustered covariance) that coefficients start..stop-1 are 0."""
    R = np.zeros((stop - start, len(res.params)))
    R[np.arange(stop - start), np.arange(start, stop)] = 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return float(res.f_test(R).pvalue)
        except (ValueError, np.linalg.LinAlgError):
            return math.nan


def _blocks(sur: Surrogate, grid_points: int, linear: bool) -> list[_Block] | None:
    out = []
    for f in sur.features:
        knots = grid_codes(f, grid_points)
        lin = linear and (f.kind != "categorical" or len(knots) == 2)
        out.append(_Block(f, knots, lin))
    return out


def _design(blocks: list[_Block], X: np.ndarray, pairs: list[tuple[int, int]]) -> tuple[np.ndarray, list[slice]]:
    parts = [np.ones((len(X), 1))]
    spans: list[slice] = []
    at = 1
    for j, b in enumerate(blocks):
        cols = b.basis(X[:, j])
        parts.append(cols)
        spans.append(slice(at, at + cols.shape[1]))
        at += cols.shape[1]
    for j, k in pairs:
        a, c = blocks[j].pair_basis(X[:, j]), blocks[k].pair_basis(X[:, k])
        parts.append(np.einsum("ni,nj->nij", a, c).reshape(len(X), -1))
    return np.column_stack(parts), spans


def main_effects_from(sur: Surrogate, grid_points: int = 12, pairs: list[tuple[str, str]] | None = None,
                      level: float = 0.95) -> MainEffectsResult:
    """The main-effects regression on a fitted surrogate's rows (cached on the surrogate).

    Args:
        sur: a fitted :class:`~analysis.surrogate.Surrogate` (its rows, target and config clusters).
        grid_points: most grid values for a many-valued numeric parameter (as the PD uses).
        pairs: planned pairs to include as interaction columns (names of features).
        level: interval level.

    Returns:
        a :class:`MainEffectsResult`; not estimable (``coding="none"``, a ``too_few_configs``
        caveat) when even the linear coding leaves fewer than :data:`CONFIGS_PER_COLUMN` configs
        per column.
    """
    key = (grid_points, tuple(tuple(p) for p in pairs or ()), level)
    cache = sur._main_effects
    if key not in cache:
        with _one_blas_thread():
            cache[key] = _fit(sur, grid_points, list(pairs or ()), level)
    return cache[key]  # type: ignore[no-any-return]


def _fit(sur: Surrogate, grid_points: int, pairs: list[tuple[str, str]], level: float) -> MainEffectsResult:
    from scipy import stats

    notes = Notes()
    X = sur.X[:, :len(sur.features)]
    groups = np.asarray(sur.clusters)
    n_configs = int(len(np.unique(groups)))
    pair_idx = [(sur.index(a), sur.index(b)) for a, b in pairs]
    coding: Coding = "none"
    design = None
    blocks: list[_Block] | None = None
    spans: list[slice] = []
    for candidate, linear in (("levels", False), ("linear", True)):
        blocks = _blocks(sur, grid_points, linear)
        assert blocks is not None
        design, spans = _design(blocks, X, pair_idx)
        if _supported(design, groups, n_configs):
            coding = candidate  # type: ignore[assignment]
            break
    method = (f"OLS of {sur.target} on the parameters' main effects"
              + (f" and {len(pairs)} planned pair(s)" if pairs else "")
              + f", standard errors clustered by config (CRV3 below {CRV3_BELOW} configs where every "
              f"leave-one-config-out fit is identified, else CRV1; t with {n_configs - 1} df); change = average over the analysed rows of the prediction at the "
              "last grid value minus at the first")
    if coding == "none" or design is None or blocks is None:
        width = design.shape[1] if design is not None else 0
        notes.warn("too_few_configs", f"{n_configs} configs are too few for a main-effects regression of "
                   f"{len(sur.features)} parameters (it needs at least {CONFIGS_PER_COLUMN:g} configs per column, "
                   f"{math.ceil(CONFIGS_PER_COLUMN * width)} for the {width} columns of the simplest coding, and "
                   "columns that are not collinear); no main effect is stated with an interval")
        return MainEffectsResult(sur.metric, sur.target, sur.log_target, "none", len(sur.y), n_configs,
                                 width, math.nan, pairs, [], method, notes.warnings)
    if coding == "linear":
        notes.warn("linear_main_effects", f"{n_configs} configs are too few for one regression column per level; "
                   "each numeric or boolean parameter's main effect is taken as linear in its (log2) value")
    res = _ols(sur.y, design, groups, n_configs)
    beta = np.asarray(res.params, dtype=float)
    cov = np.asarray(res.cov_params(), dtype=float)
    df = max(1, n_configs - 1)
    tq = float(stats.t.ppf(0.5 + level / 2, df))

    def interval(L: np.ndarray, relative: bool) -> Interval:
        est = float(L @ beta)
        var = float(L @ cov @ L)
        se = math.sqrt(var) if var > 0 else 0.0
        lo, hi = est - tq * se, est + tq * se
        if relative:
            return Interval(math.exp(est) - 1.0, math.exp(lo) - 1.0, math.exp(hi) - 1.0, level)
        return Interval(est, lo, hi, level)

    out: list[MainEffect] = []
    for j, b in enumerate(blocks):
        knots = b.knots
        Ls = []
        for v in knots:
            Xv = X.copy()
            Xv[:, j] = v
            Ls.append(_design(blocks, Xv, pair_idx)[0].mean(axis=0))
        levels_iv = []
        for L in Ls:
            iv = interval(L, False)
            lo, est, hi = (float(sur.to_metric(x)) for x in (iv.low, iv.estimate, iv.high))
            levels_iv.append(Interval(est, lo, hi, level) if sur.log_target else iv)
        change = interval(Ls[-1] - Ls[0], sur.log_target)
        p_value = _joint_p(res, spans[j].start, spans[j].stop)
        out.append(MainEffect(b.feature.name, grid_values(b.feature, knots), levels_iv, change, p_value))
    return MainEffectsResult(sur.metric, sur.target, sur.log_target, coding, len(sur.y), n_configs,
                             int(design.shape[1]), float(res.rsquared), pairs, out, method, notes.warnings, blocks)


@dataclass(frozen=True)
class PairStrength:
    """Friedman's statistics of one pair from the regression with the pair's product columns:
    ``h2`` and ``strength`` (as :mod:`analysis.interactions` defines them) with 95% intervals,
    ``joint_share``, and ``p_value`` of the joint test that the product columns are zero."""

    h2: Interval
    strength: Interval
    joint_share: float
    p_value: float


def _averaged(blocks: list[_Block], S: np.ndarray, cols: list[int], pairs: list[tuple[int, int]]) -> np.ndarray:
    """Row r: the design row averaged over ``S`` with ``cols`` set to row r's values (so that
    ``A @ beta`` is the model's partial dependence on ``cols`` at each row's own values)."""
    uniq, inv = np.unique(S[:, cols], axis=0, return_inverse=True)
    rows = []
    for u in uniq:
        Sv = S.copy()
        Sv[:, cols] = u
        rows.append(_design(blocks, Sv, pairs)[0].mean(axis=0))
    return np.asarray(rows)[np.asarray(inv).reshape(-1)]


def pair_strength(sur: Surrogate, j: int, k: int, S: np.ndarray, draws: int = 400,
                  level: float = 0.95) -> PairStrength | None:
    """Friedman's H² and the interaction strength of features ``j`` x ``k`` on the sample ``S``,
    from an OLS of the target on every main effect (coded as :func:`main_effects_from` coded them)
    plus the pair's products (linear x linear, or per level of a many-level categorical), with
    config-clustered covariance. Intervals: ``draws`` parameter vectors from the estimate's
    normal approximation, the interval built around the estimate (estimate +- the ``level``
    quantile of |draw - estimate|, clipped to [0, 1] for H² and [0, inf) for the strength), so it
    holds the estimate. None when the main effects were not estimable or the pair's model has too
    few configs per column. Cached on the surrogate."""
    me = main_effects_from(sur)
    key = ("pair", j, k, S.tobytes(), draws, level)
    if key in sur._main_effects:
        return sur._main_effects[key]  # type: ignore[no-any-return]
    with _one_blas_thread():
        out = _pair_strength(sur, me, j, k, S, draws, level)
    sur._main_effects[key] = out
    return out


def _pair_fit(sur: Surrogate, me: MainEffectsResult, j: int, k: int) -> tuple[Any, ...] | None:
    """The regression of the target on every main effect plus the products of ``j`` x ``k``:
    ``(blocks, X, design, result, beta, cov)``, or None when the main effects are not estimable or
    the pair's model has too few configs per column."""
    if not me.estimable:
        return None
    blocks = me._blocks
    X = sur.X[:, :len(sur.features)]
    design, _ = _design(blocks, X, [(j, k)])
    groups = np.asarray(sur.clusters)
    if not _supported(design, groups, me.n_configs):
        return None
    res = _ols(sur.y, design, groups, me.n_configs)
    return blocks, X, design, res, np.asarray(res.params, dtype=float), np.asarray(res.cov_params(), dtype=float)


def _pair_strength(sur: Surrogate, me: MainEffectsResult, j: int, k: int, S: np.ndarray, draws: int,
                   level: float) -> PairStrength | None:
    from analysis.common import interval_around

    fit = _pair_fit(sur, me, j, k)
    if fit is None:
        return None
    blocks, X, design, res, beta, cov = fit
    n_pair = design.shape[1] - _design(blocks, X[:1], [])[0].shape[1]
    p_value = _joint_p(res, len(beta) - n_pair, len(beta))
    Sx = S[:, :len(sur.features)]
    pairs = [(j, k)]

    def centred(A: np.ndarray) -> np.ndarray:
        return A - A.mean(axis=0, keepdims=True)

    A_j = centred(_averaged(blocks, Sx, [j], pairs))
    A_k = centred(_averaged(blocks, Sx, [k], pairs))
    A_jk = centred(_averaged(blocks, Sx, [j, k], pairs))
    P = centred(_design(blocks, Sx, pairs)[0])
    M = A_jk - A_j - A_k
    rng = np.random.default_rng([sur.seed, 9, j, k])
    try:
        B = rng.multivariate_normal(beta, cov, size=draws, method="eigh").T
    except (ValueError, np.linalg.LinAlgError):
        return None
    B = np.column_stack([beta, B])

    def stats(B: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        num = ((M @ B) ** 2).sum(axis=0)
        joint = ((A_jk @ B) ** 2).sum(axis=0)
        total = ((P @ B) ** 2).sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            return num / joint, num / total, joint / total

    h2, strength, share = stats(B)
    return PairStrength(interval_around(h2[1:], float(h2[0]), level, 0.0, 1.0),
                        interval_around(strength[1:], float(strength[0]), level, 0.0),
                        float(share[0]), p_value)


def pair_pd(sur: Surrogate, j: int, k: int, axis_j: np.ndarray, axis_k: np.ndarray,
            level: float = 0.95) -> list[Interval] | None:
    """The 2-D partial dependence of features ``j`` x ``k`` from the regression with the pair's
    product columns (the model :func:`pair_strength` fits), at every cell of ``axis_j`` x
    ``axis_k`` (row-major), on the metric's scale, with ``level`` intervals: the prediction with
    both features set to the cell's values averaged over the analysed rows, +- t (configs - 1 df)
    times its config-clustered standard error, as the 1-D regression PD states its bands. Unlike
    the forest's bands these do not shrink a real effect towards zero. None when the main effects
    are not estimable or the pair's model has too few configs per column. Cached on the surrogate."""
    key = ("pair_pd", j, k, axis_j.tobytes(), axis_k.tobytes(), level)
    if key not in sur._main_effects:
        with _one_blas_thread():
            sur._main_effects[key] = _pair_pd(sur, j, k, axis_j, axis_k, level)
    return sur._main_effects[key]  # type: ignore[no-any-return]


def _pair_pd(sur: Surrogate, j: int, k: int, axis_j: np.ndarray, axis_k: np.ndarray,
             level: float) -> list[Interval] | None:
    from scipy import stats

    me = main_effects_from(sur)
    fit = _pair_fit(sur, me, j, k)
    if fit is None:
        return None
    blocks, X, _, _, beta, cov = fit
    tq = float(stats.t.ppf(0.5 + level / 2, max(1, me.n_configs - 1)))
    out = []
    for u in axis_j:
        for v in axis_k:
            Xv = X.copy()
            Xv[:, j], Xv[:, k] = u, v
            L = _design(blocks, Xv, [(j, k)])[0].mean(axis=0)
            est, var = float(L @ beta), float(L @ cov @ L)
            se = math.sqrt(var) if var > 0 else 0.0
            lo, mid, hi = (float(sur.to_metric(x)) for x in (est - tq * se, est, est + tq * se))
            out.append(Interval(mid, lo, hi, level))
    return out
