"""Parameter importance against planted ground truth (analysis.synthetic; SYNTHETIC data).

Each ground-truth property is checked over several seeded replicates so a pass is not luck.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from analysis.common import jsonable
from analysis.frame import AnalysisInputError
from analysis.importance import importance
from analysis.surrogate import PROBE, fit_surrogate
from analysis.synthetic import planted
from tests.planted_replicates import replicate

SEEDS = (0, 1, 2, 3, 4)


@pytest.fixture(scope="module")
def replicates():
    """Per seed: importance(planted(n_configs=300, n_params=6), n_boot=30), shared with
    test_analysis_effects (tests/planted_replicates.py)."""
    return [(r.importance, r.truth) for r in map(replicate, SEEDS)]


def test_planted_parameters_rank_above_the_probe(replicates):
    for res, truth in replicates:
        assert set(truth.important) >= {"max_num_seqs", "max_num_batched_tokens"}
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            entry = res.get(name)
            assert entry.permutation.estimate > res.probe.permutation.estimate, (name, entry, res.probe)
            assert entry.vs_probe.estimate > 0
        assert res.get("max_num_seqs").verdict == "important"
        assert res.parameters[0].name == "max_num_seqs" and res.parameters[0].rank == 1
    strong = sum(res.get("max_num_batched_tokens").verdict == "important" for res, _ in replicates)
    assert strong >= len(replicates) - 1


def test_no_effect_parameter_is_indistinguishable_from_noise(replicates):
    for _, truth in replicates:
        assert "enable_prefix_caching" in truth.null
    noise = sum(res.get("enable_prefix_caching").verdict == "indistinguishable from noise" for res, _ in replicates)
    assert noise >= len(replicates) - 1
    for res, _ in replicates:
        entry = res.get("enable_prefix_caching")
        # its interval of (importance - probe's) straddles or sits below zero when so judged
        if entry.verdict != "important":
            assert entry.vs_probe.low <= 0


def test_result_carries_intervals_claim_and_serialises(replicates):
    res, _ = replicates[0]
    assert res.metric == "output_throughput" and res.target == "log(output_throughput)"
    assert res.n_boot == 30
    # a random design draws some configs twice: those are repeats, so configs are resampled
    assert res.resampled == "configs"
    assert res.claim.kind == "effect"
    assert res.oob_r2 > 0.5 and not any(w.code == "poor_fit" for w in res.warnings)
    for e in res.parameters:
        assert e.permutation.low <= e.permutation.estimate <= e.permutation.high
        assert e.shap.low <= e.shap.estimate <= e.shap.high
    # SHAP and permutation agree on the top parameter
    assert max(res.parameters, key=lambda e: e.shap.estimate).name == "max_num_seqs"
    assert res.probe.name == PROBE
    assert any("SHAP" in s.what for s in res.subsampled)
    data = json.loads(json.dumps(jsonable(res)))
    assert data["parameters"][0]["name"] == "max_num_seqs"
    assert data["probe"]["verdict"] == "probe"


def test_small_dataset_triggers_minimum_data_warnings():
    poor = 0
    for seed in range(5):
        # 12 trials for 6 parameters, with realistic run-to-run noise (30% rather than the default 5%)
        ds, _ = planted(n_configs=12, n_params=6, noise=0.3, seed=seed)
        res = importance(ds, n_boot=15, seed=seed)
        codes = {w.code for w in res.warnings}
        assert "too_few_trials" in codes
        poor += "poor_fit" in codes
        if "poor_fit" in codes:
            msg = next(w.message for w in res.warnings if w.code == "poor_fit")
            assert "R²" in msg and f"{res.oob_r2:.2f}" in msg
    assert poor >= 4
    # with almost no noise the one dominant parameter can be fitted even from 12 trials, but the
    # count is still too small for 6 parameters
    ds, _ = planted(n_configs=12, n_params=6, seed=1)
    assert "too_few_trials" in {w.code for w in importance(ds, n_boot=5).warnings}


def test_aliased_parameters_are_flagged():
    ds, _ = planted(n_configs=150, n_params=6, seed=5)
    seqs = ds["param_max_num_seqs"].values
    # block_size set in lockstep with max_num_seqs: the two determine each other
    lockstep = ds.assign_coords(param_block_size=("trial", seqs * 2))
    res = importance(lockstep, n_boot=10, seed=0)
    hits = [w for w in res.warnings if w.code == "aliased"]
    assert [w.subject for w in hits] == ["max_num_seqs,block_size"], res.warnings
    assert "determine each other" in hits[0].message
    # gpu_memory_utilization almost a linear copy (a few trials off): |r| > 0.95
    rng = np.random.default_rng(0)
    near = np.log2(seqs.astype(float)) + np.where(rng.random(len(seqs)) < 0.05, 1.0, 0.0) + rng.random(len(seqs)) * 0.01
    close = ds.assign_coords(param_gpu_memory_utilization=("trial", near))
    res2 = importance(close, n_boot=10, seed=0)
    hits2 = [w for w in res2.warnings if w.code == "aliased"]
    assert [w.subject for w in hits2] == ["max_num_seqs,gpu_memory_utilization"], res2.warnings
    assert "r = +0.9" in hits2[0].message
    # the planted, independent design has none
    assert not any(w.code == "aliased" for w in importance(ds, n_boot=5, seed=0).warnings)


def test_parameter_constant_within_the_filter_is_aliased():
    ds, _ = planted(n_configs=80, n_params=6, seed=2, load_points=("a", "b"))
    lp = ds["load_point"].values.astype(str)
    caching = np.where(lp == "a", False, ds["param_enable_prefix_caching"].values)
    ds = ds.assign_coords(param_enable_prefix_caching=("trial", caching.astype(bool)))
    res = importance(ds, load_point="a", n_boot=10, seed=0)
    assert any(w.code == "aliased" and w.subject == "enable_prefix_caching" for w in res.warnings)
    assert "enable_prefix_caching" not in [e.name for e in res.parameters]
    assert res.load_point == "a"


def test_pooled_load_points_become_a_feature():
    ds, _ = planted(n_configs=120, n_params=4, seed=3, load_points=("a", "b"))
    res = importance(ds, n_boot=20, seed=0)
    assert any(w.code == "pooled_scenarios" for w in res.warnings)
    # the planted load-point offset (-0.3 on the log scale) is found
    assert res.get("load_point").verdict == "important"


def test_repeats_resample_configs_and_adaptive_design_is_an_association():
    ds, _ = planted(n_configs=40, n_params=4, repeats=3, seed=1)
    res = importance(ds, n_boot=10, seed=0)
    assert res.resampled == "configs"
    grid, _ = planted(n_params=4, design="grid", seed=1)  # every config once
    assert importance(grid, n_boot=5).resampled == "trials"
    ds_a, _ = planted(n_configs=120, n_params=4, design="adaptive", seed=1)
    assert importance(ds_a, n_boot=5).claim.kind == "association"
    ds_o, _ = planted(n_configs=60, n_params=4, randomized=False, seed=1)
    assert importance(ds_o, n_boot=5).claim.kind == "association"


def test_subsampling_is_recorded_and_bad_input_named():
    ds, _ = planted(n_configs=400, n_params=4, seed=4)
    sur = fit_surrogate(ds, max_rows=150)
    assert sur.rows_used <= 150 < sur.n_trials
    note = [s for s in sur.subsampled if "surrogate" in s.what]
    assert note and note[0].used == sur.rows_used and note[0].of == sur.n_trials
    res = importance(ds, n_boot=5, max_rows=150)
    assert any(s.used == sur.rows_used for s in res.subsampled)
    with pytest.raises(AnalysisInputError, match="no_such_metric"):
        importance(ds, metric="no_such_metric", n_boot=2)
    with pytest.raises(AnalysisInputError, match="nowhere"):
        importance(ds, load_point="nowhere", n_boot=2)


def test_same_seed_same_answer():
    ds, _ = planted(n_configs=60, n_params=4, seed=7)
    a = importance(ds, n_boot=8, seed=3)
    from analysis.surrogate import clear_cache

    clear_cache()
    b = importance(ds, n_boot=8, seed=3)
    assert jsonable(a) == jsonable(b)


def test_the_forest_is_judged_against_the_probe_not_against_zero():
    from analysis.verdict import beats_probe

    rng = np.random.default_rng(0)
    # a column the forest splits on but that carries nothing: its permutation importance is above
    # zero in every refit, and so is the probe's, by as much
    probe = 0.02 + 0.01 * rng.random(50)
    noise_column = probe + rng.normal(0, 0.01, 50)
    assert (noise_column > 0).all()
    beats, diff = beats_probe(noise_column, probe)
    assert not beats and diff.low < 0 < diff.high
    real = probe + 0.05 + rng.normal(0, 0.01, 50)
    assert beats_probe(real, probe)[0]
    # on planted data the verdict on a no-effect parameter carries the probe comparison
    ds, _ = planted(n_configs=200, n_params=6, seed=3)
    res = importance(ds, n_boot=20, seed=3)
    null = res.get("enable_prefix_caching")
    assert null.verdict == "indistinguishable from noise" and null.vs_probe.low <= 0
    assert "random probe" in null.why


def test_a_collapsed_bootstrap_is_caught():
    ds, _ = planted(n_configs=120, n_params=4, repeats=2, seed=6)
    res = importance(ds, n_boot=20, seed=0)
    sur = fit_surrogate(ds, seed=0)
    fits = sur.boot_fits(20)
    # every refit resamples afresh: different in-bag weights, different probes, different answers
    assert len({f.weights.tobytes() for f in fits}) == 20
    assert len({f.probe.tobytes() for f in fits}) == 20
    for entry in (*res.parameters, res.probe):
        assert entry.permutation.low < entry.permutation.high, entry
        assert entry.shap.low < entry.shap.high, entry
    top = res.parameters[0]
    assert top.vs_probe.low < top.vs_probe.high
    assert res.heldout_r2.low < res.heldout_r2.high
