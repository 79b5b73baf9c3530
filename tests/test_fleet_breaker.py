"""Circuit breaker, drain and retries end to end: a real coordinator and real daemons on loopback
(tests/fleet_harness.py), the ``openai`` backend against the FAKE endpoint of
tests/fakes/openai_server.py, the FAKE network of tests/fakes/faultproxy.py. Short timings
(heartbeat 0.2 s, TTL 2 s, grace 1 s; cool-downs of 1 to 3 s) so each scenario takes seconds."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import xarray as xr

import analysis
from servetune.exitcodes import ExitCode
from tests.fakes.faultproxy import FaultProxy
from tests.fleet_harness import Fleet, wait_for
from tests.test_fleet_faults import _invariants
from tests.test_fleet_faults import endpoint as _endpoint

endpoint = _endpoint  # the fault suite's fixture: one FAKE OpenAI endpoint for the module

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def fleet(tmp_path: Path, endpoint: str) -> Iterator[Fleet]:
    f = Fleet(tmp_path, endpoint, repeats=3)
    yield f
    left = f.close()
    assert not left, f"processes left behind: {left}"


def _fleet_file(fleet: Fleet, **keys: object) -> str:
    path = fleet.tmp / "settings-fleet.yaml"  # not fleet.yaml: that is the spec
    path.write_text("".join(f"{k}: {v}\n" for k, v in keys.items()))
    return str(path)


def _transport_losses(fleet: Fleet) -> int:
    return sum(1 for a in fleet.attempts() if a["failure_kind"] == "transport")


def test_a_flaky_daemon_opens_its_breaker_answers_its_probe_and_the_sweep_completes(fleet: Fleet) -> None:
    fleet.start_coordinator("--fleet", _fleet_file(fleet, breaker_failures=3, recovery_after_s=3.0,
                                                   max_transport_retries=6))
    with FaultProxy("127.0.0.1", fleet.port) as proxy:
        fleet.start_daemon("d1", proxy.address)
        for drop in range(3):  # its connection dropped three times, each past TTL + grace: a lost lease
            wait_for(lambda: fleet.measuring_on("d1"), 60, f"d1 measuring before drop {drop + 1}")
            before = _transport_losses(fleet)
            proxy.blackhole()
            wait_for(lambda b=before: _transport_losses(fleet) > b, 30, f"the lease lost in drop {drop + 1}")  # type: ignore[misc]
            proxy.pass_through()
        code, _, log = fleet.wait_coordinator(120)
        assert proxy.stats()["bytes_dropped"] > 0
    assert code == ExitCode.OK, log[-4000:]
    down, up = log.find("DOWN d1: breaker open: 3 consecutive transport failures"), log.find("UP d1")
    assert 0 <= down < log.find("PROBE d1") < up, log[-4000:]
    attempts = fleet.attempts()
    assert all(a["status"] == "ok" or a["failure_kind"] == "transport" for a in attempts)
    assert {a["trial_id"] for a in attempts} == {a["trial_id"] for a in attempts if a["status"] == "ok"}

    lines = [json.loads(x) for x in (fleet.folder / "retries.jsonl").read_text().splitlines()]
    lost = [(a["trial_id"], a["attempt"]) for a in attempts if a["failure_kind"] == "transport"]
    assert sorted((x["trial_id"], x["attempt"]) for x in lines) == sorted(lost), "one line per lost attempt"
    assert all(x["event"] == "retry" and x["daemon_id"] == "d1" and x["reason"] and x["time"] > 0 for x in lines)

    warned = 0
    for a in attempts:
        if a["status"] != "ok":
            continue
        record = json.loads((fleet.folder / a["result_path"]).read_text())
        n_lost = sum(1 for t, _ in lost if t == a["trial_id"])
        warning = record["metrics"].get("retry_warning")
        if n_lost:
            assert warning == f"produced on attempt {n_lost + 1} of 6 after {n_lost} transport failure(s) on d1"
            warned += 1
        else:
            assert warning is None
    assert warned >= 1
    with xr.open_dataset(fleet.folder / "results.nc") as ds:
        assert sum(1 for w in ds["retry_warning"].values if str(w)) == warned
    from analysis.report import _design_warnings  # the report's warnings list (dashboards/report.py shows it)

    retried = [w for w in _design_warnings(analysis.load(fleet.folder)) if w["code"] == "retried"]
    assert len(retried) == warned and all("transport failure(s) on d1" in w["message"] for w in retried)

    schedule = json.loads((fleet.folder / "schedule.json").read_text())
    d1 = schedule["daemons"]["d1"]
    assert d1["breaker"]["state"] == "closed" and len(d1["breaker"]["trips"]) == 1
    trip = schedule["breaker_trips"][0]
    assert trip["daemon_id"] == "d1" and trip["closed_at"] >= trip["at"] > 0
    assert schedule["policy"]["recovery_after_s"] == 3.0 and schedule["sweep_status"] == "finished"
    assert schedule["retries"]["retry"] == len(lines) and set(schedule["clock_offsets"]) == {"d1"}
    _invariants(fleet, "d1")


def test_a_class_whose_only_daemon_dies_ends_as_loud_holes_that_a_resume_picks_up(fleet: Fleet) -> None:
    fleet_file = _fleet_file(fleet, recovery_after_s=1.0, artifact_drain_s=2)  # the dead daemon uploads nothing more
    fleet.start_coordinator("--fleet", fleet_file)
    d1 = fleet.start_daemon("d1")
    wait_for(lambda: fleet.ok_count() >= 1 and fleet.measuring_on("d1"), 60, "a result and d1 measuring")
    d1.send_signal(signal.SIGKILL)
    code, out, log = fleet.wait_coordinator(60)
    assert code == ExitCode.HOLES, log[-4000:]
    assert "DRAINED" in log and "not attempted: no daemon of class" in log and "re-run to retry" in log
    holes = [a for a in fleet.attempts() if a["status"] != "ok"]
    assert holes and all(a["failure_kind"] == "transport" for a in holes)
    planned = {r[0] for r in fleet.query("SELECT trial_id FROM spec_trials")}
    ok_before = {a["trial_id"] for a in fleet.attempts() if a["status"] == "ok"}
    assert ok_before and ok_before < planned
    schedule = json.loads((fleet.folder / "schedule.json").read_text())
    drained = schedule["drained"]  # the batch pinned to its class after the loss, and work no class had taken
    assert sum(v["trials"] for v in drained.values()) == len(planned - ok_before)
    assert all("no daemon of class" in v["reason"] for v in drained.values())
    assert schedule["daemons"]["d1"]["connected"] is False

    fleet.start_coordinator("--fleet", fleet_file)  # the resume: holes are run again
    fleet.start_daemon("d2")
    code, _, log2 = fleet.wait_coordinator(120)
    assert code == ExitCode.OK, log2[-4000:]
    latest: dict[str, str] = {}
    for a in fleet.attempts():
        latest[a["trial_id"]] = a["status"]
    assert set(latest) == planned and set(latest.values()) == {"ok"}
    assert "resuming:" in log2
    fresh = json.loads((fleet.folder / "schedule.json").read_text())
    assert fresh["drained"] == {} and fresh["sweep_status"] == "finished"
    _invariants(fleet, "d2")
