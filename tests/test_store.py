"""The store keeps every attempt and never overwrites a measurement."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.dataset import build_dataset, write_dataset
from coordinator.store import Store, StoreError
from coordinator.sweep import select_work
from servetune.manifest import TrialManifest, plan_grid
from servetune.spec import parse_spec

SPEC = """
name: store-test
engine: {grid: {max_num_seqs: [2, 4]}, fixed: {max_model_len: 256}}
load_points:
  - {name: a, request_rate: 1, num_requests: 2, input_len: 8, output_len: 8}
"""


def _setup(tmp_path: Path) -> tuple[Store, list[str]]:
    spec = parse_spec(SPEC)
    plan = plan_grid(spec)
    store = Store.open(tmp_path / "exp")
    store.record_plan(spec.spec_hash(), spec.model_dump(mode="json"), SPEC, plan)
    return store, [m.trial_id for m in plan.trials()]


def test_attempts_are_kept_and_results_never_overwritten(tmp_path: Path) -> None:
    store, (t0, t1) = _setup(tmp_path)
    a1 = store.begin_attempt(t0, daemon_id="d", batch_id="b", spec_hash="h")
    store.finish_attempt(t0, a1, status="failed", failure_kind="transport", error="lost", submission_id=None,
                         record=None, metrics=None, hardware_class=None)
    a2 = store.begin_attempt(t0, daemon_id="d", batch_id="b", spec_hash="h")
    assert (a1, a2) == (1, 2)
    path = store.finish_attempt(t0, a2, status="ok", failure_kind=None, error=None, submission_id="s",
                                record={"x": 1}, metrics={"output_throughput": 5.0}, hardware_class="cpu-2c-AVX2")
    assert isinstance(path, str) and Path(path).read_text()
    with pytest.raises(StoreError, match="already finished"):
        store.finish_attempt(t0, a2, status="failed", failure_kind="measurement", error="x", submission_id="s2",
                             record={"x": 2}, metrics=None, hardware_class=None)
    with pytest.raises(StoreError, match="refusing to overwrite"):
        store._write_result_file(t0, a2, {"x": 3})
    assert '"x": 1' in Path(path).read_text()
    assert [a.status for a in store.attempts(t0)] == ["failed", "ok"]


def test_abandoned_attempts_become_transport_failures_and_are_rerun(tmp_path: Path) -> None:
    store, (t0, t1) = _setup(tmp_path)
    store.begin_attempt(t0, daemon_id="d", batch_id="b", spec_hash="h")
    a = store.begin_attempt(t1, daemon_id="d", batch_id="b", spec_hash="h")
    store.finish_attempt(t1, a, status="failed", failure_kind="measurement", error="OOM", submission_id="s",
                         record={"y": 1}, metrics={}, hardware_class=None)
    closed = store.close_abandoned("coordinator died")
    assert [c[0] for c in closed] == [t0]
    plan = plan_grid(parse_spec(SPEC))
    work, skipped = select_work(plan, store, retry_failed=False)
    assert [t.trial_id for w in work for t in w.trials] == [t0]
    assert skipped == {t1: "failed (measurement)"}
    work, _ = select_work(plan, store, retry_failed=True)
    assert sorted(t.trial_id for w in work for t in w.trials) == sorted([t0, t1])


def test_dataset_rows_holes_and_atomic_write(tmp_path: Path) -> None:
    store, (t0, t1) = _setup(tmp_path)
    a = store.begin_attempt(t0, daemon_id="d", batch_id="b", spec_hash="h")
    metrics = {"quantiles": [0.5, 0.9, 0.95, 0.99], "ttft_ms": [1.0, 2.0, 3.0, 4.0], "output_throughput": 7.5,
               "client_fell_behind": False}
    store.finish_attempt(t0, a, status="ok", failure_kind=None, error=None, submission_id="s", record={"m": 1},
                         metrics=metrics, hardware_class="cpu-2c-AVX2")
    ds = build_dataset(store)
    assert ds.sizes == {"trial": 2, "quantile": 4}
    by_id = {str(t): i for i, t in enumerate(ds.trial_id.values)}
    assert str(ds.status.values[by_id[t0]]) == "ok" and str(ds.status.values[by_id[t1]]) == "hole"
    assert float(ds.output_throughput.values[by_id[t0]]) == 7.5
    assert list(ds.ttft_ms.values[by_id[t0]]) == [1.0, 2.0, 3.0, 4.0]
    assert "max_num_seqs" in ds.attrs["swept_parameters"]
    assert ds.attrs["design"] == "grid"
    path = write_dataset(store)
    import analysis

    loaded = analysis.load(tmp_path / "exp")
    assert path.exists() and loaded.sizes["trial"] == 2
    assert int(loaded.started_at.values[by_id[t0]]) == store.attempts(t0)[0].started_at_us
    assert not list((tmp_path / "exp").glob(".results-*"))


def _visible_ok(folder: Path) -> int:
    """Finished ok attempts another process would see now (a read-only connection)."""
    reader = Store.open_readonly(folder)
    try:
        return sum(1 for a in reader.all_attempts() if a.status == "ok")
    finally:
        reader.close()


def test_group_commit_makes_many_results_durable_in_one_transaction(tmp_path: Path) -> None:
    store, trials = _setup(tmp_path)
    for t in trials:
        store.begin_attempt(t, daemon_id="d", batch_id="b", spec_hash="h")
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)
    with store.group():
        for t in trials:
            path = store.finish_attempt(t, 1, status="ok", failure_kind=None, error=None, submission_id="s",
                                        record={"t": t}, metrics={}, hardware_class=None)
            assert path is not None and not Path(path).exists(), "a result file waits for the commit"
        assert _visible_ok(store.folder) == 0, "nothing is committed (nor may be ACKed) inside the group"
    store._conn.set_trace_callback(None)
    assert sum(1 for s in statements if s.strip().upper() == "COMMIT") == 1
    assert _visible_ok(store.folder) == len(trials)
    assert store.write_result_files() == len(trials)
    assert all((store.folder / "results" / t / "attempt-1.json").read_text() == f'{{"t": "{t}"}}' for t in trials)


def test_a_failed_operation_in_a_group_leaves_the_others_and_an_escaping_error_rolls_back(tmp_path: Path) -> None:
    store, (t0, t1) = _setup(tmp_path)
    store.begin_attempts({t0: 1, t1: 1}, daemon_id="d", batch_id="b", spec_hash="h")
    with pytest.raises(StoreError, match="attempt 1 requested, but the next attempt is 2"):
        store.begin_attempts({t0: 2, t1: 1}, daemon_id="d", batch_id="b", spec_hash="h")  # all or nothing
    assert [a.attempt for a in store.attempts(t0)] == [1]
    with store.group():
        store.finish_attempt(t0, 1, status="ok", failure_kind=None, error=None, submission_id="s", record={"a": 1},
                             metrics={}, hardware_class=None)
        with pytest.raises(StoreError, match="no attempt 5"):
            store.finish_attempt(t1, 5, status="ok", failure_kind=None, error=None, submission_id="s",
                                 record={"b": 1}, metrics={}, hardware_class=None)
    store.write_result_files()
    assert [a.status for a in store.attempts(t0)] == ["ok"] and [a.status for a in store.attempts(t1)] == ["running"]
    with pytest.raises(RuntimeError), store.group():
        store.finish_attempt(t1, 1, status="ok", failure_kind=None, error=None, submission_id="s", record={"b": 1},
                             metrics={}, hardware_class=None)
        raise RuntimeError("the loop stopped before the commit")
    assert [a.status for a in store.attempts(t1)] == ["running"]
    assert store.write_result_files() == 0 and not (store.folder / "results" / t1).exists()


_CRASH_AFTER_COMMIT = """
import os, sys
import json
import os
import subprocess
import sys
from pathlib import Path
from coordinator.store import Store
store = Store.open(Path(sys.argv[1]))
trials = sys.argv[2:]
with store.group():
    for t in trials:
        store.finish_attempt(t, 1, status="ok", failure_kind=None, error=None, submission_id="s",
                             record={"t": t, "samples": [1, 2, 3]}, metrics={"m": 1}, hardware_class=None)
