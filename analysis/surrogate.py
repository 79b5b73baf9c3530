"""A surrogate model of one metric as a function of the swept parameters, shared by importance,
partial dependence and interaction analyses.

Choices (documented because every downstream number depends on them):

- **Model**: scikit-learn's ``RandomForestRegressor`` (small: 32 trees, depth <= 12, up to 5 trials per
  leaf on large data, every feature tried at each split: feature subsampling visibly shrinks the
  partial dependence of a dominant parameter towards the mean). Forests need no tuning, give an out-of-bag R²
  for free, handle categorical codes and interactions, and ``shap.TreeExplainer`` explains them
  exactly. Gradient boosting fits slightly better but needs tuning and has no OOB estimate.
- **Target**: the natural log of the metric when every analysed value is strictly positive
  (throughputs and latencies are ratio-scale and their effects multiplicative); the raw metric
  otherwise (e.g. an SLO attainment with zeros). Results are reported back on the metric's scale
  (``exp`` of a log-scale average is a geometric mean).
- **Rows**: ok, non-baseline trials of the chosen load point / hardware class with a finite metric.
  When the dataset holds several load points and none is chosen, they are pooled and ``load_point``
  enters the model as an extra categorical feature, with a ``pooled_scenarios`` caveat; pass
  ``load_point=`` to analyse within one scenario. Hardware classes are never pooled: with trials of
  several classes, ``hardware_class=`` must name one (:func:`analysis.hardware.one_class`), and
  :func:`analysis.report.analyze` fits each class on its own. Failover trials (tag
  ``failover-from:...``) are included with a ``failover_trials`` caveat unless
  ``include_failover=False`` (:mod:`analysis.hardware`).
- **Probe**: a column of uniform noise named :data:`PROBE` is added as a feature, so "as important
  as noise" has a yardstick. Each bootstrap fit draws a fresh probe.
- **Missing values** (a flag not passed: vLLM's default) are coded as their own level below the
  observed range (``missing_values`` caveat).
- **Subsampling**: above ``max_rows`` trials a random subset of whole configs (all their repeats)
  is used, recorded as a :class:`~analysis.common.Subsample`; intervals then reflect the smaller
  sample (conservative).
- **Bootstrap unit**: configs (``config_id``) when any config has repeats in the analysed rows,
  otherwise trials (:attr:`Surrogate.resampled`). Bootstrap fits are seeded per index, so the first
  ``k`` of ``n`` fits are the same whatever ``n`` is; they are cached on the surrogate, and
  :func:`fit_surrogate` caches surrogates by data and settings, so importance, partial dependence
  and interactions called on the same dataset share their fits.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd
import xarray as xr

from analysis.common import Caveat, Claim, Notes, Subsample, claim_for
from analysis.frame import AnalysisInputError, Parameter, parameters, trial_table
from analysis.hardware import failover_of, one_class

log = logging.getLogger(__name__)

PROBE = "__probe__"
DEFAULT_MAX_ROWS = 2500
DEFAULT_TREES = 32
MAX_DEPTH = 12
MAX_FEATURES = 1.0
_CACHE_SIZE = 4
_CACHE: OrderedDict[str, Surrogate] = OrderedDict()


@dataclass(frozen=True)
class Feature:
    """One model feature: a swept parameter, or a pooled scenario column (``load_point``,
    ``hardware_class``; ``is_parameter`` false). ``levels`` are the values observed in the analysed
    trials (sorted) and ``codes`` their encodings; ``missing_code`` is the code of "not passed"."""

    param: Parameter
    levels: tuple[Any, ...]
    codes: tuple[float, ...]
    is_parameter: bool = True
    missing_code: float = math.nan

    @property
    def name(self) -> str:
        return self.param.name

    @property
    def kind(self) -> str:
        return self.param.kind


@dataclass
class BootFit:
    """One bootstrap refit: the model, the in-bag multiplicity of each surrogate row (0 = held
    out) and the probe column this fit was given."""

    model: Any
    weights: np.ndarray
    probe: np.ndarray

    @property
    def heldout(self) -> np.ndarray:
        """Rows of the surrogate's data this fit never saw."""
        return np.flatnonzero(self.weights == 0)


