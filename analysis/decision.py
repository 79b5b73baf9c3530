"""What to deploy: one engine config per hardware class for a stated traffic mix and SLOs.

:func:`recommend` turns an experiment's per-load-point results into ONE recommendation per hardware
class (classes never mix; :data:`CROSS_MODES` is the explicit, labelled exception).

Inputs: ``weights`` (load point -> traffic share >= 0, default equal) and ``slos`` (default the
spec's, as :func:`analysis.ranking.rank` reads them: ``{metric, percentile, max_ms}``).

Feasibility (the conservative rule, :data:`SLO_RULE`): a config is a candidate only if it has
usable trials on EVERY load point and no trial failed by its own fault (a ``transport`` loss is not
held against it). It meets an SLO on a load point when the one-sided 95% upper confidence bound of
the median over its repeats of the SLO column (``ttft_ms`` at 99 -> ``ttft_ms_p99``) is at most
``max_ms``; the bound is a distribution-free order statistic of the repeats
(:func:`median_upper_bound`: exact for independent repeats of any continuous distribution). Fewer
than 5 repeats cannot reach 95%: the bound is then the largest repeat and a ``few_repeats`` warning
gives its real confidence (87.5% for 3); a single repeat is checked on its value (``single_repeat``).
A config must meet every SLO on every load point.

Rules (:data:`RULES`): each load point's objective median is normalised by the best median any
candidate reached there (feasible or not, so the scale does not move with the SLO bounds; for a
lower-is-better objective, best / value), which makes closed-loop and fixed-rate load points
comparable.

``weighted`` (default)
    maximise ``sum(w_l * n_cl) / sum(w_l)`` over the feasible configs.
``regret``
    minimise the worst-case regret ``max over load points with w_l > 0 of (1 - n_cl)``; the
    weights only say which load points count.

Ties go to the smaller config id. The margin is winner minus runner-up in the rule's score (for
``regret``: runner-up's worst regret minus the winner's) with a 95% percentile bootstrap interval
from resampling every config's repeats on every load point (normalisation recomputed in each
resample; the feasible set is held fixed). It is distinguishable when the interval excludes 0.
``benchmarks/analysis/decision_coverage.py`` checks its coverage by simulation.

What would change the answer: for each load point's weight (others fixed) and each SLO bound (the
others fixed), the nearest value above and below the current one at which the winner changes,
computed exactly (the weighted score is linear in one weight; feasibility changes only at the
configs' bounds), or None when no value in range (weights 0..infinity, bounds 0..infinity) does.

Drift-suspect trials (``drift_suspect`` coordinate, else :func:`analysis.drift.drift` on the
objective) are left out unless ``include_drift``; the result counts them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr
from scipy.stats import binom

from analysis.common import (
    Caveat,
    Claim,
    Interval,
    Notes,
    claim_for,
    percentile_interval,
    warn_if_repeats_share_a_server,
    warn_of_pruned_configs,
)
from analysis.crosshw import NORMALISATIONS, relabel, resolve_prices
from analysis.drift import drift
from analysis.frame import AnalysisInputError, metric_sense, trial_table
from analysis.hardware import classes_of, failover_of, per_class, require_not_mixed, simulated_of
from analysis.pareto import ConfigGroup, bootstrap_medians, config_groups, param_values
from analysis.ranking import objective_of, slo_columns, slos_of
from analysis.sla_decision import (
    SLA_OBJECTIVE,
    SLA_RULE,
    SLA_SLO_RULE,
    SlaSearch,
    distinguishable,
    rate_text,
    sla_of,
    sla_slos_match,
    sla_table,
)
from servetune.ranking import NOT_THE_CONFIGS_FAULT

log = logging.getLogger(__name__)

LEVEL = 0.95
RULES: dict[str, str] = {
    "weighted": "among configs meeting every SLO on every load point, the largest traffic-weighted mean of each "
                "load point's objective normalised by that load point's best value",
    "regret": "among configs meeting every SLO on every load point, the smallest worst-case regret "
              "(1 - normalised objective) over the load points with weight > 0",
}
SLO_RULE = ("a config meets an SLO on a load point when the one-sided 95% upper confidence bound of the median "
            "over its repeats of the SLO column (a distribution-free order statistic; with fewer than 5 repeats the "
            "largest repeat, at lower confidence) is at most the bound; single repeats are checked on the "
            "measured value (no uncertainty); configs with a failure of their own or a load point without usable "
            "trials are never recommended")
#: cross-hardware mode -> the normalised objective column (from :data:`analysis.crosshw.NORMALISATIONS`)
CROSS_MODES = {mode: column for mode, (_, column, _) in NORMALISATIONS.items()}


@dataclass(frozen=True)
class Choice:
    """A recommended (or runner-up) config: its rule ``score`` and, per load point, the objective
    median, the normalised value and the SLO columns' upper bounds."""

    config_id: str
    label: str
    score: float
    per_load_point: dict[str, dict[str, Any]]


@dataclass(frozen=True)
class Threshold:
    """Where the winner changes when one input moves (the others fixed).

    ``kind`` ``weight`` (``name`` a load point) or ``slo`` (``name`` an SLO column); ``current`` its
    value; ``up``/``down`` the nearest values above / below at which the winner changes (None:
    never in range), ``up_winner``/``down_winner`` the config that wins past them (None: no config
    is feasible there)."""

    kind: str
    name: str
    current: float
    up: float | None
    up_winner: str | None
    down: float | None
    down_winner: str | None
    sentence: str


