"""Failure probability by region: Wilson intervals, kinds kept apart, logistic model and its fallback.

Ground truth from :func:`analysis.synthetic.planted` (SYNTHETIC data): a failure region
``gpu_memory_utilization >= 0.95 and max_num_seqs >= 128`` failing at ``fail_rate_region``, elsewhere
``fail_rate_base``, transport failures anywhere."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from statsmodels.stats.proportion import proportion_confint

from analysis.common import jsonable
from analysis.failure import FailureGroup, FailureResult, RegionRate, failure_probability, wilson_interval
from analysis.frame import AnalysisInputError
from analysis.synthetic import planted

PAIR = ("max_num_seqs", "gpu_memory_utilization")
CUTS = {"max_num_seqs": [128]}


def region(group: FailureGroup, params: tuple[str, ...], levels: tuple[str, ...]) -> RegionRate:
    found = [r for r in group.regions if r.params == params and r.levels == levels]
    assert len(found) == 1, f"region {params}={levels} not found in {[r.label for r in group.regions]}"
    return found[0]


def codes(res: FailureResult) -> set[str]:
    return {w.code for w in res.warnings}


@pytest.mark.parametrize("level", [0.8, 0.95, 0.99])
def test_wilson_matches_statsmodels(level: float) -> None:
    for n in (1, 2, 7, 30, 250):
        for x in sorted({0, 1, n // 3, n // 2, n - 1, n}):
            ours = wilson_interval(x, n, level)
            lo, hi = proportion_confint(x, n, alpha=1 - level, method="wilson")
            assert ours.low == pytest.approx(lo, abs=1e-9) and ours.high == pytest.approx(hi, abs=1e-9), (x, n)
            assert ours.estimate == pytest.approx(x / n)
    assert np.isnan(wilson_interval(0, 0).low)
    with pytest.raises(AnalysisInputError):
        wilson_interval(5, 3)


def test_wilson_covers_planted_region_and_base_rates() -> None:
    """Over 20 seeds the 95% intervals cover the planted failure rates about as often as promised."""
    cover_region = cover_base = 0
    for seed in range(20):
        ds, truth = planted(n_configs=250, n_params=4, fail_rate_region=0.6, fail_rate_base=0.1,
                            transport_rate=0.05, seed=seed)
        res = failure_probability(ds, params=list(PAIR), cuts=CUTS, seed=seed)
        g = res.groups[0]
        hot = region(g, PAIR, (">= 128", "0.95"))
        cold = region(g, ("max_num_seqs",), ("< 128",))  # entirely outside the failure region
        assert hot.n >= 3
        cover_region += not hot.rate.excludes(truth.fail_rate_region)
        cover_base += not cold.rate.excludes(truth.fail_rate_base)
    assert cover_region >= 17, cover_region
    assert cover_base >= 17, cover_base


def test_transport_failures_counted_apart_and_not_in_config_rate() -> None:
    ds, _ = planted(n_configs=200, n_params=4, fail_rate_region=0.6, fail_rate_base=0.1, transport_rate=0.1, seed=3)
    kind = ds["failure_kind"].values.astype(str)
    n_transport = int((kind == "transport").sum())
    n_measure = int((kind == "measurement").sum())
    assert n_transport > 5
    res = failure_probability(ds, params=list(PAIR), cuts=CUTS)
    counts = {k.kind: k for k in res.by_kind}
    assert counts["transport"].failures == n_transport and not counts["transport"].modelled
    assert counts["measurement"].failures == n_measure and counts["measurement"].modelled
    g = res.groups[0]
    assert g.failures == n_measure
    assert g.n == ds.sizes["trial"] - n_transport  # transport trials are neither failures nor successes
    assert sum(r.n for r in g.regions if r.params == ("max_num_seqs",)) == g.n
    assert "excluded_transport" in codes(res)
    # asked for, transport failures do count
    both = failure_probability(ds, params=list(PAIR), cuts=CUTS, kinds=["measurement", "transport"])
    assert both.groups[0].failures == n_measure + n_transport


def test_holes_and_baselines_are_not_failures() -> None:
    ds, _ = planted(n_configs=80, n_params=4, baseline_every=10, seed=1)
    status = ds["status"].values.astype(object).copy()
    ok = np.flatnonzero((status == "ok") & ~ds["is_baseline"].values)
    status[ok[:7]] = "hole"
    holed = ds.assign_coords(status=("trial", status))
    res = failure_probability(holed)
    assert res.n_holes == 7
    assert res.n_baseline == int(ds["is_baseline"].values.sum()) > 0
    assert res.n_trials == 80 - 7
    assert res.groups[0].failures == int((ds["failure_kind"].values == "measurement").sum())
    assert "holes" in codes(res)


def separated_dataset() -> tuple[object, int]:
    """Enough repeats (12) for 10 events per model term, so separation, not too few events, is what drops the model."""
    ds, _ = planted(design="grid", params=list(PAIR), repeats=12, fail_rate_region=1.0, fail_rate_base=0.0, seed=0)
    fails = int((ds["status"].values == "failed").sum())
    return ds, fails


def test_perfect_separation_falls_back_to_regional_intervals() -> None:
    ds, fails = separated_dataset()
    assert fails == 2 * 12  # (0.95) x (128, 256) x 12 repeats, none elsewhere
    res = failure_probability(ds, cuts=CUTS)
    g = res.groups[0]
    assert "separation" in codes(res)
    assert g.model == "fallback" and g.coefficients == []
    assert all(r.predicted is None for r in g.regions)
    hot = region(g, PAIR, (">= 128", "0.95"))
    assert (hot.n, hot.failures) == (24, 24)
    assert hot.rate.estimate == 1.0 and 0.5 < hot.rate.low < 1.0 and hot.rate.high == 1.0
    for r in g.regions:
        if r.params == PAIR and r.levels != (">= 128", "0.95"):
            assert r.failures == 0 and r.rate.high < 0.5


HOT_TERM = "max_num_seqs >= 128 and gpu_memory_utilization >= 0.95"  # the planted corner, as a model term


def test_logistic_model_finds_the_failure_corner_and_covers_it() -> None:
    """Enough events and no separation: coefficients with intervals, predictions per region; the
    model adds the planted corner as a term (a main-effects logit averages it away) and its interval
    for the corner covers the planted 80%."""
    found = covered = 0
    for seed in range(5):
        ds, _ = planted(n_configs=400, n_params=4, fail_rate_region=0.8, fail_rate_base=0.1, seed=seed)
        res = failure_probability(ds, params=list(PAIR), cuts=CUTS, seed=seed)
        g = res.groups[0]
        assert g.model == "logit", res.warnings
        coef = {c.term: c for c in g.coefficients}
        assert coef["max_num_seqs"].odds_ratio.estimate == pytest.approx(np.exp(coef["max_num_seqs"].log_odds.estimate))
        for r in g.regions:
            assert r.predicted is not None and r.predicted.low <= r.predicted.estimate <= r.predicted.high
        if HOT_TERM in coef and coef[HOT_TERM].log_odds.low > 0:
            found += 1
            assert "failure_terms" in codes(res)
        hot = region(g, PAIR, (">= 128", "0.95"))
        assert hot.predicted is not None
        covered += not hot.predicted.excludes(0.8)
    assert found >= 4, found
    assert covered >= 4, covered


def test_model_misfit_flags_a_corner_the_model_cannot_represent(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no added terms (main effects only) the logit misses the corner; model_misfit must say so,
    and name the corner's region."""
    import analysis.failure as failure

    monkeypatch.setattr(failure, "_MAX_INTERACTIONS", 0)
    flagged = 0
    for seed in range(5):
        ds, _ = planted(n_configs=400, n_params=4, fail_rate_region=0.8, fail_rate_base=0.1, seed=seed)
        res = failure_probability(ds, params=list(PAIR), cuts=CUTS, seed=seed)
        msgs = [w.message for w in res.warnings if w.code == "model_misfit"]
        flagged += any("gpu_memory_utilization=0.95" in m for m in msgs)
    assert flagged >= 4, flagged


