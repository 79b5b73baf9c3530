"""Pareto fronts: the mask against brute force and its invariants (hypothesis), and fronts of
synthetic experiments with known structure."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.frame import AnalysisInputError
from analysis.pareto import _front_kd, front, pareto_mask
from analysis.synthetic import log_throughput, planted


def make_ds(records: list[dict[str, Any]], slos: list[dict[str, Any]] | None = None,
            prices: dict[str, float] | None = None, design: str = "random", randomized: bool = True) -> xr.Dataset:
    """A minimal dataset in the results schema: one record per trial (config_id, output_throughput,
    ttft_p99 and optional label, load_point, hardware_class, status, is_baseline, goodput, tp, x)."""
    n = len(records)

    def col(key: str, default: Any) -> list[Any]:
        return [r.get(key, default) for r in records]

    ok = np.array([s == "ok" for s in col("status", "ok")])
    tp = np.where(ok, np.asarray(col("output_throughput", np.nan), dtype=float), np.nan)
    ttft99 = np.where(ok, np.asarray(col("ttft_p99", np.nan), dtype=float), np.nan)
    ttft = np.column_stack([ttft99 / 2.6, ttft99])
    goodput = np.where(ok, np.asarray(col("goodput", np.nan), dtype=float), np.nan)
    coords: dict[str, Any] = {
        "quantile": ("quantile", np.array([0.5, 0.99])),
        "trial_id": ("trial", np.array([f"t{i:05d}" for i in range(n)], dtype=object)),
        "config_id": ("trial", np.array(col("config_id", ""), dtype=object)),
        "config_label": ("trial", np.array([r.get("label", r["config_id"]) for r in records], dtype=object)),
        "load_point": ("trial", np.array(col("load_point", "lp"), dtype=object)),
        "hardware_class": ("trial", np.array(col("hardware_class", "hw"), dtype=object)),
        "status": ("trial", np.array(col("status", "ok"), dtype=object)),
        "failure_kind": ("trial", np.array(["" if s == "ok" else "measurement" for s in col("status", "ok")],
                                           dtype=object)),
        "is_baseline": ("trial", np.array(col("is_baseline", False), dtype=bool)),
        "max_concurrency": ("trial", np.full(n, 32.0)),
        "param_tensor_parallel_size": ("trial", np.asarray(col("tp", 1), dtype="int64")),
        "param_x": ("trial", np.asarray(col("x", 0), dtype="int64")),
    }
    data_vars = {
        "output_throughput": ("trial", tp),
        "request_throughput": ("trial", tp / 128.0),
        "request_goodput": ("trial", goodput),
        "ttft_ms": (("trial", "quantile"), ttft),
    }
    ds = xr.Dataset(data_vars, coords=coords).assign_coords(trial=np.arange(n, dtype="int64"))
    ds.attrs.update({
        "design": design, "randomized": int(randomized), "vllm_version": "test", "hardware_classes": "hw",
        "slos": json.dumps([{"metric": "ttft_ms", "percentile": 99.0, "max_ms": 200.0}] if slos is None else slos),
        "ranking": json.dumps({"objective": "output_throughput", "require_slos": True}),
        "gpu_hour_prices": json.dumps(prices or {}),
    })
    return ds


def brute_mask(values: np.ndarray, senses: list[int]) -> np.ndarray:
    v = np.asarray(values, dtype=float) * np.asarray(senses, dtype=float)
    fin = np.isfinite(v).all(axis=1)
    out = np.zeros(len(v), dtype=bool)
    for i in range(len(v)):
        if not fin[i]:
            continue
        others = v[fin]
        dom = (others >= v[i]).all(axis=1) & (others > v[i]).any(axis=1)
        out[i] = not dom.any()
    return out


def points(k: int) -> st.SearchStrategy[np.ndarray]:
    row = st.lists(st.one_of(st.integers(0, 6).map(float), st.just(float("nan"))), min_size=k, max_size=k)
    return st.lists(row, min_size=1, max_size=30).map(lambda rows: np.array(rows, dtype=float))


senses2 = st.lists(st.sampled_from([1, -1]), min_size=2, max_size=2)
senses3 = st.lists(st.sampled_from([1, -1]), min_size=3, max_size=3)


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.tuples(points(2), senses2), st.tuples(points(3), senses3)))
def test_mask_matches_brute_force_with_ties_duplicates_and_nans(case: tuple[np.ndarray, list[int]]) -> None:
    values, senses = case
    assert pareto_mask(values, senses).tolist() == brute_mask(values, senses).tolist()


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.tuples(points(2), senses2), st.tuples(points(3), senses3)), st.data())
def test_a_dominated_point_is_never_on_the_front_and_adding_it_changes_nothing(
        case: tuple[np.ndarray, list[int]], data: st.DataObject) -> None:
    values, senses = case
    fin = np.flatnonzero(np.isfinite(values).all(axis=1))
    if not len(fin):
        return
    i = data.draw(st.sampled_from(fin.tolist()))
    k = values.shape[1]
    worse = data.draw(st.lists(st.integers(0, 3), min_size=k, max_size=k).filter(lambda d: any(d)))
    new = values[i] - np.asarray(senses, dtype=float) * np.asarray(worse, dtype=float)
    before = pareto_mask(values, senses)
    after = pareto_mask(np.vstack([values, new]), senses)
    assert not after[-1]
    assert after[:-1].tolist() == before.tolist()


@settings(max_examples=100, deadline=None)
@given(st.one_of(st.tuples(points(2), senses2), st.tuples(points(3), senses3)), st.randoms())
def test_front_is_invariant_under_row_permutation(case: tuple[np.ndarray, list[int]], rnd: Any) -> None:
    values, senses = case
    perm = list(range(len(values)))
    rnd.shuffle(perm)
    assert pareto_mask(values[perm], senses).tolist() == pareto_mask(values, senses)[perm].tolist()


def test_duplicates_of_a_front_point_are_both_on_it_and_nan_rows_never() -> None:
    v = np.array([[3.0, 1.0], [3.0, 1.0], [1.0, 3.0], [2.0, 2.0], [1.0, 1.0], [np.nan, 9.0], [9.0, np.inf]])
    assert pareto_mask(v, [1, 1]).tolist() == [True, True, True, True, False, False, False]
    # minimising the second metric: (3, 1) dominates everything that is not better on the first metric
    assert pareto_mask(v, [1, -1]).tolist() == [True, True, False, False, False, False, False]


def test_the_2d_sort_agrees_with_the_block_filter_on_many_tied_points() -> None:
    rng = np.random.default_rng(3)
    v = rng.integers(0, 200, size=(20_000, 2)).astype(float)
    assert pareto_mask(v, [1, 1]).tolist() == _front_kd(v).tolist()
    v = rng.random((2_000, 2))
    v[:, 1] = 1.0 - v[:, 0] + rng.normal(0, 0.01, 2_000)  # a long front
    assert pareto_mask(v, [1, 1]).tolist() == _front_kd(v).tolist()


def test_bad_input_is_named() -> None:
    with pytest.raises(AnalysisInputError, match="senses"):
        pareto_mask(np.zeros((3, 2)), [1])
    ds, _ = planted(n_configs=5, repeats=2, seed=0)
    with pytest.raises(AnalysisInputError, match="no_such_metric"):
        front(ds, metrics=("output_throughput", "no_such_metric"))
    with pytest.raises(AnalysisInputError, match="2 or 3"):
        front(ds, metrics=("output_throughput",))


def test_front_of_planted_experiments_marks_exactly_the_nondominated_medians() -> None:
    for seed in range(3):
        ds, _ = planted(n_configs=30, repeats=4, seed=seed, fail_rate_region=0.0, fail_rate_base=0.0)
        res = front(ds, n_boot=50, seed=seed)
        (g,) = res.groups
        assert len(g.points) == 30
        vals = np.array([[p.values["output_throughput"], p.values["ttft_ms_p99"]] for p in g.points])
        assert [p.on_front for p in g.points] == brute_mask(vals, [1, -1]).tolist()
        # the highest-throughput config is on the front and (5% noise, 4 repeats) nearly always so
        top = max(g.points, key=lambda p: p.values["output_throughput"])
        assert top.on_front
        # the medians are the medians of the repeats
        for p in g.points[:5]:
            raw = ds["output_throughput"].values[ds["config_id"].values == p.config_id]
            assert p.values["output_throughput"] == pytest.approx(float(np.median(raw)))
        assert all(0.0 <= (p.p_front or 0.0) <= 1.0 for p in g.points)
        on = [p.p_front for p in g.points if p.on_front]
        off = [p.p_front for p in g.points if not p.on_front]
        assert float(np.mean(on)) > float(np.mean(off)) + 0.3
        assert res.warnings == []


def test_p_front_of_a_config_straddling_a_front_point_is_in_between_and_a_far_dominated_one_is_zero() -> None:
    recs: list[dict[str, Any]] = []
    for t, lat in [(100.0, 50.0), (101.0, 50.5), (99.0, 49.5), (100.5, 50.2), (99.5, 49.8)]:
        recs.append({"config_id": "a", "output_throughput": t, "ttft_p99": lat})
    for t, lat in [(96.0, 52.0), (104.0, 52.0), (103.0, 53.0), (97.0, 51.0), (100.2, 52.5)]:
        recs.append({"config_id": "b", "output_throughput": t, "ttft_p99": lat})  # worse latency, same throughput
    for t, lat in [(50.0, 90.0), (51.0, 91.0), (49.0, 89.0)]:
        recs.append({"config_id": "c", "output_throughput": t, "ttft_p99": lat})
    res = front(make_ds(recs), n_boot=200, seed=1)
    p = {pt.config_id: pt for pt in res.groups[0].points}
    assert p["a"].on_front and p["a"].p_front == 1.0
    assert p["c"].p_front == 0.0 and not p["c"].on_front
    assert p["b"].p_front is not None and 0.2 < p["b"].p_front < 0.8


def test_derived_metrics_and_three_metric_fronts() -> None:
    ds, _ = planted(n_configs=25, repeats=3, seed=4, fail_rate_region=0.0, fail_rate_base=0.0)
    res = front(ds, metrics=("output_tokens_per_gpu", "output_tokens_per_user"), n_boot=0)
    (g,) = res.groups
    # one GPU and a fixed concurrency: both derived metrics follow throughput, so the front is its maximum
    best = max(p.values["output_tokens_per_gpu"] for p in g.points)
    assert {p.config_id for p in g.points if p.on_front} == {
        p.config_id for p in g.points if p.values["output_tokens_per_gpu"] == best}
    assert all(p.p_front is None for p in g.points)
    res3 = front(ds, metrics=("output_throughput", "ttft_ms_p99", "tpot_ms_p99"), n_boot=20)
    pts = res3.groups[0].points
    vals = np.array([[p.values[m] for m in res3.metrics] for p in pts])
    assert [p.on_front for p in pts] == brute_mask(vals, [1, -1, -1]).tolist()
    assert res3.senses == (1, -1, -1)
    # hover data: label and parameter values of each point
    assert "max_num_seqs" in pts[0].params and pts[0].label.startswith("max_num_seqs=")


def test_single_repeats_are_warned_about_and_hardware_classes_never_share_a_front() -> None:
    ds, _ = planted(n_configs=12, repeats=1, seed=2, hardware_classes=("hw-a", "hw-b"), load_points=("x", "y"))
    res = front(ds, n_boot=30)
    assert [w.code for w in res.warnings].count("single_repeat") == 1
    assert "0 or 1" in next(w.message for w in res.warnings if w.code == "single_repeat")
    keys = [(g.group["load_point"], g.group["hardware_class"]) for g in res.groups]
    assert keys == [("x", "hw-a"), ("x", "hw-b"), ("y", "hw-a"), ("y", "hw-b")]
    for g in res.groups:
        assert {p.p_front for p in g.points} <= {0.0, 1.0}
        assert len(g.points) + g.n_without_data == 12
    # baseline trials never appear on a front
    ds, _ = planted(n_configs=6, repeats=2, seed=2, baseline_every=3)
    res = front(ds, n_boot=0)
    assert sum(len(g.points) + g.n_without_data for g in res.groups) == 6


def test_planted_truth_the_best_true_throughput_is_on_the_front() -> None:
    hits = 0
    for seed in range(5):
        ds, truth = planted(n_configs=30, repeats=3, seed=seed, fail_rate_region=0.0, fail_rate_base=0.0)
        res = front(ds, n_boot=0)
        pts = res.groups[0].points
        true = {p.config_id: log_throughput({k: v for k, v in p.params.items() if k in truth.params}) for p in pts}
        best = max(true.values())
        hits += any(p.on_front for p in pts if true[p.config_id] >= best - 1e-9)
    assert hits == 5


# --- the lean paths for large experiments: the same answers ---------------------------------------------


def _planted_mixed(seed: int) -> xr.Dataset:
    ds, _ = planted(n_configs=40, repeats=3, seed=seed, load_points=("a", "b"), hardware_classes=("h1", "h2"),
                    baseline_every=7, params=["max_num_seqs", "tensor_parallel_size", "dtype", "block_size"],
                    gpu_hour_prices={"h1": 2.0})
    return ds


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_front_without_a_table_equals_front_on_the_full_table(seed: int) -> None:
    from analysis.common import jsonable
    from analysis.frame import trial_table
    from analysis.pareto import clear_cache

    ds = _planted_mixed(seed)
    for metrics in (("output_throughput", "ttft_ms_p99"), ("output_tokens_per_gpu", "output_tokens_per_user"),
                    ("output_throughput", "ttft_ms_p99", "tpot_ms_p50")):
        for n_boot in (0, 30):
            clear_cache()
            lean = front(ds, metrics=metrics, n_boot=n_boot, seed=seed)
            full = front(ds, metrics=metrics, n_boot=n_boot, seed=seed, table=trial_table(ds))
            assert json.dumps(jsonable(lean), sort_keys=True) == json.dumps(jsonable(full), sort_keys=True)
            assert lean == full


@pytest.mark.parametrize("seed", [0, 3])
def test_points_front_lists_exactly_the_front_points_of_points_all(seed: int) -> None:
    from analysis.frame import trial_table

    ds = _planted_mixed(seed)
    for n_boot in (0, 25):
        every = front(ds, n_boot=n_boot, seed=seed)
        only = front(ds, n_boot=n_boot, seed=seed, points="front")
        shared = front(ds, n_boot=n_boot, seed=seed, points="front", table=trial_table(ds))
        assert len(every.groups) == len(only.groups) == 4
        for ga, gf, gs in zip(every.groups, only.groups, shared.groups):
            assert gf.points == [p for p in ga.points if p.on_front] == gs.points
            assert gf.n_front == ga.n_front == len(gf.points) > 0
            assert gf.n_points == ga.n_points == len(ga.points)
            assert gf.n_without_data == ga.n_without_data
        assert only.warnings == every.warnings
    with pytest.raises(AnalysisInputError, match="points"):
        front(ds, points="some")  # type: ignore[arg-type]


def test_factorize_gives_pandas_sorted_codes() -> None:
    import pandas as pd

    from analysis.pareto import _factorize

    rng = np.random.default_rng(0)
    ids = np.asarray([f"cfg-{i:03d}" for i in rng.integers(0, 300, 2000)], dtype=object)
    cases = [ids, np.asarray(["b", "a", "b", None, "c", "a"], dtype=object),
             np.asarray(["x"] * 5, dtype=object), np.asarray([3, 1, 2, 1], dtype=object),
             np.asarray(["é", "e", "Z", "a", "ä"], dtype=object), np.asarray([], dtype=object)]
    for values in cases:
        codes, uniq = _factorize(values)
        want_codes, want_uniq = pd.factorize(values, sort=True)
        assert codes.tolist() == np.asarray(want_codes).tolist()
        assert list(uniq) == list(want_uniq)
