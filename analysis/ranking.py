"""Rankings of engine configs under switchable policies, with the uncertainty of every score.

:func:`rank` ranks the configs of every scenario (load point) x hardware class separately
(incomparable hardware never shares a ranking); baseline re-runs are drift controls and are left out.
A config's score is computed from the medians of its repeats' per-trial values (repeats are the unit
of replication); its interval and its probability of being #1 (``p_best``) come from resampling every
config's repeats with replacement (``n_boot`` times) and recomputing the whole ranking. Switching the
policy re-reads the same trial table; nothing is re-run.

Policies (:data:`POLICIES`; higher scores rank first, ties by config id). Under every policy a
config some of whose trials failed by its own fault (a measurement failure: OOM, a server that died
under load) ranks after every config of its SLO tier whose trials all succeeded: a config that works
only sometimes is not a deployment answer, however fast its lucky runs were. A trial lost to
``transport`` (the daemon or its connection) is not held against its config (``n_lost`` counts
them). The tiers and which failure kinds count are one rule, :func:`servetune.ranking.tier` and
:func:`servetune.ranking.blames_config`, called by both this module and the table ``sweep`` prints
(:func:`servetune.ranking.order_key`: tier, score, config id). The SLO gate is the rule of
:func:`servetune.ranking.meets_slos` (the median over the ok repeats of each SLO's value at most its
bound; a value no repeat measured misses), computed here on arrays of medians (:func:`_tiers`) rather
than by calling it per config; ``tests/test_ranking.py`` holds the two orders equal on the same trials.

``slo_throughput``
    the objective (default the spec's ``ranking.objective``, e.g. ``output_throughput``) among the
    configs meeting every SLO (``slos`` or the spec's): a config meets an SLO when the median over its
    repeats of the SLO's column (``ttft_ms`` at percentile 99 -> ``ttft_ms_p99``) is at most
    ``max_ms``. Configs missing an SLO rank after those meeting all; configs without a usable trial
    (every trial failed) rank last.
``goodput``
    ``request_goodput`` (requests per second that met every SLO, computed per request by the load
    generator); no further gate.
``knee``
    the knee of the front of the objective against a latency (``latency``, default the first SLO's
    column, else ``ttft_ms_p99``). Both axes are normalised to 0..1 over the group's configs (1 =
    best); the chord through the front's two extremes (the best-objective point and the
    best-latency point) is drawn, and a config's score is its signed distance from that chord in
    units of the ideal corner's distance from it: 1 at the ideal corner (best on both axes), 0 on
    the chord, negative below it. The knee is the config of largest score; it is always on the
    front, and a dominated config always scores below the config dominating it. Handled explicitly,
    each saying so in its row's ``note``: the two extremes lie on the chord and score 0 by
    construction; where no config lies above the chord (a front of 2 points, or one that sags
    toward the worst corner) the front has no knee, and of the configs tied at the top score the
    one nearer the ideal corner (Euclidean, normalised axes) ranks first, never the config id; a
    front of 1 point (one config best on both axes) is the knee and scores 1, the others
    ``(u + v) / 2`` (their mean normalised value; the chord is a point there).
``weighted``
    ``sum(w * u) / sum(w)`` where ``u`` is each metric's median normalised to 0..1 over the group's
    configs with 1 the best (direction from :func:`analysis.frame.metric_sense`); ``weights`` maps
    metric -> non-negative weight (default the objective and every SLO column at weight 1).
``per_gpu``
    the objective per GPU the config used (``output_tokens_per_gpu`` for output throughput), gated by
    the SLOs as ``slo_throughput``.
``per_cost``
    the objective per US dollar of GPU time (``output_tokens_per_dollar``), gated by the SLOs, using
    the spec's ``gpu_hour_prices``. A group whose hardware class has no price ranks nothing and says
    so (caveat ``no_prices``): prices are never invented.

Whether #1 is distinguishable from #2: #1 ranked above #2 in at least 97.5% of the bootstrap
resamples, i.e. the 95% percentile interval of the difference in their ranking keys excludes 0 (for
two configs in the same SLO tier, the interval of the #1 - #2 score difference excludes 0). With a
single repeat of either, or without a bootstrap, it cannot be told and the result says so.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Callable, Container, Sequence
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
    percentile_interval,
    warn_if_repeats_share_a_server,
    warn_of_pruned_configs,
)
from analysis.frame import AnalysisInputError, lean_table, metric_sense, quantile_column, table_columns
from analysis.hardware import require_separate, select_failover
from analysis.pareto import ConfigGroup, base_columns, bootstrap_medians, config_groups
from servetune.ranking import FAILS as _FAILS
from servetune.ranking import MEETS as _MEETS
from servetune.ranking import NO_DATA as _NO_DATA
from servetune.ranking import NOT_THE_CONFIGS_FAULT
from servetune.ranking import tier as _tier

log = logging.getLogger(__name__)

LEVEL = 0.95


@dataclass(frozen=True)
class RankedRow:
    """One config in a group's ranking.

    ``score`` is the policy's score (estimate from the repeats' medians, interval from the bootstrap;
    NaN bounds with a single repeat or without a bootstrap, all NaN without a usable trial);
    ``slos_met`` whether the medians meet every SLO (None without SLOs or data); ``p_best`` the
    fraction of bootstrap resamples in which it ranked #1 (None without a bootstrap); ``values`` the
    medians of the metrics the policy used; ``note`` what the policy says about this row's score
    where it needs a word (the ``knee`` policy's extremes and fronts of 1 or 2 points), else "".
    """

    rank: int
    config_id: str
    label: str
    score: Interval
    n_ok: int
    n_failed: int
    n_holes: int
    n_repeats: int
    slos_met: bool | None
    p_best: float | None
    values: dict[str, float]
    n_lost: int = 0
    n_failover: int = 0
    note: str = ""


@dataclass(frozen=True)
class RankedGroup:
    """The ranking of one scenario x hardware-class group.

    ``margin`` is the #1 - #2 score difference with its bootstrap interval (None where it cannot be
    computed); ``p_order`` the fraction of resamples ranking #1 above #2; ``sentence`` says in words
    whether #1 is distinguishable from #2. ``n_ranked`` is how many configs the ranking orders;
    ``rows`` lists all of them, or the first ``top`` (see :func:`rank`).
    """

    group: dict[str, str]
    rows: list[RankedRow]
    distinguishable: bool
    sentence: str
    margin: Interval | None = None
    p_order: float | None = None
    n_ranked: int = -1


@dataclass(frozen=True)
class RankingResult:
    """A ranking under ``policy`` (its ``score_name``, higher is better when ``higher_is_better``)."""

    policy: str
    description: str
    objective: str
    score_name: str
    higher_is_better: bool
    slos: list[dict[str, Any]]
    groups: list[RankedGroup]
    n_boot: int
    claim: Claim
    warnings: list[Caveat] = field(default_factory=list)
    subsampled: list[Subsample] = field(default_factory=list)


# --- policies ---------------------------------------------------------------------------------------------

ScoreFn = Callable[[np.ndarray], np.ndarray]


@dataclass
class _Plan:
    """What a policy needs: the metric columns whose per-config medians it reads (the first ones are
    the score's), a score function of the medians (``... x C x m`` -> ``... x C``, higher better),
    the SLO gate (column index, max) and the score's name and sense for display. ``tiebreak``
    (same shape as the score, higher first) orders configs tied on the score before the config id
    does; ``notes`` maps the point medians (``C x m``) to one note per config."""

    columns: list[str]
    score: ScoreFn
    gate: list[tuple[int, float]]
    score_name: str
    sense: int
    derived: dict[str, Callable[[pd.DataFrame], np.ndarray]] = field(default_factory=dict)
    needs_price: bool = False
    tiebreak: ScoreFn | None = None
    notes: Callable[[np.ndarray], list[str]] | None = None


@dataclass(frozen=True)
class _Request:
    objective: str
    weights: dict[str, float] | None
    slo_columns: list[tuple[str, float]]
    latency: str | None


@dataclass(frozen=True)
class Policy:
    """A ranking policy: ``name``, a one-line ``description`` and how it plans its scores."""

    name: str
    description: str
    plan: Callable[[_Request], _Plan]


def _with_slos(req: _Request, columns: list[str], gate: bool) -> tuple[list[str], list[tuple[int, float]]]:
    cols = list(columns)
    out: list[tuple[int, float]] = []
    for col, max_ms in req.slo_columns:
        if col not in cols:
            cols.append(col)
        if gate:
            out.append((cols.index(col), max_ms))
    return cols, out


def _plain(col_index: int) -> ScoreFn:
    def score(med: np.ndarray) -> np.ndarray:
        return np.asarray(med[..., col_index], dtype=float)
    return score


def _plan_objective(req: _Request, column: str, derived: dict[str, Callable[[pd.DataFrame], np.ndarray]] | None = None,
                    gate: bool = True, needs_price: bool = False) -> _Plan:
    sense = metric_sense(req.objective) if column not in (derived or {}) else 1
    cols, g = _with_slos(req, [column], gate)
    return _Plan(cols, _plain(0), g, column, sense, derived or {}, needs_price)


def _plan_slo_throughput(req: _Request) -> _Plan:
    return _plan_objective(req, req.objective)


def _plan_goodput(req: _Request) -> _Plan:
    return _plan_objective(req, "request_goodput", gate=False)


def _per_name(objective: str, what: str) -> str:
    if objective == "output_throughput":
        return f"output_tokens_per_{what}"
    return f"{objective}_per_{what}"


def _plan_per_gpu(req: _Request) -> _Plan:
    name = _per_name(req.objective, "gpu")
    obj = req.objective

    def per_gpu(df: pd.DataFrame) -> np.ndarray:
        return np.asarray(df[obj].to_numpy(dtype=float) / df["gpus"].to_numpy(dtype=float))
    return _plan_objective(req, name, {name: per_gpu})


def _plan_per_cost(req: _Request) -> _Plan:
    name = _per_name(req.objective, "dollar")
    obj = req.objective

    def per_dollar(df: pd.DataFrame) -> np.ndarray:
        return np.asarray(df[obj].to_numpy(dtype=float) * 3600.0
                          / (df["gpus"].to_numpy(dtype=float) * df["gpu_hour_price"].to_numpy(dtype=float)))
    return _plan_objective(req, name, {name: per_dollar}, needs_price=True)


def _normalise(x: np.ndarray, sense: int) -> np.ndarray:
    """0..1 over the configs (last axis), 1 the best; NaN stays NaN; a constant metric gives 0."""
    with np.errstate(invalid="ignore", all="ignore"):
        lo = np.nanmin(np.where(np.isfinite(x), x, np.nan), axis=-1, keepdims=True)
        hi = np.nanmax(np.where(np.isfinite(x), x, np.nan), axis=-1, keepdims=True)
        span = hi - lo
        u = np.where(span > 0, (x - lo) / np.where(span > 0, span, 1.0), 0.0)
    u = np.where(np.isfinite(x), u, np.nan)
    return u if sense > 0 else np.where(np.isfinite(u), np.where(span > 0, 1.0 - u, 0.0), np.nan)


def _plan_weighted(req: _Request) -> _Plan:
    weights = dict(req.weights) if req.weights else {req.objective: 1.0, **{c: 1.0 for c, _ in req.slo_columns}}
    for metric, w in weights.items():
        metric_sense(metric)  # names an unknown metric
        if not (isinstance(w, (int, float)) and math.isfinite(w) and w >= 0):
            raise AnalysisInputError(f"weight of {metric!r} must be a finite number >= 0, got {w!r}")
    total = sum(weights.values())
    if total <= 0:
        raise AnalysisInputError(f"weights must not all be 0: {weights}")
    metrics = list(weights)
    cols, gate = _with_slos(req, metrics, gate=False)
    senses = [metric_sense(m) for m in metrics]
    ws = np.array([weights[m] / total for m in metrics])

    def score(med: np.ndarray) -> np.ndarray:
        parts = [ws[j] * _normalise(med[..., j], senses[j]) for j in range(len(metrics))]
        return np.asarray(np.sum(parts, axis=0), dtype=float)
    name = "weighted score (" + ", ".join(f"{w:g} x {m}" for m, w in weights.items()) + ")"
    return _Plan(cols, score, gate, name, 1)


def _plan_knee(req: _Request) -> _Plan:
    latency = req.latency or (req.slo_columns[0][0] if req.slo_columns else "ttft_ms_p99")
    s_obj, s_lat = metric_sense(req.objective), metric_sense(latency)
    if req.objective == latency:
        raise AnalysisInputError(f"the knee needs two different metrics, got {latency!r} twice")
    cols, gate = _with_slos(req, [req.objective, latency], gate=False)

    def axes(med: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return _normalise(med[..., 0], s_obj), _normalise(med[..., 1], s_lat)

    def score(med: np.ndarray) -> np.ndarray:
        return _knee_distance(*axes(med))

    def nearer_ideal(med: np.ndarray) -> np.ndarray:
        u, v = axes(med)
        return np.asarray(-np.hypot(1.0 - u, 1.0 - v), dtype=float)

    def notes(med: np.ndarray) -> list[str]:
        return _knee_notes(*axes(med), req.objective, latency)
    return _Plan(cols, score, gate, f"distance above the front's chord ({req.objective} vs {latency}, "
                 "normalised: 1 = the ideal corner, 0 = the chord)", 1, tiebreak=nearer_ideal, notes=notes)


def _knee_geometry(u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, ...]:
    """The front's extremes ``a`` (best ``u``, ties: best ``v``) and ``b`` (best ``v``, ties: best
    ``u``) over the last axis, the chord's unit normal ``(nx, ny)`` toward (1, 1), the ideal
    corner's distance ``h`` from the chord and whether the chord is a point (``a`` best on both)."""
    a = _lex_argmax(u, v)
    b = _lex_argmax(v, u)
    ua = np.take_along_axis(u, a[..., None], axis=-1)
    va = np.take_along_axis(v, a[..., None], axis=-1)
    ub = np.take_along_axis(u, b[..., None], axis=-1)
    vb = np.take_along_axis(v, b[..., None], axis=-1)
    nx, ny = vb - va, ua - ub  # normal of the chord a -> b, pointing toward the ideal corner
    norm = np.hypot(nx, ny)
    point = ~(norm > 0)
    nx = np.where(point, 0.0, nx) / np.where(point, 1.0, norm)
    ny = np.where(point, 0.0, ny) / np.where(point, 1.0, norm)
    h = (1.0 - ua) * nx + (1.0 - va) * ny  # > 0 off a point chord: a has u = 1 and v < 1
    point = point | ~(h > 0)
    return a, b, ua, va, nx, ny, np.where(point, 1.0, h), point