def test_model_misfit_is_quiet_where_the_model_is_right() -> None:
    """Failures at one rate everywhere: the model is right, and model_misfit (family-wise 5% over the
    dozens of regions) fires in at most 1 of 8 seeds (P(>= 2) < 6% at a 5% rate)."""
    fired = 0
    for seed in range(8):
        ds, _ = planted(n_configs=400, n_params=6, fail_rate_region=0.2, fail_rate_base=0.2, seed=seed)
        res = failure_probability(ds, seed=seed)
        assert res.groups[0].model == "logit", res.warnings
        fired += "model_misfit" in codes(res)
    assert fired <= 1, fired


def test_few_events_caveat_and_no_model() -> None:
    ds, _ = planted(n_configs=40, n_params=4, fail_rate_region=0.0, fail_rate_base=0.05, seed=2)
    fails = int((ds["status"].values == "failed").sum())
    assert fails < 5
    res = failure_probability(ds)
    assert "few_events" in codes(res)
    assert res.groups[0].model == "none"
    assert all(r.rate.low <= r.rate.estimate <= r.rate.high for r in res.groups[0].regions)


def test_binning_keeps_whole_levels_and_caps_regions() -> None:
    ds, _ = planted(n_configs=300, n_params=6, seed=4)
    res = failure_probability(ds, max_regions=12)
    g = res.groups[0]
    assert len(g.regions) <= 12
    mns = [r for r in g.regions if r.params == ("max_num_seqs",)]
    if mns:  # 7 levels -> at most 4 bins, each a run of whole levels
        assert len(mns) <= 4 and sum(r.n for r in mns) == g.n
    full = failure_probability(ds, max_regions=64)
    singles = {r.params[0] for r in full.groups[0].regions if len(r.params) == 1}
    assert singles == {"max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill", "gpu_memory_utilization",
                       "enable_prefix_caching", "block_size"}
    assert full.subsampled and full.subsampled[0].used < full.subsampled[0].of  # not every pair fits in 64 cells
    assert "regions_capped" in codes(res)


