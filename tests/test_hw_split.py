"""Hardware classes never mix in an analysis; the cross-hardware mode is explicit, normalised and
labelled; failover trials are marked and can be left out.

The data are SYNTHETIC (analysis.synthetic.planted, two simulated hardware classes), with class
``sim-gpu-b`` planted to measure ten times the throughput of ``sim-gpu-a`` and in the reverse order
of configs: any view that pooled the classes would be dominated by b and get a's answer wrong.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import analysis  # noqa: F401  (registers ds.sweep)
from analysis.__main__ import main as analysis_main
from analysis.crosshw import compare_hardware, parse_prices
from analysis.effects import partial_dependence
from analysis.failure import failure_probability
from analysis.frame import AnalysisInputError, trial_table
from analysis.hardware import FAILOVER_PREFIX, failover_sources, parse_tags
from analysis.importance import importance
from analysis.interactions import interactions
from analysis.pareto import front
from analysis.ranking import rank
from analysis.report import analyze, validate_report
from analysis.synthetic import planted
from servetune.netcdf import write_netcdf

A, B = "sim-gpu-a", "sim-gpu-b"
FAST = {"n_boot": 2, "shap_rows": 4, "perm_rows": 40, "n_trees": 8}  # small fits: these tests are about rows


def _two_classes() -> xr.Dataset:
    ds, _ = planted(n_configs=8, n_params=3, repeats=3, seed=11, hardware_classes=(A, B), noise=0.05)
    hw = ds["hardware_class"].values.astype(str)
    out = ds["output_throughput"].values.copy()
    b = hw == B
    out[b] = 1.0e7 / out[b]  # b: 10x-ish faster and in the reverse order of configs
    return ds.assign(output_throughput=("trial", out))


@pytest.fixture(scope="module")
def two() -> xr.Dataset:
    return _two_classes()


def _alone(ds: xr.Dataset, cls: str) -> xr.Dataset:
    return ds.isel(trial=np.flatnonzero(ds["hardware_class"].values.astype(str) == cls))


def _order(group: object) -> list[tuple[str, float]]:
    return [(r.config_id, round(r.score.estimate, 9)) for r in group.rows]  # type: ignore[attr-defined]


def test_the_planted_classes_disagree_so_pooling_would_show(two: xr.Dataset) -> None:
    wins = {c: rank(_alone(two, c), n_boot=0).groups[0].rows[0].config_id for c in (A, B)}
    assert wins[A] != wins[B]
    df = trial_table(two)
    assert df[df.hardware_class == B].output_throughput.min() > df[df.hardware_class == A].output_throughput.max()


def test_each_class_ranking_equals_the_ranking_of_that_class_alone(two: xr.Dataset) -> None:
    res = rank(two, n_boot=40, seed=3)
    assert [g.group["hardware_class"] for g in res.groups] == [A, B]
    for g in res.groups:
        alone = rank(_alone(two, g.group["hardware_class"]), n_boot=40, seed=3).groups
        assert len(alone) == 1 and _order(g) == _order(alone[0])
        assert g.distinguishable == alone[0].distinguishable


def test_each_class_front_equals_the_front_of_that_class_alone(two: xr.Dataset) -> None:
    res = front(two, n_boot=20, seed=1)
    assert [g.group["hardware_class"] for g in res.groups] == [A, B]
    for g in res.groups:
        alone = front(_alone(two, g.group["hardware_class"]), n_boot=20, seed=1).groups[0]
        assert [(p.config_id, p.on_front, p.p_front) for p in g.points] == \
            [(p.config_id, p.on_front, p.p_front) for p in alone.points]


@pytest.mark.parametrize("call", [
    lambda ds: rank(ds, n_boot=0, by=("load_point",)),
    lambda ds: front(ds, n_boot=0, by=("load_point",)),
    lambda ds: importance(ds, **FAST),
    lambda ds: partial_dependence(ds, "max_num_seqs", n_boot=0),
    lambda ds: interactions(ds, n_boot=0),
], ids=["rank", "front", "importance", "partial_dependence", "interactions"])
def test_a_view_that_would_pool_classes_is_refused_naming_them(two: xr.Dataset, call: object) -> None:
    with pytest.raises(AnalysisInputError, match=f"2 hardware classes \\({A}, {B}\\).*never share"):
        call(two)  # type: ignore[operator]


def test_importance_and_verdicts_of_a_class_equal_those_fitted_on_that_class_alone(two: xr.Dataset) -> None:
    for cls in (A, B):
        got = importance(two, hardware_class=cls, seed=2, **FAST)
        ref = importance(_alone(two, cls), seed=2, **FAST)
        assert got.n_trials == ref.n_trials == int(((trial_table(two).hardware_class == cls)
                                                    & (trial_table(two).status == "ok")).sum())
        assert [(p.name, p.permutation.estimate, p.verdict) for p in got.parameters] == \
            [(p.name, p.permutation.estimate, p.verdict) for p in ref.parameters]
        assert not [w for w in got.warnings if w.code == "pooled_scenarios"]


def test_analyze_gives_one_document_per_class_and_skips_pooled_sections(two: xr.Dataset) -> None:
    small = two.isel(trial=np.flatnonzero(two["repeat"].values < 2))
    doc = analyze(small, n_boot=2)
    validate_report(doc)
    assert doc["hardware_classes"] == [A, B] and doc["hardware_class"] is None
    for section in ("pareto", "ranking", "importance", "failure", "drift"):
        assert "never share" in doc[section]["skipped"]
    parts = doc["per_hardware_class"]
    assert [p["hardware_class"] for p in parts] == [A, B]
    for p in parts:
        assert {g["group"]["hardware_class"] for g in p["ranking"]["groups"]} == {p["hardware_class"]}
        assert {g["group"]["hardware_class"] for g in p["pareto"]["groups"]} == {p["hardware_class"]}
        assert p["context"]["hardware"] == p["hardware_class"]
        ok = trial_table(_alone(small, p["hardware_class"]))
        assert p["importance"]["n_trials"] == int(((ok.status == "ok") & ~ok.is_baseline).sum())
    one = analyze(small, n_boot=2, hardware_class=B)
    assert one["hardware_class"] == B and "per_hardware_class" not in one
    with pytest.raises(AnalysisInputError, match="unknown hardware class 'nope'"):
        analyze(small, hardware_class="nope")


def test_a_single_class_document_is_unchanged_apart_from_naming_its_class() -> None:
    ds, _ = planted(n_configs=6, n_params=2, repeats=2, seed=4)
    doc = analyze(ds, n_boot=2)
    assert doc["hardware_class"] == "sim-gpu-a" and "per_hardware_class" not in doc and "cross_hardware" not in doc
    assert "groups" in doc["ranking"] and "parameters" in doc["importance"]


def test_cross_hardware_per_gpu_normalises_and_labels_every_output(two: xr.Dataset) -> None:
    tp = np.where(np.arange(two.sizes["trial"]) % 2 == 0, 2.0, 1.0)  # some configs use 2 GPUs
    ds = two.assign_coords(param_tensor_parallel_size=("trial", tp))
    c = compare_hardware(ds, "per_gpu", n_boot=20)
    assert c.mode == "cross-hardware" and "CROSS-HARDWARE" in c.label and "normalised per GPU" in c.label
    assert c.metric == "output_tokens_per_gpu" and c.front.metrics[0] == "output_tokens_per_gpu"
    for result in (c.ranking, c.front):
        assert len(result.groups) == 1 and result.groups[0].group["hardware_class"].startswith("cross-hardware (")
    rows = c.ranking.groups[0].rows
    df = trial_table(ds)
    pairs = set(zip(df.config_id.astype(str), df.hardware_class.astype(str)))
    assert {c.measured_on[r.config_id] for r in rows} == {A, B} and len(rows) == len(pairs)  # one row per pair
    for r in rows:
        cfg, cls = r.config_id.rsplit("@", 1)
        sub = df[(df.config_id == cfg) & (df.hardware_class == cls) & (df.status == "ok")]
        assert r.label.endswith(f" on {cls}")
        want = float(np.median(sub.output_throughput / sub.param_tensor_parallel_size))
        assert r.score.estimate == pytest.approx(want)


def test_per_gpu_hour_uses_the_users_prices_and_refuses_without_them(two: xr.Dataset) -> None:
    with pytest.raises(AnalysisInputError, match=f"no price.*for {A}, {B}.*never guessed|for {A}, {B}.*never guessed"):
        compare_hardware(two, "per_gpu_hour")
    with pytest.raises(AnalysisInputError, match=f"given for {B}\\b"):
        compare_hardware(two, "per_gpu_hour", prices={A: 2.0})
    with pytest.raises(AnalysisInputError, match=f"{A}.*> 0"):
        compare_hardware(two, "per_gpu_hour", prices={A: -1, B: 3.0})
    c = compare_hardware(two, "per_gpu_hour", prices={A: 2.0, B: 40.0}, n_boot=0)
    assert c.prices == {A: 2.0, B: 40.0} and c.prices_from == "argument" and "per GPU-hour" in c.label
    df = trial_table(two)
    for r in c.ranking.groups[0].rows:
        cfg, cls = r.config_id.rsplit("@", 1)
        sub = df[(df.config_id == cfg) & (df.hardware_class == cls) & (df.status == "ok")]
        want = float(np.median(sub.output_throughput * 3600.0 / c.prices[cls]))
        assert r.score.estimate == pytest.approx(want)
    spec_priced = two.assign_attrs(gpu_hour_prices='{"sim-gpu-a": 1.0, "sim-gpu-b": 2.0}')
    assert compare_hardware(spec_priced, "per_gpu_hour", n_boot=0).prices_from == "spec"


def test_cli_refuses_per_gpu_hour_without_prices_with_exit_2(two: xr.Dataset, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    nc = tmp_path / "results.nc"
    write_netcdf(two, nc)
    assert analysis_main(["analyze", str(nc), "--cross-hardware", "per_gpu_hour"]) == 2
    assert "never guessed" in capsys.readouterr().err
    assert analysis_main(["analyze", str(nc), "--cross-hardware", "per_gpu_hour", "--gpu-hour-price", "a100"]) == 2
    assert "--gpu-hour-price 'a100'" in capsys.readouterr().err
    assert parse_prices(["a=2.5", "b=4"]) == {"a": 2.5, "b": 4.0} and parse_prices([]) is None


def _with_failover(ds: xr.Dataset) -> tuple[xr.Dataset, np.ndarray]:
    """Two trials of class a's first config tagged as moved there from class b."""
    hw = ds["hardware_class"].values.astype(str)
    cfg = ds["config_id"].values.astype(str)
    ok = ds["status"].values.astype(str) == "ok"
    target = np.flatnonzero((hw == A) & ok & (cfg == cfg[(hw == A) & ok][0]))[:2]
    tags = np.full(ds.sizes["trial"], "", dtype=object)
    tags[target[0]] = f"{FAILOVER_PREFIX}{B}"
    tags[target[1]] = f'["other", "{FAILOVER_PREFIX}{B}"]'
    return ds.assign_coords(tags=("trial", tags)), target


