"""A resumed fleet sweep with nothing left to run still takes the artifact uploads a daemon left
spooled: the first sweep ends (a drain window too short for its slow uploads) with artifacts still
on the node; the second finds every trial measured, waits for daemons within its drain window,
and stores what the daemon offers. Real coordinator and ``daemon start`` processes, CURVE on, the
FAKE openai endpoint of tests/fakes (no GPU here)."""

from __future__ import annotations

import signal
from pathlib import Path

from daemon.artifact_spool import ArtifactSpool
from tests.fleet_harness import Fleet, wait_for
from tests.test_artifact_fleet import (  # noqa: F401 (fixtures)
    SLOW_TIMINGS,
    SLOW_UPLOAD,
    _all_stored_and_verified,
    _finish,
    _invariants,
    endpoint,
    make_fleet,
)


def _fleet_file(fleet: Fleet, drain_s: float) -> str:
    path = Path(fleet.tmp) / f"fleet-{drain_s:g}.yaml"
    path.write_text(f"artifact_drain_s: {drain_s}\n")
    return str(path)


def test_a_resumed_sweep_with_nothing_to_run_collects_leftover_uploads(make_fleet: type[Fleet]) -> None:  # noqa: F811
    fleet = make_fleet(repeats=1, requests=60, timings=dict(SLOW_TIMINGS))
    fleet.start_coordinator("--fleet", _fleet_file(fleet, 0.0))  # no drain: it ends with uploads on the node
    d1 = fleet.start_daemon("d1", None, *SLOW_UPLOAD)
    _ = fleet.wait_coordinator(120)
    assert fleet.coordinator_runs[-1][0] == 0, fleet.coordinator_log()[-3000:]
    d1.send_signal(signal.SIGKILL)  # it would go on trying to upload to a coordinator that is gone
    d1.wait(timeout=10)
    spool = ArtifactSpool.for_workdir(fleet.tmp / "daemon")
    assert spool.pending(), "the first sweep took every artifact: nothing is left over to test"

    fleet.start_coordinator("--fleet", _fleet_file(fleet, 60.0))
    wait_for(lambda: "taking leftover artifact uploads" in fleet.coordinator_log(), 60, "the coordinator to wait")
    fleet.start_daemon("d1")
    log = _finish(fleet)
    assert "leftover artifact(s) stored" in log, log[-3000:]
    assert not ArtifactSpool.for_workdir(fleet.tmp / "daemon").pending()
    _all_stored_and_verified(fleet)
    _invariants(fleet)