def test_claim_wording_follows_design() -> None:
    ds, _ = planted(n_configs=150, n_params=4, seed=5)
    res = failure_probability(ds, params=list(PAIR), cuts=CUTS)
    assert res.claim.kind == "effect"
    assert all(r.statement.startswith("setting ") for r in res.groups[0].regions)
    ds2, _ = planted(n_configs=150, n_params=4, design="adaptive", seed=5)
    res2 = failure_probability(ds2, params=list(PAIR), cuts=CUTS)
    assert res2.claim.kind == "association"
    assert all("association" in r.statement for r in res2.groups[0].regions)


def test_input_not_mutated_and_json() -> None:
    ds, _ = planted(n_configs=120, n_params=4, transport_rate=0.05, baseline_every=5, seed=6)
    before = ds.copy(deep=True)
    res = failure_probability(ds, cuts=CUTS)
    assert ds.identical(before) and ds.attrs == before.attrs
    text = json.dumps(jsonable(res))
    assert '"separation"' not in text or res.groups[0].model != "logit"
    assert json.loads(text)["groups"][0]["hardware_class"] == "sim-gpu-a"


def test_hardware_classes_analysed_separately() -> None:
    ds, _ = planted(n_configs=60, n_params=4, hardware_classes=("a", "b"), seed=7)
    res = failure_probability(ds)
    assert [g.hardware_class for g in res.groups] == ["a", "b"]
    assert sum(g.n for g in res.groups) == res.n_trials


