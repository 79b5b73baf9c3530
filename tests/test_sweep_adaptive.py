"""The Optuna planner driven ask/tell by the sweep, from YAML through the coordinator and a child
daemon on the SIMULATED backend (no vLLM): the budget is measured, every batch after the first is
what the planner asked given the results told, and a stopped sweep resumes from the store."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

import analysis
from coordinator.planning import create_planner
from coordinator.store import Store
from servetune.ranking import TrialSummary
from servetune.spec import ExperimentSpec, load_spec
from tests.conftest import cli_env, coordinator_cmd

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "optuna-sim.yaml"
NAME = "optuna-sim"


def _sweep(root: Path, cache: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(coordinator_cmd("sweep", *extra, "--results-root", str(root)),
                          capture_output=True, text=True, timeout=120, env=cli_env(cache))


def _batches(folder: Path) -> list[tuple[int, str, str]]:
    """(batch index, config id, trial id) of every planned trial, in run order."""
    conn = sqlite3.connect(folder / "experiment.sqlite")
    try:
        return list(conn.execute("SELECT s.batch_index, t.config_id, s.trial_id FROM spec_trials s JOIN trials t"
                                 " USING (trial_id) ORDER BY s.run_order"))
    finally:
        conn.close()


def _replay(spec: ExperimentSpec, folder: Path) -> list[tuple[str, float]]:
    """The (config, fidelity) pairs a fresh planner asks when told, batch by batch (rung by rung for
    successive halving), the results the sweep stored."""
    store = Store.open_readonly(folder)
    try:
        latest = store.latest_finished()
        told: dict[tuple[str, float], list[TrialSummary]] = {}
        for tid, m, _ in store.trials():
            a = latest[tid]
            told.setdefault((m.config_id, m.fidelity), []).append(TrialSummary(
                trial_id=tid, config_id=m.config_id, config_label="", load_point=m.load_point.name,
                status=a.status, failure_kind=a.failure_kind, metrics=a.metrics or {}))
    finally:
        store.close()
    planner, asked = create_planner(spec), []
    while not planner.done:
        batch = planner.ask_at()
        assert batch, "the planner must ask while it is not done"
        for c, f in batch:
            asked.append((c.config_id, f))
            planner.tell_at(c, f, told[(c.config_id, f)])
    return asked


def stop_in_the_middle(done: Path, folder: Path, never_asked: list[int], lost: int,
                       never_granted: int) -> tuple[dict[int, str], list[tuple[Any, ...]]]:
    """A copy in ``folder`` of the finished experiment ``done`` as a sweep stopped mid-way leaves it:
    the trials of batches ``never_asked`` not planned yet, batch ``lost``'s lost to transport,
    ``never_granted``'s planned but never run. Returns the trial id per batch index of ``done`` (one
    trial per batch) and the ok attempts kept (trial id, attempt, metrics JSON)."""
    shutil.copytree(done, folder, ignore=shutil.ignore_patterns("results.nc"))
    ids = {i: t for i, _, t in _batches(done)}
    kept = _cut(folder, [ids[i] for i in never_asked], ids[lost], ids[never_granted])
    return ids, kept


def _cut(folder: Path, never_asked: list[str], lost: str, never_granted: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(folder / "experiment.sqlite")
    with conn:
        marks = ",".join("?" * len(never_asked))
        conn.execute(f"DELETE FROM attempts WHERE trial_id IN ({marks})", never_asked)
        conn.execute(f"DELETE FROM spec_trials WHERE trial_id IN ({marks})", never_asked)
        conn.execute(f"DELETE FROM trials WHERE trial_id IN ({marks})", never_asked)
        conn.execute("UPDATE attempts SET status='failed', failure_kind='transport', error='daemon lost',"
                     " metrics_json=NULL WHERE trial_id=?", (lost,))
        conn.execute("DELETE FROM attempts WHERE trial_id=?", (never_granted,))
        kept = list(conn.execute("SELECT trial_id, attempt, metrics_json FROM attempts WHERE status='ok'"))
    conn.close()
    for t in [never_granted, *never_asked]:  # a trial never granted has no result file
        shutil.rmtree(folder / "results" / t, ignore_errors=True)
    return kept


def attempts_keeping(folder: Path, kept: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Every attempt (trial id, attempt, status, failure kind), once each ``kept`` ok attempt is
    checked to be stored as it was before the resume."""
    conn = sqlite3.connect(folder / "experiment.sqlite")
    try:
        for row in kept:
            assert conn.execute("SELECT metrics_json FROM attempts WHERE trial_id=? AND attempt=?",
                                row[:2]).fetchone()[0] == row[2], "an earlier result is kept as it was"
        return list(conn.execute("SELECT trial_id, attempt, status, failure_kind FROM attempts"))
    finally:
        conn.close()


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    tmp = tmp_path_factory.mktemp("adaptive")
    cache = tmp / "cache"
    proc = _sweep(tmp / "runs", cache, str(CONFIG))
    return tmp / "runs", cache, proc


