"""The results.nc writer process: writes the result files left to it and results.nc from the store
read-only, coalesces requests, and ends when asked (or when its pipe closes)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from coordinator.dataset_writer import DatasetWriter
from coordinator.store import Store
from servetune.manifest import plan_grid
from servetune.schema import DATASET_FILE
from servetune.spec import parse_spec

SPEC = """
name: writer-test
engine: {grid: {max_num_seqs: [2, 4]}, fixed: {max_model_len: 256}}
load_points:
  - {name: a, request_rate: 1, num_requests: 2, input_len: 8, output_len: 8}
"""


def _wait_for(cond, timeout_s: float = 60.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def test_writer_process_writes_deferred_result_files_and_the_dataset(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    spec = parse_spec(SPEC)
    plan = plan_grid(spec)
    store = Store.open(tmp_path / "exp")
    store.record_plan(spec.spec_hash(), spec.model_dump(mode="json"), SPEC, plan)
    trials = [m.trial_id for m in plan.trials()]
    store.defer_result_files = True
    with store.group():
        for t in trials:
            store.begin_attempt(t, daemon_id="d", batch_id="b", spec_hash="h")
            store.finish_attempt(t, 1, status="ok", failure_kind=None, error=None, submission_id="s",
                                 record={"t": t}, metrics={"output_throughput": 1.0}, hardware_class=None)
    store.write_result_files()
    files = [store.folder / "results" / t / "attempt-1.json" for t in trials]
    assert not any(f.exists() for f in files)
    repo = str(Path(__file__).resolve().parents[1])  # the child imports this checkout's coordinator
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p))
    writer = DatasetWriter(store.folder, debounce_s=0.1)
    try:
        assert writer.request() and writer.request()  # coalesced into one rewrite (or two)
        assert _wait_for(lambda: (store.folder / DATASET_FILE).exists() and all(f.exists() for f in files))
        assert [f.read_text() for f in files] == [f'{{"t": "{t}"}}' for t in trials]
    finally:
        writer.close(timeout_s=30.0)
    assert not writer.alive and not writer.request()
    store.close()


def test_final_rewrite_in_a_child_writes_the_dataset_and_says_none_when_it_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """write_final: the sweep's final results.nc, written by a ``--once`` child (the coordinator's
    process never imports xarray); a failed child gives None (the coordinator then writes it itself)."""
    import xarray as xr

    from coordinator.dataset_writer import write_final

    spec = parse_spec(SPEC)
    plan = plan_grid(spec)
    store = Store.open(tmp_path / "exp")
    store.record_plan(spec.spec_hash(), spec.model_dump(mode="json"), SPEC, plan)
    trials = [m.trial_id for m in plan.trials()]
    store.begin_attempt(trials[0], daemon_id="d", batch_id="b", spec_hash="h")
    store.finish_attempt(trials[0], 1, status="ok", failure_kind=None, error=None, submission_id="s",
                         record={"t": trials[0]}, metrics={"output_throughput": 7.0}, hardware_class=None)
    repo = str(Path(__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p))
    assert write_final(store.folder) == store.folder / DATASET_FILE
    with xr.open_dataset(store.folder / DATASET_FILE) as ds:
        assert ds.sizes["trial"] == len(trials)
        assert sorted(float(x) for x in ds["output_throughput"].values if x == x) == [7.0]
    assert write_final(tmp_path / "no-such-experiment") is None


def test_the_coordinators_process_does_not_import_the_dataset_stack() -> None:
    """xarray, pandas and netCDF (~55 MB resident) are the writer children's: the coordinator's
    CLI and sweep loop import none of them (their RSS at 1,000 daemons counts both processes)."""
    import subprocess
    import sys

    code = ("import sys, coordinator.cli, coordinator.sweep; "
            "print(sorted(m for m in ('xarray', 'pandas', 'netCDF4', 'h5netcdf', 'scipy') if m in sys.modules))")
    repo = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_interim_rewrites_wait_ten_times_their_length_once_that_exceeds_the_debounce() -> None:
    from coordinator.dataset_writer import REWRITE_SHARE, rewrite_wait_s

    assert REWRITE_SHARE == 10.0
    assert rewrite_wait_s(2.0, 0.05) == 2.0  # a small store: the debounce
    assert rewrite_wait_s(2.0, 1.5) == 15.0  # a large one: the child stays near a tenth of the core
