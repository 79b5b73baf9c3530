"""Progress lines, the summary and the JSON document of a chaos run (pure: text and dicts)."""

from __future__ import annotations

import re
import statistics
from collections import Counter
from typing import Any

from benchmarks.chaos.run import ScheduleResult
from benchmarks.chaos.schedule import WEIGHTS


def _fault_word(result: ScheduleResult, n: int) -> str:
    a = result.faults[n]
    f = a.fault
    who = "coordinator" if f.slot is None else result.schedule.slots[f.slot].daemon_id
    word = f"{f.kind} {who}" if f.slot is not None else f.kind
    return word if a.took_effect else f"{word} [no effect: {a.detail}]"


def line(result: ScheduleResult, index: int, total: int) -> str:
    """One line per schedule: seed, faults applied, seconds, sweeps and attempts, violations."""
    exits = ",".join(str(c) for c in result.sweep_exits)
    faults = "; ".join(_fault_word(result, n) for n in range(len(result.faults)))
    no_effect = sum(1 for a in result.faults if not a.took_effect)
    head = (f"[{index + 1:>{len(str(total))}}/{total}] seed {result.schedule.seed}: {result.seconds:5.1f} s, "
            f"{len(result.faults)} faults ({no_effect} without effect), coordinator runs {result.sweeps} (exits {exits}), "
            f"attempts {result.attempts}/{result.trials} trials, violations {len(result.violations)}: {faults}")
    details = [f"    VIOLATION: {v}" for v in result.violations]
    if result.code[0] != result.code[1]:
        details.append(f"    WARNING: the code under test changed during this schedule ({result.code[0]} -> "
                       f"{result.code[1]})")
    return "\n".join([head, *details])


def _kind_of_note(note: str) -> str:
    """A note with its daemon ids, pids and numbers taken out, to count notes by kind."""
    return re.sub(r"\b(d\d+(-r\d+)?|pid \d+|\d+)\b", "N", note.splitlines()[0])


def summary(results: list[ScheduleResult]) -> dict[str, Any]:
    """The figures of a run: counts by fault kind, times, sweeps, violations."""
    drawn: Counter[str] = Counter()
    effect: Counter[str] = Counter()
    for r in results:
        for a in r.faults:
            drawn[a.fault.kind] += 1
            effect[a.fault.kind] += bool(a.took_effect)
    times = [r.seconds for r in results]
    signs: Counter[str] = Counter()
    for r in results:
        signs.update(r.signs)
    return {
        "schedules": len(results),
        "violations": sum(len(r.violations) for r in results),
        "schedules_with_violations": [r.schedule.seed for r in results if r.violations],
        "faults": {k: {"drawn": drawn[k], "took_effect": effect[k], "no_effect": drawn[k] - effect[k]}
                   for k in WEIGHTS},
        "faults_total": sum(drawn.values()),
        "faults_without_effect": sum(drawn.values()) - sum(effect.values()),
        "schedules_with_a_fault_without_effect": sum(1 for r in results if any(not a.took_effect for a in r.faults)),
        "total_s": round(sum(times), 1),
        "median_schedule_s": round(statistics.median(times), 2) if times else None,
        "max_schedule_s": round(max(times), 2) if times else None,
        "sweeps_run_again_after_holes": sum(sum(1 for c in r.sweep_exits[:-1] if c in (3, 4)) for r in results),
        "sweep_exit_codes": dict(Counter(str(c) for r in results for c in r.sweep_exits)),
        "attempts": sum(r.attempts for r in results),
        "trials": sum(r.trials for r in results),
        "log_signs": dict(signs),
        "code_versions": sorted({c for r in results for c in r.code}),
        "schedules_where_the_code_changed": [r.schedule.seed for r in results if r.code[0] != r.code[1]],
        "notes": dict(Counter(_kind_of_note(n) for r in results for n in r.notes)),
    }


def summary_text(s: dict[str, Any]) -> str:
    kinds = ", ".join(f"{k} {v['drawn']} ({v['no_effect']} without effect)" for k, v in s["faults"].items())
    verdict = "OK" if s["violations"] == 0 else f"FAILED in schedules {s['schedules_with_violations']}"
    return "\n".join([
        f"{s['schedules']} schedules in {s['total_s']} s (median {s['median_schedule_s']} s, "
        f"max {s['max_schedule_s']} s): {s['violations']} violations: {verdict}",
        f"faults: {s['faults_total']} ({s['faults_without_effect']} without effect, in "
        f"{s['schedules_with_a_fault_without_effect']} schedules): {kinds}",
        f"sweeps run again after holes: {s['sweeps_run_again_after_holes']}; exit codes {s['sweep_exit_codes']}; "
        f"{s['attempts']} attempts for {s['trials']} trials",
        f"in the logs: {s['log_signs']}",
        *([f"WARNING: the code under test changed during the run (versions {s['code_versions']}; during "
           f"schedules {s['schedules_where_the_code_changed']}): the figures are not of one version"]
          if len(s["code_versions"]) > 1 else []),
    ])


def document(results: list[ScheduleResult], meta: dict[str, Any]) -> dict[str, Any]:
    return {**meta, "summary": summary(results), "schedules": [r.to_json() for r in results]}
