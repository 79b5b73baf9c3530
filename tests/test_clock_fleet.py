"""Clock offsets end to end on loopback: real coordinator and daemon processes (tests/clock_fleet.py),
one daemon with a TEST-ONLY planted offset of +2.5 s, two without (one machine: they must agree)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from coordinator.clock import NS, PROBES_PER_ESTIMATE, read_clock_offsets
from servetune.messages import Bye, Capabilities, Hello, Rejoin, TimeProbe, TimeReply, Welcome
from tests.clock_fleet import run_clock_fleet
from tests.fakes.openai_server import FakeOpenAIServer
from tests.fleet_harness import Fleet, wait_for
from tests.test_fleet_faults import Scripted, _fingerprint

pytestmark = pytest.mark.timeout(180)


def test_a_planted_offset_is_reported_within_its_uncertainty_and_daemons_on_one_machine_agree(tmp_path: Path) -> None:
    with FakeOpenAIServer(token_delay_ms=5.0, ttft_ms=5.0) as server:
        run = run_clock_fleet(tmp_path, server.base_url, {"skewed": 2.5, "plain-a": 0.0, "plain-b": 0.0})
    assert run.exit_code == 0, run.log[-4000:]
    assert set(run.offsets) == {"skewed", "plain-a", "plain-b"}, run.log[-4000:]
    skewed = run.offsets["skewed"]
    assert abs(skewed["offset_s"] - 2.5) <= skewed["uncertainty_s"], skewed
    assert skewed["uncertainty_s"] < 0.5 and not skewed["agrees"], skewed
    assert skewed["probes_answered"] >= 1 and skewed["rtt_s"] >= 2 * skewed["uncertainty_s"]
    for name in ("plain-a", "plain-b"):
        assert run.offsets[name]["agrees"], run.offsets[name]
        assert abs(run.offsets[name]["offset_s"]) <= run.offsets[name]["uncertainty_s"]
    # the console line shows the estimate to the precision of its uncertainty (e.g. +2.49996 s ± 0.00039 s)
    shown = [(float(m[1]), float(m[2])) for m in re.finditer(r"clock: daemon skewed offset ([+-][0-9.]+) s ± ([0-9.]+) s",
                                                             run.log)]
    assert shown and all(abs(v - 2.5) <= u * 1.1 for v, u in shown), shown
    assert "clock: daemon plain-a agrees within ±" in run.log
    assert "clock: daemon plain-b agrees within ±" in run.log


def test_a_time_reply_counts_only_from_the_live_session_of_the_probed_daemon(tmp_path: Path) -> None:
    """A scripted daemon (a test double for the wire, tests/test_fleet_faults.py) answers its first
    probe under another session, claiming +100 s, then every later probe truthfully with a +5 s
    clock: only the +5 s replies may count (the forged one is a probe sent, never answered), and
    the reply from a session the coordinator does not know is answered REJOIN (never swallowed)."""
    with FakeOpenAIServer() as server:
        fleet = Fleet(tmp_path, server.base_url, name="scripted-clock", repeats=1)
        (tmp_path / "fleet.yaml").write_text("clock_probe_every_s: 600\n")
        fleet.start_coordinator("--fleet", str(tmp_path / "fleet.yaml"))
        d = Scripted(fleet.address, fleet.home)
        try:
            d.send(Hello(daemon_id=d.daemon_id, session_nonce=d.nonce, pid=1,
                         capabilities=Capabilities(fingerprint=_fingerprint())))
            assert isinstance(d.recv((Welcome,), 30), Welcome)
            forged = d.recv((TimeProbe,), 30)
            assert isinstance(forged, TimeProbe)
            now = time.time_ns() + 100 * NS
            d.send(TimeReply(session_nonce="another-session", probe_id=forged.probe_id, received_at_ns=now,
                             replied_at_ns=now))
            rejoin = d.recv((Rejoin, TimeProbe), 30)  # a session it does not know: REJOIN, as for any message
            assert isinstance(rejoin, Rejoin) and rejoin.session_nonce == "another-session", rejoin
            for _ in range(PROBES_PER_ESTIMATE):
                p = d.recv((TimeProbe,), 30)
                assert isinstance(p, TimeProbe) and p.probe_id != forged.probe_id
                now = time.time_ns() + 5 * NS
                d.send(TimeReply(session_nonce=d.nonce, probe_id=p.probe_id, received_at_ns=now, replied_at_ns=now))
            est = wait_for(lambda: read_clock_offsets(fleet.folder).get(d.daemon_id), 30, "the scripted daemon's estimate")
            assert abs(est["offset_s"] - 5.0) <= est["uncertainty_s"] < 1.0, est
            assert (est["probes_answered"], est["probes_sent"]) == (PROBES_PER_ESTIMATE, PROBES_PER_ESTIMATE + 1), est
            d.send(Bye(session_nonce=d.nonce, reason="done"))
        finally:
            d.close()
            fleet.close()  # the sweep itself never ran a trial: its coordinator is stopped here