@dataclass(frozen=True)
class ClassDecision:
    """The recommendation for one hardware class (or the cross-hardware group)."""

    hardware_class: str
    winner: Choice | None
    runner_up: Choice | None
    margin: Interval | None
    distinguishable: bool
    sentence: str
    thresholds: list[Threshold]
    evidence: dict[str, Any]
    n_configs: int
    n_feasible: int
    excluded: dict[str, int]


@dataclass(frozen=True)
class Decision:
    """What :func:`recommend` returns (see the module docstring)."""

    rule: str
    rule_text: str
    slo_rule: str
    objective: str
    weights: dict[str, float]
    slos: list[dict[str, Any]]
    include_drift: bool
    n_drift_excluded: int
    mode: str
    classes: list[ClassDecision]
    claim: Claim
    dataset: dict[str, Any]
    n_boot: int
    warnings: list[Caveat] = field(default_factory=list)
    #: per hardware class, the decision on the SLA searches' max rate at SLO
    #: (:mod:`analysis.sla_decision`); when the experiment has no other load points these are also
    #: ``classes`` (and ``objective`` is :data:`~analysis.sla_decision.SLA_OBJECTIVE`)
    sla: list[ClassDecision] = field(default_factory=list)


# --- the pure core: arrays in, choices out -----------------------------------------------------------------


