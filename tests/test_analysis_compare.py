"""Comparing two configs: interval coverage over seeds, verdicts, the rank test, config lookup and
the causal wording."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from analysis.common import Interval
from analysis.compare import compare, verdict_of
from analysis.frame import AnalysisInputError, trial_table
from analysis.synthetic import log_throughput, planted
from tests.test_analysis_pareto import make_ds


def two(a: list[float], b: list[float], lat_a: list[float] | None = None, lat_b: list[float] | None = None,
        **kw: Any) -> Any:
    recs = [{"config_id": "aaaa1111", "label": "seqs=8", "output_throughput": t,
             "ttft_p99": (lat_a or [100.0] * len(a))[i]} for i, t in enumerate(a)]
    recs += [{"config_id": "bbbb2222", "label": "seqs=64", "output_throughput": t,
              "ttft_p99": (lat_b or [100.0] * len(b))[i]} for i, t in enumerate(b)]
    return make_ds(recs, **kw)


def test_ratio_interval_covers_the_true_ratio_near_its_nominal_rate() -> None:
    covered, n = 0, 20
    for seed in range(n):
        rng = np.random.default_rng(100 + seed)
        true_ratio = float(rng.uniform(0.8, 1.3))
        a = rng.lognormal(np.log(1000.0), 0.08, 8)  # the population median is exp(mu): ratio of medians is exact
        b = rng.lognormal(np.log(1000.0 * true_ratio), 0.08, 8)
        res = compare(two(list(a), list(b)), "aaaa", "bbbb", n_boot=400, seed=seed)
        covered += res.ratio.low <= true_ratio <= res.ratio.high
    assert 16 <= covered <= 20  # nominal 95%: 19 of 20 expected; the percentile bootstrap runs a little narrow


def test_planted_configs_true_ratio_is_covered_and_the_better_config_wins() -> None:
    covered = 0
    for seed in range(5):
        ds, truth = planted(n_configs=20, repeats=6, seed=seed, fail_rate_region=0.0, fail_rate_base=0.0, noise=0.05)
        df = trial_table(ds)
        cfgs = df.drop_duplicates("config_id")
        true = {c: log_throughput({k: cfgs.loc[cfgs.config_id == c, f"param_{k}"].tolist()[0] for k in truth.params})
                for c in cfgs.config_id}
        lo, hi = min(true, key=lambda c: true[c]), max(true, key=lambda c: true[c])
        res = compare(ds, lo, hi, n_boot=400, seed=seed)
        assert res.verdict == "b better"
        covered += res.ratio.low <= np.exp(true[hi] - true[lo]) <= res.ratio.high
        assert res.p_value is not None and res.p_value < 0.01
    assert covered >= 4


def test_verdicts_for_clearly_different_identical_and_noisy_configs() -> None:
    a = [1000.0, 1010.0, 990.0, 1005.0, 995.0]
    better = compare(two(a, [x * 1.5 for x in a]), "aaaa", "bbbb", n_boot=300)
    assert better.verdict == "b better" and better.ratio.low > 1.05
    assert better.p_value == pytest.approx(2 / 252)  # exact two-sided Mann-Whitney for 5 vs 5 fully separated
    worse = compare(two(a, [x * 0.7 for x in a]), "aaaa", "bbbb", n_boot=300)
    assert worse.verdict == "a better"
    same = compare(two(a, list(a)), "aaaa", "bbbb", n_boot=300)
    assert same.verdict == "equivalent" and same.ratio.estimate == pytest.approx(1.0)
    slightly = compare(two(a, [x * 1.02 for x in a]), "aaaa", "bbbb", n_boot=300)
    assert slightly.verdict == "equivalent"  # real but below the 5% that matters
    rng = np.random.default_rng(0)
    noisy = compare(two(list(rng.lognormal(np.log(1000), 0.3, 4)), list(rng.lognormal(np.log(1100), 0.3, 4))),
                    "aaaa", "bbbb", n_boot=300)
    assert noisy.verdict == "inconclusive"
    # latency: lower is better, so a higher ratio means b is worse
    lat = compare(two(a, a, lat_a=[100.0, 101, 99, 100.5, 99.5], lat_b=[150.0, 151, 149, 150.5, 149.5]),
                  "aaaa", "bbbb", metric="ttft_ms_p99", n_boot=300)
    assert lat.verdict == "a better" and not lat.higher_is_better


def test_too_few_repeats_give_no_interval_and_no_rank_test() -> None:
    one = compare(two([1000.0], [2000.0]), "aaaa", "bbbb", n_boot=300)
    assert one.verdict == "inconclusive" and np.isnan(one.ratio.low) and one.ratio.estimate == pytest.approx(2.0)
    assert one.p_value is None and "not possible" in one.rank_test
    assert any(w.code == "too_few_repeats" for w in one.warnings)
    pair = compare(two([1000.0, 1001.0], [2000.0, 2001.0]), "aaaa", "bbbb", n_boot=300)
    assert pair.p_value is None and "not possible" in pair.rank_test and pair.verdict == "b better"
    assert any(w.code == "few_repeats" for w in pair.warnings)


def test_verdict_bands() -> None:
    assert verdict_of(Interval(1.1, 1.06, 1.2), 1, 0.05) == "b better"
    assert verdict_of(Interval(1.1, 1.04, 1.2), 1, 0.05) == "inconclusive"
    assert verdict_of(Interval(1.0, 0.96, 1.04), 1, 0.05) == "equivalent"
    assert verdict_of(Interval(0.8, 0.7, 0.9), 1, 0.05) == "a better"
    assert verdict_of(Interval(0.8, 0.7, 0.9), -1, 0.05) == "b better"


def test_configs_by_id_prefix_or_label_and_unknown_names() -> None:
    ds = two([1.0, 2.0, 3.0], [2.0, 3.0, 4.0])
    assert compare(ds, "seqs=8", "bbbb2222", n_boot=50).config_a == "aaaa1111"
    with pytest.raises(AnalysisInputError, match="'zzz'"):
        compare(ds, "zzz", "bbbb")
    with pytest.raises(AnalysisInputError, match="ambiguous"):
        compare(make_ds([{"config_id": "ab1", "output_throughput": 1.0, "ttft_p99": 1.0},
                         {"config_id": "ab2", "output_throughput": 1.0, "ttft_p99": 1.0}]), "ab", "ab1")
    with pytest.raises(AnalysisInputError, match="not_a_metric"):
        compare(ds, "aaaa", "bbbb", metric="not_a_metric")
    two_lp = make_ds([{"config_id": c, "output_throughput": 1.0, "ttft_p99": 1.0, "load_point": lp}
                      for c in ("a1", "b1") for lp in ("lo", "hi")])
    with pytest.raises(AnalysisInputError, match="several load points"):
        compare(two_lp, "a1", "b1")
    assert compare(two_lp, "a1", "b1", load_point="hi", n_boot=10).load_point == "hi"


def test_sentence_wording_follows_the_design() -> None:
    a, b = [1000.0, 1010.0, 990.0], [1500.0, 1510.0, 1490.0]
    effect = compare(two(a, b, design="random", randomized=True), "aaaa", "bbbb", n_boot=100)
    assert effect.claim.kind == "effect" and effect.sentence.startswith("switching the engine config from seqs=8")
    assert "+50%" in effect.sentence
    assoc = compare(two(a, b, design="adaptive"), "aaaa", "bbbb", n_boot=100)
    assert assoc.claim.kind == "association" and "an association, not an effect" in assoc.sentence
    # baseline trials are not part of either side
    recs = [{"config_id": "aaaa", "output_throughput": 1.0, "ttft_p99": 1.0, "is_baseline": True}] * 3
    recs += [{"config_id": "aaaa", "output_throughput": 5.0, "ttft_p99": 1.0}] * 2
    recs += [{"config_id": "bbbb", "output_throughput": 5.0, "ttft_p99": 1.0}] * 2
    res = compare(make_ds(recs), "aaaa", "bbbb", n_boot=50)
    assert res.n_a == 2 and res.median_a == 5.0
