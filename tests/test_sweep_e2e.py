"""End to end through coordinator, ZeroMQ, a child daemon and real vLLM servers (CPU build)."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

import analysis
from coordinator.store import Store
from tests.conftest import SweepRun, coordinator_cmd, recorded_server_groups, wait_groups_gone

pytestmark = pytest.mark.vllm


def _ok_rows(run: SweepRun):  # type: ignore[no-untyped-def]
    ds = analysis.load("e2e", results_root=run.root)
    return ds, [i for i in range(ds.sizes["trial"]) if str(ds.status.values[i]) == "ok"]


def test_sweep_prints_ranked_table_and_results_path(e2e_sweep: SweepRun) -> None:
    out = e2e_sweep.proc.stdout
    assert e2e_sweep.proc.returncode == 0, e2e_sweep.proc.stderr[-3000:]
    assert "load point rate: ranked by output_throughput" in out
    assert "load point conc: ranked by output_throughput" in out
    assert "max_num_seqs=16" in out and "max_num_seqs=2 " in out
    assert "failed (measurement)" in out
    assert f"results: {e2e_sweep.folder / 'results.nc'}" in out
    # progress went to stderr: trials done / total and phases
    assert "[6/6]" in e2e_sweep.proc.stderr and "server starting" in e2e_sweep.proc.stderr


def test_dataset_one_row_per_trial_with_provenance_and_fingerprint(e2e_sweep: SweepRun) -> None:
    ds, ok = _ok_rows(e2e_sweep)
    assert ds.sizes["trial"] == 6
    assert len(ok) == 4
    failed = [i for i in range(6) if str(ds.status.values[i]) == "failed"]
    assert len(failed) == 2
    assert all(str(ds.failure_kind.values[i]) == "measurement" for i in failed)
    assert all("server would not start" in str(ds.error.values[i]) for i in failed)
    assert ds.attrs["design"] == "grid" and int(ds.attrs["randomized"]) == 1 and ds.attrs["spec_hash"]
    assert len(json.loads(ds.attrs["run_order"])) == 6
    assert ds.attrs["vllm_version"].startswith("0.")
    assert json.loads(ds.attrs["model"]) == {"source": "tiny", "version": "1"}
    for i in ok:
        assert str(ds.hardware_class.values[i]).startswith("cpu-")
        assert int(ds.started_at.values[i]) > 1_700_000_000_000_000  # microseconds since the epoch
        assert float(ds.output_throughput.values[i]) > 0
        assert float(ds.n_errors.values[i]) == 0
        assert not math.isnan(float(ds.ttft_ms.sel(quantile=0.99).values[i]))
        assert float(ds.kv_cache_tokens.values[i]) > 0
    assert set(map(int, ds.param_max_num_seqs.values)) == {2, 16}
    # the TPOT SLO is impossible: every ok trial is ok but misses it (missing an SLO is not a failure)
    assert all(float(ds.slos_met.values[i]) == 0.0 for i in ok)
    assert all(float(ds.slo_attainment.values[i]) == 0.0 for i in ok)


def test_client_counts_match_vllm_counters(e2e_sweep: SweepRun) -> None:
    ds, ok = _ok_rows(e2e_sweep)
    for i in ok:
        n = int(ds.n_completed.values[i])
        assert n == int(ds.n_requests.values[i]) and n in (12, 16)
        assert float(ds.server_requests_delta.values[i]) == n
        assert float(ds.server_generation_tokens_delta.values[i]) == float(ds.total_output_tokens.values[i]) == n * 16


def test_every_attempt_has_its_own_result_file(e2e_sweep: SweepRun) -> None:
    store = Store.open_readonly(e2e_sweep.folder)
    attempts = store.all_attempts()
    store.close()
    assert len(attempts) == 6 and all(a.attempt == 1 for a in attempts)
    for a in attempts:
        assert a.result_path is not None
        record = json.loads((e2e_sweep.folder / a.result_path).read_text())
        assert record["trial_id"] == a.trial_id
        assert record["outcome"]["fingerprint"]["cpu_count"] >= 1
        if a.status == "ok":
            samples = record["outcome"]["samples"]
            assert sum(1 for s in samples if s["warmup"]) == 2
            assert all(s["output_tokens"] == 16 for s in samples if not s["warmup"])
        else:
            assert record["outcome"]["exit_code"] not in (None, 0)
            assert record["outcome"]["log_tail"]


def test_ok_trials_carry_the_server_metric_series(e2e_sweep: SweepRun) -> None:
    store = Store.open_readonly(e2e_sweep.folder)
    attempts = [a for a in store.all_attempts() if a.status == "ok"]
    store.close()
    assert len(attempts) == 4
    peaks = []
    for a in attempts:
        assert a.result_path is not None
        record = json.loads((e2e_sweep.folder / a.result_path).read_text())
        outcome, metrics = record["outcome"], record["metrics"]
        series = outcome["server_series"]
        assert series, f"trial {a.trial_id[:12]} has no server series"
        measured = [s for s in outcome["samples"] if not s["warmup"]]
        # from the start of the measurement (read once before the first send) until the server drained
        assert series[0]["t_ns"] <= min(s["send_ns"] for s in measured)
        assert series[-1]["t_ns"] >= max(s["end_ns"] for s in measured)
        assert {"num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"} <= set(series[0])
        assert series[-1]["num_requests_running"] == series[-1]["num_requests_waiting"] == 0
        max_num_seqs = record["manifest"]["engine"]["args"]["max_num_seqs"]
        assert metrics["server_max_running"] <= max_num_seqs
        assert metrics["server_preemptions_delta"] == 0
        assert metrics["stopped_early"] is None and metrics["n_cancelled"] == 0
        peaks.append(metrics["server_max_running"])
    assert max(peaks) >= 1, peaks  # some scrape saw requests running
    ds, ok = _ok_rows(e2e_sweep)
    assert all(float(ds.server_max_running.values[i]) == float(ds.server_max_running.values[i]) for i in ok)  # not NaN
    assert all(str(ds.stopped_early.values[i]) == "" for i in ok)


def test_no_vllm_outlives_the_sweep(e2e_sweep: SweepRun) -> None:
    groups = recorded_server_groups(e2e_sweep.folder)
    assert len(groups) == 3  # one server start per config, the failed one included
    assert wait_groups_gone(groups, timeout_s=5) == []


def test_rerun_measures_nothing_new_and_overwrites_nothing(e2e_sweep: SweepRun, tmp_path: Path) -> None:
    files = {p: p.read_bytes() for p in (e2e_sweep.folder / "results").rglob("*.json")}
    proc = subprocess.run(
        coordinator_cmd("sweep", str(e2e_sweep.spec_path), "--results-root", str(e2e_sweep.root)),
        capture_output=True, text=True, timeout=120, env=e2e_sweep.env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "nothing to run" in proc.stderr
    assert "2 measurement failures kept" in proc.stderr
    assert {p: p.read_bytes() for p in (e2e_sweep.folder / "results").rglob("*.json")} == files
    proc = subprocess.run(
        coordinator_cmd("sweep", "e2e", "--resume", "--dry-run", "--results-root", str(e2e_sweep.root)),
        capture_output=True, text=True, timeout=120, env=e2e_sweep.env,
    )
    assert proc.returncode == 0 and "6 trials" in proc.stdout, proc.stderr


def test_edited_spec_keeps_results_says_what_changed_and_rescores_slos(e2e_sweep: SweepRun, tmp_path: Path) -> None:
    """Runs last: it changes the experiment's current spec (only its SLOs, so no trial changes)."""
    files = {p: p.read_bytes() for p in (e2e_sweep.folder / "results").rglob("*.json")}
    edited = tmp_path / "e2e.yaml"
    edited.write_text(e2e_sweep.spec_path.read_text().replace("max_ms: 0.001", "max_ms: 60000"))
    proc = subprocess.run(
        coordinator_cmd("sweep", str(edited), "--results-root", str(e2e_sweep.root)),
        capture_output=True, text=True, timeout=120, env=e2e_sweep.env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "the spec changed since the last sweep" in proc.stderr
    assert "slos: " in proc.stderr and "0.001" in proc.stderr
    assert "recomputed SLO attainment and goodput of 4 trial(s)" in proc.stderr
    assert "nothing to run" in proc.stderr
    assert "misses SLO" not in proc.stdout
    ds, ok = _ok_rows(e2e_sweep)
    assert all(float(ds.slos_met.values[i]) == 1.0 and float(ds.slo_attainment.values[i]) == 1.0 for i in ok)
    assert {p: p.read_bytes() for p in (e2e_sweep.folder / "results").rglob("*.json")} == files
    store = Store.open_readonly(e2e_sweep.folder)
    assert len(store.all_attempts()) == 6
    store.close()


def test_raw_samples_and_pooled_percentiles(e2e_sweep: SweepRun) -> None:
    ds, ok = _ok_rows(e2e_sweep)
    ids = [str(ds.trial_id.values[i]) for i in ok if str(ds.load_point.values[i]) == "conc"]
    samples = [analysis.trial_samples("e2e", t, results_root=e2e_sweep.root) for t in ids]
    assert [len(s) for s in samples] == [16] * len(ids)
    pooled = analysis.pooled_latencies(samples)
    assert pooled["n"] == [16.0 * len(ids)]
    lo = min(float(ds.ttft_ms.sel(quantile=0.5).values[i]) for i in ok if str(ds.load_point.values[i]) == "conc")
    hi = max(float(ds.ttft_ms.sel(quantile=0.5).values[i]) for i in ok if str(ds.load_point.values[i]) == "conc")
    assert lo <= pooled["ttft_ms"][0] <= hi


def test_the_shared_sweep_ran_through_two_daemons(e2e_sweep: SweepRun) -> None:
    import sqlite3

    conn = sqlite3.connect(f"file:{e2e_sweep.folder / 'experiment.sqlite'}?mode=ro", uri=True, timeout=10)
    try:
        rows = conn.execute("SELECT daemon_id, status, failure_kind FROM attempts").fetchall()
    finally:
        conn.close()
    assert {r[0] for r in rows} == {"e2e-daemon-1", "e2e-daemon-2"}, rows
    assert not [r for r in rows if r[2] == "transport"], "no attempt may be lost on a healthy fleet"
    assert e2e_sweep.daemon_codes == [0, 0], "each daemon exits 0 when the coordinator says SHUTDOWN"
    assert "daemon start --coordinator tcp://127.0.0.1:" in e2e_sweep.proc.stderr