def _normalised(med: np.ndarray, sense: int) -> np.ndarray:
    """``... x C x L`` objective medians -> value / best at each load point (1 = best), NaN stays NaN."""
    with np.errstate(invalid="ignore", divide="ignore", all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a load point no candidate has: all-NaN, stays NaN
        if sense > 0:
            best = np.nanmax(np.where(np.isfinite(med), med, np.nan), axis=-2, keepdims=True)
            return np.asarray(med / best, dtype=float)
        best = np.nanmin(np.where(np.isfinite(med), med, np.nan), axis=-2, keepdims=True)
        return np.asarray(best / med, dtype=float)


def scores(norm: np.ndarray, weights: np.ndarray, rule: str) -> np.ndarray:
    """Rule score (higher is better) of every config, from normalised values ``... x C x L``."""
    if rule == "weighted":
        return np.asarray((norm * weights).sum(axis=-1) / weights.sum(), dtype=float)
    counted = weights > 0
    return np.asarray(-(1.0 - norm[..., counted]).max(axis=-1), dtype=float)


def choose(score: np.ndarray, feasible: np.ndarray) -> tuple[int | None, int | None]:
    """Winner and runner-up indices among ``feasible`` (ties: the lower index = smaller config id)."""
    idx = np.flatnonzero(feasible & np.isfinite(score))
    if not len(idx):
        return None, None
    order = idx[np.lexsort((idx, -score[idx]))]
    return int(order[0]), (int(order[1]) if len(order) > 1 else None)


def weight_thresholds(norm: np.ndarray, weights: np.ndarray, feasible: np.ndarray, i: int,
                      rule: str) -> tuple[float | None, int | None, float | None, int | None]:
    """(up, winner past it, down, winner past it) for load point ``i``'s weight, others fixed."""
    win, _ = choose(scores(norm, weights, rule), feasible)
    if win is None:
        return None, None, None, None

    def winner_at(w: float) -> int | None:
        ws = weights.copy()
        ws[i] = w
        return choose(scores(norm, ws, rule), feasible)[0] if ws.sum() > 0 else None

    rest = weights.sum() - weights[i]
    if rule == "regret":  # only w > 0 vs w == 0 matters
        if weights[i] > 0:
            other = winner_at(0.0) if rest > 0 else win
            return None, None, (0.0 if other != win else None), (other if other != win else None)
        other = winner_at(1.0)
        return (0.0 if other != win else None), (other if other != win else None), None, None
    ok = np.flatnonzero(feasible & np.isfinite(norm).all(axis=1))
    a = norm[ok, i]
    r = (norm[ok] * weights).sum(axis=1) - weights[i] * a  # intercepts at w_i = 0
    k = int(np.flatnonzero(ok == win)[0])
    with np.errstate(divide="ignore", invalid="ignore"):
        cross = (r[k] - r) / (a - a[k])
    w0 = float(weights[i])
    ups = cross[(a > a[k]) & (cross > w0)]
    downs = cross[(a < a[k]) & (cross < w0) & (cross >= 0 if rest > 0 else cross > 0)]
    up = float(ups.min()) if len(ups) else None
    down = float(downs.max()) if len(downs) else None
    up_w = winner_at(up * (1 + 1e-9) + 1e-12) if up is not None else None
    down_w = winner_at(max(0.0, down * (1 - 1e-9) - 1e-12)) if down is not None else None
    if up_w == win:
        up, up_w = None, None
    if down_w == win:
        down, down_w = None, None
    return up, up_w, down, down_w


def slo_thresholds(score: np.ndarray, base: np.ndarray, bound_of: np.ndarray,
                   current: float) -> tuple[float | None, int | None, float | None, int | None]:
    """(up, winner, down, winner) for one SLO bound: ``base`` the configs feasible on everything but
    this SLO, ``bound_of`` each config's worst upper bound of this SLO's column over the load points.
    Feasibility changes only at those bounds, and scores do not depend on the feasible set."""
    feasible = base & (bound_of <= current)
    win, _ = choose(score, feasible)
    up = up_w = down = down_w = None
    beat = base & ~feasible & np.isfinite(bound_of)
    if win is not None:
        beat &= (score > score[win]) | ((score == score[win]) & (np.arange(len(score)) < win))
    if beat.any():
        up = float(bound_of[beat].min())
        up_w = choose(score, base & (bound_of <= up))[0]
    if win is not None:
        down = float(bound_of[win])
        down_w = choose(score, base & (bound_of < down))[0]
    return up, up_w, down, down_w


# --- from a dataset -----------------------------------------------------------------------------------------


def median_upper_bound(values: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """A distribution-free one-sided upper confidence bound of the median of ``values``' distribution
    and its exact confidence: the smallest order statistic ``x_(k)`` with P(Binomial(n, 1/2) <= k-1)
    >= ``level`` (for continuous iid values, P(median <= x_(k)) is that binomial probability). With
    fewer than 5 values no order statistic reaches 95%: the largest value is returned with its
    confidence ``1 - 2**-n`` (87.5% for 3 values)."""
    x = np.sort(np.asarray(values, dtype=float)[np.isfinite(values)])
    n = len(x)
    if n == 0:
        return math.nan, math.nan
    cdf = binom.cdf(np.arange(n + 1), n, 0.5)  # P(Bin <= i); exact sums of 2**-n overflow past n ~ 1,023
    k = next((i + 1 for i in range(n) if cdf[i] >= level), n)
    return float(x[k - 1]), float(cdf[k - 1])


@dataclass
class _Cells:
    """One class's configs x load points: objective medians, SLO upper bounds, bootstrap medians."""

    config_ids: list[str]
    labels: list[str]
    load_points: list[str]
    med: np.ndarray  # C x L
    ucb: np.ndarray  # C x L x S
    boot: np.ndarray  # B x C x L (NaN where no bootstrap)
    counts: np.ndarray  # C x L
    usable: np.ndarray  # C: usable trials on every load point
    own_failure: np.ndarray  # C


def _cells(df: pd.DataFrame, obj: str, slo_cols: list[tuple[str, float]], load_points: list[str],
           n_boot: int, seed: int) -> _Cells:
    cols = [obj, *[c for c, _ in slo_cols]]
    groups = {g.key["load_point"]: g for g in config_groups(df, cols, ("load_point",), with_trials=True)}
    ids = sorted({str(c) for g in groups.values() for c in g.config_ids})
    pos = {c: i for i, c in enumerate(ids)}
    labels = [""] * len(ids)
    n_c, n_l, n_s = len(ids), len(load_points), len(slo_cols)
    med = np.full((n_c, n_l), np.nan)
    ucb = np.full((n_c, n_l, n_s), np.nan)
    boot = np.full((max(n_boot, 0), n_c, n_l), np.nan)
    counts = np.zeros((n_c, n_l), dtype=np.int64)
    failed = np.zeros(n_c, dtype=bool)
    for j, lp in enumerate(load_points):
        g: ConfigGroup | None = groups.get(lp)
        if g is None:
            continue
        at = np.asarray([pos[str(c)] for c in g.config_ids], dtype=np.int64)
        for k, c in zip(at.tolist(), g.labels):
            labels[k] = labels[k] or c
        med[at, j] = g.medians[:, 0]
        counts[at, j] = g.counts
        ucb[at, j, :] = g.medians[:, 1:]
        if n_boot > 0 and (g.counts > 0).any():
            boot[:, at, j] = bootstrap_medians(g, n_boot, seed + 7919 * j)[:, :, 0]
        if n_s and g.values is not None and g.starts is not None:
            for c in np.flatnonzero(g.counts > 1).tolist():
                lo = int(g.starts[c])
                vals = g.values[lo:lo + int(g.counts[c]), 1:]
                ucb[at[c], j, :] = [median_upper_bound(vals[:, s])[0] for s in range(n_s)]
    if "failure_kind" in df:
        own = (df["status"].astype(str) == "failed") & ~df["failure_kind"].astype(str).isin(NOT_THE_CONFIGS_FAULT)
        if "is_baseline" in df:
            own &= ~df["is_baseline"].astype(bool)
        for c in set(df.loc[own, "config_id"].astype(str)):
            if c in pos:
                failed[pos[c]] = True
    return _Cells(ids, [lb or c for lb, c in zip(labels, ids)], load_points, med, ucb, boot, counts,
                  np.asarray((counts > 0).all(axis=1), dtype=bool), failed)


def _suspect(ds: xr.Dataset, obj: str, notes: Notes) -> np.ndarray:
    """Per trial, whether it is drift-suspect."""
    if "drift_suspect" in ds.coords:
        return np.asarray(ds["drift_suspect"].values, dtype=bool)
    n = ds.sizes.get("trial", 0)
    if "is_baseline" not in ds.coords or not bool(np.asarray(ds["is_baseline"].values, dtype=bool).any()):
        notes.warn("drift_unchecked", "no baseline re-runs: drift could not be checked, so no trial is left out "
                                      "as drift-suspect")
        return np.zeros(n, dtype=bool)
    try:
        res = drift(ds, metric=obj)
    except AnalysisInputError as exc:
        notes.warn("drift_unchecked", f"drift could not be checked ({exc}); no trial is left out as drift-suspect")
        return np.zeros(n, dtype=bool)
    return np.asarray(pd.Index(ds["trial_id"].values.astype(str)).isin([str(t) for t in res.suspect]), dtype=bool)


def _count(df: pd.DataFrame, mask: pd.Series | np.ndarray) -> int:
    return int(np.asarray(mask, dtype=bool).sum()) if len(df) else 0


def _evidence(df: pd.DataFrame, cells: _Cells, config: str | None, drift_left_out: pd.DataFrame) -> dict[str, Any]:
    if config is None:
        return {}
    rows = df[df["config_id"].astype(str) == config]
    if "is_baseline" in rows:
        rows = rows[~rows["is_baseline"].astype(bool)]
    k = cells.config_ids.index(config)
    status = rows["status"].astype(str)
    return {
        "repeats": {lp: int(cells.counts[k, j]) for j, lp in enumerate(cells.load_points)},
        **_trial_counts(rows),
        "holes": _count(rows, status == "hole"),
        "drift_suspect_left_out": _count(drift_left_out, drift_left_out["config_id"].astype(str) == config),
    }


def _trial_counts(rows: pd.DataFrame) -> dict[str, int]:
    """How many of ``rows`` failed (and of them were lost to transport), were retried, stopped early,
    had a client that fell behind, or ran on a failover daemon."""
    status = rows["status"].astype(str)
    kind = rows["failure_kind"].astype(str) if "failure_kind" in rows else pd.Series("", index=rows.index)
    return {
        "failed": _count(rows, status == "failed"),
        "lost_to_transport": _count(rows, (status == "failed") & kind.isin(NOT_THE_CONFIGS_FAULT)),
        "retried": _count(rows, rows["attempt"].to_numpy(dtype=float) > 1) if "attempt" in rows else 0,
        "stopped_early": _count(rows, rows["stopped_early"].astype(str) != "") if "stopped_early" in rows else 0,
        "client_fell_behind": (_count(rows, rows["client_fell_behind"].astype(bool))
                               if "client_fell_behind" in rows else 0),
        "failover": _count(rows, failover_of(rows) != ""),
    }


def _choice(cells: _Cells, norm: np.ndarray, score: np.ndarray, k: int | None,
            slo_cols: list[tuple[str, float]]) -> Choice | None:
    if k is None:
        return None
    per = {lp: {"objective": float(cells.med[k, j]), "normalised": float(norm[k, j]),
                "repeats": int(cells.counts[k, j]),
                "slo_upper_bound": {c: float(cells.ucb[k, j, s]) for s, (c, _) in enumerate(slo_cols)}}
           for j, lp in enumerate(cells.load_points)}
    return Choice(cells.config_ids[k], cells.labels[k], float(score[k]), per)


def _fmt(v: float | None) -> str:
    return "never in range" if v is None else f"{v:.4g}"


def _warn_missing_values(df: pd.DataFrame, cols: list[str], name: str, notes: Notes) -> None:
    """An ok trial with no value for the objective or an SLO metric cannot enter its config's cell;
    say how many were left out and from which configs, rather than judging those configs silently
    on their other repeats."""
    if df.empty or "status" not in df:
        return
    present = [c for c in cols if c in df]
    ok = df["status"].astype(str) == "ok"
    bad = ok & ~np.isfinite(df[present].to_numpy(dtype=float)).all(axis=1)
    if not bad.any():
        return
    missing = sorted({c for c in present if (~np.isfinite(df.loc[bad, c].to_numpy(dtype=float))).any()})
    configs = sorted(set(df.loc[bad, "config_id"].astype(str)))
    notes.warn("missing_values", f"{int(bad.sum())} ok trial(s) of {len(configs)} config(s) have no value for "
                                 f"{', '.join(missing)} and were left out of their configs' cells, so those "
                                 f"configs are judged on their other repeats", name)


def _weight_thresholds(lps: Sequence[str], norm: np.ndarray, w: np.ndarray, feasible: np.ndarray, rule: str,
                       ids: Sequence[str], labels: Sequence[str]) -> list[Threshold]:
    """For each load point's weight (others fixed), where the winner changes and to which config."""
    out: list[Threshold] = []
    for i, lp in enumerate(lps):
        up, uw, down, dw = weight_thresholds(norm, w, feasible, i, rule)
        out.append(Threshold(
            "weight", lp, float(w[i]), up, None if uw is None else ids[uw], down, None if dw is None else ids[dw],
            f"weight of {lp} (now {w[i]:g}): raised, the winner changes "
            + (f"above {up:.4g} (to {labels[uw]})" if up is not None and uw is not None else "never in range")
            + "; lowered, it changes "
            + (f"below {down:.4g} (to {labels[dw]})" if down is not None and dw is not None else "never in range")))
    return out


def _decide_class(name: str, df: pd.DataFrame, left_out: pd.DataFrame, obj: str,
                  slo_cols: list[tuple[str, float]], weights: dict[str, float], rule: str, n_boot: int,
                  seed: int, notes: Notes) -> ClassDecision:
    lps = list(weights)
    w = np.asarray([weights[lp] for lp in lps], dtype=float)
    cells = _cells(df, obj, slo_cols, lps, n_boot, seed)
    _warn_missing_values(df, [obj, *[c for c, _ in slo_cols]], name, notes)
    sense = metric_sense(obj)
    base = cells.usable & ~cells.own_failure
    norm = _normalised(np.where(base[:, None], cells.med, np.nan), sense)
    score = scores(norm, w, rule)
    meets = np.ones((len(cells.config_ids), len(slo_cols)), dtype=bool)
    worst = np.full((len(cells.config_ids), len(slo_cols)), np.nan)
    for s, (_, bound) in enumerate(slo_cols):
        with np.errstate(invalid="ignore"):
            worst[:, s] = np.where(np.isfinite(cells.ucb[:, :, s]).all(axis=1), cells.ucb[:, :, s].max(axis=1), np.inf)
        meets[:, s] = worst[:, s] <= bound
    feasible = base & meets.all(axis=1)
    win, run = choose(score, feasible)
    excluded = {"no_usable_trials_on_some_load_point": int((~cells.usable).sum()),
                "failed_by_own_fault": int((cells.usable & cells.own_failure).sum()),
                "misses_an_slo": int((base & ~meets.all(axis=1)).sum())}
    single = bool(win is not None and (cells.counts[win] == 1).any()) or bool(
        run is not None and (cells.counts[run] == 1).any())
    if n_boot == 0:
        notes.warn("no_bootstrap", "n_boot=0: the margin has no interval", name)
    if slo_cols and (cells.counts[base] == 1).any():
        notes.warn("single_repeat", "some candidates have a single repeat on a load point: their SLO check uses the "
                                    "measured value, with no uncertainty", name)
    few = sorted({int(n) for n in cells.counts[base].ravel().tolist() if 1 < n < 5})
    if slo_cols and few:
        levels = ", ".join(f"{n} repeats {median_upper_bound(np.arange(n))[1]:.1%}" for n in few)
        notes.warn("few_repeats", "with fewer than 5 repeats the SLO upper bound is the largest repeat, which bounds "
                                  f"the median at less than 95% confidence ({levels})", name)
    margin: Interval | None = None
    distinguishable = False
    label = f"hardware class {name}" if name else "this experiment"
    if win is None:
        sentence = f"no config meets every SLO on every load point on {label}: nothing to recommend"
    elif run is None:
        sentence = f"{cells.labels[win]} is the only config meeting every SLO on every load point on {label}"
    else:
        est = float(score[win] - score[run])
        if n_boot > 0 and not single:
            bs = scores(_normalised(np.where(base[None, :, None], cells.boot, np.nan), sense), w, rule)
            margin = percentile_interval(bs[:, win] - bs[:, run], estimate=est, level=LEVEL)
            distinguishable = bool(margin.low > 0)
        else:
            margin = Interval(est, math.nan, math.nan, LEVEL)
        how = ("distinguishable from" if distinguishable else "NOT distinguishable from")
        shown = (f"{margin}" if math.isfinite(margin.low) else
                 f"{est:.4g} with no interval ("
                 + ("a single repeat has no spread to resample" if single else "no bootstrap was run") + ")")
        sentence = (f"recommend {cells.labels[win]} on {label}; it is {how} the runner-up {cells.labels[run]}: "
                    f"margin {shown}")
    thresholds: list[Threshold] = []
    ids = cells.config_ids
    if win is not None:
        thresholds += _weight_thresholds(lps, norm, w, feasible, rule, ids, cells.labels)
        for s, (col, bound) in enumerate(slo_cols):
            others = base & np.delete(meets, s, axis=1).all(axis=1)
            up, uw, down, dw = slo_thresholds(score, others, worst[:, s], bound)
            up_to = f" (to {cells.labels[uw]})" if uw is not None else ""
            down_to = (f" (to {cells.labels[dw]})" if dw is not None else " (then no config is feasible)")
            thresholds.append(Threshold(
                "slo", col, bound, up, None if uw is None else ids[uw], down, None if dw is None else ids[dw],
                f"{col} <= {bound:g}: winner changes when the bound reaches {_fmt(up)}{up_to}, and when it drops "
                f"below {_fmt(down)}{down_to if down is not None else ''}"))
    evidence = {"winner": _evidence(df, cells, None if win is None else ids[win], left_out),
                "runner_up": _evidence(df, cells, None if run is None else ids[run], left_out),
                "configs": len(ids), "trials": int(len(df)), "drift_suspect_left_out": int(len(left_out))}
    return ClassDecision(name, _choice(cells, norm, score, win, slo_cols), _choice(cells, norm, score, run, slo_cols),
                         margin, distinguishable, sentence, thresholds, evidence, len(ids), int(feasible.sum()),
                         excluded)


def _decide_sla_class(name: str, searches: Sequence[SlaSearch], weights: dict[str, float], rule: str,
                      notes: Notes, probe_rows: pd.DataFrame | None = None) -> ClassDecision:
    """One hardware class's decision on its SLA searches' max rate at SLO (:mod:`analysis.sla_decision`)."""
    lps = list(weights)
    w = np.asarray([weights[lp] for lp in lps], dtype=float)
    t = sla_table(searches, lps)
    norm = _normalised(t.rate, 1)
    score = scores(norm, w, rule)
    feasible = np.isfinite(t.rate).all(axis=1)
    win, run = choose(score, feasible)
    searched = np.array([all((cid, lp) in t.searches for lp in lps) for cid in t.config_ids], dtype=bool)
    excluded = {"no_sla_search_on_some_load_point": int((~searched).sum()),
                "no_rate_meeting_slos_in_every_run": int((searched & ~feasible).sum())}
    label = f"hardware class {name}" if name else "this experiment"

    def said(k: int) -> str:
        return "; ".join(f"{lp}: {rate_text(t.searches.get((t.config_ids[k], lp)))}" for lp in lps)

    dist = False
    margin: Interval | None = None
    if win is None:
        sentence = f"no config's SLA search found a rate meeting every SLO in every run on {label}: nothing to recommend"
    elif run is None:
        sentence = f"{t.labels[win]} is the only config with a max rate at SLO on {label} ({said(win)})"
    else:
        dist = distinguishable(t, win, run, w)
        margin = Interval(float(score[win] - score[run]), math.nan, math.nan, LEVEL)
        runs = min(s.runs for s in searches)
        why = ("its 95% interval over runs on the typical boundary lies wholly above the runner-up's" if dist else
               "one run per config gives no interval over runs" if runs < 2 else
               "their 95% intervals over runs on the typical boundary overlap")
        sentence = (f"recommend {t.labels[win]} on {label}: max rate at SLO {said(win)}; it is "
                    + ("distinguishable from" if dist else "NOT distinguishable from")
                    + f" the runner-up {t.labels[run]} ({said(run)}): {why}")
    if searches and min(s.runs for s in searches) < 2:
        notes.warn("sla_one_run", "some SLA searches ran once: a run's bracket holds only that run's boundary (a server "
                                  "start's own speed moves it from run to run), so no interval over runs is given and "
                                  "no difference is called distinguishable; repeats: 3 gives one", name)

    def choice(k: int | None) -> Choice | None:
        if k is None:
            return None
        per: dict[str, dict[str, Any]] = {}
        for j, lp in enumerate(lps):
            s = t.searches.get((t.config_ids[k], lp))
            per[lp] = {"objective": float(t.rate[k, j]), "normalised": float(norm[k, j]),
                       "repeats": 0 if s is None else s.runs,
                       "boundary_estimate_rps": None if s is None else s.boundary_estimate_rps,
                       "boundary_ci95_rps": None if s is None or s.boundary_ci95_rps is None else list(s.boundary_ci95_rps),
                       "brackets_rps": [] if s is None else [list(b) for b in s.brackets],
                       "stopped": [] if s is None else list(s.stopped),
                       "slo_upper_bound": {}}
        return Choice(t.config_ids[k], t.labels[k], float(score[k]), per)

    thresholds: list[Threshold] = []
    if win is not None and len(lps) > 1:
        thresholds += _weight_thresholds(lps, norm, w, feasible, rule, t.config_ids, t.labels)

    def evidence(k: int | None) -> dict[str, Any]:
        if k is None:
            return {}
        mine = [s for s in searches if s.config_id == t.config_ids[k]]
        out: dict[str, Any] = {"runs": {s.load_point: s.runs for s in mine},
                               "probes": sum(len(s.trial_ids) for s in mine),
                               "stopped": sorted({r for s in mine for r in s.stopped})}
        if probe_rows is not None and "trial_id" in probe_rows:
            # a failed probe counted as missing the SLOs; one lost to transport was run again
            out.update(_trial_counts(probe_rows[probe_rows["trial_id"].astype(str).isin(
                set().union(*(s.trial_ids for s in mine)))]))
        return out

    return ClassDecision(name, choice(win), choice(run), margin, dist, sentence, thresholds,
                         {"winner": evidence(win), "runner_up": evidence(run), "configs": len(t.config_ids),
                          "trials": sum(len(s.trial_ids) for s in searches), "drift_suspect_left_out": 0},
                         len(t.config_ids), int(feasible.sum()), excluded)


def _split_weights(weights: Mapping[str, Any] | None, sla_lps: Sequence[str],
                   other_lps: Sequence[str]) -> tuple[dict[str, Any] | None, dict[str, float]]:
    """``weights`` split into the ordinary load points' (for :func:`_weights`) and the SLA search
    load points' (checked here: a finite number >= 0 each)."""
    if weights is None:
        return None, {lp: 1.0 for lp in sla_lps}
    other: dict[str, Any] = {}
    sla: dict[str, float] = {}
    for lp, value in weights.items():
        if str(lp) in sla_lps:
            try:
                x = float(value)
            except (TypeError, ValueError):
                x = math.nan
            if not math.isfinite(x) or x < 0:
                raise AnalysisInputError(f"weight of load point {lp!r} must be a finite number >= 0, got {value!r}")
            sla[str(lp)] = x
        elif str(lp) in other_lps:
            other[str(lp)] = value
        else:
            raise AnalysisInputError(f"unknown load point {lp!r} in weights; known: "
                                     f"{', '.join(sorted([*other_lps, *sla_lps]))} (an SLA search is named by its "
                                     "load point, not by its probed rates)")
    # each part has its own mix: load points named in it share it (unnamed ones get 0), none named: equal
    full = {lp: sla.get(lp, 0.0) for lp in sla_lps} if sla else {lp: 1.0 for lp in sla_lps}
    if sla and sum(full.values()) <= 0:
        raise AnalysisInputError(f"weights of the SLA search load points must not all be 0: {full}")
    return other or None, full


def _weights(df: pd.DataFrame, weights: Mapping[str, Any] | None) -> dict[str, float]:
    known = sorted({str(v) for v in pd.unique(df["load_point"].astype(str).to_numpy(dtype=object))} - {""})
    if not known:
        raise AnalysisInputError("the dataset has no trials with a load point: nothing to decide")
    if weights is None:
        return {lp: 1.0 for lp in known}
    out: dict[str, float] = {}
    for lp, value in weights.items():
        if str(lp) not in known:
            raise AnalysisInputError(f"unknown load point {lp!r} in weights; known: {', '.join(known)}")
        try:
            x = float(value)
        except (TypeError, ValueError):
            raise AnalysisInputError(f"weight of load point {lp!r} must be a number >= 0, got {value!r}") from None
        if not math.isfinite(x) or x < 0:
            raise AnalysisInputError(f"weight of load point {lp!r} must be a finite number >= 0, got {value!r}")
        out[str(lp)] = x
    full = {lp: out.get(lp, 0.0 if out else 1.0) for lp in known}
    if sum(full.values()) <= 0:
        raise AnalysisInputError(f"weights must not all be 0: {full}")
    return full


def fingerprint(ds: xr.Dataset) -> dict[str, Any]:
    """What names the data a decision stands on: schema version, spec hash, trial count and a
    SHA-256 over every trial's id, attempt and status."""
    h = hashlib.sha256()
    for name in ("trial_id", "attempt", "status"):
        if name in ds.coords or name in ds.data_vars:
            h.update("\x1f".join(map(str, ds[name].values.tolist())).encode())
    return {"schema_version": int(ds.attrs.get("schema_version", 0) or 0), "spec_hash": str(ds.attrs.get("spec_hash", "")),
            "experiment": str(ds.attrs.get("experiment", "")), "n_trials": int(ds.sizes.get("trial", 0)),
            "trials_sha256": h.hexdigest(), "synthetic": bool(int(ds.attrs.get("synthetic", 0) or 0)),
            "simulated": simulated_of(ds)}


@dataclass(frozen=True)
class Prepared:
    """What :func:`recommend` derives from the dataset alone, whatever the weights, SLOs and rule:
    the trial table, the drift-suspect mask (the costliest part: :func:`analysis.drift.drift`) with
    the warnings its check gave, and the data fingerprint. Made by :func:`prepare` for one dataset
    and objective; valid only while that dataset is unchanged (the dashboard keeps one per dataset
    version, so a page's later decisions skip this work)."""

    objective: str
    table: pd.DataFrame
    suspect: np.ndarray
    warnings: list[Caveat]
    fingerprint: dict[str, Any]


def prepare(ds: xr.Dataset, objective: str | None = None, table: pd.DataFrame | None = None) -> Prepared:
    """The input-independent part of :func:`recommend` for ``ds`` (``table``: its trial table when
    the caller already has it, as ``ds.sweep.table()`` gives it; never modified)."""
    obj = objective_of(ds, objective)
    notes = Notes()
    suspect = _suspect(ds, obj, notes)
    return Prepared(obj, trial_table(ds) if table is None else table, suspect, list(notes.warnings), fingerprint(ds))


def recommend(ds: xr.Dataset, weights: Mapping[str, Any] | None = None, slos: list[dict[str, Any]] | None = None,
              rule: str = "weighted", include_drift: bool = False, objective: str | None = None, n_boot: int = 1000,
              seed: int = 0, cross_hardware: str | None = None, prices: Mapping[str, Any] | None = None,
              prepared: Prepared | None = None,
              sla: tuple[Sequence[SlaSearch], Sequence[Mapping[str, Any]]] | None = None) -> Decision:
    """One engine config per hardware class for the traffic mix ``weights`` under ``slos``.

    Args:
        ds: an experiment's dataset; never modified.
        weights: load point -> traffic weight >= 0 (default equal; load points not named get 0).
        slos: ``[{metric, percentile, max_ms}]`` (default the spec's; ``[]`` for none).
        rule: a name in :data:`RULES`.
        include_drift: keep drift-suspect trials (default: left out, and counted).
        objective: the metric to maximise (default the spec's ranking objective).
        n_boot: bootstrap resamples for the margin's interval (0: none).
        seed: resampling seed.
        cross_hardware: None (each class on its own) or a mode in :data:`CROSS_MODES` (labelled).
        prices: hardware class -> USD per GPU-hour, for ``per_gpu_hour`` (default the spec's).
        prepared: :func:`prepare` of this same, unchanged ``ds`` (same result, less work); one
            made for another objective is not used.
        sla: the experiment's SLA searches and the SLOs they were judged against
            (:func:`analysis.sla_decision.read_sla_searches`; default: the record next to the file
            ``ds`` was loaded from, if any; ``([], [])``: none). Their probes leave the per-load-point
            decision; each class gets a decision on max rate at SLO in ``Decision.sla``, which is also
            ``Decision.classes`` when no other load point is left. ``slos`` must then be the judged
            ones (an SLA verdict cannot be re-judged) and ``cross_hardware`` None.

    Raises:
        AnalysisInputError: an unknown rule, load point, metric or mode, a bad weight, or
            ``per_gpu_hour`` without a price for every class.
    """
    if rule not in RULES:
        raise AnalysisInputError(f"unknown rule {rule!r}; known: {', '.join(RULES)}")
    if cross_hardware is not None and cross_hardware not in CROSS_MODES:
        raise AnalysisInputError(f"unknown cross-hardware mode {cross_hardware!r}; known: {', '.join(CROSS_MODES)}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 0:
        raise AnalysisInputError(f"n_boot must be a whole number >= 0, got {n_boot!r}")
    notes = Notes()
    warn_if_repeats_share_a_server(ds, notes)
    warn_of_pruned_configs(ds, notes)
    obj = objective_of(ds, objective)
    metric_sense(obj)
    slo_list = slos_of(ds, slos)
    if prepared is not None and prepared.objective != obj:
        prepared = None
    table = trial_table(ds) if prepared is None else prepared.table
    if obj not in table:
        raise AnalysisInputError(f"objective {obj!r} is not in the trial table")
    slo_cols = slo_columns(slo_list, table)
    if sla is None:
        sla = sla_of(ds, table)
    searches, judged = (list(sla[0]), list(sla[1])) if sla else ([], [])
    probes = set().union(*(x.trial_ids for x in searches)) if searches else set()
    ordinary = ~table["trial_id"].astype(str).isin(probes).to_numpy(dtype=bool)
    probe_rows = table[~ordinary] if searches else None
    sla_weights: dict[str, float] = {}
    if searches:
        if cross_hardware is not None:
            raise AnalysisInputError("--cross-hardware does not combine SLA searches: their max rate at SLO is decided "
                                     "per hardware class")
        if slos is not None and not sla_slos_match(slo_list, judged):
            raise AnalysisInputError("the SLA searches were judged during the sweep against the spec's SLOs ("
                                     + "; ".join(f"{x.get('metric')} p{float(x.get('percentile', 99)):g} <= "
                                                 f"{float(x.get('max_ms', math.nan)):g} ms" for x in judged)
                                     + "): other SLOs cannot re-judge them; change the spec's slos and run the sweep")
        other_lps = sorted({str(v) for v in table.loc[ordinary, "load_point"].astype(str)} - {""})
        weights, sla_weights = _split_weights(weights, sorted({x.load_point for x in searches}), other_lps)
        if not other_lps:
            ordinary = np.zeros(len(table), dtype=bool)
    w = _weights(table[ordinary], weights) if ordinary.any() else {}
    if prepared is None:  # after the inputs are checked: a bad weight is refused before the drift check
        prepared = prepare(ds, obj, table)
    suspect = prepared.suspect
    notes.warnings.extend(prepared.warnings)
    n_suspect = int((suspect & ordinary).sum())
    mode = "per-class"
    parts: list[tuple[str, pd.DataFrame]]
    if cross_hardware is not None:
        require_not_mixed(ds, "a decision")
        classes = classes_of(ds)
        src = ds
        if cross_hardware == "per_gpu_hour":
            used, _ = resolve_prices(ds, classes, prices)
            src = ds.copy()
            src.attrs = {**ds.attrs, "gpu_hour_prices": json.dumps(used, sort_keys=True)}
        elif prices:
            notes.warn("unused_prices", "prices are used only by the per_gpu_hour cross-hardware mode")
        label = f"cross-hardware ({', '.join(classes)}; normalised {cross_hardware})"
        _, cross_table, _ = relabel(src, label)
        obj = CROSS_MODES[cross_hardware]
        mode = f"cross-hardware {cross_hardware}"
        parts = [(label, cross_table.assign(_suspect=suspect))]
    else:
        table = table.assign(_suspect=suspect)[ordinary]
        hw = table["hardware_class"].astype(str) if "hardware_class" in table else pd.Series("", index=table.index)
        parts = []
        for cls, _ in per_class(ds) if ordinary.any() else []:
            parts.append((cls, table[(hw == cls) | (hw == "")] if cls else table))
    out = []
    for cls, part in parts:
        left_out = part[part["_suspect"] & ~part.get("is_baseline", pd.Series(False, index=part.index)).astype(bool)]
        used_part = part if include_drift else part[~part["_suspect"]]
        out.append(_decide_class(cls, used_part, left_out if not include_drift else left_out.iloc[:0], obj, slo_cols,
                                 w, rule, n_boot, seed, notes))
    if n_suspect and not include_drift:
        notes.warn("drift_excluded", f"{n_suspect} drift-suspect trial(s) were left out of the decision "
                                     "(include_drift=True keeps them)")
    elif n_suspect:
        notes.warn("drift_included", f"{n_suspect} drift-suspect trial(s) are INCLUDED in the decision")
    if not slo_list:
        notes.warn("no_slos", "no SLOs are defined: every config with usable trials on every load point is feasible")
    sla_out = [_decide_sla_class(cls, [x for x in searches if x.hardware_class == cls], sla_weights, rule, notes,
                                 probe_rows)
               for cls in sorted({x.hardware_class for x in searches})]
    rule_text, slo_rule = RULES[rule], SLO_RULE
    if sla_out and not out:
        out, obj, w = list(sla_out), SLA_OBJECTIVE, sla_weights
        rule_text = SLA_RULE if len(sla_weights) == 1 else f"{SLA_RULE}; load points combined by the {rule} rule"
        slo_rule = SLA_SLO_RULE
    elif sla_out:
        notes.warn("sla_decided_apart", "the SLA search load points (" + ", ".join(sla_weights) + ") are decided apart, "
                   "on their max rate at SLO (Decision.sla): the per-load-point decision covers the other load points "
                   "only, and the two may name different configs")
    return Decision(rule, rule_text, slo_rule, obj, w, slo_list, include_drift,
                    0 if include_drift else n_suspect, mode, out, claim_for(ds), dict(prepared.fingerprint), n_boot,
                    notes.warnings, sla_out)


def serve_params(ds: xr.Dataset, config_id: str) -> dict[str, Any]:
    """The parameter values of one trial of ``config_id`` (for its ``vllm serve`` command,
    :func:`servetune.export.engine_config_from_params`)."""
    ids = np.asarray(ds["config_id"].values, dtype=object).astype(str)
    hit = np.flatnonzero(ids == config_id)
    if not len(hit):
        raise AnalysisInputError(f"no trial of config {config_id!r}")
    return param_values(trial_table(ds.isel(trial=hit[:1])), [0])[0]


__all__ = ["RULES", "SLO_RULE", "CROSS_MODES", "Choice", "Threshold", "ClassDecision", "Decision", "recommend",
           "scores", "choose", "median_upper_bound", "weight_thresholds", "slo_thresholds", "fingerprint", "serve_params"]
