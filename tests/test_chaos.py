"""The chaos runner (benchmarks/chaos): three seeded schedules against a real fleet on loopback
keep every invariant, and the checks it relies on do catch a broken store, a lost acknowledged
submission and a process left behind (so the runner can fail)."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.chaos import checks, report
from benchmarks.chaos.run import ChaosOptions, ScheduleResult, run_chaos
from benchmarks.chaos.schedule import GAP_S, PROXY_FAULTS, draw
from tests.fleet_harness import Fleet

SEED = 1  # schedules 1, 2, 3 (1 ends with holes and is run again): about 65 s on a 2-core machine


@pytest.fixture(scope="module")
def chaos_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ScheduleResult]]:
    out = tmp_path_factory.mktemp("chaos")
    lines: list[str] = []
    results = run_chaos(ChaosOptions(schedules=3, out=out, seed=SEED, deadline_s=90.0),
                        lambda r, i: lines.append(report.line(r, i, 3)))
    print("\n".join(lines))
    yield results


@pytest.mark.timeout(330)
def test_three_seeded_schedules_keep_every_invariant(chaos_run: list[ScheduleResult]) -> None:
    assert [r.schedule.seed for r in chaos_run] == [SEED, SEED + 1, SEED + 2]
    problems = [f"seed {r.schedule.seed}: {v}" for r in chaos_run for v in r.violations]
    assert not problems, "\n".join(problems)
    assert all(r.sweep_exits[-1] == 0 and r.trials > 0 for r in chaos_run)
    took_effect = [a for r in chaos_run for a in r.faults if a.took_effect]
    assert len(took_effect) >= 6, "most faults of the three schedules should have hit the fleet"
    summary = report.summary(chaos_run)
    assert summary["violations"] == 0 and summary["schedules"] == 3


def test_schedules_are_seeded_and_keep_their_rules() -> None:
    assert draw(7) == draw(7)
    assert draw(7) != draw(8)
    for seed in range(300):
        s = draw(seed)
        assert 2 <= len(s.slots) <= 3 and 4 <= s.repeats <= 8 and 2 <= len(s.faults) <= 5
        assert [f.at_s for f in s.faults] == sorted(f.at_s for f in s.faults)
        windows: dict[str, list[tuple[float, float]]] = {}
        for f in s.faults:
            if f.kind in PROXY_FAULTS:
                assert f.slot is not None and s.slots[f.slot].proxied
            assert (f.slot is None) == (f.kind == "kill_coordinator")
            windows.setdefault(f.target, []).append((f.at_s, f.end_s))
        for spans in windows.values():
            spans.sort()
            assert all(b[0] >= a[1] + GAP_S - 1e-9 for a, b in zip(spans, spans[1:])), (seed, spans)


def _copy(result: ScheduleResult, tmp: Path) -> Fleet:
    """A Fleet over a copy of a finished schedule's store (nothing is started)."""
    shutil.copytree(result.folder / "runs", tmp / "runs")
    return Fleet(tmp, "http://127.0.0.1:9", name=f"chaos-{result.schedule.seed}")


def _db(fleet: Fleet) -> sqlite3.Connection:
    return sqlite3.connect(fleet.folder / "experiment.sqlite")


def _an_ok_attempt(conn: sqlite3.Connection) -> tuple[str, int]:
    row = conn.execute("SELECT trial_id, attempt FROM attempts WHERE status='ok' LIMIT 1").fetchone()
    assert row is not None
    return str(row[0]), int(row[1])


def test_the_copied_store_is_clean(chaos_run: list[ScheduleResult], tmp_path: Path) -> None:
    fleet = _copy(chaos_run[0], tmp_path)
    assert checks.store_violations(fleet, checks.acked_everywhere(fleet)) == []


