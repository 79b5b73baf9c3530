"""A loopback fleet whose daemons carry TEST-ONLY planted clock offsets (``SERVETUNE_TEST_CLOCK_OFFSET_S``,
:mod:`daemon.agent`): the clock e2e test and ``benchmarks/clock`` both run it.

Every daemon is a real ``daemon start`` process on this machine (so their true offset from the
coordinator is 0 plus what was planted), the coordinator a real ``sweep --no-local-daemon``
process (:mod:`tests.fleet_harness`), the ``openai`` backend against the FAKE endpoint of
:mod:`tests.fakes.openai_server`. The daemons are started first and the coordinator once each has
said it runs, so every daemon joins (and is probed) before the short sweep can finish."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coordinator.clock import read_clock_offsets
from daemon.agent import TEST_CLOCK_OFFSET_ENV
from tests.fleet_harness import Fleet, wait_for


@dataclass
class ClockRun:
    exit_code: int
    log: str
    #: clock.json's per-daemon estimates (coordinator.clock.ClockEstimate.as_dict)
    offsets: dict[str, dict[str, Any]]
    planted: dict[str, float]
    left_behind: list[str]


def run_clock_fleet(tmp: Path, url: str, planted: dict[str, float], *, probe_every_s: float = 1.0,
                    repeats: int = 3, requests: int = 20, timeout_s: float = 120.0) -> ClockRun:
    """One sweep with a daemon per entry of ``planted`` (daemon id -> planted offset, s; 0: none)."""
    fleet = Fleet(tmp, url, name="clocks", repeats=repeats, requests=requests)
    fleet_file = tmp / "fleet.yaml"
    fleet_file.write_text(f"clock_probe_every_s: {probe_every_s}\n")
    try:
        for daemon_id, offset in planted.items():
            argv = ["env", f"{TEST_CLOCK_OFFSET_ENV}={offset!r}", sys.executable, "-m", "daemon"] if offset else None
            fleet.start_daemon(daemon_id, argv=argv)
        for daemon_id in planted:
            wait_for(lambda d=daemon_id: f"daemon {d} on " in fleet.daemon_log(d), 60, f"daemon {daemon_id} to start")
        fleet.start_coordinator("--fleet", str(fleet_file))
        code, _, log = fleet.wait_coordinator(timeout_s)
        for proc in fleet.daemons.values():
            if proc.poll() is None:
                proc.wait(timeout=15)
        return ClockRun(code, log, read_clock_offsets(fleet.folder), dict(planted), [])
    finally:
        left = fleet.close()
        if left:
            raise AssertionError(f"processes left behind: {left}")