# committed, so its ACKs could go out now; the coordinator dies before writing any result file
os._exit(9)
"""


def test_a_crash_between_commit_and_result_files_loses_nothing(tmp_path: Path) -> None:
    store, trials = _setup(tmp_path)
    for t in trials:
        store.begin_attempt(t, daemon_id="d", batch_id="b", spec_hash="h")
    store.close()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-c", _CRASH_AFTER_COMMIT, str(tmp_path / "exp"), *trials], env=env,
                          timeout=120)
    assert proc.returncode == 9
    assert not any((tmp_path / "exp" / "results" / t / "attempt-1.json").exists() for t in trials)
    # a partly written file (a crash mid-write) is repaired too
    (tmp_path / "exp" / "results" / trials[0]).mkdir(parents=True)
    (tmp_path / "exp" / "results" / trials[0] / "attempt-1.json").write_text('{"t": ')
    reopened = Store.open(tmp_path / "exp")  # settles what the crash left
    for t in trials:
        [att] = reopened.attempts(t)
        assert att.status == "ok" and att.result_path
        record = json.loads((reopened.folder / att.result_path).read_text())
        assert record == {"t": t, "samples": [1, 2, 3]}
    assert reopened._conn.execute("SELECT COUNT(*) FROM pending_results").fetchone()[0] == 0
    reopened.close()


def test_result_files_left_to_another_process_are_written_from_sqlite_and_settled(tmp_path: Path) -> None:
    store, trials = _setup(tmp_path)
    store.defer_result_files = True
    with store.group():
        for t in trials:
            store.begin_attempt(t, daemon_id="d", batch_id="b", spec_hash="h")
            store.finish_attempt(t, 1, status="ok", failure_kind=None, error=None, submission_id="s",
                                 record={"t": t}, metrics={}, hardware_class=None)
    assert store.write_result_files() == 0
    files = [store.folder / "results" / t / "attempt-1.json" for t in trials]
    assert not any(f.exists() for f in files)
    reader = Store.open_readonly(store.folder)  # as the results.nc writer's process does
    last = reader.materialize_result_files(0)
    files[1].unlink()  # one it did not get to: the store's close writes it
    assert reader.materialize_result_files(last) == last  # nothing new after that row
    reader.close()
    assert files[0].read_text() == f'{{"t": "{trials[0]}"}}' and not files[1].exists()
    store.close()
    assert [f.read_text() for f in files] == [f'{{"t": "{t}"}}' for t in trials]
    again = Store.open(tmp_path / "exp")
    assert again._conn.execute("SELECT COUNT(*) FROM pending_results").fetchone()[0] == 0
    again.close()


def test_a_store_rebuilt_beside_old_results_refuses_to_overwrite_them(tmp_path: Path) -> None:
    """experiment.sqlite deleted, results/ kept: attempt 1 starts again, and its result file is
    refused before anything of it is stored (the old measurement stays as it was)."""
    store, (t0, _t1) = _setup(tmp_path)
    a = store.begin_attempt(t0, daemon_id="d", batch_id="b", spec_hash="h")
    old = store.finish_attempt(t0, a, status="ok", failure_kind=None, error=None, submission_id="s",
                               record={"old": 1}, metrics={}, hardware_class=None)
    store.close()
    (tmp_path / "exp" / "experiment.sqlite").unlink()
    for extra in ("experiment.sqlite-wal", "experiment.sqlite-shm"):
        (tmp_path / "exp" / extra).unlink(missing_ok=True)
    store, _ = _setup(tmp_path)
    a = store.begin_attempt(t0, daemon_id="d", batch_id="b", spec_hash="h")
    assert a == 1
    with store.group():
        with pytest.raises(StoreError, match="refusing to overwrite"):
            store.finish_attempt(t0, a, status="ok", failure_kind=None, error=None, submission_id="s2",
                                 record={"new": 2}, metrics={}, hardware_class=None)
    store.write_result_files()
    assert json.loads(Path(old).read_text()) == {"old": 1}
    assert [x.status for x in store.attempts(t0)] == ["running"]


def test_the_writer_child_parses_each_manifest_once_across_rewrites(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    store, ids = _setup(tmp_path)
    cache: dict = {}
    store.manifest_cache = cache
    first = store.trials()
    assert [t for t, _, _ in first] == ids and set(cache) == set(ids)
    parsed = []
    real = TrialManifest.model_validate_json
    monkeypatch.setattr(TrialManifest, "model_validate_json", lambda text: parsed.append(text) or real(text))
    again = store.trials()
    assert parsed == [] and [m for _, m, _ in again] == [m for _, m, _ in first]
    assert all(a is b for (_, a, _), (_, b, _) in zip(again, first))
    cache[ids[0]] = ("stale text", cache[ids[0]][1])  # text that is not the row's: parsed again
    store.trials()
    assert len(parsed) == 1


def test_a_temporary_name_left_by_a_dead_process_is_stepped_around(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import itertools

    import coordinator.store as store_mod

    store, (t0, _t1) = _setup(tmp_path)
    folder = tmp_path / "exp" / "results" / t0
    folder.mkdir(parents=True)
    stale = folder / f".attempt-{os.getpid()}-7.json"
    stale.write_text("left by a process that had this pid")
    monkeypatch.setattr(store_mod, "_TMP_SEQ", itertools.count(7))
    a = store.begin_attempt(t0, daemon_id="d", batch_id="b", spec_hash="h")
    path = store.finish_attempt(t0, a, status="ok", failure_kind=None, error=None, submission_id="s",
                                record={"kept": 1}, metrics={}, hardware_class=None)
    assert json.loads(Path(path).read_text()) == {"kept": 1}
    assert stale.read_text() == "left by a process that had this pid"
    assert sorted(p.name for p in folder.iterdir()) == sorted([stale.name, f"attempt-{a}.json"])