def test_a_planted_second_accepted_attempt_is_caught(chaos_run: list[ScheduleResult], tmp_path: Path) -> None:
    fleet = _copy(chaos_run[0], tmp_path)
    with _db(fleet) as conn:
        trial_id, attempt = _an_ok_attempt(conn)
        cols = [r[1] for r in conn.execute("PRAGMA table_info(attempts)")]
        row = dict(zip(cols, conn.execute("SELECT * FROM attempts WHERE trial_id=? AND attempt=?",
                                          (trial_id, attempt)).fetchone()))
        top = conn.execute("SELECT MAX(attempt) FROM attempts WHERE trial_id=?", (trial_id,)).fetchone()[0]
        row.update(attempt=top + 1, submission_id="planted0submission")
        conn.execute(f"INSERT INTO attempts ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                     [row[c] for c in cols])
    problems = checks.store_violations(fleet, set())
    assert any(f"trial {trial_id[:12]}: 2 accepted results" in p for p in problems), problems


def test_a_stale_epoch_accepted_is_caught(chaos_run: list[ScheduleResult], tmp_path: Path) -> None:
    fleet = _copy(chaos_run[0], tmp_path)
    with _db(fleet) as conn:
        trial_id, attempt = _an_ok_attempt(conn)
        top = conn.execute("SELECT MAX(attempt) FROM attempts WHERE trial_id=?", (trial_id,)).fetchone()[0]
        conn.execute("INSERT INTO attempts (trial_id, attempt, status, failure_kind, error, started_at_us) "
                     "VALUES (?, ?, 'failed', 'transport', 'planted: re-granted', 1)", (trial_id, top + 1))
    problems = checks.store_violations(fleet, set())
    assert any("a later attempt exists" in p and trial_id[:12] in p for p in problems), problems


def test_a_trial_left_without_an_ok_result_is_caught(chaos_run: list[ScheduleResult], tmp_path: Path) -> None:
    fleet = _copy(chaos_run[0], tmp_path)
    with _db(fleet) as conn:
        trial_id, attempt = _an_ok_attempt(conn)
        conn.execute("UPDATE attempts SET status='failed', failure_kind='transport', error='planted',"
                     " submission_id=NULL, result_path=NULL WHERE trial_id=? AND attempt=?", (trial_id, attempt))
    problems = checks.store_violations(fleet, set())
    assert any(f"trial {trial_id[:12]} has no ok result" in p for p in problems), problems


def test_an_acknowledged_submission_missing_from_the_store_is_caught(chaos_run: list[ScheduleResult],
                                                                      tmp_path: Path) -> None:
    fleet = _copy(chaos_run[0], tmp_path)
    with _db(fleet) as conn:
        trial_id, attempt = _an_ok_attempt(conn)
        sub = conn.execute("SELECT submission_id FROM attempts WHERE trial_id=? AND attempt=?",
                           (trial_id, attempt)).fetchone()[0]
        conn.execute("DELETE FROM attempts WHERE trial_id=? AND attempt=?", (trial_id, attempt))
    problems = checks.store_violations(fleet, {sub})
    assert any(f"acknowledged submission {sub} is not in the store" in p for p in problems), problems


def test_a_process_left_behind_is_found_and_killed(tmp_path: Path) -> None:
    marker = tmp_path / "schedule-x"
    marker.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"{marker}/runs"])
    try:
        deadline = time.monotonic() + 10
        found: list[tuple[int, str]] = []
        while not found and time.monotonic() < deadline:
            found = checks.stray_processes(f"{marker}/")
            time.sleep(0.05)
        assert [pid for pid, _ in found] == [proc.pid]
        checks.kill_strays(found)
        assert proc.wait(timeout=10) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_a_violation_makes_the_run_fail(chaos_run: list[ScheduleResult]) -> None:
    broken = ScheduleResult(**{**chaos_run[0].__dict__, "violations": ["planted"]})
    summary = report.summary([broken, *chaos_run[1:]])
    assert summary["violations"] == 1 and summary["schedules_with_violations"] == [SEED]
    assert "VIOLATION: planted" in report.line(broken, 0, 3)
    assert "FAILED" in report.summary_text(summary)
