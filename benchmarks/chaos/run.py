"""The loop over chaos schedules: one fake endpoint and one model cache shared by all, one folder
per schedule (its store and every coordinator-*.log and daemon-*.log), the checks after each.

:func:`run_schedule` runs one schedule and checks it; :func:`run_chaos` runs ``options.schedules``
of them (seeds ``seed``, ``seed + 1``, ...) and calls ``say`` with one progress line each.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.chaos import checks
from benchmarks.chaos.execute import AppliedFault, Executor
from benchmarks.chaos.schedule import Schedule, draw
from tests.fakes.openai_server import start_fake_openai_process
from tests.fleet_harness import Fleet

log = logging.getLogger(__name__)

#: What the logs say, counted per schedule (how the faults showed; not checked).
COORDINATOR_SIGNS = {
    "lease_expired": "lease expired", "suspected": " suspected: ", "rejoined": "rejoined holding",
    "orphan_not_adopted": "orphaned lease not adopted", "daemon_error": "daemon error on",
}
DAEMON_SIGNS = {"fenced": "could not renew within TTL", "stale": "refused (STALE)", "conflict": "refused (CONFLICT)"}


@dataclass(frozen=True)
class ChaosOptions:
    """``schedules`` schedules from seed ``seed`` on; folders under ``out``. ``deadline_s``: one
    schedule's limit; ``max_reruns``: sweeps run again after holes; ``cold_cache``: each schedule
    generates the tiny model itself (by its daemons, concurrently) instead of sharing one made first."""

    schedules: int
    out: Path
    seed: int = 0
    deadline_s: float = 120.0
    max_reruns: int = 3
    cold_cache: bool = False


@dataclass
class ScheduleResult:
    schedule: Schedule
    folder: Path
    seconds: float
    faults: list[AppliedFault]
    sweep_exits: list[int | None]
    attempts: int
    trials: int
    violations: list[str]
    notes: list[str] = field(default_factory=list)
    signs: dict[str, int] = field(default_factory=dict)
    daemon_exits: dict[str, int | None] = field(default_factory=dict)
    timeline: dict[str, float] = field(default_factory=dict)
    #: :func:`code_fingerprint` before and after the schedule
    code: tuple[str, str] = ("", "")

    @property
    def sweeps(self) -> int:
        """Sweep commands run until the end (a restart after a SIGKILL included)."""
        return len(self.sweep_exits)

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.schedule.seed, "folder": str(self.folder), "seconds": round(self.seconds, 2),
            "schedule": self.schedule.to_json(), "faults": [f.to_json() for f in self.faults],
            "sweep_exits": self.sweep_exits, "attempts": self.attempts, "trials": self.trials,
            "violations": self.violations, "notes": self.notes, "log_signs": self.signs,
            "daemon_exits": self.daemon_exits, "timeline_s": self.timeline,
            "code_before": self.code[0], "code_after": self.code[1],
        }


#: The packages the fleet runs; their sources are fingerprinted before and after every schedule.
CODE_PACKAGES = ("coordinator", "daemon", "servetune")


def code_fingerprint() -> str:
    """A short hash of every ``.py`` file of :data:`CODE_PACKAGES` as this interpreter finds them:
    if it changes during a run, the run measured more than one version of the code."""
    digest = hashlib.sha256()
    for name in CODE_PACKAGES:
        spec = importlib.util.find_spec(name)
        roots = list(spec.submodule_search_locations or []) if spec else []
        for root in roots:
            for path in sorted(Path(root).rglob("*.py")):
                digest.update(str(path.relative_to(root)).encode() + b"\0")
                try:
                    digest.update(path.read_bytes())
                except OSError:
                    digest.update(b"<unreadable>")
    return digest.hexdigest()[:12]


def _signs(folder: Path) -> dict[str, int]:
    counts = dict.fromkeys([*COORDINATOR_SIGNS, *DAEMON_SIGNS], 0)
    for pattern, signs in (("coordinator-*.log", COORDINATOR_SIGNS), ("daemon-*.log", DAEMON_SIGNS)):
        for path in folder.glob(pattern):
            # the coordinator logs each notice twice (log line and progress line): count log lines
            lines = [ln for ln in path.read_text(errors="replace").splitlines() if re.match(r"\d{4}-\d\d-\d\d ", ln)]
            for key, needle in signs.items():
                counts[key] += sum(needle in ln for ln in lines)
    return counts


def run_schedule(schedule: Schedule, folder: Path, url: str, env: dict[str, str], *, deadline_s: float = 120.0,
                 max_reruns: int = 3) -> ScheduleResult:
    """Run ``schedule`` in ``folder`` against the endpoint ``url`` and check everything after."""
    t0 = time.monotonic()
    code_before = code_fingerprint()
    fleet = Fleet(folder, url, name=f"chaos-{schedule.seed}", repeats=schedule.repeats,
                  timings=schedule.timings, env=dict(env))
    execution = Executor(schedule, fleet, deadline_s=deadline_s, max_reruns=max_reruns).run()
    violations = list(execution.problems)
    violations += [f"process left behind (killed at the end): {p}" for p in execution.left_behind]
    strays = checks.stray_processes(f"{folder}/")
    if strays:
        checks.kill_strays(strays)
        violations += [f"stray process {pid} left behind (killed): {cmd[:200]}" for pid, cmd in strays]
    violations += checks.store_violations(fleet, checks.acked_everywhere(fleet))
    trials = len(fleet.query("SELECT trial_id FROM spec_trials"))
    return ScheduleResult(
        schedule=schedule, folder=folder, seconds=time.monotonic() - t0, faults=execution.faults,
        sweep_exits=execution.sweep_exits, attempts=len(fleet.attempts()), trials=trials, violations=violations,
        notes=execution.notes, signs=_signs(folder), daemon_exits=execution.daemon_exits,
        timeline=execution.timeline, code=(code_before, code_fingerprint()),
    )


def _shared_cache(out: Path) -> Path:
    """A model cache with the tiny model already in it (made once, before any daemon starts)."""
    from daemon.tiny_model import generate
    from servetune.tiny import TINY_MODEL_VERSION

    cache = out / "cache"
    generate(cache / "models" / f"tiny-v{TINY_MODEL_VERSION}")
    return cache


def run_chaos(options: ChaosOptions, say: Callable[[ScheduleResult, int], None]) -> list[ScheduleResult]:
    """Run the schedules of ``options``; ``say(result, index)`` after each. Stops everything it started."""
    options.out.mkdir(parents=True, exist_ok=True)
    env: dict[str, str] = {}
    if not options.cold_cache:
        env["SERVETUNE_CACHE"] = str(_shared_cache(options.out))
    server, url = start_fake_openai_process(options.out, token_delay_ms=5.0, ttft_ms=5.0)
    results: list[ScheduleResult] = []
    try:
        for i in range(options.schedules):
            seed = options.seed + i
            schedule = draw(seed)
            result = run_schedule(schedule, options.out / f"schedule-{seed}", url, env,
                                  deadline_s=options.deadline_s, max_reruns=options.max_reruns)
            results.append(result)
            say(result, i)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
    return results