@dataclass
class Surrogate:
    """A fitted surrogate and the data it was fitted on.

    ``X`` (rows x features, the probe last) and ``y`` (the target: log metric when
    ``log_target``) are the rows used; ``clusters`` the bootstrap unit of each row; ``oob_r2`` the
    forest's out-of-bag R² on the target scale (inflated by repeats of a config; :func:`grouped_r2`
    holds configs out); ``n_trials`` the analysed trials before
    subsampling (``rows_used`` after).
    """

    metric: str
    log_target: bool
    features: list[Feature]
    X: np.ndarray
    y: np.ndarray
    clusters: np.ndarray
    resampled: Literal["configs", "trials"]
    df: pd.DataFrame
    n_trials: int
    model: Any
    oob_r2: float
    load_point: str | None
    hardware_class: str | None
    seed: int
    n_trees: int
    claim: Claim
    warnings: list[Caveat] = field(default_factory=list)
    subsampled: list[Subsample] = field(default_factory=list)
    include_failover: bool = True
    _boot: list[BootFit] = field(default_factory=list, repr=False)
    _main_effects: dict[Any, Any] = field(default_factory=dict, repr=False)
    _permutations: dict[Any, Any] = field(default_factory=dict, repr=False)
    _verdicts: dict[Any, Any] = field(default_factory=dict, repr=False)
    _grouped_r2: float | None = field(default=None, repr=False)

    @property
    def feature_names(self) -> list[str]:
        return [f.name for f in self.features] + [PROBE]

    @property
    def probe_index(self) -> int:
        return len(self.features)

    @property
    def params(self) -> list[Parameter]:
        return [f.param for f in self.features if f.is_parameter]

    @property
    def rows_used(self) -> int:
        return int(len(self.y))

    @property
    def target(self) -> str:
        return f"log({self.metric})" if self.log_target else self.metric

    def index(self, name: str) -> int:
        """Column of feature ``name``; :class:`AnalysisInputError` naming it when unknown."""
        names = [f.name for f in self.features]
        if name in names:
            return names.index(name)
        raise AnalysisInputError(
            f"parameter {name!r} is not a varying feature of this analysis; features: {', '.join(names) or 'none'}")

    def to_metric(self, values: np.ndarray | float) -> np.ndarray:
        """Target-scale values back on the metric's scale (``exp`` when the target is a log)."""
        arr = np.asarray(values, dtype=float)
        return np.exp(arr) if self.log_target else arr

    def boot_fits(self, n: int) -> list[BootFit]:
        """The first ``n`` bootstrap refits (fitted on demand, cached; fit ``i`` depends only on
        the seed and ``i``). Each resamples :attr:`resampled` units with replacement and fits the
        same bagged forest to the resample (duplicates included) that the primary fit is to the
        data; the units the resample left out are the fit's held-out rows."""
        while len(self._boot) < n:
            self._boot.append(self._fit_boot(len(self._boot)))
        return self._boot[:n]

    def _fit_boot(self, i: int) -> BootFit:
        rng = np.random.default_rng([self.seed, 1, i])
        n_units = int(self.clusters.max()) + 1 if len(self.clusters) else 0
        counts = np.bincount(rng.integers(0, n_units, n_units), minlength=n_units)
        weights = counts[self.clusters].astype(float)
        probe = rng.random(len(self.y))
        Xb = self.X.copy()
        Xb[:, self.probe_index] = probe
        idx = np.repeat(np.arange(len(self.y)), counts[self.clusters])
        model = _forest(len(idx), self.n_trees, int(rng.integers(2**31 - 1)), oob=False)
        model.fit(Xb[idx], self.y[idx])
        model.set_params(n_jobs=1)
        return BootFit(model, weights, probe)


def default_metric(ds: xr.Dataset) -> str:
    """The ranking objective the experiment recorded (``output_throughput`` when none)."""
    raw = ds.attrs.get("ranking", "")
    if raw:
        try:
            data = json.loads(raw) if isinstance(raw, str) else dict(raw)
            if data.get("objective"):
                return str(data["objective"])
        except (ValueError, TypeError):
            log.warning("unreadable ranking attribute %r; using output_throughput", raw)
    return "output_throughput"


