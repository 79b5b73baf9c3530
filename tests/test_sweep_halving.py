"""Successive halving (``planner.kind: halving``): the rungs and their promotion rule on planted
results, and the planner driven by the sweep from YAML through the coordinator and a child daemon on
the SIMULATED backend (no vLLM): each rung runs shortened load points and records its fidelity, the
ranking and ``analysis.load`` keep screening trials apart, and a stopped sweep resumes from the store."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

import analysis
from coordinator.planning.halving import HalvingPlanner, rung_fidelities, rung_sizes
from coordinator.store import Store
from coordinator.summary import collect_summaries
from servetune.errors import SpecError
from servetune.manifest import MIN_FIDELITY_REQUESTS, EngineConfig, at_fidelity
from servetune.ranking import TrialSummary
from servetune.spec import ExperimentSpec, LoadPoint, load_spec, parse_spec
from tests.test_sweep_adaptive import _batches, _replay, _sweep, attempts_keeping, stop_in_the_middle

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "halving-sim.yaml"
NAME = "halving-sim"


def _spec(**planner: Any) -> ExperimentSpec:
    data = load_spec(CONFIG).model_dump(mode="json", exclude_none=True)
    data["planner"] = {"kind": "halving", "n_configs": 9, "seed": 7, **planner}
    return ExperimentSpec.model_validate(data)


def _told(config: EngineConfig, value: float | None, ttft_ms: float = 100.0) -> list[TrialSummary]:
    """One planted trial: ``value`` output tok/s (None: a measurement failure) at TTFT p99 ``ttft_ms``."""
    if value is None:
        return [TrialSummary(trial_id="t-" + config.config_id[:8], config_id=config.config_id, config_label="",
                             load_point="burst-c32", status="failed", failure_kind="measurement", metrics={})]
    slo = {"metric": "ttft_ms", "percentile": 99.0, "max_ms": 2000.0, "value_ms": ttft_ms, "met": ttft_ms <= 2000}
    return [TrialSummary(trial_id="t-" + config.config_id[:8], config_id=config.config_id, config_label="",
                         load_point="burst-c32", status="ok", failure_kind=None,
                         metrics={"output_throughput": value, "slos": [slo]})]


# ----------------------------------------------------------------------------- rungs


def test_rungs_run_from_the_lowest_fidelity_to_the_full_load_point() -> None:
    assert rung_fidelities(3, None) == [0.111111, 0.333333, 1.0]
    assert rung_fidelities(2, 0.25) == [0.25, 0.5, 1.0]
    assert rung_fidelities(3, 0.5) == [0.5, 1.0]
    assert rung_sizes(27, 3, 3) == [27, 9, 3] and rung_sizes(10, 3, 3) == [10, 3, 1] and rung_sizes(4, 3, 3) == [4, 1, 1]


def test_a_shortened_load_point_keeps_everything_but_its_length() -> None:
    lp = LoadPoint(name="c", max_concurrency=8, num_requests=288, warmup_requests=4, input_len=64)
    short = at_fidelity(lp, 1 / 9)
    assert short.num_requests == 32 and short.model_dump(exclude={"num_requests"}) == lp.model_dump(exclude={"num_requests"})
    assert at_fidelity(LoadPoint(name="c", max_concurrency=8, num_requests=20), 0.1).num_requests == MIN_FIDELITY_REQUESTS
    assert at_fidelity(LoadPoint(name="c", max_concurrency=8, num_requests=5), 0.1).num_requests == 5
    timed = at_fidelity(LoadPoint(name="r", request_rate=4, duration_s=90), 1 / 3)
    assert timed.duration_s == pytest.approx(30) and timed.num_requests is None
    assert at_fidelity(lp, 1.0) is lp


def test_the_best_third_meeting_the_slos_is_promoted_never_a_failed_config() -> None:
    planner = HalvingPlanner(_spec())
    first = planner.ask_at()
    assert [f for _, f in first] == [0.111111] * 9 and planner.ask_at() == [], "one rung at a time"
    configs = [c for c, _ in first]
    # planted: config 8 has the highest throughput but misses its SLO; 0 failed; 5 > 2 > 7 > the rest
    values = {0: None, 5: 900.0, 2: 800.0, 7: 700.0, 8: 5000.0}
    for i, c in enumerate(configs):
        planner.tell_at(c, 0.111111, _told(c, values.get(i, 100.0 + i), ttft_ms=9000.0 if i == 8 else 100.0))
    second = planner.ask_at()
    assert [f for _, f in second] == [0.333333] * 3
    assert {c.config_id for c, _ in second} == {configs[i].config_id for i in (2, 5, 7)}, "the 3 best meeting the SLO"
    assert [c.config_id for c, _ in second] == [configs[i].config_id for i in (2, 5, 7)], "in the draw's order"
    for c, _ in second:
        planner.tell_at(c, 0.333333, _told(c, 1000.0 if c.config_id == configs[7].config_id else 10.0))
    last = planner.ask_at()
    assert [(c.config_id, f) for c, f in last] == [(configs[7].config_id, 1.0)], "rung 1's best, at full fidelity"
    assert planner.done and planner.ask_at() == []


def test_a_rung_with_every_config_failed_ends_the_search() -> None:
    planner = HalvingPlanner(_spec())
    for c, f in planner.ask_at():
        planner.tell_at(c, f, _told(c, None))
    assert planner.ask_at() == [] and planner.done, "nothing to promote: done, never waiting for a tell"


def test_halving_refuses_what_it_cannot_plan_naming_the_key() -> None:
    data = load_spec(CONFIG).model_dump(mode="json", exclude_none=True)
    swept = [{"name": "rs", "num_requests": 16, "rate_sweep": {"max_concurrency": 8}}]
    for update, where in [({"planner": {"kind": "halving", "n_configs": 2}}, "planner.n_configs"),
                          ({"planner": {"kind": "grid", "eta": 3}}, "planner.eta"),
                          ({"planner": {"kind": "halving", "n_configs": 9, "min_fidelity": 1.5}}, "planner.min_fidelity"),
                          ({"load_points": swept}, "load_points[0].rate_sweep")]:
        with pytest.raises(SpecError) as err:
            parse_spec(yaml.safe_dump({**data, **update}))
        assert where in str(err.value), str(err.value)


def test_validate_says_the_first_rung_is_only_the_start(capsys: pytest.CaptureFixture[str]) -> None:
    from coordinator.cli import main

    assert main(["validate", str(CONFIG)]) == 0
    out = capsys.readouterr().out
    assert "halving planner (adaptive design, seed 7) over 24 engine configs; its first batch: 9 engine config(s)" in out
    assert "then 4 more engine config(s) on longer rungs, chosen from the results (9 -> 3 -> 1 configs" in out
    assert main(["validate", str(REPO / "configs" / "optuna-sim.yaml")]) == 0
    assert "then batches of 2 chosen from the results, up to 8 engine configs in all" in capsys.readouterr().out


# ----------------------------------------------------------------------------- through the sweep


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    tmp = tmp_path_factory.mktemp("halving")
    cache = tmp / "cache"
    return tmp / "runs", cache, _sweep(tmp / "runs", cache, str(CONFIG))


def test_a_halving_sweep_runs_each_rung_shortened_and_ranks_only_full_trials(swept: tuple[Path, Path, Any]) -> None:
    root, _, proc = swept
    assert proc.returncode == 0, proc.stderr[-3000:]
    spec = load_spec(CONFIG)
    store = Store.open_readonly(root / NAME)
    try:
        manifests = {tid: m for tid, m, _ in store.trials()}
        ranked = [s.trial_id for s in collect_summaries(store)]
    finally:
        store.close()
    assert [manifests[t].fidelity for t in ranked] == [1.0], "the ranking holds the full-fidelity trial only"
    rows = _batches(root / NAME)
    per_rung = [[manifests[t] for _, _, t in rows if manifests[t].fidelity == f] for f in (0.111111, 0.333333, 1.0)]
    assert [len(r) for r in per_rung] == [9, 3, 1], "9 -> 3 -> 1 configs, 1 load point and 1 repeat each"
    assert [{m.load_point.num_requests for m in r} for r in per_rung] == [{32}, {96}, {288}]
    assert [i for i, _, _ in rows] == list(range(13))
    replayed = _replay(spec, root / NAME)
    assert [{c for _, c, t in rows if manifests[t].fidelity == f} for f in (0.111111, 0.333333, 1.0)] == \
        [{c for c, g in replayed if g == f} for f in (0.111111, 0.333333, 1.0)], \
        "each rung is what the planner promoted, told the stored results (run order shuffled: randomize)"
    assert "halving planner: queued 3 more engine config batch(es)" in proc.stderr
    assert "12 screening trial(s) on shortened load points (9 at fidelity 0.111, 3 at fidelity 0.333)" in proc.stdout
    ds = analysis.load(NAME, results_root=root)
    assert ds.sizes["trial"] == 1 and ds.attrs["screening_trials"] == 12 and float(ds.fidelity[0]) == 1.0
    assert ds.attrs["design"] == "adaptive"
    from analysis.report import analyze
    from dashboards.app.marks import synthetic_html

    warnings = [w for w in analyze(ds, n_boot=5)["warnings"] if w["code"] == "screening"]
    assert warnings and warnings[0]["message"].startswith("12 screening trial(s) of successive halving")
    assert "12 screening trial(s) of successive halving" in synthetic_html(root / NAME), "the dashboard says so"
    every = analysis.load(NAME, results_root=root, fidelity="all")
    assert sorted(every.fidelity.values.tolist()) == [0.111111] * 9 + [0.333333] * 3 + [1.0]
    assert set(every.status.values.tolist()) == {"ok"}


def test_a_stopped_halving_sweep_resumes_from_the_store(swept: tuple[Path, Path, Any], tmp_path: Path) -> None:
    """A sweep stopped in its second rung (one of its trials lost to transport, the rest never run):
    the resumed sweep rebuilds the rungs from the store, runs the rest of rung 2 and promotes as the
    uninterrupted sweep did; no trial twice, every earlier result kept."""
    root, cache, proc = swept
    assert proc.returncode == 0, proc.stderr[-3000:]
    full = _batches(root / NAME)
    folder = tmp_path / "runs" / NAME
    by_index, kept = stop_in_the_middle(root / NAME, folder, never_asked=[12], lost=10, never_granted=11)
    again = _sweep(tmp_path / "runs", cache, NAME, "--resume")
    assert again.returncode == 0, again.stderr[-3000:]
    assert [(i, c) for i, c, _ in _batches(folder)] == [(i, c) for i, c, _ in full], "the uninterrupted sweep's rungs"
    attempts = attempts_keeping(folder, kept)
    ok = [t for t, _, s, _ in attempts if s == "ok"]
    assert len(ok) == len(set(ok)) == 13, "one ok attempt per trial: none measured twice"
    assert {t for t, a, _, _ in attempts if a > 1} == {by_index[10]}, "only the lost trial ran again"
