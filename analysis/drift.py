"""Baseline drift: control charts over the baseline re-runs the sweep schedules.

A sweep re-runs one fixed baseline config every so often (``is_baseline``; ``baseline_run`` numbers
the re-runs). If the machine drifts (thermal throttling, a noisy neighbour, a driver change), the
baseline's metric moves although its config did not. :func:`drift` charts the baseline, per load
point and hardware class, in run order (``baseline_run``, then ``started_at``):

XmR chart (individuals and moving range)
    The centre line and limits come from a reference period: the first half of the baseline runs,
    and at least the first 5 (all of them when there are fewer). Centre = their mean; MR-bar = the
    mean absolute difference of consecutive reference values; limits = centre +- 2.66 x MR-bar
    (3 sigma, sigma = MR-bar / 1.128). Every run outside the limits is flagged.
Tabular CUSUM
    On standardised values z = (x - centre) / sigma: S+ = max(0, S+ + z - k), S- = max(0, S- - z - k),
    with reference value ``k`` and decision interval ``h`` in sigma units (defaults 0.5 and 4: a
    shift of one sigma is caught in about 8 runs, a false alarm about every 170 runs per side).

The first alarm of a chart is the earliest run outside the XmR limits or with S+ or S- above
``h``; its ``started_at`` is the alarm time. The change itself began earlier: the onset estimate is
the first run after the last run at which the alarming CUSUM side was zero (for an XmR-only alarm,
the alarming run). Every non-baseline trial of the same hardware class (any load point: drift is a
property of the machine) started after the last in-control baseline run before the onset, and so
every trial started after the alarm, is listed as ``suspect``. Raw values are never modified:
:func:`flag_suspect` returns a NEW dataset with a boolean ``drift_suspect`` coordinate.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import pandas as pd
import xarray as xr

from analysis.common import Caveat, Notes, Subsample
from analysis.frame import AnalysisInputError, known_metrics, trial_table

log = logging.getLogger(__name__)

XMR_FACTOR = 2.66
D2 = 1.128
MIN_REFERENCE = 5
MIN_RUNS = 5


@dataclass(frozen=True)
class DriftChart:
    """XmR chart and CUSUM of one load point x hardware class's baseline runs.

    Per run (in order): ``trial_ids``, ``started_at`` (µs), ``values`` (the metric, raw),
    ``out_of_limits`` (outside the XmR limits), ``cusum_upper``/``cusum_lower``. ``n_reference``
    first runs set ``centre``, ``mr_bar``, ``sigma`` (= MR-bar / 1.128), ``ucl``/``lcl``.
    ``false_alarm_probability`` is the chance that this chart (its length, reference period, k and h,
    with the limits estimated as here) alarms on a process that never drifted, by simulation of
    independent normal runs: with few runs it is large, and an alarm is weaker evidence.
    ``alarm_index`` is the first alarming run (None: in control), ``alarm_rule`` which rule fired
    (``xmr``, ``cusum_upper``, ``cusum_lower``), ``alarm_at`` its ``started_at``; ``onset_index``
    the estimated first drifted run and ``suspect_from`` the ``started_at`` after which trials are
    suspect (the last in-control run before the onset; None without an alarm)."""

    load_point: str
    hardware_class: str
    trial_ids: list[str]
    started_at: list[int]
    values: list[float]
    n_reference: int
    centre: float
    mr_bar: float
    sigma: float
    ucl: float
    lcl: float
    out_of_limits: list[bool]
    cusum_upper: list[float]
    cusum_lower: list[float]
    k: float
    h: float
    false_alarm_probability: float
    alarm_index: int | None
    alarm_rule: str
    alarm_at: int | None
    onset_index: int | None
    suspect_from: int | None


@dataclass(frozen=True)
class DriftResult:
    """Drift of ``metric`` over the baseline re-runs.

    ``charts`` one per load point x hardware class with baseline runs; ``alarm`` whether any chart
    alarmed; ``alarm_at`` the earliest alarm time (µs since the epoch); ``suspect`` the trial ids of
    non-baseline trials measured after a drift began on their hardware class (raw values untouched)."""

    metric: str
    charts: list[DriftChart]
    alarm: bool
    alarm_at: int | None
    suspect: list[str]
    warnings: list[Caveat] = field(default_factory=list)
    subsampled: list[Subsample] = field(default_factory=list)


def drift(ds: xr.Dataset, metric: str = "output_throughput", load_point: str | None = None,
          k: float = 0.5, h: float = 4.0) -> DriftResult:
    """XmR chart and tabular CUSUM of ``metric`` over the baseline re-runs; suspect trials after an alarm.

    Args:
        ds: an experiment's dataset; never modified.
        metric: a per-trial metric (a scalar variable, ``<var>_p<q>`` or a derived metric).
        load_point: chart this load point only (default: every load point with baseline runs).
            Suspect trials are still every trial of the alarming hardware class.
        k: CUSUM reference value, in sigma units.
        h: CUSUM decision interval, in sigma units.
    Returns:
        :class:`DriftResult`.
    Raises:
        AnalysisInputError: an unknown metric or load point, or non-positive ``h`` / negative ``k``.
    """
    if k < 0 or h <= 0:
        raise AnalysisInputError(f"CUSUM needs k >= 0 and h > 0, got k={k!r}, h={h!r}")
    df = trial_table(ds)
    if metric not in df.columns:
        raise AnalysisInputError(f"unknown metric {metric!r}; known: {', '.join(known_metrics())}")
    if load_point is not None:
        lps = set(df["load_point"].astype(str)) if "load_point" in df else set()
        if load_point not in lps:
            raise AnalysisInputError(f"unknown load_point {load_point!r}; the dataset has: {', '.join(sorted(lps))}")
    notes = Notes()
    is_bl = df["is_baseline"].astype(bool).to_numpy() if "is_baseline" in df else np.zeros(len(df), dtype=bool)
    base = df[is_bl]
    if load_point is not None:
        base = base[base["load_point"].astype(str) == load_point]
    status = base["status"].astype(str).to_numpy() if "status" in base else np.full(len(base), "ok")
    values = base[metric].to_numpy(dtype=float)
    usable = (status == "ok") & np.isfinite(values)
    if (~usable).any():
        notes.warn("baseline_unusable", f"{int((~usable).sum())} baseline run(s) failed or lack {metric}; they are "
                                        "left out of the charts")
    base = base[usable]
    if not len(base):
        notes.warn("no_baseline", f"no usable baseline runs{' at load point ' + load_point if load_point else ''}: "
                                  "drift cannot be checked; schedule baseline re-runs to detect it")
        return DriftResult(metric, [], False, None, [], notes.warnings, notes.subsampled)

    charts: list[DriftChart] = []
    for (lp, hw), sub in base.groupby([base["load_point"].astype(str), base["hardware_class"].astype(str)],
                                      sort=True):
        sub = sub.sort_values(["baseline_run", "started_at"], kind="stable")
        chart = _chart(str(lp), str(hw), sub, metric, k, h, notes)
        if chart is not None:
            charts.append(chart)

    suspect: list[str] = []
    earliest: dict[str, int] = {}
    for c in charts:
        if c.suspect_from is not None:
            earliest[c.hardware_class] = min(earliest.get(c.hardware_class, c.suspect_from), c.suspect_from)
    if earliest:
        trials = df[~is_bl]
        started = trials["started_at"].to_numpy(dtype="int64")
        hws = trials["hardware_class"].astype(str).to_numpy()
        ids = trials["trial_id"].astype(str).to_numpy()
        for i in range(len(trials)):
            t0 = earliest.get(str(hws[i]))
            if t0 is not None and started[i] > t0:
                suspect.append(str(ids[i]))
    alarms = [c.alarm_at for c in charts if c.alarm_at is not None]
    alarm_at = min(alarms) if alarms else None
    if alarm_at is not None:
        log.info("baseline drift alarm at %s; %d trials suspect", alarm_at, len(suspect))
    return DriftResult(metric, charts, bool(alarms), alarm_at, suspect, notes.warnings, notes.subsampled)


def _chart(lp: str, hw: str, sub: pd.DataFrame, metric: str, k: float, h: float, notes: Notes) -> DriftChart | None:
    subject = f"load_point={lp}, hardware_class={hw}"
    x = sub[metric].to_numpy(dtype=float)
    n = len(x)
    if n < MIN_RUNS:
        notes.warn("few_baseline_runs", f"only {n} baseline run(s) of {metric}: "
                                        f"{'drift cannot be checked' if n < 3 else 'the control limits are rough'} "
                                        f"(at least {MIN_RUNS} are needed for a usable chart)", subject)
    if n < 3:
        return None
    n_ref = reference_size(n)
    ref = x[:n_ref]
    centre = float(ref.mean())
    mr_bar = float(np.abs(np.diff(ref)).mean())
    sigma = mr_bar / D2
    ucl, lcl = centre + XMR_FACTOR * mr_bar, centre - XMR_FACTOR * mr_bar
    ooc = [bool(v > ucl or v < lcl) for v in x]
    up = np.zeros(n)
    lo = np.zeros(n)
    if sigma > 0:
        up, lo = (a[0] for a in _cusum(((x - centre) / sigma)[None, :], k))
    else:
        notes.warn("zero_variation", f"the reference baseline runs of {metric} are identical: no spread to scale "
                                     "the chart by; any change is flagged by the XmR rule only", subject)
        ooc = [bool(v != centre) for v in x]
    alarm_index: int | None = None
    rule = ""
    onset: int | None = None
    for i in range(n):
        if up[i] > h or lo[i] > h or ooc[i]:
            alarm_index = i
            if up[i] > h:
                rule, side = "cusum_upper", up
            elif lo[i] > h:
                rule, side = "cusum_lower", lo
            else:
                rule, side = "xmr", np.zeros(n)
            j = i
            while j > 0 and side[j - 1] > 0:
                j -= 1
            onset = j
            break
    fa = false_alarm_probability(n, n_ref, k, h)
    if fa > 0.1:
        notes.warn("short_reference", f"with {n} baseline runs and limits estimated from the first {n_ref}, this "
                                      f"chart alarms on a steady process with probability {fa:.0%}: an alarm is "
                                      "weak evidence on its own; more baseline re-runs make it stronger", subject)
    started = [int(v) for v in sub["started_at"].to_numpy(dtype="int64")]
    alarm_at = started[alarm_index] if alarm_index is not None else None
    suspect_from = None
    if onset is not None:
        suspect_from = started[onset - 1] if onset > 0 else started[0] - 1
    if alarm_index is not None:
        notes.warn("drift", f"baseline {metric} left control at run {alarm_index} ({rule}); the change likely began "
                            f"at run {onset} (false-alarm probability of this chart {fa:.0%}); trials measured after it are flagged suspect (values untouched)", subject)
    return DriftChart(
        load_point=lp, hardware_class=hw, trial_ids=[str(v) for v in sub["trial_id"].tolist()], started_at=started,
        values=[float(v) for v in x], n_reference=n_ref, centre=centre, mr_bar=mr_bar, sigma=sigma,
        ucl=ucl, lcl=lcl, out_of_limits=ooc, cusum_upper=[float(v) for v in up], cusum_lower=[float(v) for v in lo],
        k=k, h=h, false_alarm_probability=fa, alarm_index=alarm_index, alarm_rule=rule, alarm_at=alarm_at, onset_index=onset,
        suspect_from=suspect_from,
    )


def _cusum(z: np.ndarray, k: float) -> tuple[np.ndarray, np.ndarray]:
    """Upper and lower tabular CUSUM paths of standardised series (rows of ``z``)."""
    up = np.zeros_like(z)
    lo = np.zeros_like(z)
    s_up = np.zeros(z.shape[0])
    s_lo = np.zeros(z.shape[0])
    for i in range(z.shape[1]):
        s_up = np.maximum(0.0, s_up + z[:, i] - k)
        s_lo = np.maximum(0.0, s_lo - z[:, i] - k)
        up[:, i], lo[:, i] = s_up, s_lo
    return up, lo


def reference_size(n: int) -> int:
    """Runs in the reference period of a chart of ``n`` runs: all up to 5, else the first half (>= 5)."""
    return n if n <= MIN_REFERENCE else max(MIN_REFERENCE, n // 2)


@lru_cache(maxsize=256)
def false_alarm_probability(n: int, n_ref: int, k: float, h: float, sims: int = 4000) -> float:
    """Probability that a chart of ``n`` runs with limits from the first ``n_ref`` alarms (XmR or
    CUSUM) on independent normal runs without drift (Monte Carlo with a fixed seed)."""
    if n < 2 or n_ref < 2:
        return math.nan
    rng = np.random.default_rng(12345)
    x = rng.standard_normal((sims, n))
    ref = x[:, :n_ref]
    centre = ref.mean(axis=1, keepdims=True)
    sigma = np.abs(np.diff(ref, axis=1)).mean(axis=1, keepdims=True) / D2
    z = (x - centre) / sigma
    up, lo = _cusum(z, k)
    alarm = (np.abs(z) > 3.0) | (up > h) | (lo > h)
    return float(alarm.any(axis=1).mean())


def flag_suspect(ds: xr.Dataset, result: DriftResult) -> xr.Dataset:
    """A NEW dataset: ``ds`` plus a boolean ``drift_suspect`` coordinate on ``trial`` (True for the
    trials ``result`` lists as suspect) and attributes ``drift_metric`` / ``drift_alarm_at``.
    ``ds`` itself is left untouched and no value is changed."""
    if "trial_id" not in ds.coords:
        raise AnalysisInputError("the dataset has no trial_id coordinate to flag suspect trials by")
    wanted = set(result.suspect)
    mask = np.array([str(t) in wanted for t in ds["trial_id"].values.tolist()], dtype=bool)
    out = ds.copy(deep=False).assign_coords(drift_suspect=("trial", mask))
    out.attrs = dict(ds.attrs)
    out.attrs["drift_metric"] = result.metric
    out.attrs["drift_alarm_at"] = int(result.alarm_at) if result.alarm_at is not None else -1
    return out