def test_an_optuna_sweep_measures_its_budget_chosen_by_the_planner(swept: tuple[Path, Path, Any]) -> None:
    root, _, proc = swept
    assert proc.returncode == 0, proc.stderr[-3000:]
    spec = load_spec(CONFIG)
    assert spec.planner.kind == "optuna" and spec.planner.n_trials == 8 and spec.planner.batch == 2
    rows = _batches(root / NAME)
    configs = [c for _, c, _ in rows]
    assert len(rows) == len(set(configs)) == 8, "n_trials distinct configs, one trial each (1 load point, 1 repeat)"
    assert [i for i, _, _ in rows] == list(range(8))
    assert configs == [c for c, _ in _replay(spec, root / NAME)], \
        "each batch is what the planner asked, told the stored results"
    assert proc.stderr.count("optuna planner: queued 2 more engine config batch(es)") >= 1
    ds = analysis.load(NAME, results_root=root)
    assert ds.attrs["design"] == "adaptive"
    assert ds.sizes["trial"] == 8 and set(ds.status.values.tolist()) == {"ok"}


def test_a_stopped_optuna_sweep_resumes_from_the_store(swept: tuple[Path, Path, Any], tmp_path: Path) -> None:
    """The store is left as a sweep stopped during its second batch leaves it: batches 0-1 measured,
    batch 2 lost to transport, batch 3 never granted, nothing asked after. The resumed sweep rebuilds
    the planner from the store, runs batches 2-3 again, asks the rest and ends with the budget: the
    same configs as the uninterrupted sweep, no trial twice, every earlier result kept."""
    root, cache, proc = swept
    assert proc.returncode == 0, proc.stderr[-3000:]
    full = _batches(root / NAME)
    folder = tmp_path / "runs" / NAME
    by_index, kept = stop_in_the_middle(root / NAME, folder, never_asked=[4, 5, 6, 7], lost=2, never_granted=3)
    again = _sweep(tmp_path / "runs", cache, NAME, "--resume")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "planner's history rebuilt from 4 engine config(s) planned before" in again.stdout + again.stderr
    rows = _batches(folder)
    assert [(i, c) for i, c, _ in rows] == [(i, c) for i, c, _ in full], "the uninterrupted sweep's configs"
    attempts = attempts_keeping(folder, kept)
    ok = [t for t, _, s, _ in attempts if s == "ok"]
    assert len(ok) == len(set(ok)) == 8, "one ok attempt per trial: none measured twice"
    assert {t for t, _, s, k in attempts if s == "failed"} == {by_index[2]}, "the lost attempt stays on record"
    assert {t for t, a, _, _ in attempts if a > 1} == {by_index[2]}, "only the lost trial ran again"
    ds = analysis.load(NAME, results_root=tmp_path / "runs")
    assert ds.attrs["design"] == "adaptive" and int((ds.status == "ok").sum()) == 8


def test_the_loop_tells_measurement_failures_and_never_transport_ones(tmp_path: Path) -> None:
    """The sweep's side of ask/tell on a real store, no daemon: a config whose trial failed as a
    measurement is told (as FAIL), one lost to transport is not (nothing more is asked until it
    finishes), and a restored loop rebuilds the same history."""
    from coordinator.adaptive_loop import AdaptiveLoop

    spec = load_spec(CONFIG)
    h = spec.spec_hash()
    store = Store.open(tmp_path / "exp")
    try:
        loop = AdaptiveLoop(spec, h)
        plan = loop.start(store)
        store.record_plan(h, spec.model_dump(mode="json"), None, plan)
        first, second = (b.trials[0] for b in plan.batches)

        def finish(m: Any, status: str, kind: str | None) -> None:
            n = store.begin_attempt(m.trial_id, daemon_id="d", batch_id="b", spec_hash=h)
            store.finish_attempt(m.trial_id, n, status=status, failure_kind=kind, error=None, submission_id=None,
                                 record=None, metrics={"output_throughput": 1.0} if status == "ok" else {},
                                 hardware_class=None)

        finish(first, "failed", "measurement")
        finish(second, "failed", "transport")
        assert loop.settle(store) == [], "a config lost to transport is not told: the batch is not over"
        assert list(loop.untold) == [(second.config_id, 1.0)]
        assert [s.values for s in loop.planner.history] == [None], "the measurement failure is told as FAIL"  # type: ignore[attr-defined]
        finish(second, "ok", None)
        more = loop.settle(store)
        assert len(more) == 2 and not loop.untold.keys() - {(b.config_id, 1.0) for b in more}
        assert [s.values for s in loop.planner.history] == [None, (1.0,)]  # type: ignore[attr-defined]
        again = AdaptiveLoop(spec, h)
        replan = again.start(store)
        assert [b.config_id for b in replan.batches] == [b.config_id for b in (*plan.batches, *more)]
        assert again.restored == 4 and set(again.untold) == {(b.config_id, 1.0) for b in more}
        assert again.planner.history == loop.planner.history  # type: ignore[attr-defined]
    finally:
        store.close()
