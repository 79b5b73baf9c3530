"""Partial dependence and pairwise interactions against planted ground truth (analysis.synthetic;
SYNTHETIC data), each property over several seeded replicates."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from analysis.common import jsonable
from analysis.effects import partial_dependence, partial_dependence_all
from analysis.frame import AnalysisInputError
from analysis.interactions import interactions
from analysis.synthetic import INTERACTION, LEVELS, planted
from tests.planted_replicates import replicate

SEEDS = (0, 1, 2, 3)
PLANTED_CHANGE = math.exp(1.0) - 1.0  # max_num_seqs: +1.0 on the log scale from its lowest to highest level


@pytest.fixture(scope="module")
def replicates():
    """Per seed: planted(n_configs=300, n_params=6), its PD of max_num_seqs (n_boot=30) and its
    interactions (n_boot=10), shared with test_analysis_importance (tests/planted_replicates.py)."""
    return [(r.ds, r.truth, r.pd_seqs, r.interactions) for r in map(replicate, SEEDS)]


def test_pd_of_max_num_seqs_increases_within_the_observed_range(replicates):
    for ds, _, res, _ in replicates:
        observed = sorted({int(v) for v in ds["param_max_num_seqs"].values})
        assert res.grid == [observed]  # the sampled levels, nothing beyond
        est = np.array(res.estimate)
        assert np.all(np.diff(est) > 0), est
        assert res.change is not None and res.change.low > 0 and res.relative
        # the surrogate recovers the planted size roughly (forests shrink edges a little)
        assert 0.6 * PLANTED_CHANGE < res.change.estimate < 1.3 * PLANTED_CHANGE


def test_pd_bands_contain_the_estimate_and_cover_the_planted_change(replicates):
    covered = 0
    for _, _, res, _ in replicates:
        est, low, high = (np.array(v) for v in (res.estimate, res.low, res.high))
        assert np.all(low <= est) and np.all(est <= high)
        # 300 configs: the main-effects regression gives the curve's intervals, no forest refits needed
        assert res.bands == "regression" and res.n_boot == 0
        assert res.change.low <= res.change.estimate <= res.change.high
        covered += res.change.low <= PLANTED_CHANGE <= res.change.high
    assert covered >= len(replicates) - 1


def test_ice_curves_and_subsampling_notes(replicates):
    ds, _, res, _ = replicates[0]
    assert len(res.ice) == 50 and all(len(c) == len(res.grid[0]) for c in res.ice)
    # each ICE curve moves the same way as the planted (purely additive) effect
    assert np.mean([c[-1] > c[0] for c in res.ice]) > 0.9
    assert any("ICE" in s.what and s.used == 50 for s in res.subsampled)
    assert "geometric mean" in res.scale
    json.dumps(jsonable(res))


def test_effect_wording_follows_the_design(replicates):
    _, _, res, _ = replicates[0]
    assert res.claim.kind == "effect"
    assert res.sentence is not None and res.sentence.startswith("setting max_num_seqs from 4 to 256 changed")
    ds_a, _ = planted(n_configs=150, n_params=4, design="adaptive", seed=0)
    adaptive = partial_dependence(ds_a, "max_num_seqs", n_boot=10)
    assert adaptive.claim.kind == "association"
    assert adaptive.sentence is not None and "association, not an effect" in adaptive.sentence


def test_two_parameter_pd_shows_the_planted_interaction():
    for seed in (0, 1):
        res = replicate(seed).pd_pair  # partial_dependence(planted(300, 6, seed), INTERACTION, n_boot=20, seed)
        est = np.array(res.estimate)
        assert est.shape == (len(LEVELS[INTERACTION[0]]), 2)
        assert res.grid[1] == [False, True]
        # chunked prefill (column 1) flattens the benefit of a larger token budget
        assert est[-1, 0] / est[0, 0] > est[-1, 1] / est[0, 1] + 0.1
        low, high = np.array(res.low), np.array(res.high)
        assert np.all(low <= est) and np.all(est <= high)
        assert res.change is None and res.ice == []


def test_many_valued_numeric_gets_a_grid_within_its_range():
    ds, _ = planted(n_configs=200, n_params=4, seed=3)
    rng = np.random.default_rng(0)
    util = rng.uniform(0.8, 0.95, ds.sizes["trial"])
    ds = ds.assign_coords(param_gpu_memory_utilization=("trial", util))
    res = partial_dependence(ds, "gpu_memory_utilization", n_boot=5, grid_points=7, ice=False)
    grid = res.grid[0]
    ok = ds["status"].values == "ok"
    assert len(grid) == 7
    assert grid[0] == pytest.approx(util[ok].min()) and grid[-1] == pytest.approx(util[ok].max())
    assert any("grid values" in s.what for s in res.subsampled)


def test_pd_bad_input_is_named():
    ds, _ = planted(n_configs=40, n_params=4, seed=0)
    with pytest.raises(AnalysisInputError, match="no_such"):
        partial_dependence(ds, "no_such", n_boot=2)
    with pytest.raises(AnalysisInputError, match="one or two"):
        partial_dependence(ds, ["max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill"], n_boot=2)
    assert [r.params[0] for r in partial_dependence_all(ds, n_boot=2, ice=False)] == [
        "max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill", "gpu_memory_utilization"]


def test_planted_interaction_is_the_strongest_pair(replicates):
    for _, truth, _, res in replicates:
        assert truth.interaction == INTERACTION
        assert res.n_pairs_total == res.n_pairs_computed == 15
        top = res.pairs[0]
        assert set(top.params) == set(INTERACTION), [(p.params, p.strength) for p in res.pairs[:3]]
        # ... and has the largest H² among pairs whose joint effect is not negligible
        solid = [p for p in res.pairs if not any(w.code == "weak_joint_effect" for w in p.warnings)]
        assert max(solid, key=lambda p: p.h2.estimate).params == top.params
        assert top.h2.low > 0.05 and top.h2.estimate > 0.1
        # SHAP interaction values agree
        assert max(res.pairs, key=lambda p: p.shap_interaction).params == top.params
        assert res.claim.kind == "effect"


def test_interaction_cells_count_every_trial_and_bin_many_levels(replicates):
    ds, _, _, res = replicates[0]
    n_ok = int(((ds["status"].values == "ok") & ~ds["is_baseline"].values).sum())
    for pair in res.pairs:
        assert sum(c.count for c in pair.cells) == n_ok
    seqs_pair = res.get("max_num_seqs", "enable_chunked_prefill")
    # 7 levels of max_num_seqs are cut into at most 4 quantile bins
    assert len({c.a for c in seqs_pair.cells}) <= 4 and len({c.b for c in seqs_pair.cells}) == 2
    planted_pair = res.get(*INTERACTION)
    budgets = list(dict.fromkeys(c.a for c in planted_pair.cells))  # low to high
    assert len(budgets) == 4 and budgets[-1] == "8192"
    by = {(c.a, c.b): c.median for c in planted_pair.cells}
    # observed medians show it too: a bigger token budget helps without chunked prefill, much less with it
    gain_off = by[(budgets[-1], "False")] / by[(budgets[0], "False")]
    gain_on = by[(budgets[-1], "True")] / by[(budgets[0], "True")]
    assert gain_off > gain_on
    assert res.h_rows == 80 and any("H²" in s.what for s in res.subsampled)
    json.dumps(jsonable(res))


def test_thin_and_correlated_pairs_are_flagged():
    ds, _ = planted(n_configs=15, n_params=4, seed=0)
    seqs = ds["param_max_num_seqs"].values
    # gpu_memory_utilization rises with max_num_seqs in this sample
    util = np.where(seqs >= 32, 0.95, 0.8)
    ds = ds.assign_coords(param_gpu_memory_utilization=("trial", util))
    res = interactions(ds, n_boot=0, h_rows=20, shap_rows=8)
    assert any(w.code == "thin_cells" for p in res.pairs for w in p.warnings)
    pair = res.get("max_num_seqs", "gpu_memory_utilization")
    assert abs(pair.spearman) > 0.5 and any(w.code == "correlated" for w in pair.warnings)
    assert math.isnan(pair.h2.low)  # no refits asked for: no interval


def test_max_pairs_is_reported_as_a_subsample():
    ds, _ = planted(n_configs=120, n_params=6, seed=4)
    res = interactions(ds, max_pairs=4, n_boot=0, h_rows=30, shap_rows=8)
    assert res.n_pairs_computed == 4 and res.n_pairs_total == 15 and len(res.pairs) == 4
    assert any(s.used == 4 and s.of == 15 for s in res.subsampled)
    # the most important parameter takes part in the pairs kept
    assert any("max_num_seqs" in p.params for p in res.pairs)
    with pytest.raises(AnalysisInputError, match="two distinct"):
        interactions(ds, pairs=[("max_num_seqs", "max_num_seqs")])


def test_the_pd_sentence_states_the_model_estimate_beside_the_measured_medians() -> None:
    """Issue 13: "max_num_seqs 4 -> 32 changed throughput by +33.9%" beside measured medians that rose
    about 155%. The sentence now calls the change a model estimate and states the measured medians'
    change next to it, computed here independently from the trial table."""
    import numpy as np

    from analysis.frame import trial_table
    from analysis.synthetic import planted

    ds, _ = planted(n_configs=40, repeats=2, seed=1)
    res = partial_dependence(ds, "max_num_seqs", seed=0)
    assert res.sentence is not None and res.measured_change is not None
    df = trial_table(ds)
    df = df[(df["status"] == "ok") & ~df["is_baseline"].astype(bool)]
    x = df["param_max_num_seqs"].astype(float)
    first, last = float(res.grid[0][0]), float(res.grid[0][-1])
    y = df["output_throughput"].astype(float)
    want = float(np.median(y[x == last])) / float(np.median(y[x == first])) - 1.0
    assert res.measured_change == pytest.approx(want, rel=1e-6)
    assert "modelled" in res.sentence and "measured" in res.sentence
    assert f"changed by {want * 100:+.3g}%" in res.sentence
    assert f"({int((x == first).sum())} and {int((x == last).sum())} trials)" in res.sentence
