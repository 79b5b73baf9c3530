"""Metric-vs-load curves (GuideLLM style): each config's metrics against the load it was offered.

A load point is **open loop** when it sets a request rate (x = ``request_rate``, req/s, the
nominal rate) and **closed loop** when it sets only a concurrency (x = ``max_concurrency``,
requests in flight). The two never share an x axis: :func:`curves` returns one :class:`Series`
per kind x workload (dataset, lengths, endpoint, arrival) x hardware class, and within a series
one point per config and load level: the median of the metric over the config's repeats there
(repeats are the unit of replication; baseline re-runs left out), from
:func:`analysis.pareto.config_groups`.

Intervals (:func:`median_interval`): a distribution-free two-sided interval for the median over
repeats, from order statistics (exact for independent repeats of a continuous distribution), built
from :func:`analysis.decision.median_upper_bound` applied to both tails. It reaches 95% from 6
repeats; with 2-5 repeats it is ``[min, max]`` at its exact, lower, confidence (50%, 75%, 87.5%,
93.75%), which it reports; a single repeat has no interval.

The knee (:func:`knee`, :data:`KNEE_RULE`): the highest load up to which every segment of the
throughput curve still gains at least :data:`KNEE_FRACTION` of the first segment's gain per unit
load. None with fewer than 3 load levels, when the first segment does not gain, or when no segment
falls below the fraction (the curve has not flattened within the loads measured).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis.decision import median_upper_bound
from analysis.frame import AnalysisInputError
from analysis.pareto import ConfigGroup, config_groups

KNEE_FRACTION = 0.5
MIN_LEVELS = 3
KNEE_RULE = (f"knee: the highest load up to which every segment of the config's output-throughput curve (medians "
             f"over repeats) still gains at least {KNEE_FRACTION:.0%} of the first segment's throughput per unit "
             f"load; none with fewer than {MIN_LEVELS} load levels, when the first segment gains nothing, or when "
             "the curve never falls below that within the loads measured")
LEVEL = 0.95
KINDS = {"rate": "request rate (req/s)", "concurrency": "concurrency (requests in flight)"}
#: the trial-table columns that describe a load point's workload besides its load
WORKLOAD_COLUMNS = ("dataset", "input_len", "output_len", "endpoint", "arrival", "burstiness")
BY = ("load_point", "hardware_class")


@dataclass(frozen=True)
class Knee:
    """Where a throughput curve stops paying: ``load`` (None when there is none) and ``why`` in words."""

    load: float | None
    why: str


def knee(loads: Sequence[float] | np.ndarray, throughput: Sequence[float] | np.ndarray,
         fraction: float = KNEE_FRACTION) -> Knee:
    """The knee of one throughput curve under :data:`KNEE_RULE` (points with a missing value are
    dropped; loads need not be sorted)."""
    x = np.asarray(loads, dtype=float)
    y = np.asarray(throughput, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    x, inverse = np.unique(x, return_inverse=True)  # two load points at one load: their median
    y = np.asarray([float(np.median(y[inverse == i])) for i in range(len(x))]) if len(x) < len(y) else y[np.argsort(
        inverse, kind="stable")]
    if len(x) < MIN_LEVELS:
        return Knee(None, f"no knee: {len(x)} load level(s) with data, the rule needs at least {MIN_LEVELS}")
    slopes = np.diff(y) / np.diff(x)
    first = float(slopes[0])
    if not first > 0:
        return Knee(None, "no knee: throughput does not rise between the two lowest loads")
    below = np.flatnonzero(slopes < fraction * first)
    if not len(below):
        return Knee(None, f"no knee within the loads measured: throughput still gains >= {fraction:.0%} of the "
                          f"first segment's rate up to {x[-1]:g}")
    k = int(below[0])  # the segment x[k] -> x[k + 1] is the first to gain too little
    return Knee(float(x[k]), f"knee at {x[k]:g}: the segment to {x[k + 1]:g} gains {slopes[k] / first:.0%} of "
                             "the first segment's throughput per unit load")


@dataclass(frozen=True)
class Band:
    """A median over repeats with its interval: ``low``/``high`` NaN without one, ``level`` the
    interval's exact confidence (NaN without one), ``n`` the repeats."""

    median: float
    low: float
    high: float
    level: float
    n: int


