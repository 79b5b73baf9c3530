"""Ranking policies: planted ground truth, policy switches on constructed data, prices, the fast
path, and invariants (hypothesis)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.common import jsonable
from analysis.frame import AnalysisInputError, trial_table
from analysis.ranking import POLICIES, RankingResult, rank
from analysis.synthetic import log_throughput, planted
from tests.test_analysis_pareto import make_ds


def cfg(config_id: str, tps: list[float], lats: list[float], **extra: Any) -> list[dict[str, Any]]:
    return [{"config_id": config_id, "output_throughput": t, "ttft_p99": lat, **extra} for t, lat in zip(tps, lats)]


def order(res: RankingResult, group: int = 0) -> list[str]:
    return [r.config_id for r in res.groups[group].rows]


def spread(center: float, n: int = 4, rel: float = 0.01) -> list[float]:
    return [center * (1 + rel * (i - (n - 1) / 2)) for i in range(n)]


def test_planted_best_config_ranks_first() -> None:
    for seed, repeats in [(0, 3), (1, 4), (2, 5), (3, 4)]:
        ds, truth = planted(n_configs=40, repeats=repeats, seed=seed, fail_rate_region=0.0, fail_rate_base=0.0)
        res = rank(ds, slos=[], n_boot=50, seed=seed)
        rows = res.groups[0].rows
        df = trial_table(ds)
        params = {c: {k: df.loc[df.config_id == c, f"param_{k}"].tolist()[0] for k in truth.params}
                  for c in df.config_id.unique()}
        true = {c: log_throughput(p) for c, p in params.items()}
        best = max(true.values())
        top = rows[0]
        assert params[top.config_id]["max_num_seqs"] == 256
        assert true[top.config_id] >= best - 0.05  # within the noise of the planted maximum
        assert top.p_best is not None and top.p_best == max(r.p_best or 0.0 for r in rows)
        assert sum(r.p_best or 0.0 for r in rows) == pytest.approx(1.0)
        assert [r.rank for r in rows] == list(range(1, len(rows) + 1))


def test_policy_switch_changes_the_winner_where_the_data_says_so() -> None:
    recs = (cfg("fast", spread(1000), spread(300), goodput=2.0) + cfg("balanced", spread(800), spread(150), goodput=6.0)
            + cfg("slow", spread(500), spread(100), goodput=3.9))
    ds = make_ds(recs)
    slo = rank(ds, "slo_throughput", n_boot=100)
    assert order(slo) == ["balanced", "slow", "fast"]  # fast misses the 200 ms SLO: after all that meet it
    assert [r.slos_met for r in slo.groups[0].rows] == [True, True, False]
    assert slo.groups[0].distinguishable
    assert order(rank(ds, "slo_throughput", slos=[], n_boot=0)) == ["fast", "balanced", "slow"]
    assert order(rank(ds, "goodput", n_boot=0)) == ["balanced", "slow", "fast"]
    assert order(rank(ds, "weighted", weights={"ttft_ms_p99": 1.0}, n_boot=0)) == ["slow", "balanced", "fast"]
    assert order(rank(ds, "weighted", weights={"output_throughput": 1.0}, n_boot=0)) == ["fast", "balanced", "slow"]
    # a stricter SLO passed at call time: only the slow config meets 120 ms
    strict = rank(ds, slos=[{"metric": "ttft_ms", "percentile": 99, "max_ms": 120}], n_boot=0)
    assert order(strict) == ["slow", "fast", "balanced"]


def test_knee_is_the_bend_of_the_front_and_dominated_configs_score_below() -> None:
    recs = (cfg("low", spread(100), spread(10)) + cfg("knee", spread(190), spread(20))
            + cfg("high", spread(200), spread(100)) + cfg("dominated", spread(150), spread(50)))
    res = rank(make_ds(recs), "knee", n_boot=100)
    rows = res.groups[0].rows
    assert rows[0].config_id == "knee" and rows[0].score.estimate > 0
    scores = {r.config_id: r.score.estimate for r in rows}
    assert scores["low"] == pytest.approx(0.0, abs=1e-12) and scores["high"] == pytest.approx(0.0, abs=1e-12)
    assert scores["dominated"] < scores["knee"]
    assert res.groups[0].distinguishable
    # one config best on both axes is the knee
    res = rank(make_ds(cfg("both", spread(300), spread(5)) + cfg("other", spread(100), spread(50))), "knee", n_boot=0)
    assert order(res) == ["both", "other"]


def test_per_gpu_and_per_cost_normalise_and_never_invent_prices() -> None:
    recs = (cfg("tp2", spread(1500), spread(100), tp=2, x=2, hardware_class="a100")
            + cfg("tp1", spread(1000), spread(100), tp=1, x=1, hardware_class="a100")
            + cfg("tp1", spread(900), spread(100), tp=1, x=1, hardware_class="cpu"))
    ds = make_ds(recs, prices={"a100": 2.0})
    assert order(rank(ds, n_boot=0)) == ["tp2", "tp1"]
    per_gpu = rank(ds, "per_gpu", n_boot=0)
    assert order(per_gpu) == ["tp1", "tp2"]
    assert per_gpu.groups[0].rows[0].score.estimate == pytest.approx(1000.0)
    per_cost = rank(ds, "per_cost", n_boot=50)
    a100, cpu = per_cost.groups
    assert a100.group["hardware_class"] == "a100" and order(per_cost) == ["tp1", "tp2"]
    assert a100.rows[0].score.estimate == pytest.approx(1000.0 * 3600 / 2.0)
    assert cpu.rows == [] and not cpu.distinguishable
    caveats = [w for w in per_cost.warnings if w.code == "no_prices"]
    assert len(caveats) == 1 and "cpu" in caveats[0].message and "hardware_class=cpu" in caveats[0].subject
    none = rank(make_ds(recs), "per_cost", n_boot=0)
    assert all(g.rows == [] for g in none.groups) and sum(w.code == "no_prices" for w in none.warnings) == 2
    ds_p, _ = planted(n_configs=8, repeats=2, seed=0)
    assert any(w.code == "no_prices" for w in rank(ds_p, "per_cost", n_boot=0).warnings)


def test_failed_configs_rank_last_baselines_are_left_out_and_counts_are_kept() -> None:
    recs = (cfg("good", spread(500), spread(100)) + cfg("flaky", spread(700, 2), spread(100, 2))
            + [{"config_id": "flaky", "status": "failed"}] * 2 + [{"config_id": "broken", "status": "failed"}] * 3
            + [{"config_id": "base", "output_throughput": 9e9, "ttft_p99": 1.0, "is_baseline": True}] * 3)
    res = rank(make_ds(recs), n_boot=50)
    rows = res.groups[0].rows
    # flaky is faster but failed half its trials: a config that works only sometimes ranks after
    # every reliable one; a config that never worked ranks last
    assert order(res) == ["good", "flaky", "broken"]
    assert (rows[1].n_ok, rows[1].n_failed) == (2, 2) and (rows[2].n_ok, rows[2].n_failed) == (0, 3)
    assert math.isnan(rows[2].score.estimate) and rows[2].p_best == 0.0 and rows[2].slos_met is None
    assert any(w.code == "few_repeats" for w in res.warnings)


def test_distinguishability() -> None:
    apart = cfg("a", [1000, 1010, 990, 1005, 995], [100] * 5) + cfg("b", [900, 910, 890, 905, 895], [100] * 5)
    g = rank(make_ds(apart), n_boot=200).groups[0]
    assert g.distinguishable and "is distinguishable" in g.sentence
    assert g.margin is not None and g.margin.low > 0 and g.p_order == 1.0
    rng = np.random.default_rng(5)
    same = rng.lognormal(np.log(1000), 0.05, 10)
    tied = cfg("a", list(same[:5]), [100] * 5) + cfg("b", list(same[5:]), [100] * 5)
    g = rank(make_ds(tied), n_boot=200).groups[0]
    assert not g.distinguishable and "not distinguishable" in g.sentence
    assert g.margin is not None and g.margin.low < 0 < g.margin.high
    single = rank(make_ds(cfg("a", [1000], [100]) + cfg("b", [900], [100])), n_boot=200)
    assert not single.groups[0].distinguishable and "cannot be told" in single.groups[0].sentence
    assert any(w.code == "single_repeat" for w in single.warnings)
    assert math.isnan(single.groups[0].rows[0].score.low)
    fast = rank(make_ds(apart), n_boot=0).groups[0]
    assert not fast.distinguishable and "not assessed" in fast.sentence


def test_fast_path_matches_the_bootstrap_path_and_plain_medians() -> None:
    ds, _ = planted(n_configs=30, repeats=3, seed=7, load_points=("p", "q"), hardware_classes=("h1", "h2"))
    fast = rank(ds, n_boot=0)
    slow = rank(ds, n_boot=40)
    assert len(fast.groups) == 4
    df = trial_table(ds)
    df = df[(df.status == "ok") & ~df.is_baseline]
    for gf, gs in zip(fast.groups, slow.groups):
        assert order_of(gf) == order_of(gs)
        assert [r.score.estimate for r in gf.rows] == [r.score.estimate for r in gs.rows]
        assert all(r.p_best is None and math.isnan(r.score.low) for r in gf.rows)
        sub = df[(df.load_point == gf.group["load_point"]) & (df.hardware_class == gf.group["hardware_class"])]
        med = sub.groupby("config_id")["output_throughput"].median()
        meets = sub.groupby("config_id")["ttft_ms_p99"].median() <= 200.0
        every = trial_table(ds)
        every = every[(every.load_point == gf.group["load_point"]) & (every.hardware_class == gf.group["hardware_class"])]
        failed = every[every.status == "failed"].groupby("config_id").size()
        want = sorted(med.index, key=lambda c: (not meets[c], failed.get(c, 0) > 0, -med[c], c))
        assert order_of(gf)[:len(want)] == want
        for r in gf.rows[:len(want)]:
            assert r.score.estimate == pytest.approx(med[r.config_id])


def order_of(g: Any) -> list[str]:
    return [r.config_id for r in g.rows]


def test_unknown_names_are_reported() -> None:
    ds = make_ds(cfg("a", [1.0, 2.0], [1.0, 1.0]))
    with pytest.raises(AnalysisInputError, match="'nope'.*slo_throughput.*per_cost"):
        rank(ds, "nope")
    with pytest.raises(AnalysisInputError, match="bogus_metric"):
        rank(ds, objective="bogus_metric")
    with pytest.raises(AnalysisInputError, match="ttft_ms_p42"):
        rank(ds, slos=[{"metric": "ttft_ms", "percentile": 42, "max_ms": 1}])
    with pytest.raises(AnalysisInputError, match="output_throughput"):
        rank(ds, "weighted", weights={"output_throughput": -1.0})
    assert set(POLICIES) == {"slo_throughput", "goodput", "knee", "weighted", "per_gpu", "per_cost"}


def test_results_serialise_and_carry_the_claim() -> None:
    ds, _ = planted(n_configs=6, repeats=2, seed=1, design="adaptive")
    res = rank(ds, "knee", n_boot=20)
    out = jsonable(res)
    assert out["policy"] == "knee" and out["claim"]["kind"] == "association"
    assert isinstance(out["groups"][0]["rows"][0]["score"]["estimate"], float)


# --- invariants ----------------------------------------------------------------------------------------------

trial_values = st.lists(st.tuples(st.floats(100, 1000), st.floats(50, 400)), min_size=1, max_size=4)
experiments = st.lists(trial_values, min_size=2, max_size=5)


def records_of(configs: list[list[tuple[float, float]]]) -> list[dict[str, Any]]:
    return [{"config_id": f"c{i}", "output_throughput": t, "ttft_p99": lat}
            for i, trials in enumerate(configs) for t, lat in trials]


def snapshot(res: RankingResult) -> list[tuple[Any, ...]]:
    return [(r.config_id, r.rank, r.score.estimate, r.score.low, r.score.high, r.p_best, r.slos_met)
            for g in res.groups for r in g.rows]


@settings(max_examples=40, deadline=None)
@given(experiments, st.randoms())
def test_ranking_is_invariant_under_row_permutation(configs: list[list[tuple[float, float]]], rnd: Any) -> None:
    ds = make_ds(records_of(configs))
    perm = list(range(ds.sizes["trial"]))
    rnd.shuffle(perm)
    shuffled = ds.isel(trial=perm)
    for policy in ("slo_throughput", "knee"):
        a = rank(ds, policy, n_boot=30, seed=3)
        b = rank(shuffled, policy, n_boot=30, seed=3)
        assert snapshot(a) == snapshot(b)
        assert [g.distinguishable for g in a.groups] == [g.distinguishable for g in b.groups]


@settings(max_examples=40, deadline=None)
@given(experiments, st.data())
def test_adding_a_failed_or_dominated_config_changes_nothing_else(configs: list[list[tuple[float, float]]],
                                                                   data: st.DataObject) -> None:
    recs = records_of(configs)
    before = snapshot(rank(make_ds(recs), n_boot=30, seed=1))
    failed = recs + [{"config_id": "zz-failed", "status": "failed"}] * data.draw(st.integers(1, 3))
    after = snapshot(rank(make_ds(failed), n_boot=30, seed=1))
    assert after[:-1] == before and after[-1][0] == "zz-failed"
    # a config worse than an existing one in every trial: lower throughput and higher latency
    host = data.draw(st.integers(0, len(configs) - 1))
    tps = [t for t, _ in configs[host]]
    lats = [lat for _, lat in configs[host]]
    n_new = data.draw(st.integers(1, 4))
    dominated = recs + [{"config_id": "zz-dominated", "output_throughput": min(tps) * 0.5,
                         "ttft_p99": max(lats) * 2.0}] * n_new
    after = snapshot(rank(make_ds(dominated), n_boot=30, seed=1))
    kept = [row for row in after if row[0] != "zz-dominated"]
    assert [(c, s, lo, hi, p, m) for c, _, s, lo, hi, p, m in kept] == [
        (c, s, lo, hi, p, m) for c, _, s, lo, hi, p, m in before]
    assert after[0][0] != "zz-dominated"
    assert next(row for row in after if row[0] == "zz-dominated")[5] == 0.0


def test_a_config_that_sometimes_fails_ranks_after_reliable_ones() -> None:
    """The fastest config fails in most of its repeats (OOM): it must not win over a reliable one."""
    from analysis.synthetic import planted

    ds, _ = planted(n_configs=150, n_params=4, repeats=4, fail_rate_region=0.6, fail_rate_base=0.0, seed=11)
    res = rank(ds, "slo_throughput", slos=[], n_boot=50)
    rows = res.groups[0].rows
    reliable = [r for r in rows if r.n_failed == 0 and r.n_ok > 0]
    flaky = [r for r in rows if r.n_failed > 0 and r.n_ok > 0]
    assert reliable and flaky
    assert max(r.rank for r in reliable) < min(r.rank for r in flaky)
    assert max(r.score.estimate for r in flaky) > rows[0].score.estimate, "the planted flaky configs are faster"


# --- the lean paths for large experiments: the same answers ---------------------------------------------


def _planted_mixed(seed: int) -> Any:
    ds, _ = planted(n_configs=40, repeats=3, seed=seed, load_points=("a", "b"), hardware_classes=("h1", "h2"),
                    baseline_every=7, params=["max_num_seqs", "tensor_parallel_size", "dtype", "block_size"],
                    gpu_hour_prices={"h1": 2.0})
    return ds


POLICY_CASES: list[tuple[str, dict[str, Any]]] = [
    ("slo_throughput", {}), ("goodput", {}), ("knee", {}), ("weighted", {}),
    ("weighted", {"weights": {"output_tokens_per_user": 1.0, "tpot_ms_p90": 2.0}}), ("per_gpu", {}),
    ("per_cost", {}), ("slo_throughput", {"slos": []}),
    ("slo_throughput", {"slos": [{"metric": "tpot_ms", "percentile": 90, "max_ms": 12.0}]}),
]


@pytest.mark.parametrize("seed", [0, 1])
def test_rank_without_a_table_equals_rank_on_the_full_table(seed: int) -> None:
    import json

    from analysis.pareto import clear_cache

    ds = _planted_mixed(seed)
    for policy, kw in POLICY_CASES:
        for n_boot in (0, 30):
            clear_cache()
            lean = rank(ds, policy=policy, n_boot=n_boot, seed=seed, **kw)
            full = rank(ds, policy=policy, n_boot=n_boot, seed=seed, table=trial_table(ds), **kw)
            assert json.dumps(jsonable(lean), sort_keys=True) == json.dumps(jsonable(full), sort_keys=True), policy
            assert [g.n_ranked for g in lean.groups] == [len(g.rows) for g in full.groups]


@pytest.mark.parametrize("top", [0, 1, 2, 5, 1000])
def test_top_k_lists_the_first_k_rows_of_the_full_ranking(top: int) -> None:
    ds = _planted_mixed(4)
    for policy, kw in POLICY_CASES[:4] + POLICY_CASES[6:7]:
        for n_boot in (0, 30):
            full = rank(ds, policy=policy, n_boot=n_boot, seed=4, **kw)
            some = rank(ds, policy=policy, n_boot=n_boot, seed=4, top=top, **kw)
            shared = rank(ds, policy=policy, n_boot=n_boot, seed=4, top=top, table=trial_table(ds), **kw)
            assert some == shared
            assert some.warnings == full.warnings
            for gf, gs in zip(full.groups, some.groups):
                assert gs.rows == gf.rows[:top]
                assert gs.n_ranked == len(gf.rows)
                assert (gs.distinguishable, gs.sentence, gs.margin, gs.p_order) == \
                    (gf.distinguishable, gf.sentence, gf.margin, gf.p_order)
    with pytest.raises(AnalysisInputError, match="top"):
        rank(ds, top=-1)


def _with_kinds(recs: list[dict[str, Any]], kinds: dict[int, str]) -> Any:
    """``make_ds(recs)`` with the failure kind of the trials at the given positions replaced."""
    ds = make_ds(recs)
    fk = ds["failure_kind"].values.copy()
    for i, kind in kinds.items():
        fk[i] = kind
    return ds.assign_coords(failure_kind=("trial", fk))


def test_a_trial_lost_to_transport_is_not_held_against_its_config() -> None:
    """700 tok/s with one trial lost to a daemon beats 500 tok/s; lost to OOM (measurement) it does not."""
    recs = cfg("fast", spread(700, 3), spread(100, 3)) + [{"config_id": "fast", "status": "failed"}] \
        + cfg("slow", spread(500), spread(100))
    lost = rank(_with_kinds(recs, {3: "transport"}), n_boot=50)
    assert order(lost) == ["fast", "slow"]
    row = lost.groups[0].rows[0]
    assert (row.n_ok, row.n_failed, row.n_lost) == (3, 1, 1)
    oom = rank(_with_kinds(recs, {3: "measurement"}), n_boot=50)
    assert order(oom) == ["slow", "fast"] and oom.groups[0].rows[1].n_lost == 0
