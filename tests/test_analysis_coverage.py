"""The stated 95% intervals cover the planted truth at close to 95% (a fast subset of
``benchmarks/analysis/coverage.py``; SYNTHETIC data from analysis.synthetic, fixed seeds).

Tolerances are binomial: with n intervals of true coverage 0.95 the count covered is below the
asserted floor with probability under 0.1%, while intervals that are too narrow by a factor of two
(coverage about 68%) fail by a wide margin."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from analysis.effects import partial_dependence_from
from analysis.importance import importance_from
from analysis.interactions import interactions_from
from analysis.main_effects import main_effects_from, pair_strength
from analysis.surrogate import clear_cache, fit_surrogate, grid_codes, sample_rows
from analysis.verdict import parameter_verdicts
from benchmarks.analysis.coverage import SURFACE, TrueModel, dataset, true_levels

LARGE_SEEDS = range(12)


def floor(n: int, p: float = 0.95, alpha: float = 0.001) -> int:
    """The smallest count a calibrated interval reaches with probability 1 - alpha."""
    return int(stats.binom.ppf(alpha, n, p))


@pytest.fixture(scope="module")
def large():
    out = []
    for seed in LARGE_SEEDS:
        ds, truth = dataset("large", seed)
        clear_cache()
        out.append((ds, truth, fit_surrogate(ds, seed=seed)))
    return out


def test_main_effect_intervals_cover_the_planted_change(large):
    covered, total = 0, 0
    prefix = []
    for _, truth, sur in large:
        me = main_effects_from(sur)
        assert me.estimable and me.coding == "levels"
        for j, f in enumerate(sur.features):
            lv = true_levels(sur, truth, j, grid_codes(f, 12))
            true_change = math.exp(lv[-1] - lv[0]) - 1.0
            iv = me.get(f.name).change
            assert iv.low <= iv.estimate <= iv.high
            covered += iv.low <= true_change <= iv.high
            total += 1
            if f.name == "enable_prefix_caching":
                prefix.append(iv.estimate)
    assert covered >= floor(total), (covered, total)
    # the planted +3% of prefix caching is recovered, not shrunk towards zero
    assert math.exp(SURFACE["enable_prefix_caching"]) - 1 == pytest.approx(0.03)
    assert 0.02 < float(np.mean(prefix)) < 0.04, prefix


def test_regression_interaction_strength_covers_the_planted_one(large):
    covered, total, nulls_covered, nulls = 0, 0, 0, 0
    for _, truth, sur in large:
        S = sur.X[sample_rows(len(sur.y), 80, np.random.default_rng([sur.seed, 5]))]
        true = TrueModel(sur, truth)
        from analysis.interactions import h2_statistics

        pairs = [(sur.index("max_num_batched_tokens"), sur.index("enable_chunked_prefill")),
                 (sur.index("max_num_seqs"), sur.index("dtype")), (sur.index("enforce_eager"), sur.index("dtype"))]
        _, true_strength, _ = h2_statistics(true, S, pairs)
        for (j, k), ts in zip(pairs, true_strength):
            ps = pair_strength(sur, j, k, S)
            assert ps is not None
            assert ps.strength.low <= ps.strength.estimate <= ps.strength.high
            assert ps.h2.low <= ps.h2.estimate <= ps.h2.high
            hit = ps.strength.low <= ts <= ps.strength.high
            if (j, k) == pairs[0]:
                covered, total = covered + hit, total + 1
                assert ts > 0.02 and ps.p_value < 0.01
            else:
                nulls_covered, nulls = nulls_covered + hit, nulls + 1
    assert covered >= floor(total) and nulls_covered >= floor(nulls), (covered, total, nulls_covered, nulls)


def test_one_verdict_for_pd_importance_and_text(large):
    # seed 3 holds the case the rule is for: prefix caching's main effect excludes no change while
    # the forest does not beat the probe (seed 0 alone let a verdict that ignored the regression pass)
    regression_only = 0
    for ds, _, sur in (large[0], large[3]):
        verdicts = parameter_verdicts(sur)
        imp = importance_from(sur, ds, n_boot=20)
        for f in sur.features:
            pdr = partial_dependence_from(sur, ds, f.name, n_boot=10, ice=False)
            entry = imp.get(f.name)
            assert pdr.verdict == entry.verdict == verdicts[f.name].verdict
            assert pdr.sentence is not None and f"verdict: {pdr.verdict}" in pdr.sentence
            # an interval that excludes no change never stands beside a verdict of noise
            if pdr.change is not None and pdr.change.excludes(0.0):
                assert pdr.verdict == "important", (f.name, pdr.change)
            assert entry.main_effect == pdr.change
            regression_only += pdr.verdict == "important" and "random probe" not in verdicts[f.name].why
        assert verdicts["max_num_seqs"].verdict == "important"
    assert regression_only >= 1, "no parameter was important by its main effect alone: the check above is idle"


def test_small_experiments_warn_instead_of_claiming():
    for seed in range(3):
        ds, truth = dataset("small", seed)
        clear_cache()
        sur = fit_surrogate(ds, seed=seed)
        me = main_effects_from(sur)
        assert not me.estimable and [w.code for w in me.warnings] == ["too_few_configs"]
        pdr = partial_dependence_from(sur, ds, "enable_prefix_caching", n_boot=10, ice=False)
        codes = {w.code for w in pdr.warnings}
        assert {"too_few_trials", "too_few_configs", "forest_bands", "no_interval"} <= codes, codes
        assert pdr.bands == "forest"
        # the forest's bands per grid value are stated (they covered 97.5% at this size) ...
        assert all(math.isfinite(x) for x in pdr.low + pdr.high)
        # ... but not an interval of the change: the refit spread, when it was stated, covered 82.9% of
        # 140 planted changes (RESULTS.md, coverage notes; the table now counts them as not stated)
        assert pdr.change is not None and math.isfinite(pdr.change.estimate)
        assert math.isnan(pdr.change.low) and math.isnan(pdr.change.high)
        assert pdr.sentence is not None and "no 95% interval" in pdr.sentence and "nan" not in pdr.sentence
        if seed == 0:
            # nor the other intervals that under-covered at this size (2-D PD cells 80%, the planted
            # pair's interaction strength 0%): the estimates alone, each with the reason
            pd2 = partial_dependence_from(sur, ds, list(truth.interaction), n_boot=5, ice=False)
            assert pd2.bands == "forest" and pd2.n_boot == 0
            assert {w.code for w in pd2.warnings} >= {"no_interval"} and "forest_bands" not in {
                w.code for w in pd2.warnings}
            assert np.all(np.isnan(np.array(pd2.low, dtype=float))) and np.all(np.isfinite(np.array(pd2.estimate)))
            inter = interactions_from(sur, ds, h_rows=40)
            for pair in inter.pairs:
                assert pair.source == "forest" and "no_interval" in {w.code for w in pair.warnings}
                assert math.isnan(pair.strength.low) and math.isnan(pair.h2.high)
                assert math.isfinite(pair.strength.estimate)
        for name in truth.null:
            assert parameter_verdicts(sur)[name].verdict == "indistinguishable from noise"


def test_two_parameter_pd_bands_cover_the_planted_surface(large):
    """The 2-D partial dependence of the planted pair takes its bands from the regression with the
    pair's products (the forest's refit bands covered 5 of 10 cells at this size): every cell's band
    holds its estimate, and the cells cover the planted geometric mean at a calibrated rate (cells of
    one seed are correlated, so the floor is loose)."""
    from benchmarks.analysis.coverage import Tally, pair_pd

    tally = Tally()
    for ds, truth, sur in large:
        res = partial_dependence_from(sur, ds, list(truth.interaction), n_boot=10, ice=False)
        assert res.bands == "regression" and res.n_boot == 0
        est, low, high = (np.array(x, dtype=float) for x in (res.estimate, res.low, res.high))
        assert np.all(low <= est) and np.all(est <= high)
        pair_pd(sur, ds, truth, "large", tally, 10)
    (xs,) = tally.covered.values()
    assert sum(xs) >= floor(len(xs), alpha=0.01) - 2, (sum(xs), len(xs))