def median_interval(values: Sequence[float] | np.ndarray, level: float = LEVEL) -> Band:
    """The median of ``values`` (the repeats of one config at one load) with the distribution-free
    interval of the module docstring (``level`` two-sided, or the closest confidence the repeats
    allow below it, reported in :attr:`Band.level`)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    n = len(v)
    if n == 0:
        return Band(math.nan, math.nan, math.nan, math.nan, 0)
    med = float(np.median(v))
    if n < 2:
        return Band(med, math.nan, math.nan, math.nan, 1)
    k, conf = _order_statistic(n, 1.0 - (1.0 - level) / 2.0)
    v = np.sort(v)
    return Band(med, float(v[n - 1 - k]), float(v[k]), 2.0 * conf - 1.0, n)


@functools.lru_cache(maxsize=256)
def _order_statistic(n: int, tail: float) -> tuple[int, float]:
    """The 0-based index of the order statistic that bounds the median of ``n`` repeats from above
    at one-sided confidence ``tail`` (or the largest, below it) and its exact confidence: what
    :func:`analysis.decision.median_upper_bound` picks, found once per ``n`` (it depends on nothing else)."""
    at, conf = median_upper_bound(np.arange(n, dtype=float), tail)
    return int(at), float(conf)


@dataclass
class Series:
    """One x axis: the load levels of one kind and workload on one hardware class.

    ``loads`` the sorted distinct load levels, ``load_points`` their names; ``config_ids`` and
    ``labels`` the configs measured there; ``medians[metric]`` is configs x levels (NaN where a
    config has no usable trial at a level), ``counts`` the usable repeats (configs x levels); the
    groups keep the usable trials' values for intervals (:meth:`band`)."""

    kind: str
    workload: dict[str, str]
    hardware_class: str
    loads: np.ndarray
    load_points: list[str]
    config_ids: list[str]
    labels: list[str]
    metrics: list[str]
    medians: dict[str, np.ndarray]
    counts: np.ndarray
    _cells: list[tuple[ConfigGroup, np.ndarray]] = field(default_factory=list, repr=False)

    @property
    def title(self) -> str:
        w = self.workload
        kind = "open loop" if self.kind == "rate" else "closed loop"
        lens = (f", {w.get('input_len', '?')} in / {w.get('output_len', '?')} out tokens"
                if w.get("input_len", "nan") != "nan" else "")
        arrival = f" ({w['arrival']})" if self.kind == "rate" and w.get("arrival") else ""
        return f"{kind}{arrival}: {w.get('dataset', '')}{lens} on {self.hardware_class}"

    def peak(self, metric: str = "output_throughput") -> np.ndarray:
        """Per config, the highest median of ``metric`` over the levels (-inf without data)."""
        m = self.medians[metric]
        return np.where(np.isfinite(m).any(axis=1), np.nanmax(np.where(np.isfinite(m), m, -np.inf), axis=1), -np.inf)

    def band(self, config: int, level: int, metric: str) -> Band:
        """The :class:`Band` of config index ``config`` at level index ``level``."""
        g, pos = self._cells[level]
        c = int(pos[config])
        if c < 0 or g.values is None or g.starts is None:
            return Band(math.nan, math.nan, math.nan, math.nan, 0)
        j = self.metrics.index(metric)
        a = int(g.starts[c])
        return median_interval(g.values[a:a + int(g.counts[c]), j])

    def knee(self, config: int, metric: str = "output_throughput") -> Knee:
        return knee(self.loads, self.medians[metric][config])