def _knee_distance(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Every point's (last axis) signed distance from the chord through the front's extremes, in
    units of the ideal corner's distance from it (1 at (1, 1), 0 on the chord, negative below);
    where one point is best on both axes (the chord is a point), ``(u + v) / 2`` (1 for it)."""
    a, b, ua, va, nx, ny, h, point = _knee_geometry(u, v)
    chord = np.array((u - ua) * nx + (v - va) * ny, dtype=float) / h
    for end in (a, b):  # exactly 0, so two extremes tie and the tie-break, not rounding, orders them
        np.put_along_axis(chord, end[..., None], 0.0, axis=-1)
    return np.asarray(np.where(point, (u + v) / 2.0, chord), dtype=float)


def _knee_notes(u: np.ndarray, v: np.ndarray, objective: str, latency: str) -> list[str]:
    """One note per config (1-D ``u``, ``v``) for the rows whose knee score needs a word."""
    out = [""] * len(u)
    if not np.isfinite(u).any():
        return out
    a, b, _, _, _, _, _, point = (np.asarray(x).reshape(-1) for x in _knee_geometry(u, v))
    ia, ib = int(a[0]), int(b[0])
    if bool(point[0]):
        out[ia] = (f"best on both {objective} and {latency}: the front is this one config, so it is the knee "
                   "(score 1, the ideal corner); the others score their mean normalised value")
        return out
    score = _knee_distance(u, v)
    knee = bool(np.nanmax(score) > 1e-12)
    for i, what in ((ia, f"best {objective}"), (ib, f"best {latency}")):
        out[i] = f"an extreme of the front ({what}): on the chord by construction, so its score is 0"
        if not knee:
            out[i] += ("; no config lies above the chord (a front of 2 points, or one that sags), so the front "
                       "has no knee and the extreme nearer the ideal corner ranks first")
    return out


def _lex_argmax(first: np.ndarray, then: np.ndarray) -> np.ndarray:
    """Index (last axis) of the largest ``first``, ties broken by the largest ``then`` (NaN never wins)."""
    f = np.where(np.isfinite(first), first, -np.inf)
    top = f.max(axis=-1, keepdims=True)
    t = np.where(np.isfinite(then), then, np.finfo(float).min)
    tie = np.where(f == top, t, -np.inf)
    return np.asarray(np.argmax(tie, axis=-1))


POLICIES: dict[str, Policy] = {p.name: p for p in (
    Policy("slo_throughput", "max objective among configs meeting every SLO", _plan_slo_throughput),
    Policy("goodput", "max request goodput (requests/s meeting every SLO)", _plan_goodput),
    Policy("knee", "the knee of the objective-vs-latency front", _plan_knee),
    Policy("weighted", "weighted score of normalised metrics", _plan_weighted),
    Policy("per_gpu", "max objective per GPU among configs meeting every SLO", _plan_per_gpu),
    Policy("per_cost", "max objective per dollar of GPU time among configs meeting every SLO", _plan_per_cost),
)}


def policies() -> dict[str, str]:
    """Known policy names and their one-line descriptions."""
    return {name: p.description for name, p in POLICIES.items()}


# --- ranking ----------------------------------------------------------------------------------------------


def slos_of(ds: xr.Dataset, slos: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """``slos`` when given (``[]``: none), else the spec's SLOs recorded in ``ds.attrs["slos"]``."""
    if slos is not None:
        return [dict(s) for s in slos]
    raw = ds.attrs.get("slos", "")
    if not raw:
        return []
    data = json.loads(raw) if isinstance(raw, str) else raw
    return [dict(s) for s in data]


def slo_columns(slos: list[dict[str, Any]], df: pd.DataFrame | Container[str]) -> list[tuple[str, float]]:
    """``(trial-table column, max_ms)`` of every SLO (``ttft_ms`` at percentile 99 -> ``ttft_ms_p99``);
    :class:`AnalysisInputError` for an SLO without ``metric``/``max_ms`` or a column ``df`` lacks."""
    out = []
    for s in slos:
        if "metric" not in s or "max_ms" not in s:
            raise AnalysisInputError(f"an SLO needs 'metric' and 'max_ms', got {s}")
        col = quantile_column(str(s["metric"]), float(s.get("percentile", 99.0)) / 100.0)
        if col not in df:
            raise AnalysisInputError(f"SLO column {col!r} (from {s}) is not in the trial table")
        out.append((col, float(s["max_ms"])))
    return out


def objective_of(ds: xr.Dataset, objective: str | None) -> str:
    """``objective`` when given, else the spec's ``ranking.objective``, else ``output_throughput``."""
    if objective:
        return objective
    raw = ds.attrs.get("ranking", "")
    if raw:
        data = json.loads(raw) if isinstance(raw, str) else dict(raw)
        if data.get("objective"):
            return str(data["objective"])
    return "output_throughput"


#: the names these had when they were private (kept for callers written against them)
_slos_of, _slo_columns, _objective_of = slos_of, slo_columns, objective_of


def _tiers(med: np.ndarray, has: np.ndarray, gate: list[tuple[int, float]], failing: np.ndarray) -> np.ndarray:
    """``... x C`` tiers from medians ``... x C x m``; ``failing`` (``C``) marks configs with failed
    trials they are to blame for (:func:`servetune.ranking.tier`)."""
    miss = np.zeros(np.shape(has), dtype=bool)
    for j, limit in gate:
        miss |= ~(med[..., j] <= limit)
    return np.asarray(_tier(np.asarray(has, dtype=bool), miss, np.asarray(failing, dtype=bool)), dtype=np.int64)


def _lost_counts(df: pd.DataFrame, by: Sequence[str]) -> dict[tuple[str, ...], dict[str, int]]:
    """Per group key (the values of ``by`` present in ``df``, as strings) and config id, how many of
    its non-baseline trials failed by a kind that is not the config's fault (transport)."""
    if "failure_kind" not in df:
        return {}
    lost = (df["status"].to_numpy(dtype=object) == "failed") & np.isin(
        df["failure_kind"].to_numpy(dtype=object).astype(str), sorted(NOT_THE_CONFIGS_FAULT))
    if "is_baseline" in df:
        lost &= ~df["is_baseline"].to_numpy(dtype=bool)
    if not lost.any():
        return {}
    keys = [k for k in by if k in df]
    sub = df.loc[lost, [*keys, "config_id"]].astype(str)
    out: dict[tuple[str, ...], dict[str, int]] = {}
    for row, n in sub.value_counts().items():
        row = row if isinstance(row, tuple) else (row,)
        out.setdefault(tuple(row[:-1]), {})[str(row[-1])] = int(n)
    return out


def _finite(x: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(x), x, -np.inf)


def _order(tier: np.ndarray, score: np.ndarray, tiebreak: np.ndarray | None = None) -> np.ndarray:
    """Indices sorted by (tier, -score, -tiebreak, index) for 1-D inputs (configs already sorted by id)."""
    tb = np.zeros(len(tier)) if tiebreak is None else _finite(tiebreak)
    return np.lexsort((np.arange(len(tier)), -tb, -_finite(score), tier))


def _best(tier: np.ndarray, score: np.ndarray, tiebreak: np.ndarray | None = None) -> np.ndarray:
    """Per resample (rows of ``B x C``), the index of #1: lowest tier, then highest score, then
    highest ``tiebreak``, then index."""
    t = tier.min(axis=1, keepdims=True)
    s = np.where(tier == t, _finite(score), -np.inf)
    if tiebreak is None:
        return np.asarray(np.argmax(s, axis=1))
    top = s.max(axis=1, keepdims=True)
    return np.asarray(np.argmax(np.where((s == top) & (tier == t), _finite(tiebreak), -np.inf), axis=1))


def rank(ds: xr.Dataset, policy: str = "slo_throughput", objective: str | None = None,
         weights: dict[str, float] | None = None, slos: list[dict[str, Any]] | None = None, n_boot: int = 1000,
         seed: int = 0, by: Sequence[str] = ("load_point", "hardware_class"), latency: str | None = None,
         table: pd.DataFrame | None = None, top: int | None = None, include_failover: bool = True) -> RankingResult:
    """Rank engine configs per scenario x hardware class under ``policy``.

    Args:
        ds: an experiment's dataset (:mod:`servetune.schema`).
        policy: a name in :data:`POLICIES`.
        objective: the metric to maximise (default the spec's ``ranking.objective``, else
            ``output_throughput``).
        weights: for ``weighted``: metric -> weight >= 0.
        slos: list of ``{metric, percentile, max_ms}`` (default the spec's; ``[]`` for none).
        n_boot: bootstrap resamples of every config's repeats (0: scores only, no intervals, no
            ``p_best``: the fast path for very large datasets).
        seed: seed of the resampling (each config draws from its own stream, see
            :func:`analysis.pareto.bootstrap_medians`).
        by: grouping columns; incomparable hardware classes never share a ranking (a ``by`` without
            ``hardware_class`` on trials of several classes is refused; :mod:`analysis.crosshw`
            compares classes on normalised metrics).
        latency: for ``knee``: the latency axis (default the first SLO's column, else ``ttft_ms_p99``).
        table: the trial table of ``ds`` if already built (switching policies then costs no re-flattening;
            its grouping is cached while the object lives, so do not modify it in place between calls).
            Without it only the columns the policy needs are flattened
            (:func:`analysis.frame.trial_table`'s ``columns``).
        top: list only the first ``top`` rows of every group (None: all). The order, #1 vs #2
            distinguishability and every listed row are exactly those of the full ranking;
            ``n_ranked`` still counts every config. For large experiments: no row object for each
            of hundreds of thousands of configs.
        include_failover: keep failover trials (tag ``failover-from:...``), marked in each row's
            ``n_failover`` and a caveat; ``False`` leaves them out (:mod:`analysis.hardware`).

    Returns:
        A :class:`RankingResult` with the ordered rows of every group, whether #1 is distinguishable
        from #2, and caveats.

    Raises:
        AnalysisInputError: an unknown policy, metric, SLO column or a bad weight, or a grouping
            that would mix hardware classes.
    """
    if policy not in POLICIES:
        raise AnalysisInputError(f"unknown ranking policy {policy!r}; known: {', '.join(POLICIES)}")
    if top is not None and (isinstance(top, bool) or not isinstance(top, (int, np.integer)) or top < 0):
        raise AnalysisInputError(f"top must be a whole number >= 0 or None, got {top!r}")
    require_separate(ds if table is None else table, by, "a ranking")
    notes = Notes()
    warn_if_repeats_share_a_server(ds, notes)
    warn_of_pruned_configs(ds, notes)
    ds, table, moved = select_failover(ds, table, include_failover, notes, by)
    have: pd.DataFrame | Container[str] = set(table_columns(ds)) if table is None else table
    obj = objective_of(ds, objective)
    metric_sense(obj)
    if obj not in have:
        raise AnalysisInputError(f"objective {obj!r} is not in the trial table")
    slo_list = slos_of(ds, slos)
    req = _Request(obj, weights, slo_columns(slo_list, have), latency)
    plan = POLICIES[policy].plan(req)
    if table is None:
        needs = [*base_columns(by), "failure_kind", obj, *plan.columns]
        if plan.derived or plan.needs_price:
            needs += ["gpus", "gpu_hour_price"]
        df = lean_table(ds, needs)
    else:
        df = table
    if plan.gate == [] and policy in ("slo_throughput", "per_gpu", "per_cost") and not slo_list:
        notes.warn("no_slos", f"no SLOs are defined, so {policy} ranks by {plan.score_name} alone")
    extra = {name: fn(df) for name, fn in plan.derived.items()}
    groups = config_groups(df, plan.columns, by, with_trials=n_boot > 0, extra=extra,
                           source=ds if table is None else None)
    lost_by_group = _lost_counts(df, by)
    out: list[RankedGroup] = []
    n_single = n_two = 0
    for g in groups:
        if plan.needs_price and not _priced(df, g):
            hw = g.key.get("hardware_class", "this hardware class")
            msg = (f"no price per GPU-hour is given for {hw}, so configs cannot be ranked per dollar here "
                   "(add gpu_hour_prices to the spec; prices are never invented)")
            notes.warn("no_prices", msg, _subject(g.key))
            out.append(RankedGroup(g.key, [], False, msg, n_ranked=0))
            continue
        lost_of = lost_by_group.get(tuple(g.key.values()), {})
        n_lost = np.asarray([lost_of.get(str(c), 0) for c in g.config_ids], dtype=np.int64) if lost_of else None
        ranked, single = _rank_group(g, plan, n_boot, seed, top, n_lost)
        if moved.by_cell:
            ranked = dataclasses.replace(ranked, rows=[
                dataclasses.replace(r, n_failover=moved.n_failover(g.key, r.config_id)) for r in ranked.rows])
        n_single += single
        n_two += int((g.counts == 2).sum())
        out.append(ranked)
    if n_single and n_boot > 0:
        notes.warn("single_repeat", f"{n_single} config(s) have a single repeat: their score has no interval and "
                                    "their p_best can only be 0 or 1 (one trial has no spread to resample); run "
                                    "repeats to tell configs apart")
    if n_two and n_boot > 0:
        notes.warn("few_repeats", f"{n_two} config(s) have only 2 repeats: their bootstrap intervals are rough "
                                  "(too narrow as a rule), so read their p_best and distinguishability with care")
    return RankingResult(
        policy=policy, description=POLICIES[policy].description, objective=obj, score_name=plan.score_name,
        higher_is_better=plan.sense > 0, slos=slo_list, groups=out, n_boot=max(0, n_boot), claim=claim_for(ds),
        warnings=notes.warnings, subsampled=notes.subsampled)


def _priced(df: pd.DataFrame, g: ConfigGroup) -> bool:
    if "gpu_hour_price" not in df:
        return False
    prices = df["gpu_hour_price"].to_numpy(dtype=float)[g.first_rows]
    return bool(np.isfinite(prices).any())


def _subject(key: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in key.items())


def _rank_group(g: ConfigGroup, plan: _Plan, n_boot: int, seed: int, top: int | None = None,
                n_lost: np.ndarray | None = None) -> tuple[RankedGroup, int]:
    has = g.counts > 0
    sense = plan.sense
    score = plan.score(g.medians) * sense  # higher is better from here on
    score = np.where(has, score, np.nan)
    lost = np.zeros(len(has), dtype=np.int64) if n_lost is None else n_lost
    failing = (g.n_failed - lost) > 0
    tier = _tiers(g.medians, has, plan.gate, failing)
    tb = None if plan.tiebreak is None else np.where(has, plan.tiebreak(g.medians), np.nan)
    order = _order(tier, score, tb)
    notes = plan.notes(np.where(has[:, None], g.medians, np.nan)) if plan.notes is not None else None
    boot_score = boot_tier = boot_tb = None
    p_best = np.full(len(has), np.nan)
    if n_boot > 0 and has.any():
        med = bootstrap_medians(g, n_boot, seed)
        boot_score = np.where(has[None, :], plan.score(med) * sense, np.nan)
        boot_tier = _tiers(med, np.broadcast_to(has, boot_score.shape), plan.gate, failing)
        boot_tb = None if plan.tiebreak is None else np.where(has[None, :], plan.tiebreak(med), np.nan)
        best = _best(boot_tier, boot_score, boot_tb)
        p_best = np.bincount(best, minlength=len(has)) / n_boot
    single = has & (g.counts == 1)
    rows: list[RankedRow] = []
    for r, c in enumerate(order[:top].tolist() if top is not None else order.tolist(), start=1):
        est = float(score[c] * sense)
        if boot_score is not None and has[c] and not single[c]:
            iv = percentile_interval(boot_score[:, c] * sense, estimate=est, level=LEVEL)
        else:
            iv = Interval(est, math.nan, math.nan, LEVEL)
        met = None
        if plan.gate and has[c]:
            met = bool(tier[c] - (tier[c] & _FAILS) == _MEETS)
        rows.append(RankedRow(
            rank=r, config_id=str(g.config_ids[c]), label=g.labels[c], score=iv, n_ok=int(g.n_ok[c]),
            n_failed=int(g.n_failed[c]), n_holes=int(g.n_holes[c]), n_repeats=int(g.counts[c]), slos_met=met,
            p_best=None if boot_score is None else float(p_best[c]),
            values={col: float(g.medians[c, j]) for j, col in enumerate(plan.columns)}, n_lost=int(lost[c]),
            note=notes[c] if notes is not None and has[c] else ""))
    group = _distinguish(g, plan, order, tier, score, boot_tier, boot_score, single, rows, n_boot, boot_tb)
    return dataclasses.replace(group, n_ranked=len(order)), int(single.sum())


def _distinguish(g: ConfigGroup, plan: _Plan, order: np.ndarray, tier: np.ndarray, score: np.ndarray,
                 boot_tier: np.ndarray | None, boot_score: np.ndarray | None, single: np.ndarray,
                 rows: list[RankedRow], n_boot: int, boot_tb: np.ndarray | None = None) -> RankedGroup:
    if not bool((tier != _NO_DATA).any()):
        return RankedGroup(g.key, rows, False, "no config has a usable trial in this group, so there is no #1")
    first = int(order[0])
    name1 = f"#1 ({g.labels[first]})"
    if len(order) < 2:
        return RankedGroup(g.key, rows, False, f"{name1} is the only config in this group; there is nothing to "
                                               "distinguish it from")
    second = int(order[1])
    name2 = f"#2 ({g.labels[second]})"
    if tier[second] == _NO_DATA:
        return RankedGroup(g.key, rows, True, f"{name1} is the only config with a usable trial; {name2} and any "
                                              "below it failed every trial")
    if boot_tier is None or boot_score is None:
        return RankedGroup(g.key, rows, False, f"no bootstrap was run (n_boot={n_boot}), so whether {name1} is "
                                               f"distinguishable from {name2} was not assessed")
    if single[first] or single[second]:
        return RankedGroup(g.key, rows, False, f"whether {name1} is distinguishable from {name2} cannot be told: "
                                               "at least one of them has a single repeat, which has no spread to "
                                               "resample")
    t1, t2 = boot_tier[:, first], boot_tier[:, second]
    s1 = np.where(np.isfinite(boot_score[:, first]), boot_score[:, first], -np.inf)
    s2 = np.where(np.isfinite(boot_score[:, second]), boot_score[:, second], -np.inf)
    if boot_tb is None:
        b1 = b2 = np.zeros(len(s1))
    else:
        b1, b2 = _finite(boot_tb[:, first]), _finite(boot_tb[:, second])
    tied = (s1 == s2) & ((b1 > b2) | ((b1 == b2) & (first < second)))
    above = (t1 < t2) | ((t1 == t2) & ((s1 > s2) | tied))
    p_order = float(above.mean())
    diff = (boot_score[:, first] - boot_score[:, second]) * plan.sense
    margin = percentile_interval(diff, estimate=float((score[first] - score[second]) * plan.sense), level=LEVEL)
    ok = p_order >= 1.0 - (1.0 - LEVEL) / 2.0
    gated = f"; #2 misses an SLO in {np.mean(t2 > t1):.0%} of them" if plan.gate and (t2 > t1).any() else ""
    if ok:
        sentence = (f"{name1} is distinguishable from {name2}: it ranked above #2 in {p_order:.1%} of "
                    f"{n_boot} bootstrap resamples of the repeats{gated}; {plan.score_name} difference "
                    f"{margin}")
    else:
        sentence = (f"{name1} is not distinguishable from {name2}: it ranked above #2 in only {p_order:.1%} of "
                    f"{n_boot} bootstrap resamples of the repeats (needs {1 - (1 - LEVEL) / 2:.1%}){gated}; "
                    f"{plan.score_name} difference {margin}")
    return RankedGroup(g.key, rows, bool(ok), sentence, margin, p_order)
