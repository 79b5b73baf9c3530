"""A sweep interrupted by Ctrl-C, then by SIGKILL of the coordinator, and run again, completes only
what is missing, overwrites nothing, and leaves no vLLM process behind (checked by the process
groups the daemon recorded, not by matching process names)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from coordinator.store import Store
from tests.conftest import cli_env, coordinator_cmd, recorded_server_groups, wait_groups_gone

pytestmark = pytest.mark.vllm

SPEC = textwrap.dedent(
    """
    name: interrupt
    model: {source: tiny}
    engine:
      fixed: {max_model_len: 256, max_num_batched_tokens: 512, enforce_eager: true}
      grid: {max_num_seqs: [4, 8]}
      env: {VLLM_CPU_KVCACHE_SPACE: 1}
    load_points:
      - {name: c4, max_concurrency: 4, num_requests: 8, input_len: 16, output_len: 8}
    planner: {randomize: false}
    budgets: {server_start_timeout_s: 300, trial_timeout_s: 120}
    """
)


def _query(db: Path, sql: str) -> list[tuple[object, ...]]:
    if not db.exists():
        return []
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return list(conn.execute(sql).fetchall())
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()


def _wait_for(predicate, timeout_s: float, proc: subprocess.Popen[str], what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"sweep exited ({proc.returncode}) before {what}:\n{err[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def _start(spec: Path, root: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    # A session of its own, as a terminal gives a foreground job: SIGINT goes to the whole group.
    return subprocess.Popen(
        coordinator_cmd("sweep", str(spec), "--results-root", str(root)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
    )


def _second_server_starting(db: Path, n_started: int) -> bool:
    rows = _query(db, "SELECT COUNT(*) FROM transitions WHERE phase='server_starting'")
    return bool(rows) and int(rows[0][0]) >= n_started  # type: ignore[call-overload]


def test_interrupted_sweeps_resume_without_loss(tmp_path: Path, tiny_cache: Path) -> None:
    spec = tmp_path / "interrupt.yaml"
    spec.write_text(SPEC)
    root = tmp_path / "runs"
    folder = root / "interrupt"
    db = folder / "experiment.sqlite"
    env = cli_env(tiny_cache)

    # --- 1. Ctrl-C while the second batch's server is starting.
    proc = _start(spec, root, env)
    _wait_for(lambda: _second_server_starting(db, 2), 400, proc, "the second server start")
    time.sleep(5)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 130, err[-3000:]
    assert "interrupted" in err
    assert wait_groups_gone([proc.pid], 30) == [], "coordinator or daemon still running after Ctrl-C"
    groups = recorded_server_groups(folder)
    assert len(groups) == 2
    assert wait_groups_gone(groups, 30) == [], "a vLLM server outlived Ctrl-C"
    store = Store.open_readonly(folder)
    attempts = {a.trial_id: a for a in store.all_attempts()}
    store.close()
    ok = [a for a in attempts.values() if a.status == "ok"]
    lost = [a for a in attempts.values() if a.status == "failed"]
    assert len(ok) == 1 and len(lost) == 1
    assert lost[0].failure_kind == "transport" and "interrupted" in (lost[0].error or "")
    assert ok[0].result_path is not None
    kept = (folder / ok[0].result_path).read_bytes()

    # --- 2. SIGKILL of the coordinator while the resumed sweep starts the missing trial's server.
    proc = _start(spec, root, env)
    _wait_for(lambda: _second_server_starting(db, 3), 200, proc, "the resumed server start")
    time.sleep(5)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    # The child daemon notices its parent died (PR_SET_PDEATHSIG) and takes its vLLM down with it.
    assert wait_groups_gone([proc.pid], 60) == [], "the daemon outlived its coordinator"
    groups = recorded_server_groups(folder)
    assert len(groups) == 3
    assert wait_groups_gone(groups, 60) == [], "a vLLM server outlived the killed coordinator"
    rows = _query(db, f"SELECT status FROM attempts WHERE trial_id = '{lost[0].trial_id}' ORDER BY attempt")
    assert [r[0] for r in rows] == ["failed", "running"]  # the killed coordinator could not close it

    # --- 3. Run again: only the missing trial runs; nothing measured is touched.
    done = subprocess.run(
        coordinator_cmd("sweep", str(spec), "--results-root", str(root)),
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "1 running attempt(s) recorded as transport failures" in done.stderr
    assert "resuming: 1 of 2 trials already have results" in done.stderr
    store = Store.open_readonly(folder)
    history = {t: [(a.attempt, a.status, a.failure_kind) for a in store.attempts(t)] for t in attempts}
    store.close()
    assert history[ok[0].trial_id] == [(1, "ok", None)]
    assert history[lost[0].trial_id] == [(1, "failed", "transport"), (2, "failed", "transport"), (3, "ok", None)]
    assert (folder / ok[0].result_path).read_bytes() == kept
    groups = recorded_server_groups(folder)
    assert len(groups) == 4 and wait_groups_gone(groups, 30) == []
