"""The foundation of the analyses: trial table, parameters, derived metrics, filters, combining
experiments, and the causal/associational wording from the recorded design."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

import analysis  # noqa: F401  (registers ds.sweep)
from analysis.common import Interval, claim_for, context_of, effect_sentence, jsonable, percentile_interval
from analysis.frame import AnalysisInputError, design_matrix, metric_sense, parameters, trial_table
from analysis.load import combine
from analysis.synthetic import planted


def test_parameters_kinds_levels_and_encoding() -> None:
    ds, truth = planted(n_configs=200, n_params=8, seed=1)
    ps = {p.name: p for p in parameters(ds)}
    assert set(ps) == set(truth.params)
    assert ps["max_num_seqs"].kind == "numeric" and ps["max_num_seqs"].log
    assert ps["max_num_seqs"].levels == (4, 8, 16, 32, 64, 128, 256)
    assert ps["enable_chunked_prefill"].kind == "bool"
    assert ps["gpu_memory_utilization"].kind == "numeric" and not ps["gpu_memory_utilization"].log
    x = design_matrix(trial_table(ds), [ps["max_num_seqs"], ps["enable_chunked_prefill"]])
    assert set(np.unique(x[:, 0])) <= {2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0}
    assert set(np.unique(x[:, 1])) == {0.0, 1.0}
    assert ps["max_num_seqs"].decode(5.0) == 32.0
    with pytest.raises(AnalysisInputError, match="no_such_param"):
        parameters(ds, ["no_such_param"])


def test_categorical_and_missing_values_encode() -> None:
    ds, _ = planted(n_configs=50, params=["dtype", "max_num_seqs"], seed=2)
    p = parameters(ds, ["dtype"])[0]
    assert p.kind == "categorical" and p.levels == ("bfloat16", "float16", "float32")
    enc = p.encode(np.array(["float16", "", None, "bfloat16"], dtype=object))
    assert enc[0] == 1.0 and math.isnan(enc[1]) and math.isnan(enc[2]) and enc[3] == 0.0


def test_quantile_columns_and_metric_sense() -> None:
    ds, _ = planted(n_configs=10, n_params=2, seed=3)
    df = trial_table(ds)
    ok = df[df.status == "ok"].iloc[0]
    i = int(ok.name)
    assert ok["ttft_ms_p99"] == pytest.approx(float(ds["ttft_ms"].sel(quantile=0.99).values[i]))
    assert metric_sense("output_throughput") == 1 and metric_sense("ttft_ms_p99") == -1
    assert metric_sense("output_tokens_per_dollar") == 1
    with pytest.raises(AnalysisInputError, match="bogus"):
        metric_sense("bogus")


def test_derived_metrics_per_user_gpu_and_cost() -> None:
    ds, _ = planted(n_configs=40, params=["max_num_seqs", "tensor_parallel_size"], seed=4,
                    hardware_classes=("sim-gpu-a", "sim-gpu-b"), gpu_hour_prices={"sim-gpu-a": 2.0})
    df = trial_table(ds)
    ok = df[df.status == "ok"]
    # closed loop at concurrency 32: tokens/s per user = output throughput / 32
    assert np.allclose(ok.output_tokens_per_user, ok.output_throughput / 32.0)
    assert set(ok.concurrency_source) == {"max_concurrency"}
    assert np.allclose(ok.output_tokens_per_gpu, ok.output_throughput / ok.param_tensor_parallel_size)
    a = ok[ok.hardware_class == "sim-gpu-a"]
    assert np.allclose(a.output_tokens_per_dollar, a.output_throughput * 3600 / (a.param_tensor_parallel_size * 2.0))
    b = ok[ok.hardware_class == "sim-gpu-b"]
    assert b.output_tokens_per_dollar.isna().all(), "no price for sim-gpu-b: never invented"


def test_open_loop_concurrency_from_littles_law() -> None:
    ds, _ = planted(n_configs=5, n_params=2, seed=5)
    ds = ds.assign_coords(max_concurrency=("trial", np.full(ds.sizes["trial"], np.nan)))
    df = trial_table(ds)
    ok = df[df.status == "ok"]
    expected = ok.request_throughput * ok.mean_e2el_ms / 1000.0
    assert np.allclose(ok.concurrency, expected) and set(ok.concurrency_source) == {"littles_law"}


def test_filters_by_status_scenario_hardware_and_parameters() -> None:
    ds, _ = planted(n_configs=60, n_params=4, load_points=("a", "b"), baseline_every=10,
                    hardware_classes=("h1", "h2"), seed=6)
    sub = ds.sweep.filter(status="ok", scenario="b", hardware_class="h2", max_num_seqs=(8, 32),
                          enable_chunked_prefill=True, include_baseline=False)
    df = trial_table(sub)
    assert len(df) > 0
    assert set(df.status) == {"ok"} and set(df.load_point) == {"b"} and set(df.hardware_class) == {"h2"}
    assert df.param_max_num_seqs.between(8, 32).all() and df.param_enable_chunked_prefill.all()
    assert not df.is_baseline.any()
    assert ds.sweep.filter(dataset="random").sizes["trial"] == ds.sizes["trial"]
    with pytest.raises(AnalysisInputError, match="not_a_param"):
        ds.sweep.filter(not_a_param=3)


def test_combining_experiments_aligns_parameters_and_words_associations() -> None:
    a, _ = planted(n_configs=10, params=["max_num_seqs"], seed=1)
    b, _ = planted(n_configs=8, params=["max_num_seqs", "block_size"], seed=2)
    b.attrs["experiment"] = "second"
    both = combine([a, b])
    assert both.sizes["trial"] == a.sizes["trial"] + b.sizes["trial"]
    assert json.loads(both.attrs["experiments"]) == ["planted", "second"]
    assert np.isnan(both["param_block_size"].values[: a.sizes["trial"]].astype(float)).all()
    assert claim_for(a).kind == "effect" and claim_for(both).kind == "association"


@pytest.mark.parametrize(("design", "randomized", "kind"), [
    ("grid", True, "effect"), ("random", True, "effect"), ("quasi-random", True, "effect"),
    ("grid", False, "association"), ("adaptive", True, "association"), ("", True, "association"),
])
def test_claim_follows_the_recorded_design(design: str, randomized: bool, kind: str) -> None:
    ds, _ = planted(n_configs=5, n_params=2, seed=1)
    ds.attrs.update(design=design, randomized=int(randomized))
    claim = claim_for(ds)
    assert claim.kind == kind and claim.why
    sentence = effect_sentence(claim, context_of(ds, "lp"), "max_num_seqs", 4, 256, "output_throughput",
                               Interval(0.5, 0.4, 0.6))
    if kind == "effect":
        assert sentence.startswith("setting max_num_seqs from 4 to 256 changed output_throughput by +50%")
        assert "sim-gpu-a" in sentence and "vLLM synthetic" in sentence and "workload lp" in sentence
    else:
        assert "association" in sentence and claim.why in sentence
    assert claim_for(ds, tool_set=False).kind == "association"


def test_percentile_interval_and_jsonable() -> None:
    iv = percentile_interval(np.arange(1001, dtype=float))
    assert (iv.estimate, round(iv.low), round(iv.high)) == (500.0, 25, 975)
    assert math.isnan(percentile_interval([math.nan]).estimate)
    assert jsonable({"a": np.float64("nan"), "b": (np.int64(3), np.bool_(True)), "c": iv}) == {
        "a": None, "b": [3, True], "c": {"estimate": 500.0, "low": iv.low, "high": iv.high, "level": 0.95}}


def test_unset_environment_variable_is_a_level_of_its_own() -> None:
    ds, _ = planted(n_configs=6, params=["max_num_seqs"], seed=7)
    values = np.array(["" if i % 2 else "NOT_A_LEVEL" for i in range(ds.sizes["trial"])], dtype=object)
    ds = ds.assign_coords({"param_env.VLLM_LOGGING_LEVEL": ("trial", values)})
    p = {q.name: q for q in parameters(ds)}["env.VLLM_LOGGING_LEVEL"]
    assert p.kind == "categorical" and p.levels == ("", "NOT_A_LEVEL")
    assert p.encode(np.array(["", "NOT_A_LEVEL", None], dtype=object)).tolist() == [0.0, 1.0, 0.0]


# --- the lean table and the vectorised encoding --------------------------------------------------------


def test_lean_trial_table_equals_the_full_tables_columns() -> None:
    import pandas as pd

    from analysis.frame import DERIVED_COLUMNS, lean_table, table_columns

    ds, _ = planted(n_configs=40, params=["max_num_seqs", "tensor_parallel_size", "dtype"], seed=4, repeats=2,
                    hardware_classes=("sim-gpu-a", "sim-gpu-b"), gpu_hour_prices={"sim-gpu-a": 2.0},
                    load_points=("x", "y"), baseline_every=5)
    full = trial_table(ds)
    assert list(full.columns) == table_columns(ds)
    for cols in (table_columns(ds)[::-1], ["config_id", "ttft_ms_p99", "output_tokens_per_dollar", "status"],
                 list(DERIVED_COLUMNS), ["gpus"], ["status", "status"]):
        want = list(dict.fromkeys(cols))
        pd.testing.assert_frame_equal(trial_table(ds, columns=cols), full[want])
        lean = lean_table(ds, cols)  # text kept as numpy objects: the same values
        assert list(lean.columns) == want
        for c in want:
            a, b = lean[c].to_numpy(dtype=object), full[c].to_numpy(dtype=object)
            assert all((x == y) or (x != x and y != y) for x, y in zip(a, b)), c
    # names the dataset lacks are left out (the caller's own check names them)
    assert list(trial_table(ds, columns=["no_such", "config_id"]).columns) == ["config_id"]


def _encode_reference(p: Any, values: Any) -> np.ndarray:
    """The encoding as it was written before vectorising (one value at a time)."""
    from analysis.frame import _missing, _truthy

    arr = np.asarray(values, dtype=object)
    out = np.full(len(arr), np.nan)
    default = p.levels.index("") if p.kind == "categorical" and "" in p.levels else None
    for i, v in enumerate(arr):
        if _missing(v):
            if default is not None:
                out[i] = float(default)
            continue
        if p.kind == "numeric":
            out[i] = math.log2(float(v)) if p.log else float(v)
        elif p.kind == "bool":
            out[i] = 1.0 if _truthy(v) else 0.0
        else:
            out[i] = float(p.levels.index(v)) if v in p.levels else np.nan
    return out


def test_vectorised_encode_is_unchanged() -> None:
    import pandas as pd

    from analysis.frame import Parameter

    rng = np.random.default_rng(0)
    log_p = Parameter("max_num_seqs", "param_max_num_seqs", "numeric", (4, 8, 256), log=True)
    lin_p = Parameter("gpu_memory_utilization", "param_gpu_memory_utilization", "numeric", (0.8, 0.9))
    bool_p = Parameter("enforce_eager", "param_enforce_eager", "bool", (False, True))
    cat_p = Parameter("dtype", "param_dtype", "categorical", ("bfloat16", "float16"))
    env_p = Parameter("env.X", "param_env.X", "categorical", ("", "a", "b"))
    wide = rng.random(5000) * 1e4 + 1.0
    cases: list[tuple[Parameter, Any]] = [
        (log_p, np.array([4, 8, 256, 8], dtype=np.int64)),
        (log_p, np.array([4.0, np.nan, 256.0, 3.3])),
        (log_p, wide), (log_p, pd.Series(wide)),
        (log_p, [4, None, "", 8.0, "16"]),
        (lin_p, np.array([0.8, np.nan, 0.9])), (lin_p, [0.8, None, "0.85"]),
        (bool_p, np.array([True, False, True])), (bool_p, np.array([1.0, 0.0, np.nan, 2.0])),
        (bool_p, ["true", "False", "1", "no", None, "", True, 0]),
        (cat_p, np.array(["float16", "", None, "bfloat16", "int8"], dtype=object)),
        (cat_p, pd.Series(["float16", "bfloat16", None])), (cat_p, np.array(["float16", "bfloat16"])),
        (env_p, np.array(["a", "", None, "b", float("nan"), "c"], dtype=object)), (env_p, []),
    ]
    for p, values in cases:
        got = p.encode(values)
        ref = _encode_reference(p, values.to_numpy(dtype=object) if isinstance(values, pd.Series) else values)
        assert got.dtype == np.float64 and got.shape == ref.shape
        np.testing.assert_array_equal(got, ref)  # bit for bit, NaN where NaN
