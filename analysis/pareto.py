"""Pareto frontiers of engine configs, with each config's probability of being on the front.

:func:`pareto_mask` is the plain computation on a matrix of values (one row per point);
:func:`front` applies it per scenario (load point) x hardware class to the engine configs of an
experiment, one point per config: the median of its repeats' per-trial values (repeats are the unit
of replication). With repeats, the front is recomputed on bootstrap resamples of every config's
repeats and each config's probability of being on the front is the fraction of resamples that put
it there.

Dominance: a point dominates another when it is at least as good on every metric and strictly better
on one (``senses`` say whether more or less is better). Rows with a missing (NaN) or infinite value
are never on the front; exact duplicates of a front point are all on the front.

The helpers :func:`config_groups` (per group and config: medians and counts, vectorised; the
grouping of a trial table is cached per table object so :func:`front` and
:func:`analysis.ranking.rank` on the same table factorise ids once) and :func:`bootstrap_medians`
(every config's repeats resampled with its own seeded generator) are shared with
:mod:`analysis.ranking`.
"""

from __future__ import annotations

import logging
import math
import weakref
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd
import xarray as xr

from analysis.common import Caveat, Notes, Subsample
from analysis.frame import PARAM_PREFIX, AnalysisInputError, lean_table, metric_sense
from analysis.hardware import require_separate, select_failover

log = logging.getLogger(__name__)

#: at most this many float64 cells per broadcast block in the k-D dominance filter and the bootstrap
_BLOCK_CELLS = 4_000_000


def pareto_mask(values: np.ndarray, senses: Sequence[int]) -> np.ndarray:
    """Boolean mask of the non-dominated rows of ``values`` (``n x k``).

    Args:
        values: one row per point, one column per metric.
        senses: per column, +1 when more is better (throughput), -1 when less is (latency).

    Returns:
        ``mask[i]`` is true when no other row dominates row ``i``. Rows holding a NaN or an infinite
        value are never on the front; duplicates of a front point are all on it.

    Two metrics take O(n log n) (one sort and a running best); more metrics sort lexicographically and
    filter the sorted rows block by block against the front found so far (fine for ~1e5 points).
    """
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 2:
        raise AnalysisInputError(f"values must be a 2-D array (points x metrics), got shape {arr.shape}")
    n, k = arr.shape
    if len(senses) != k:
        raise AnalysisInputError(f"{len(senses)} senses given for {k} metrics")
    if any(s not in (1, -1) for s in senses):
        raise AnalysisInputError(f"senses must be +1 or -1, got {list(senses)}")
    mask = np.zeros(n, dtype=bool)
    if n == 0 or k == 0:
        return mask
    finite = np.isfinite(arr).all(axis=1)
    idx = np.flatnonzero(finite)
    if idx.size == 0:
        return mask
    v = arr[idx] * np.asarray(senses, dtype=float)  # maximise every column
    if k == 1:
        mask[idx] = v[:, 0] == v[:, 0].max()
        return mask
    if k == 2:
        mask[idx] = _front_2d(v)
        return mask
    mask[idx] = _front_kd(v)
    return mask


def _front_2d(v: np.ndarray) -> np.ndarray:
    """Non-dominated rows of finite ``v`` (n x 2, maximise both): sort by x then y, both descending;
    a row is on the front when its y is the best of its x-tie group and beats every y seen at a
    strictly greater x."""
    n = len(v)
    order = np.lexsort((-v[:, 1], -v[:, 0]))
    x, y = v[order, 0], v[order, 1]
    starts = np.ones(n, dtype=bool)
    starts[1:] = x[1:] != x[:-1]
    group_start = np.maximum.accumulate(np.where(starts, np.arange(n), 0))
    best_before = np.empty(n)
    best_before[0] = -np.inf
    best_before[1:] = np.maximum.accumulate(y)[:-1]
    on = (y == y[group_start]) & (y > best_before[group_start])
    out = np.zeros(n, dtype=bool)
    out[order] = on
    return out