def test_tags_are_read_in_either_form() -> None:
    assert parse_tags("x, failover-from:node-b") == ["x", "failover-from:node-b"]
    assert parse_tags('["failover-from:h100"]') == ["failover-from:h100"]
    assert failover_sources(["", "failover-from:h100", "x"]).tolist() == ["", "h100", ""]


def test_failover_trials_are_marked_by_default_and_can_be_left_out(two: xr.Dataset) -> None:
    ds, moved = _with_failover(two)
    cfg = str(ds["config_id"].values[moved[0]])
    res = rank(ds, n_boot=20)
    marked = {(g.group["hardware_class"], r.config_id): r.n_failover for g in res.groups for r in g.rows}
    assert marked[(A, cfg)] == 2 and sum(marked.values()) == 2
    assert [w for w in res.warnings if w.code == "failover_trials" and B in w.message]
    pts = {(g.group["hardware_class"], p.config_id): p.n_failover for g in front(ds, n_boot=0).groups for p in g.points}
    assert pts[(A, cfg)] == 2 and sum(pts.values()) == 2

    without = ds.isel(trial=np.setdiff1d(np.arange(ds.sizes["trial"]), moved))
    left = rank(ds, n_boot=20, include_failover=False)
    assert [_order(g) for g in left.groups] == [_order(g) for g in rank(without, n_boot=20).groups]
    assert [w for w in left.warnings if w.code == "failover_excluded"]
    assert all(r.n_failover == 0 for g in left.groups for r in g.rows)

    imp = importance(ds, hardware_class=A, **FAST)
    assert [w for w in imp.warnings if w.code == "failover_trials"]
    imp_out = importance(ds, hardware_class=A, include_failover=False, **FAST)
    assert imp_out.n_trials == imp.n_trials - 2
    assert [p.permutation.estimate for p in imp_out.parameters] == \
        [p.permutation.estimate for p in importance(without, hardware_class=A, **FAST).parameters]
    fail = failure_probability(ds, include_failover=False)
    assert fail.n_trials == failure_probability(without).n_trials == ds.sizes["trial"] - 2
    assert ds.sweep.filter(include_failover=False).sizes["trial"] == ds.sizes["trial"] - 2