def test_counts_by_kind_are_per_class_never_pooled_across_classes() -> None:
    """Two SYNTHETIC classes, one failing often and one rarely: the overall counts by kind would be a
    rate neither class has, so they are kept per class (each group's by_kind, and a caveat)."""
    ds, _ = planted(n_configs=60, n_params=4, hardware_classes=("a", "b"), seed=7)
    is_b = ds["hardware_class"].values == "b"
    ran = ds["status"].values != "hole"
    # class b: every trial that ran ok now failed with a measurement failure (a class that cannot run these configs)
    ds["status"].values[is_b & ran] = "failed"
    ds["failure_kind"].values[is_b & ran & (ds["failure_kind"].values == "")] = "measurement"
    first_a = int(np.flatnonzero(~is_b & ran & (ds["status"].values == "ok"))[0])
    ds["status"].values[first_a], ds["failure_kind"].values[first_a] = "failed", "transport"
    res = failure_probability(ds)
    assert res.by_kind == [], "no count pooled across hardware classes"
    per = {g.hardware_class: {k.kind: k for k in g.by_kind} for g in res.groups}
    assert per["b"]["measurement"].failures == per["b"]["measurement"].of - per["b"]["transport"].failures
    assert per["a"]["measurement"].rate.estimate < 0.5 < per["b"]["measurement"].rate.estimate
    caveat = next(w for w in res.warnings if w.code == "by_kind_per_class")
    assert f"a: measurement {per['a']['measurement'].failures}/" in caveat.message
    assert f"b: measurement {per['b']['measurement'].failures}/" in caveat.message
    excluded = [w for w in res.warnings if w.code == "excluded_transport"]
    assert "hardware_class=a" in {w.subject for w in excluded} and all(" on a" in w.message or " on b" in w.message
                                                                        for w in excluded)
    one = failure_probability(ds.isel(trial=~is_b))
    assert [k.kind for k in one.by_kind][:1] == ["measurement"] and not any(
        w.code == "by_kind_per_class" for w in one.warnings), "one class: the overall counts are that class's"


def test_bad_input_named() -> None:
    ds, _ = planted(n_configs=30, n_params=3, seed=0)
    with pytest.raises(AnalysisInputError, match="oom"):
        failure_probability(ds, kinds=["oom"])
    with pytest.raises(AnalysisInputError, match="nope"):
        failure_probability(ds, params=["nope"])
    with pytest.raises(AnalysisInputError, match="zzz"):
        failure_probability(ds, load_point="zzz")
    with pytest.raises(AnalysisInputError, match="enable_chunked_prefill"):
        failure_probability(ds, cuts={"enable_chunked_prefill": [1]})


def test_clustered_failures_not_flagged_where_the_regions_explain_them() -> None:
    """Every repeat fails in the failure region and none elsewhere: all-or-nothing per config, but the
    regions' rates (1 and 0) predict exactly that, so repeats are not shown to be dependent."""
    ds, _ = separated_dataset()
    assert "clustered" not in codes(failure_probability(ds, cuts=CUTS))
    indep, _ = planted(n_configs=60, n_params=4, repeats=3, fail_rate_region=0.5, fail_rate_base=0.3, seed=8)
    assert "clustered" not in codes(failure_probability(indep, cuts=CUTS))


def _repeats_agree(ds: Any) -> Any:
    """Every repeat of a config gets its first trial's outcome: truly clustered repeats (SYNTHETIC)."""
    status, kind = ds["status"].values.copy(), ds["failure_kind"].values.copy()
    first: dict[str, int] = {}
    for i, cid in enumerate(ds["config_id"].values.tolist()):
        j = first.setdefault(cid, i)
        status[i], kind[i] = status[j], kind[j]
    return ds.assign_coords(status=("trial", status), failure_kind=("trial", kind))


def test_clustered_fires_only_when_repeats_contradict_independence_given_the_regions() -> None:
    """Independent repeats under regional failure rates (80% in the OOM corner, 3% elsewhere): a pooled
    rate would expect far more configs with mixed outcomes than the regions do, and the caveat must not
    fire (at most 2 of 12 seeds: P(>= 3) < 2% at a 5% false rate). Repeats that copy one outcome: it fires."""
    false_alarms = hits = 0
    for seed in range(12):
        ds, _ = planted(n_configs=80, n_params=4, repeats=3, fail_rate_region=0.8, seed=seed)
        false_alarms += "clustered" in codes(failure_probability(ds, seed=seed))
        hits += "clustered" in codes(failure_probability(_repeats_agree(ds), seed=seed))
    assert false_alarms <= 2, false_alarms
    assert hits >= 10, hits