def _forest(n_rows: int, n_trees: int, random_state: int, oob: bool) -> Any:
    from sklearn.ensemble import RandomForestRegressor

    model = RandomForestRegressor(
        n_estimators=n_trees, max_depth=MAX_DEPTH, min_samples_leaf=max(1, min(5, n_rows // 200)),
        max_features=MAX_FEATURES, bootstrap=True, oob_score=oob, n_jobs=2 if n_rows >= 1000 else 1,
        random_state=random_state)
    from analysis._trees import CachedParamsTree

    model.estimator = CachedParamsTree()  # the same trees, without re-reading the signature per tree
    return model


def analysed_trials(ds: xr.Dataset, metric: str | None = None, load_point: str | None = None,
                    hardware_class: str | None = None, include_failover: bool = True) -> tuple[pd.DataFrame, str]:
    """The ok, non-baseline trials of the chosen scenario with a finite ``metric``, and the metric
    (failover trials left out when ``include_failover`` is false).

    Raises :class:`AnalysisInputError` naming an unknown metric, load point or hardware class, or
    when the trials ran on several hardware classes and ``hardware_class`` names none."""
    metric = metric or default_metric(ds)
    one_class(ds, hardware_class, "a surrogate fit (importance, partial dependence, interactions, verdicts)")
    df = trial_table(ds)
    if not include_failover:
        df = df[failover_of(df) == ""]
    if metric not in df:
        raise AnalysisInputError(f"unknown metric {metric!r}; not a column of the trial table")
    for col, want in (("load_point", load_point), ("hardware_class", hardware_class)):
        if want is None:
            continue
        present = sorted({str(v) for v in df[col].tolist()}) if col in df else []
        if str(want) not in present:
            raise AnalysisInputError(f"unknown {col} {want!r}; the dataset has: {', '.join(present) or 'none'}")
        df = df[df[col].astype(str) == str(want)]
    mask = (df["status"].astype(str) == "ok").to_numpy().copy()
    if "is_baseline" in df:
        mask &= ~df["is_baseline"].astype(bool).to_numpy()
    values = pd.to_numeric(df[metric], errors="coerce").to_numpy(dtype=float)
    mask &= np.isfinite(values)
    return df[mask], metric


def _features(ds: xr.Dataset, df: pd.DataFrame, load_point: str | None, hardware_class: str | None,
              notes: Notes) -> tuple[list[Feature], np.ndarray]:
    feats: list[Feature] = []
    cols: list[np.ndarray] = []
    candidates: list[tuple[Parameter, bool]] = [(p, True) for p in parameters(ds)]
    for col, chosen in (("load_point", load_point),):  # hardware classes are never pooled (analysed_trials)
        if chosen is None and col in df and df[col].astype(str).nunique() > 1:
            levels = tuple(sorted({str(v) for v in df[col].tolist()}))
            candidates.append((Parameter(col, col, "categorical", levels), False))
            notes.warn("pooled_scenarios", f"trials of {len(levels)} {col}s ({', '.join(levels)}) are pooled, with "
                       f"{col} as an extra model feature; pass {col}= to analyse one at a time", col)
    for p, is_param in candidates:
        raw = df[p.column].astype(str).to_numpy() if not is_param else df[p.column].to_numpy()
        codes = p.encode(raw)
        present = np.isfinite(codes)
        uniq = np.unique(codes[present])
        if len(uniq) < 2:
            notes.warn("aliased", f"{p.name} is constant within the analysed trials, so its effect cannot be "
                       "separated from the baseline level; left out of the model", p.name)
            continue
        levels = tuple(p.decode(float(c)) for c in uniq) if p.kind != "numeric" else tuple(
            _level_value(p, float(c)) for c in uniq)
        missing_code = math.nan
        if not present.all():
            missing_code = float(uniq.min() - 1.0)
            codes = np.where(present, codes, missing_code)
            notes.warn("missing_values", f"{p.name} was not set in {int((~present).sum())} trials (vLLM's default); "
                       "modelled as its own level", p.name)
        feats.append(Feature(p, levels, tuple(float(c) for c in uniq), is_param, missing_code))
        cols.append(codes)
    X = np.column_stack(cols) if cols else np.empty((len(df), 0))
    return feats, X


def _level_value(p: Parameter, code: float) -> Any:
    v = p.decode(code)
    if isinstance(v, float) and p.log:
        r = round(v)
        return int(r) if abs(v - r) < 1e-6 * max(1.0, abs(v)) else v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def _aliasing(feats: list[Feature], X: np.ndarray, notes: Notes) -> None:
    for a in range(len(feats)):
        for b in range(a + 1, len(feats)):
            xa, xb = X[:, a], X[:, b]
            r = float(np.corrcoef(xa, xb)[0, 1]) if xa.std() > 0 and xb.std() > 0 else 0.0
            one_to_one = False
            if len(feats[a].codes) <= 20 and len(feats[b].codes) <= 20:
                pairs = len({(u, v) for u, v in zip(xa.tolist(), xb.tolist())})
                one_to_one = pairs == len(np.unique(xa)) == len(np.unique(xb))
            if one_to_one or abs(r) > 0.95:
                how = "determine each other" if one_to_one else f"are correlated (r = {r:+.3f})"
                notes.warn("aliased", f"{feats[a].name} and {feats[b].name} {how} in the analysed trials, so their "
                           "effects cannot be told apart", f"{feats[a].name},{feats[b].name}")


def fit_surrogate(ds: xr.Dataset, metric: str | None = None, load_point: str | None = None,
                  hardware_class: str | None = None, seed: int = 0, max_rows: int = DEFAULT_MAX_ROWS,
                  n_trees: int = DEFAULT_TREES, include_failover: bool = True) -> Surrogate:
    """Fit (or fetch from the cache) the surrogate of ``metric`` on the swept parameters plus a probe.

    Args:
        ds: an experiment dataset (:mod:`servetune.schema`'s shape).
        metric: a trial-table column; default the recorded ranking objective.
        load_point, hardware_class: analyse within one scenario (see the module docstring for pooling).
        seed: seeds the probe, the row subsample and every forest.
        max_rows: at most this many trials (whole configs) are used; a :class:`Subsample` says so.
        n_trees: trees per forest.
        include_failover: keep failover trials (with a caveat) or leave them out.

    Returns:
        a :class:`Surrogate`. Raises :class:`AnalysisInputError` when fewer than 4 trials or no
        varying parameter remain, or the trials ran on several hardware classes and none is chosen.
    """
    df, metric = analysed_trials(ds, metric, load_point, hardware_class, include_failover)
    notes = Notes()
    moved = failover_of(df)
    if (moved != "").any():
        notes.warn("failover_trials", f"{int((moved != '').sum())} of the {len(df)} analysed trials are failover "
                   f"trials (moved from {', '.join(sorted(set(moved[moved != ''].tolist())))}): included; pass "
                   "include_failover=False to leave them out")
    if len(df) < 4:
        raise AnalysisInputError(f"only {len(df)} ok non-baseline trials with a finite {metric} "
                                 f"(load_point={load_point!r}, hardware_class={hardware_class!r}); need at least 4")
    feats, X = _features(ds, df, load_point, hardware_class, notes)
    if not feats:
        raise AnalysisInputError("no parameter varies within the analysed trials")
    y_raw = pd.to_numeric(df[metric], errors="coerce").to_numpy(dtype=float)
    log_target = bool(np.all(y_raw > 0))
    y = np.log(y_raw) if log_target else y_raw
    config = df["config_id"].astype(str).to_numpy() if "config_id" in df else np.arange(len(df)).astype(str)
    codes, uniq = pd.factorize(config)
    repeats = len(uniq) < len(df)
    clusters = codes if repeats else np.arange(len(df))
    key = _cache_key(X, y, clusters, metric, load_point, hardware_class, seed, max_rows, n_trees, include_failover)
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    rng = np.random.default_rng([seed, 0])
    n_trials = len(df)
    if n_trials > max_rows:
        order = rng.permutation(int(clusters.max()) + 1)
        sizes = np.bincount(clusters)[order]
        keep_units = order[np.cumsum(sizes) <= max_rows]
        rows = np.flatnonzero(np.isin(clusters, keep_units))
        notes.subsample("trials for surrogate fits (whole configs)" if repeats else "trials for surrogate fits",
                        len(rows), n_trials)
        df, X, y = df.iloc[rows], X[rows], y[rows]
        clusters = pd.factorize(clusters[rows])[0]
    _aliasing(feats, X, notes)
    probe = rng.random(len(y))
    Xp = np.column_stack([X, probe])
    model = _forest(len(y), n_trees, int(rng.integers(2**31 - 1)), oob=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(Xp, y)
    model.set_params(n_jobs=1)
    oob = float(getattr(model, "oob_score_", math.nan))
    sur = Surrogate(metric, log_target, feats, Xp, y, clusters, "configs" if repeats else "trials", df, n_trials,
                    model, oob, load_point, hardware_class, seed, n_trees, claim_for(ds), notes.warnings,
                    notes.subsampled, include_failover)
    _CACHE[key] = sur
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return sur


def _cache_key(X: np.ndarray, y: np.ndarray, clusters: np.ndarray, *settings: Any) -> str:
    h = hashlib.sha1()
    for arr in (X, y, clusters):
        h.update(np.ascontiguousarray(arr).tobytes())
        h.update(str(arr.shape).encode())
    h.update(repr(settings).encode())
    return h.hexdigest()


def clear_cache() -> None:
    """Forget cached surrogates (and their bootstrap fits)."""
    _CACHE.clear()


GROUPED_FOLDS = 5
POOR_FIT_R2 = 0.5


def grouped_r2(sur: Surrogate, folds: int = GROUPED_FOLDS) -> float:
    """R² of the target held out by config: ``folds``-fold cross-validation that keeps every
    repeat of a config in one fold (``GroupKFold`` over :attr:`Surrogate.clusters`), each fold
    predicted by a forest like the primary one fitted on the others, R² = 1 - SSE / SST over all
    held-out predictions. Unlike the forest's out-of-bag R², repeats of a held-out config never
    sit in the training data, so it is not inflated by them. NaN with fewer than 4 units. Cached."""
    if sur._grouped_r2 is not None:
        return sur._grouped_r2
    from sklearn.model_selection import GroupKFold

    n_units = int(len(np.unique(sur.clusters)))
    r2 = math.nan
    if n_units >= 4:
        k = min(folds, n_units)
        pred = np.empty(len(sur.y))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i, (train, test) in enumerate(GroupKFold(n_splits=k).split(sur.X, sur.y, sur.clusters)):
                model = _forest(len(train), sur.n_trees, int(np.random.default_rng([sur.seed, 8, i]).integers(2**31 - 1)),
                                oob=False)
                model.fit(sur.X[train], sur.y[train])
                model.set_params(n_jobs=1)
                pred[test] = predict(model, sur.X[test])
        sst = float(((sur.y - sur.y.mean()) ** 2).sum())
        r2 = 1.0 - float(((sur.y - pred) ** 2).sum()) / sst if sst > 0 else math.nan
    sur._grouped_r2 = r2
    return r2


def fit_warnings(sur: Surrogate, n_params: int | None = None) -> list[Caveat]:
    """Minimum-data caveats for a surrogate: ``too_few_trials`` (fewer than 10 per feature) and
    ``poor_fit`` (R² held out by config, :func:`grouped_r2`, below :data:`POOR_FIT_R2` or undefined)."""
    out: list[Caveat] = []
    k = n_params if n_params is not None else len(sur.features)
    if sur.n_trials < 10 * k:
        out.append(Caveat("too_few_trials", f"{sur.n_trials} trials for {k} features (rule of thumb: at least "
                          f"{10 * k}); importance and effects are rough"))
    r2 = grouped_r2(sur)
    if not math.isfinite(r2) or r2 < POOR_FIT_R2:
        shown = "undefined" if not math.isfinite(r2) else f"{r2:.2f}"
        out.append(Caveat("poor_fit", f"the surrogate explains little of {sur.target}: R² held out by config "
                          f"({GROUPED_FOLDS}-fold, every repeat of a config in one fold) = {shown} (below "
                          f"{POOR_FIT_R2}; out-of-bag R² {sur.oob_r2:.2f} counts repeats of the same config), so "
                          "importances and effects describe a poor model"))
    return out


def grid_codes(feat: Feature, grid_points: int) -> np.ndarray:
    """Encoded grid for a feature within its SAMPLED range: the observed levels, or for a numeric
    feature with more than ``grid_points`` levels an even grid from its minimum to its maximum."""
    codes = np.asarray(feat.codes, dtype=float)
    if feat.kind == "numeric" and len(codes) > grid_points:
        return np.linspace(codes.min(), codes.max(), grid_points)
    return codes


def grid_values(feat: Feature, codes: np.ndarray) -> list[Any]:
    """Parameter values for encoded grid points."""
    if feat.kind == "numeric":
        return [_level_value(feat.param, float(c)) for c in codes]
    lookup = dict(zip(feat.codes, feat.levels))
    return [lookup.get(float(c), feat.param.decode(float(c))) for c in codes]


def sample_rows(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """``min(n, k)`` distinct row indices, sorted."""
    if n <= k:
        return np.arange(n)
    return np.sort(rng.choice(n, k, replace=False))


def predict(model: Any, X: np.ndarray) -> np.ndarray:
    """``model.predict(X)`` as floats; for a fitted random forest the same numbers without
    scikit-learn's per-call dispatch (the mean of its trees' ``tree_.predict`` on float32 input,
    which is what ``RandomForestRegressor.predict`` computes), about 20x faster on small batches."""
    trees = getattr(model, "estimators_", None)
    if not trees or not all(hasattr(t, "tree_") for t in trees):
        return np.asarray(model.predict(X), dtype=float)
    X32 = np.ascontiguousarray(X, dtype=np.float32)
    out = np.zeros(len(X32))
    for t in trees:
        out += t.tree_.predict(X32).reshape(len(X32), -1)[:, 0]
    return out / len(trees)


def pd_curve(model: Any, X: np.ndarray, cols: list[int], grid: np.ndarray) -> np.ndarray:
    """Per-row predictions with ``X[:, cols]`` set to each grid point: shape (len(grid), len(X)).
    ``grid`` is (points, len(cols))."""
    n = len(X)
    big = np.tile(X, (len(grid), 1))
    for j, c in enumerate(cols):
        big[:, c] = np.repeat(grid[:, j], n)
    return predict(model, big).reshape(len(grid), n)