def load_kind(request_rate: float, max_concurrency: float) -> str:
    """``rate`` (open loop) when a request rate is set, ``concurrency`` (closed loop) when only a
    concurrency is, "" when neither."""
    if math.isfinite(request_rate) and request_rate > 0:
        return "rate"
    if math.isfinite(max_concurrency) and max_concurrency > 0:
        return "concurrency"
    return ""


def load_points(df: pd.DataFrame) -> pd.DataFrame:
    """One row per load point of the trial table: its ``kind``, ``load`` and workload columns."""
    for c in ("load_point", "request_rate", "max_concurrency"):
        if c not in df:
            raise AnalysisInputError(f"the trial table has no {c!r} column: load curves need the load points' "
                                     "request rate or concurrency")
    cols = ["load_point", "request_rate", "max_concurrency", *[c for c in WORKLOAD_COLUMNS if c in df]]
    first = df[cols].drop_duplicates("load_point")
    rate = first["request_rate"].to_numpy(dtype=float)
    conc = first["max_concurrency"].to_numpy(dtype=float)
    kinds = [load_kind(r, c) for r, c in zip(rate.tolist(), conc.tolist())]
    out = first.assign(kind=kinds, load=np.where(np.asarray(kinds) == "rate", rate, conc))
    return out.reset_index(drop=True)


def curves(df: pd.DataFrame, metrics: Sequence[str]) -> list[Series]:
    """Every :class:`Series` of the trial table ``df`` (ok trials, baseline re-runs aside) for
    ``metrics`` (trial-table columns), sorted by kind (rate first), workload and hardware class.
    Load points with neither a rate nor a concurrency are left out."""
    metrics = list(dict.fromkeys(metrics))
    lps = load_points(df)
    lps = lps[lps["kind"] != ""]
    if lps.empty:
        return []
    groups = config_groups(df, metrics, BY, with_trials=True)
    by_key = {(g.key.get("load_point", ""), g.key.get("hardware_class", "")): g for g in groups}
    classes = sorted({k[1] for k in by_key})
    wcols = [c for c in WORKLOAD_COLUMNS if c in lps]
    out: list[Series] = []
    for (kind, *wvals), sub in lps.groupby(["kind", *wcols], sort=True, dropna=False):
        workload = {c: str(v) for c, v in zip(wcols, wvals)}
        for hw in classes:
            cells = [(float(r.load), str(r.load_point), by_key[(str(r.load_point), hw)])
                     for r in sub.itertuples() if (str(r.load_point), hw) in by_key]
            if not cells:
                continue
            cells.sort(key=lambda t: t[0])
            out.append(_series(str(kind), workload, hw, cells, metrics))
    out.sort(key=lambda s: (s.kind != "rate", s.title))
    return out


def _series(kind: str, workload: dict[str, str], hw: str, cells: list[tuple[float, str, ConfigGroup]],
            metrics: list[str]) -> Series:
    ids = sorted({str(c) for _, _, g in cells for c in g.config_ids.tolist()})
    index = {c: i for i, c in enumerate(ids)}
    labels = [""] * len(ids)
    medians = {m: np.full((len(ids), len(cells)), np.nan) for m in metrics}
    counts = np.zeros((len(ids), len(cells)), dtype=np.int64)
    kept: list[tuple[ConfigGroup, np.ndarray]] = []
    for j, (_, _, g) in enumerate(cells):
        rows = np.asarray([index[str(c)] for c in g.config_ids.tolist()], dtype=np.int64)
        pos = np.full(len(ids), -1, dtype=np.int64)
        pos[rows] = np.arange(len(rows))
        for i, lab in zip(rows.tolist(), g.labels):
            labels[i] = labels[i] or lab
        for k, m in enumerate(metrics):
            medians[m][rows, j] = g.medians[:, k]
        counts[rows, j] = g.counts
        kept.append((g, pos))
    return Series(kind, workload, hw, np.asarray([t[0] for t in cells]), [t[1] for t in cells], ids, labels,
                  metrics, medians, counts, kept)
