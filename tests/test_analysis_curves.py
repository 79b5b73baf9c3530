"""Metric-vs-load curves (:mod:`analysis.curves`): the knee rule, the interval over repeats and its
coverage (by simulation), and the series built from a SYNTHETIC experiment with planted saturation
(:func:`analysis.synthetic.planted` with ``load_levels``). Fast, no browser."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom

from analysis.curves import KNEE_FRACTION, curves, knee, load_kind, median_interval
from analysis.synthetic import planted

CONC = (1, 2, 4, 8, 16, 32, 64)
RATES = (1, 2, 4, 8, 16, 32)
LEVELS = {f"c{c}": ("concurrency", c) for c in CONC} | {f"r{r}": ("rate", r) for r in RATES}


def test_knee_is_the_last_load_before_the_gain_falls_below_the_fraction() -> None:
    # gains per unit load: 1, 1, 0.5 (kept: >= 50% of the first), then 0.025
    assert knee([1, 2, 3, 5, 9], [1, 2, 3, 4, 4.1]).load == 5
    # the first segment falling short ends it at once, even if the curve rises again later
    assert knee([1, 2, 4, 8], [1, 2, 2.2, 9]).load == 2
    # order of the points does not matter; missing points are dropped
    assert knee([4, 1, math.nan, 2, 8], [3, 1, 5, 2, 3.05]).load == 4


def test_no_knee_is_said_with_its_reason() -> None:
    few = knee([1, 2], [1, 2])
    assert few.load is None and "at least 3" in few.why
    flat = knee([1, 2, 4], [5, 5, 5])
    assert flat.load is None and "does not rise" in flat.why
    rising = knee([1, 2, 4, 8], [1, 2, 4, 8])
    assert rising.load is None and "within the loads measured" in rising.why
    # a point missing at one load leaves fewer than 3 levels
    assert knee([1, 2, 4], [1, math.nan, 3]).load is None


def test_fraction_is_the_stated_one() -> None:
    just_above = knee([0, 1, 2, 3], [0, 1, 1 + KNEE_FRACTION + 1e-9, 1 + KNEE_FRACTION + 0.01])
    just_below = knee([0, 1, 2, 3], [0, 1, 1 + KNEE_FRACTION - 1e-6, 2.0])
    assert just_above.load == 2 and just_below.load == 1


def test_load_kind() -> None:
    assert load_kind(4.0, 256.0) == "rate"  # a rate with a cap on requests in flight is still open loop
    assert load_kind(math.nan, 32.0) == "concurrency"
    assert load_kind(math.nan, math.nan) == ""


def test_single_repeat_has_no_interval_and_few_repeats_say_their_confidence() -> None:
    one = median_interval([3.0])
    assert one.n == 1 and math.isnan(one.low) and math.isnan(one.level) and one.median == 3.0
    three = median_interval([1.0, 5.0, 2.0])
    assert (three.low, three.median, three.high) == (1.0, 2.0, 5.0) and three.level == pytest.approx(0.75)
    nine = median_interval(np.arange(9.0))
    assert nine.level >= 0.95 and nine.low > 0 and nine.high < 8


@pytest.mark.parametrize("n", [3, 5, 9])
def test_interval_covers_the_median_at_its_stated_rate(n: int) -> None:
    rng = np.random.default_rng(n)
    sims, hits, level = 4000, 0, math.nan
    for _ in range(sims):
        band = median_interval(rng.lognormal(0.0, 0.5, n))  # true median 1
        hits += band.low <= 1.0 <= band.high
        level = band.level
    lo, hi = binom.ppf([0.0005, 0.9995], sims, level) / sims  # 99.9% binomial band around the stated rate
    assert lo <= hits / sims <= hi, (n, hits / sims, level)


def test_series_split_by_kind_and_knees_match_the_planted_saturation() -> None:
    ds, truth = planted(n_configs=7, params=["max_num_seqs"], design="grid", repeats=3, load_levels=LEVELS,
                        fail_rate_base=0.0, fail_rate_region=0.0, seed=1)
    series = curves(ds.sweep.table(), ["output_throughput", "ttft_ms_p99"])
    assert [s.kind for s in series] == ["rate", "concurrency"]
    rate, conc = series
    assert rate.loads.tolist() == list(RATES) and conc.loads.tolist() == list(CONC)
    assert (conc.counts == 3).all()
    for i, cid in enumerate(conc.config_ids):
        cfg = {"max_num_seqs": int(cid.split(": ")[1].rstrip("}"))}
        sat = truth.saturation(cfg, "concurrency")  # a level: throughput stops growing exactly there
        want = sat if sat < max(CONC) else None  # at or past the last level the flattening is not measured
        assert conc.knee(i).load == want, (cid, conc.knee(i))
    for i, cid in enumerate(rate.config_ids):
        cfg = {"max_num_seqs": int(cid.split(": ")[1].rstrip("}"))}
        sat = truth.saturation(cfg, "rate")
        below = max(r for r in RATES if r <= sat)
        above = min(r for r in RATES if r >= sat)
        assert rate.knee(i).load in (below, above), (cid, sat, rate.knee(i))


def test_planted_default_load_point_is_unchanged_without_levels() -> None:
    a, _ = planted(n_configs=5, n_params=3, seed=4)
    b, _ = planted(n_configs=5, n_params=3, seed=4, load_levels=None)
    assert a.identical(b)
    assert np.isnan(a["request_rate"].values).all() and (a["max_concurrency"].values == 32).all()