def _front_kd(v: np.ndarray) -> np.ndarray:
    """Non-dominated rows of finite ``v`` (n x k, maximise all). After a lexicographic sort (all
    columns descending) a row can only be dominated by rows before it, so front rows found earlier
    never leave: each block of candidates is checked against the front so far and within itself."""
    n, k = v.shape
    order = np.lexsort(tuple(-v[:, j] for j in range(k - 1, -1, -1)))
    s = v[order]
    on = np.zeros(n, dtype=bool)
    front = np.empty((0, k))
    i = 0
    while i < n:
        block_len = max(16, min(128, _BLOCK_CELLS // max(1, k * len(front))))
        blk = s[i:i + block_len]
        cand = np.arange(len(blk))
        if len(front):
            dominated = np.zeros(len(blk), dtype=bool)
            step = max(1, _BLOCK_CELLS // max(1, k * len(blk)))
            for lo in range(0, len(front), step):
                f = front[lo:lo + step]
                ge = (f[None, :, :] >= blk[:, None, :]).all(axis=2)
                gt = (f[None, :, :] > blk[:, None, :]).any(axis=2)
                dominated |= (ge & gt).any(axis=1)
            cand = cand[~dominated]
        c = blk[cand]
        ge = (c[None, :, :] >= c[:, None, :]).all(axis=2)  # [i, j]: row j >= row i everywhere
        gt = (c[None, :, :] > c[:, None, :]).any(axis=2)
        keep = cand[~(ge & gt).any(axis=1)]
        on[i + keep] = True
        front = np.concatenate([front, blk[keep]])
        i += len(blk)
    out = np.zeros(n, dtype=bool)
    out[order] = on
    return out


# --- shared by front, ranking and compare: trials grouped by config --------------------------------------


@dataclass
class ConfigGroup:
    """The configs of one scenario x hardware-class group and their usable trials (internal).

    ``values`` holds the usable trials' values (``T x m``, columns as asked), sorted by config and,
    within a config, by value (a canonical order, so row order in the dataset never matters);
    ``codes`` the config index of each row; ``starts``/``counts`` where each config's rows are.
    """

    key: dict[str, str]
    config_ids: np.ndarray
    labels: list[str]
    first_rows: np.ndarray  # per config, the table position of one of its trials
    n_ok: np.ndarray
    n_failed: np.ndarray
    n_holes: np.ndarray
    medians: np.ndarray
    counts: np.ndarray
    values: np.ndarray | None = None
    starts: np.ndarray | None = None


@dataclass
class _Grouping:
    """How the non-baseline rows of a trial table split into group x config cells (cached per table)."""

    keys: list[str]
    gvalues: list[np.ndarray]
    rows: np.ndarray  # positions of the non-baseline rows in the table
    cuniq: np.ndarray  # sorted config ids
    ncfg: int
    ucombo: np.ndarray  # sorted cell codes (group code * ncfg + config code)
    first: np.ndarray  # per cell, the table position of one of its rows
    inverse: np.ndarray  # per non-baseline row, its cell
    status: np.ndarray  # per non-baseline row
    status_codes: np.ndarray | None = None  # per non-baseline row, the index of its status in status_names
    status_names: tuple[Any, ...] = ()


_GROUPING_CACHE: dict[int, tuple[weakref.ref[pd.DataFrame], int, tuple[str, ...], _Grouping]] = {}
#: the grouping of lean tables built from one dataset, keyed by the identity of the dataset's arrays it
#: was computed from (config ids, status, baseline flags, group keys): front then rank on one dataset
#: factorise its ids once
_SOURCE_CACHE: dict[tuple[Any, ...], tuple[list[weakref.ref[np.ndarray]], _Grouping]] = {}


def _source_arrays(source: xr.Dataset, by: Sequence[str]) -> list[np.ndarray] | None:
    names = ["config_id", "status", "is_baseline", *by]
    out = []
    for c in names:
        if c in source.coords or c in source.data_vars:
            v = source[c].variable._data
            if not isinstance(v, np.ndarray):
                return None
            out.append(v)
    return out


def _grouping(df: pd.DataFrame, by: Sequence[str], source: xr.Dataset | None = None) -> _Grouping:
    """Factorise group keys and config ids once per table object (front and rank share it), or,
    for lean tables built from ``source`` (row for row), once per dataset while its arrays live.

    Linear-time at scale: ids are hashed (not sorted row by row), only the distinct ids are sorted,
    and cells are found by counting (``bincount``) rather than by sorting every row."""
    n_rows = len(df)
    hit = _GROUPING_CACHE.get(id(df))
    if hit is not None and hit[1] == n_rows and hit[2] == tuple(by) and hit[0]() is df:
        return hit[3]
    arrays = _source_arrays(source, by) if source is not None else None
    skey: tuple[Any, ...] | None = None
    if arrays is not None:
        skey = (tuple(by), n_rows, tuple(c in df for c in by), tuple(id(a) for a in arrays))
        shit = _SOURCE_CACHE.get(skey)
        if shit is not None and all(r() is a for r, a in zip(shit[0], arrays)):
            return shit[1]
    if "config_id" not in df or "status" not in df:
        raise AnalysisInputError("the trial table needs 'config_id' and 'status' columns")
    baseline = df["is_baseline"].to_numpy(dtype=bool) if "is_baseline" in df else None
    rows = np.flatnonzero(~baseline) if baseline is not None and baseline.any() else np.arange(n_rows)
    everything = len(rows) == n_rows

    def column(name: str) -> np.ndarray:
        values = df[name].to_numpy(dtype=object)
        return values if everything else values[rows]

    keys = [k for k in by if k in df]
    n = len(rows)
    gcode = np.zeros(n, dtype=np.int64)
    gvalues: list[np.ndarray] = []
    for k in keys:
        codes, uniq = _factorize(column(k))
        gcode = gcode * max(1, len(uniq)) + codes
        gvalues.append(np.asarray(uniq, dtype=object))
    ccode, cuniq = _factorize(column("config_id"))
    ncfg = max(1, len(cuniq))
    combo = gcode * ncfg + ccode
    ncombo = ncfg * int(np.prod([max(1, len(u)) for u in gvalues]))
    if n and combo.min() >= 0 and ncombo <= 4 * n + 1024:
        # cells by counting: present cells in code order, each row's cell, each cell's first row
        present = np.bincount(combo, minlength=ncombo) > 0
        ucombo = np.flatnonzero(present)
        cell_of = np.cumsum(present) - 1
        inverse = cell_of[combo]
        first = np.full(len(ucombo), n, dtype=np.int64)
        np.minimum.at(first, inverse, np.arange(n, dtype=np.int64))
    else:  # missing ids (code -1) or a sparse code space: sort
        ucombo, first, inverse = np.unique(combo, return_index=True, return_inverse=True)
    status = column("status")
    scodes, snames = pd.factorize(status)
    g = _Grouping(keys, gvalues, rows, np.asarray(cuniq, dtype=object), ncfg, ucombo, rows[first],
                  np.asarray(inverse).reshape(-1), status, np.asarray(scodes), tuple(np.asarray(snames).tolist()))
    _GROUPING_CACHE.clear()  # one table at a time: enough for front + rank on the same table
    _GROUPING_CACHE[id(df)] = (weakref.ref(df), len(df), tuple(by), g)
    if skey is not None and arrays is not None:
        _SOURCE_CACHE.clear()  # one dataset at a time
        _SOURCE_CACHE[skey] = ([weakref.ref(a) for a in arrays], g)
    return g


def clear_cache() -> None:
    """Forget cached groupings (of tables and of datasets); for cold timings."""
    _GROUPING_CACHE.clear()
    _SOURCE_CACHE.clear()


def base_columns(by: Sequence[str]) -> list[str]:
    """The trial-table columns :func:`config_groups` reads besides the metrics (ids, labels, status,
    baseline flag, the grouping keys): with the metrics, what a lean table needs."""
    return list(dict.fromkeys(["config_id", "config_label", "status", "is_baseline", *by]))


def _factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Codes and sorted uniques (missing values: code -1); values of mixed types are compared as
    strings. The same codes as ``pd.factorize(values, sort=True)``, faster: the values are hashed
    in their order and only the distinct ones are sorted."""
    if len(values) and isinstance(values[0], str) and bool((values == values[0]).all()):
        return np.zeros(len(values), dtype=np.int64), np.asarray([values[0]], dtype=object)
    codes, uniq = pd.factorize(values)
    uniq = np.asarray(uniq, dtype=object)
    if len(uniq) <= 1:
        return np.asarray(codes, dtype=np.int64), uniq
    if pd.api.types.infer_dtype(uniq, skipna=False) == "string":
        order = np.asarray(sorted(range(len(uniq)), key=uniq.__getitem__), dtype=np.intp)
        rank_of = np.empty(len(uniq), dtype=np.int64)
        rank_of[order] = np.arange(len(uniq))
        return np.where(codes >= 0, rank_of[codes], -1), uniq[order]
    # mixed types: pandas' own order (or, where values do not compare, their strings')
    try:
        codes, uniq = pd.factorize(values, sort=True)
    except TypeError:
        codes, uniq = pd.factorize(values.astype(str), sort=True)
    return np.asarray(codes, dtype=np.int64), np.asarray(uniq, dtype=object)


def _status_flags(gr: _Grouping, names: Sequence[str]) -> list[np.ndarray]:
    """``status == name`` for each name, comparing codes instead of strings."""
    if gr.status_codes is None:
        return [np.asarray(gr.status == name, dtype=bool) for name in names]
    pos = {u: i for i, u in enumerate(gr.status_names) if isinstance(u, str)}
    return [gr.status_codes == pos[name] if name in pos else np.zeros(len(gr.status), dtype=bool)
            for name in names]


def config_groups(df: pd.DataFrame, columns: Sequence[str], by: Sequence[str], status: str = "ok",
                  with_trials: bool = False, extra: dict[str, np.ndarray] | None = None,
                  source: xr.Dataset | None = None) -> list[ConfigGroup]:
    """Group non-baseline trials of ``df`` by ``by`` and config; per config the median of ``columns``
    over its usable trials (status ``status`` and every column finite), plus counts by status.

    Args:
        df: a :func:`analysis.frame.trial_table` (not modified; its grouping is cached while it lives).
        columns: the metric columns needed (from ``df`` or ``extra``).
        by: grouping columns (missing ones are ignored).
        status: which trials count as usable.
        with_trials: also keep the usable trials' values (for bootstrapping).
        extra: per-trial columns computed by the caller (aligned with ``df``'s rows).
        source: the dataset ``df`` was flattened from, row for row (a lean table): the grouping is
            then cached per dataset while its arrays live (do not modify them in place).

    Returns:
        One :class:`ConfigGroup` per group, sorted by the group keys; configs sorted by id.
    """
    extra = extra or {}
    missing = [c for c in columns if c not in df and c not in extra]
    if missing:
        raise AnalysisInputError(f"unknown metric {missing[0]!r}: no such column in the trial table")
    gr = _grouping(df, by, source)
    rows, inverse, ncell = gr.rows, gr.inverse, len(gr.ucombo)
    n = len(rows)
    is_ok, is_failed, is_hole, is_usable = _status_flags(gr, ("ok", "failed", "hole", status))
    n_ok = np.bincount(inverse[is_ok], minlength=ncell).astype(np.int64)
    n_failed = np.bincount(inverse[is_failed], minlength=ncell).astype(np.int64)
    n_holes = np.bincount(inverse[is_hole], minlength=ncell).astype(np.int64)
    x = np.empty((n, len(columns)))
    everything = n == len(df)
    for j, c in enumerate(columns):
        col = np.asarray(extra[c] if c in extra else df[c].to_numpy(dtype=float), dtype=float)
        x[:, j] = col if everything else col[rows]
    usable = is_usable & np.isfinite(x).all(axis=1)
    counts = np.bincount(inverse[usable], minlength=ncell).astype(np.int64)
    medians = np.full((ncell, len(columns)), np.nan)
    if usable.any() and columns:
        med = pd.DataFrame(x[usable], columns=range(len(columns))).groupby(inverse[usable], sort=True).median()
        medians[med.index.to_numpy()] = med.to_numpy()
    trial_vals = trial_codes = None
    if with_trials:
        ui = inverse[usable]
        xu = x[usable]
        order = np.lexsort(tuple(xu[:, j] for j in range(xu.shape[1] - 1, -1, -1)) + (ui,))
        trial_vals, trial_codes = xu[order], ui[order]
    label_col = "config_label" if "config_label" in df else "config_id"
    labels_all = df[label_col].to_numpy(dtype=object)[gr.first]
    gof = gr.ucombo // gr.ncfg
    out: list[ConfigGroup] = []
    bounds = np.flatnonzero(np.r_[True, gof[1:] != gof[:-1], True])
    for a, b in zip(bounds[:-1], bounds[1:]):
        key: dict[str, str] = {}
        rest = int(gof[a])
        for k, uniq in reversed(list(zip(gr.keys, gr.gvalues))):
            key[k] = str(uniq[rest % max(1, len(uniq))])
            rest //= max(1, len(uniq))
        key = {k: key[k] for k in gr.keys}
        vals = starts = None
        if trial_codes is not None and trial_vals is not None:
            lo, hi = np.searchsorted(trial_codes, [a, b])
            vals = trial_vals[lo:hi]
            starts = np.searchsorted(trial_codes[lo:hi], np.arange(a, b))
        labels = labels_all[a:b]
        out.append(ConfigGroup(
            key=key, config_ids=gr.cuniq[gr.ucombo[a:b] % gr.ncfg],
            labels=[str(v) for v in labels.tolist()],
            first_rows=gr.first[a:b], n_ok=n_ok[a:b], n_failed=n_failed[a:b], n_holes=n_holes[a:b],
            medians=medians[a:b], counts=counts[a:b], values=vals, starts=starts))
    return out


def _config_seed(seed: int, config_id: str) -> list[int]:
    return [int(seed) & 0xFFFFFFFF, zlib.crc32(str(config_id).encode())]


def bootstrap_medians(group: ConfigGroup, n_boot: int, seed: int) -> np.ndarray:
    """``n_boot x C x m`` medians of every config's repeats resampled with replacement (NaN for
    configs without usable trials). Each config draws from its own generator, seeded by ``seed`` and
    its id, so adding or removing another config never changes its resamples."""
    if group.values is None or group.starts is None:
        raise ValueError("config_groups(..., with_trials=True) is needed to bootstrap")
    m = group.values.shape[1]
    c_total = len(group.config_ids)
    out = np.full((n_boot, c_total, m), np.nan)
    if n_boot <= 0:
        return out
    for n in np.unique(group.counts[group.counts > 0]):
        cfgs = np.flatnonzero(group.counts == n)
        chunk = max(1, _BLOCK_CELLS // max(1, n_boot * int(n) * m))
        for lo in range(0, len(cfgs), chunk):
            sel = cfgs[lo:lo + chunk]
            draws = np.stack([np.random.default_rng(_config_seed(seed, str(group.config_ids[c])))
                              .integers(0, n, size=(n_boot, int(n))) for c in sel])  # (c, B, n)
            rows = group.starts[sel][:, None, None] + draws
            sample = np.sort(group.values[rows], axis=2)  # (c, B, n, m)
            med = 0.5 * (sample[:, :, (n - 1) // 2, :] + sample[:, :, n // 2, :])
            out[:, sel, :] = np.transpose(med, (1, 0, 2))
    return out


def param_values(df: pd.DataFrame, rows: Sequence[int] | np.ndarray) -> list[dict[str, Any]]:
    """The ``param_*`` values of the trials at positions ``rows`` of ``df``, missing ones as None."""
    cols = [str(c) for c in df.columns if str(c).startswith(PARAM_PREFIX)]
    if not len(rows):
        return []
    pos = np.asarray(rows, dtype=np.int64)
    out: list[dict[str, Any]] = [{} for _ in range(len(pos))]
    for col in cols:
        name = col.removeprefix(PARAM_PREFIX)
        for i, v in enumerate(df[col].to_numpy()[pos].tolist()):
            if isinstance(v, float) and math.isnan(v) or (isinstance(v, str) and v == ""):
                v = None
            out[i][name] = v
    return out


def _dataset_param_values(ds: xr.Dataset, df: pd.DataFrame, rows: np.ndarray) -> list[dict[str, Any]]:
    """:func:`param_values` of the trials at table positions ``rows`` of a lean table of ``ds`` (one
    without the ``param_*`` columns, row for row the dataset's): the same values, read from the
    dataset for those rows only (through the same DataFrame conversion as the full table's)."""
    pos = np.asarray(rows, dtype=np.int64)
    cols = [str(c) for c in ds.coords if str(c).startswith(PARAM_PREFIX) and ds.coords[c].dims == ("trial",)]
    small = pd.DataFrame({c: np.asarray(ds.coords[c].values)[pos] for c in cols}, index=np.arange(len(pos)))
    return param_values(small, np.arange(len(pos)))


# --- the front of an experiment ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ParetoPoint:
    """One engine config in a group: ``values`` are the medians of its repeats' per-trial values;
    ``p_front`` the fraction of bootstrap resamples of the repeats that put it on the front (None
    without a bootstrap); ``n_repeats`` its usable trials."""

    config_id: str
    label: str
    params: dict[str, Any]
    values: dict[str, float]
    on_front: bool
    p_front: float | None
    n_repeats: int
    n_failover: int = 0


@dataclass(frozen=True)
class ParetoGroup:
    """The front of one scenario x hardware-class group (``group``: load_point, hardware_class).

    ``n_points`` configs had usable trials (``len(points)`` of them listed, see :func:`front`'s
    ``points``); ``n_front`` of them are on the front; ``n_without_data`` had none."""

    group: dict[str, str]
    points: list[ParetoPoint]
    n_front: int
    n_without_data: int
    n_points: int = -1
    """Configs with usable trials (each a point of the plot); with ``points="all"`` it equals
    ``len(points)``, with ``points="front"`` only the ``n_front`` front configs are listed."""


@dataclass(frozen=True)
class ParetoResult:
    """Pareto fronts per group for ``metrics`` (senses: +1 more is better, -1 less is)."""

    metrics: tuple[str, ...]
    senses: tuple[int, ...]
    groups: list[ParetoGroup]
    n_boot: int
    warnings: list[Caveat] = field(default_factory=list)
    subsampled: list[Subsample] = field(default_factory=list)


def front(ds: xr.Dataset, metrics: Sequence[str] = ("output_throughput", "ttft_ms_p99"),
          by: Sequence[str] = ("load_point", "hardware_class"), n_boot: int = 200, seed: int = 0,
          status: str = "ok", table: pd.DataFrame | None = None, points: Literal["all", "front"] = "all",
          include_failover: bool = True) -> ParetoResult:
    """Pareto front of engine configs per scenario x hardware class.

    Args:
        ds: an experiment's dataset (:mod:`servetune.schema`).
        metrics: two or three metric columns of :func:`analysis.frame.trial_table` (e.g.
            ``output_throughput`` and ``ttft_ms_p99``, or ``output_tokens_per_gpu`` and
            ``output_tokens_per_user``); their senses come from :func:`analysis.frame.metric_sense`.
        by: grouping columns; incomparable hardware classes never share a front (a ``by`` without
            ``hardware_class`` on trials of several classes is refused; :mod:`analysis.crosshw`
            compares classes on normalised metrics).
        n_boot: bootstrap resamples of every config's repeats for ``p_front`` (0 skips it).
        seed: seed of the resampling.
        status: trials counted (``ok``); baseline trials are always left out.
        table: the trial table of ``ds`` if already built (saves flattening it again; its grouping is
            cached while the object lives, so do not modify it in place between calls). Without it
            only the columns the front needs are flattened (:func:`analysis.frame.trial_table`'s
            ``columns``).
        points: ``"all"`` lists every config with usable trials; ``"front"`` only those on the front
            (the same objects, in the same order; ``n_points`` still counts every config), which is
            what a large experiment's plot of the front needs: no point object for each of
            hundreds of thousands of dominated configs.
        include_failover: keep failover trials (tag ``failover-from:...``), marked in each point's
            ``n_failover`` and a caveat; ``False`` leaves them out (:mod:`analysis.hardware`).

    Returns:
        A :class:`ParetoResult`: per group one point per config with usable trials (or only the
        front's, see ``points``), whether it is on the front and its bootstrap probability of being
        there, plus caveats (single repeats, configs left out for lack of data).
    """
    metrics = tuple(metrics)
    if len(metrics) not in (2, 3):
        raise AnalysisInputError(f"a front needs 2 or 3 metrics, got {len(metrics)}: {list(metrics)}")
    if len(set(metrics)) != len(metrics):
        raise AnalysisInputError(f"metrics repeat: {list(metrics)}")
    if points not in ("all", "front"):
        raise AnalysisInputError(f"points must be 'all' or 'front', got {points!r}")
    senses = tuple(metric_sense(m) for m in metrics)
    require_separate(ds if table is None else table, by, "a Pareto front")
    notes = Notes()
    ds, table, moved = select_failover(ds, table, include_failover, notes, by)
    if table is None:
        df = lean_table(ds, [*base_columns(by), *metrics])
    else:
        df = table
    groups = config_groups(df, metrics, by, status=status, with_trials=n_boot > 0,
                           source=ds if table is None else None)
    out: list[ParetoGroup] = []
    n_single = 0
    for g in groups:
        has = g.counts > 0
        idx = np.flatnonzero(has)
        mask = pareto_mask(g.medians[idx], senses)
        p = np.full(len(idx), np.nan)
        if n_boot > 0 and len(idx):
            boot = bootstrap_medians(g, n_boot, seed)[:, idx, :]
            hits = np.zeros(len(idx))
            for b in range(n_boot):
                hits += pareto_mask(boot[b], senses)
            p = hits / n_boot
        n_single += int((g.counts[idx] == 1).sum())
        listed = np.arange(len(idx)) if points == "all" else np.flatnonzero(mask)
        params = (param_values(df, g.first_rows[idx[listed]]) if table is not None
                  else _dataset_param_values(ds, df, g.first_rows[idx[listed]]))
        pts = [
            ParetoPoint(config_id=str(g.config_ids[c]), label=g.labels[c], params=params[k],
                        values={m: float(g.medians[c, j]) for j, m in enumerate(metrics)}, on_front=bool(mask[i]),
                        p_front=None if n_boot <= 0 else float(p[i]), n_repeats=int(g.counts[c]),
                        n_failover=moved.n_failover(g.key, str(g.config_ids[c])))
            for k, (i, c) in enumerate(zip(listed.tolist(), idx[listed].tolist()))
        ]
        n_without = int((~has).sum())
        if n_without:
            notes.warn("no_data", f"{n_without} config(s) had no {status} trial with every metric of "
                                  f"{', '.join(metrics)} measured; they are not on the plot", _subject(g.key))
        out.append(ParetoGroup(group=g.key, points=pts, n_front=int(mask.sum()), n_without_data=n_without,
                               n_points=len(idx)))
    if n_single and n_boot > 0:
        notes.warn("single_repeat", f"{n_single} config(s) have a single repeat: their probability of being on the "
                                    "front can only be 0 or 1 (one trial has no spread to resample), so it says "
                                    "nothing about their noise")
    return ParetoResult(metrics=metrics, senses=senses, groups=out, n_boot=max(0, n_boot),
                        warnings=notes.warnings, subsampled=notes.subsampled)


def _subject(key: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in key.items())
