"""``recommend(ds, prepared=prepare(ds))`` decides exactly as ``recommend(ds)``: the dashboard keeps
the input-independent part (trial table, drift check with its warnings, fingerprint) per dataset
version and passes it to every later decision, so it must change nothing but the time taken."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from analysis.common import jsonable
from analysis.decision import prepare, recommend
from analysis.synthetic import planted


@pytest.fixture(scope="module")
def drifted():
    ds, _ = planted(n_configs=12, repeats=2, load_points=("a", "b"), baseline_every=4, drift_at=0.5,
                    drift_size=-0.5, fail_rate_region=0.0, fail_rate_base=0.0)
    return ds


@pytest.mark.parametrize("inputs", [
    {},
    {"weights": {"a": 3, "b": 1}, "rule": "regret"},
    {"include_drift": True, "slos": [{"metric": "ttft_ms", "percentile": 99, "max_ms": 1e9}]},
])
def test_a_prepared_decision_is_the_same_decision(drifted, inputs) -> None:
    plain = jsonable(recommend(drifted, n_boot=50, **inputs))
    assert plain["n_drift_excluded"] or inputs.get("include_drift")  # the drift check matters here
    assert jsonable(recommend(drifted, n_boot=50, prepared=prepare(drifted), **inputs)) == plain


def test_a_prepared_part_for_another_objective_is_not_used(drifted) -> None:
    # made for request_throughput (and marked so, with no trial suspect): the default objective is output_throughput
    other = dataclasses.replace(prepare(drifted), objective="request_throughput",
                                suspect=np.zeros(drifted.sizes["trial"], dtype=bool))
    assert jsonable(recommend(drifted, n_boot=50, prepared=other)) == jsonable(recommend(drifted, n_boot=50))


def test_drift_unchecked_warning_survives_preparation(drifted) -> None:
    no_baselines = drifted.isel(trial=~drifted["is_baseline"].values.astype(bool))
    prepared = prepare(no_baselines)
    d = recommend(no_baselines, n_boot=20, prepared=prepared)
    assert [w.code for w in d.warnings].count("drift_unchecked") == 1
    assert jsonable(d) == jsonable(recommend(no_baselines, n_boot=20))
