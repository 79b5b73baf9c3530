"""Baseline drift: XmR chart and CUSUM over the baseline re-runs, suspect trials, raw data untouched.

Ground truth from :func:`analysis.synthetic.planted` (SYNTHETIC data): a step of ``drift_size`` (log
scale) on everything measured after ``drift_at`` of the run."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from analysis.common import jsonable
from analysis.drift import D2, XMR_FACTOR, DriftResult, drift, false_alarm_probability, flag_suspect
from analysis.frame import AnalysisInputError
from analysis.synthetic import planted


def drifted(seed: int, drift_at: float | None = 0.6) -> xr.Dataset:
    ds, _ = planted(n_configs=60, n_params=4, baseline_every=4, drift_at=drift_at, drift_size=-0.3, noise=0.05,
                    seed=seed)
    return ds


def planted_run(ds: xr.Dataset, drift_at: float) -> tuple[int, int]:
    """Index of the first drifted baseline run and the first drifted started_at."""
    n = ds.sizes["trial"]
    first = int(np.ceil(drift_at * n))
    t_drift = int(ds["started_at"].values[first])
    bl = np.sort(ds["started_at"].values[ds["is_baseline"].values])
    return int(np.searchsorted(bl, t_drift)), t_drift


def codes(res: DriftResult) -> set[str]:
    return {w.code for w in res.warnings}


def test_planted_drift_alarms_near_the_step_and_flags_later_trials() -> None:
    near = alarmed = 0
    for seed in range(20):
        ds = drifted(seed)
        run, t_drift = planted_run(ds, 0.6)
        res = drift(ds)
        chart = res.charts[0]
        assert chart.n_reference < run  # the reference period is before the step
        if not res.alarm:
            continue
        alarmed += 1
        assert chart.alarm_index is not None and res.alarm_at == chart.alarm_at
        if run <= chart.alarm_index <= run + 2:
            near += 1
            started = ds["started_at"].values
            later = ds["trial_id"].values[(started > res.alarm_at) & ~ds["is_baseline"].values]
            drifted_ids = ds["trial_id"].values[(started >= t_drift) & ~ds["is_baseline"].values]
            assert set(later.tolist()) <= set(res.suspect)
            assert set(drifted_ids.tolist()) <= set(res.suspect)
            # nothing long before the step is suspect
            assert chart.onset_index is not None
            early = ds["trial_id"].values[started < chart.started_at[max(0, chart.onset_index - 1)]]
            assert not set(early.tolist()) & set(res.suspect)
            assert chart.cusum_lower[chart.alarm_index] > chart.h or chart.out_of_limits[chart.alarm_index]
    assert alarmed >= 18, alarmed
    assert near >= 16, near


def test_no_drift_rarely_alarms_and_false_alarm_rate_is_calibrated() -> None:
    alarms = 0
    predicted = []
    for seed in range(20):
        res = drift(drifted(seed, drift_at=None))
        alarms += res.alarm
        predicted.append(res.charts[0].false_alarm_probability)
        assert (not res.alarm) == (res.suspect == [])
    assert alarms <= 9, alarms  # most seeds: no alarm
    # the chart reports its own false-alarm probability; the observed rate agrees within noise
    assert abs(alarms / 20 - float(np.mean(predicted))) < 0.25
    assert 0.05 < predicted[0] < 0.5


def test_xmr_and_cusum_arithmetic() -> None:
    ds = drifted(0, drift_at=None)
    bl = np.flatnonzero(ds["is_baseline"].values)
    series = np.array([100, 102, 99, 101, 100, 98, 101, 100, 130, 100, 90, 89, 88, 87, 86], dtype=float)
    assert len(bl) == len(series)
    tp = ds["output_throughput"].values.copy()
    tp[bl] = series
    hand = ds.assign(output_throughput=("trial", tp))
    res = drift(hand)
    c = res.charts[0]
    ref = series[:c.n_reference]
    assert c.n_reference == 7
    mr = np.abs(np.diff(ref)).mean()
    assert c.centre == pytest.approx(ref.mean()) and c.mr_bar == pytest.approx(mr)
    assert c.ucl == pytest.approx(ref.mean() + XMR_FACTOR * mr) and c.lcl == pytest.approx(ref.mean() - XMR_FACTOR * mr)
    assert c.sigma == pytest.approx(mr / D2)
    assert c.out_of_limits[8] and not any(c.out_of_limits[:8])
    s_up = s_lo = 0.0
    for i, x in enumerate(series):
        z = (x - c.centre) / c.sigma
        s_up, s_lo = max(0.0, s_up + z - 0.5), max(0.0, s_lo - z - 0.5)
        assert c.cusum_upper[i] == pytest.approx(s_up) and c.cusum_lower[i] == pytest.approx(s_lo)
    assert c.alarm_index == 8 and c.alarm_rule in ("xmr", "cusum_upper")
    assert res.alarm_at == int(ds["started_at"].values[bl[8]])


def test_runs_ordered_by_baseline_run_not_row_order() -> None:
    ds = drifted(1)
    perm = np.random.default_rng(0).permutation(ds.sizes["trial"])
    shuffled = ds.isel(trial=perm)
    a, b = drift(ds), drift(shuffled)
    assert a.charts[0].trial_ids == b.charts[0].trial_ids
    assert a.alarm_at == b.alarm_at and sorted(a.suspect) == sorted(b.suspect)
    assert list(a.charts[0].started_at) == sorted(a.charts[0].started_at)


def test_no_baseline_and_few_baseline_runs() -> None:
    ds, _ = planted(n_configs=30, n_params=3, seed=0)
    res = drift(ds)
    assert "no_baseline" in codes(res) and not res.alarm and res.charts == [] and res.suspect == []
    assert "cannot be checked" in next(w.message for w in res.warnings if w.code == "no_baseline")
    few, _ = planted(n_configs=16, n_params=3, baseline_every=4, seed=0)
    res = drift(few)
    assert int(few["is_baseline"].values.sum()) == 4
    assert "few_baseline_runs" in codes(res) and len(res.charts) == 1


def test_input_never_mutated_and_flag_suspect_returns_a_new_dataset() -> None:
    ds = drifted(2)
    before = ds.copy(deep=True)
    res = drift(ds)
    assert res.alarm
    assert ds.identical(before) and ds.attrs == before.attrs
    flagged = flag_suspect(ds, res)
    assert ds.identical(before) and ds.attrs == before.attrs and "drift_suspect" not in ds.coords
    assert flagged is not ds
    mask = flagged["drift_suspect"].values
    assert mask.dtype == bool and int(mask.sum()) == len(res.suspect) > 0
    assert set(flagged["trial_id"].values[mask].tolist()) == set(res.suspect)
    np.testing.assert_array_equal(flagged["output_throughput"].values, before["output_throughput"].values)
    assert flagged.attrs["drift_alarm_at"] == res.alarm_at
    jsonable(res)


def test_bad_input_named() -> None:
    ds = drifted(0)
    with pytest.raises(AnalysisInputError, match="not_a_metric"):
        drift(ds, metric="not_a_metric")
    with pytest.raises(AnalysisInputError, match="zzz"):
        drift(ds, load_point="zzz")
    with pytest.raises(AnalysisInputError):
        drift(ds, h=0)


def test_false_alarm_probability_shrinks_with_stricter_h() -> None:
    assert false_alarm_probability(30, 15, 0.5, 8.0) < false_alarm_probability(30, 15, 0.5, 4.0)
