"""What must hold after a chaos schedule, as lists of violations (empty when all hold).

- The store's promises (:func:`tests.fleet_harness.check_invariants`): at most one accepted result
  per trial, no accepted result for an attempt that is no longer current (a stale epoch), every
  attempt ended ok / failed with a reason (none left ``running``), every submission that any
  daemon's log says was acknowledged is in the store: the logs of every daemon process started,
  killed ones included.
- Every planned trial finally has an ``ok`` result: the fake endpoint never fails a request, so a
  measurement failure or a hole left at the end is a violation too.
- No process left behind: none of the fleet had to be killed at the end, and no process whose
  command line names the schedule's folder is still running (a grandchild that escaped).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.fleet_harness import Fleet, acked_submissions, check_invariants


def acked_everywhere(fleet: Fleet) -> set[str]:
    """Submissions acknowledged according to the log of every daemon process ``fleet`` started."""
    acked: set[str] = set()
    for path in fleet.daemon_log_paths():
        if path.exists():
            acked |= acked_submissions(path.read_text(errors="replace"))
    return acked


def store_violations(fleet: Fleet, acked: set[str]) -> list[str]:
    """The broken invariants of ``fleet``'s store, and every planned trial without an ok result."""
    problems = check_invariants(fleet, acked)
    planned = {r[0] for r in fleet.query("SELECT trial_id FROM spec_trials")}
    if not planned:
        return problems + ["the store has no planned trials (no experiment was created)"]
    ok = {r[0] for r in fleet.query("SELECT DISTINCT trial_id FROM attempts WHERE status='ok'")}
    for trial_id in sorted(planned - ok):
        last = fleet.query("SELECT attempt, status, failure_kind, error FROM attempts WHERE trial_id=? "
                           "ORDER BY attempt DESC LIMIT 1", (trial_id,))
        why = "never granted" if not last else (
            f"last attempt {last[0][0]} {last[0][1]} ({last[0][2]}): {(last[0][3] or '').splitlines()[:1]}")
        problems.append(f"trial {trial_id[:12]} has no ok result: {why}")
    return problems


def stray_processes(marker: str | Path) -> list[tuple[int, str]]:
    """(pid, command line) of every process but this one whose command line contains ``marker``."""
    text = str(marker)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if text in cmdline:
            found.append((int(entry.name), cmdline))
    return found


def kill_strays(strays: list[tuple[int, str]]) -> None:
    """SIGKILL the processes :func:`stray_processes` found (each by its pid; gone ones are skipped)."""
    for pid, _ in strays:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
