"""Clock offsets (coordinator/clock.py): Cristian's estimator on synthetic stamps, its guarantee by
simulation, the probing schedule with injected clocks, the wire messages and the daemon's stamps."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from coordinator.clock import (
    NS,
    ClockSchedule,
    ProbeSample,
    estimate,
    read_clock_offsets,
    write_clock_file,
)
from coordinator.fleet import FleetSettings
from daemon.agent import TEST_CLOCK_OFFSET_ENV, planted_clock_offset_ns, time_reply
from servetune.errors import ProtocolError, ServetuneError
from servetune.messages import TimeProbe, TimeReply, decode, encode

EPOCH_NS = 1_790_000_000 * NS  # a wall clock in 2026


def probe(theta_ns: int, d1_ns: int, d2_ns: int, handling_ns: int, t0_ns: int = EPOCH_NS) -> ProbeSample:
    """The stamps of one probe: daemon clock = coordinator clock + theta; delays d1 there, d2 back."""
    t1 = t0_ns + d1_ns + theta_ns
    t2 = t1 + handling_ns
    t3 = t0_ns + d1_ns + handling_ns + d2_ns
    return ProbeSample(sent_at_ns=t0_ns, received_at_ns=t1, replied_at_ns=t2, returned_at_ns=t3)


def test_symmetric_delay_gives_the_offset_exactly_and_handling_cancels() -> None:
    s = probe(theta_ns=250_000_000, d1_ns=40_000, d2_ns=40_000, handling_ns=3_000_000)
    assert s.offset_s == pytest.approx(0.25, abs=1e-12)
    assert s.uncertainty_s == pytest.approx(40e-6, abs=1e-12)  # half of the 80 us of transport
    assert s.rtt_ns == 3_080_000  # the 3 ms of handling is in the round trip, not in the uncertainty


def test_asymmetric_delay_biases_the_offset_by_half_the_difference_within_the_uncertainty() -> None:
    s = probe(theta_ns=-1_000_000_000, d1_ns=900_000, d2_ns=100_000, handling_ns=50_000)
    assert s.offset_s == pytest.approx(-1.0 + 0.0004, abs=1e-12)
    assert s.uncertainty_s == pytest.approx(0.0005, abs=1e-12)
    assert abs(s.offset_s - (-1.0)) <= s.uncertainty_s
    # all the delay on one leg: the truth sits exactly on the interval's edge
    edge = probe(theta_ns=0, d1_ns=1_000_000, d2_ns=0, handling_ns=0)
    assert edge.offset_s == pytest.approx(edge.uncertainty_s, abs=1e-15)


def test_the_true_offset_is_always_within_the_uncertainty_when_delays_are_non_negative() -> None:
    """Cristian's guarantee, by simulation: offsets of ±5 s, heavy-tailed and asymmetric delays,
    any handling time; the estimate over 5 probes must hold the truth every time (a hard bound,
    not a rate), and the best probe's interval is the tightest."""
    rng = random.Random(12)
    widths = []
    for _ in range(3000):
        theta = rng.randint(-5 * NS, 5 * NS)
        mean_there, mean_back = rng.choice([(50e3, 50e3), (10e3, 2e6), (3e6, 20e3), (1e3, 1e3)])
        samples = [
            probe(theta, int(rng.expovariate(1 / mean_there)), int(rng.expovariate(1 / mean_back)),
                  rng.randint(0, 20_000_000), t0_ns=EPOCH_NS + rng.randint(0, 10 * NS))
            for _ in range(5)
        ]
        for s in samples:
            assert abs(s.offset_s - theta / NS) <= s.uncertainty_s + 1e-12
        est = estimate("d", samples)
        assert est is not None
        assert abs(est.offset_s - theta / NS) <= est.uncertainty_s + 1e-12
        assert est.uncertainty_s == min(s.uncertainty_s for s in samples)
        widths.append(est.uncertainty_s)
    assert max(widths) > 0  # the simulation did exercise delays


def test_negative_delays_are_what_breaks_the_bound() -> None:
    """The guarantee rests on causality: with a 'delay' below zero (which no network has) the
    truth falls outside, so the simulation above is not vacuous."""
    s = probe(theta_ns=0, d1_ns=1_000_000, d2_ns=-900_000, handling_ns=2_000_000)
    assert abs(s.offset_s - 0.0) > s.uncertainty_s


def test_the_probe_with_the_smallest_unaccounted_round_trip_is_kept() -> None:
    slow_handling = probe(theta_ns=0, d1_ns=10_000, d2_ns=10_000, handling_ns=50_000_000)  # rtt 50 ms
    congested = probe(theta_ns=0, d1_ns=4_000_000, d2_ns=100_000, handling_ns=0)  # rtt 4.1 ms
    est = estimate("d", [congested, slow_handling])
    assert est is not None
    assert est.uncertainty_s == pytest.approx(10e-6)  # the slow-handling probe: its 50 ms cancel
    assert est.offset_s == pytest.approx(0.0, abs=1e-12)
    assert est.rtt_s == pytest.approx(0.05002)
    assert est.agrees and (est.probes_answered, est.probes_sent) == (2, 2)


def test_inconsistent_stamps_are_dropped_and_agreement_is_within_the_uncertainty() -> None:
    # a daemon claiming 10 ms of handling inside a 1 ms round trip: impossible, dropped
    liar = ProbeSample(sent_at_ns=EPOCH_NS, received_at_ns=EPOCH_NS, replied_at_ns=EPOCH_NS + 10_000_000,
                       returned_at_ns=EPOCH_NS + 1_000_000)
    assert not liar.consistent
    assert estimate("d", [liar]) is None
    off = estimate("d", [liar, probe(theta_ns=3_000, d1_ns=1_000, d2_ns=1_000, handling_ns=0)], probes_sent=3)
    assert off is not None and not off.agrees  # 3 us off, ± 1 us
    assert (off.probes_answered, off.probes_sent) == (1, 3)
    near = estimate("d", [probe(theta_ns=900, d1_ns=1_000, d2_ns=1_000, handling_ns=0)])
    assert near is not None and near.agrees


def test_console_lines_name_the_daemon_and_show_the_uncertainty_significantly() -> None:
    off = estimate("d1", [probe(theta_ns=250_000_000, d1_ns=1_000_000, d2_ns=1_000_000, handling_ns=0)])
    assert off is not None
    assert off.line().startswith("clock: daemon d1 offset +0.2500 s ± 0.0010 s")
    agree = estimate("d2", [probe(theta_ns=10_000, d1_ns=41_000, d2_ns=41_000, handling_ns=0)])
    assert agree is not None
    assert agree.line().startswith("clock: daemon d2 agrees within ± 0.000041 s (offset +0.000010 s")


# ---------------------------------------------------------------------- schedule


class World:
    """Fake clocks: the coordinator's monotonic and wall clocks (wall = monotonic + a base), and
    a daemon on the wire whose wall clock runs ``theta_ns`` ahead, with fixed delays."""

    def __init__(self, theta_ns: int = 0, d1_ns: int = 100_000, d2_ns: int = 300_000, handling_ns: int = 20_000):
        self.mono = 5 * NS
        self.theta_ns, self.d1_ns, self.d2_ns, self.handling_ns = theta_ns, d1_ns, d2_ns, handling_ns
        self.sched = ClockSchedule(60.0, probes=3, timeout_s=1.0, wall_ns=lambda: self.mono + EPOCH_NS,
                                   mono_ns=lambda: self.mono)

    def answer(self, daemon_id: str, p: TimeProbe, nonce: str = "s1") -> TimeReply:
        self.mono += self.d1_ns
        t1 = self.mono + EPOCH_NS + self.theta_ns
        self.mono += self.handling_ns
        reply = TimeReply(session_nonce=nonce, probe_id=p.probe_id, received_at_ns=t1,
                          replied_at_ns=t1 + self.handling_ns)
        self.mono += self.d2_ns
        return reply

    def advance(self, seconds: float) -> None:
        self.mono += int(seconds * NS)


def test_a_joined_daemon_is_probed_at_once_one_probe_in_flight_and_estimated_after_three() -> None:
    w = World(theta_ns=2_500_000_000)
    w.sched.join("d1")
    step = w.sched.step()
    assert [d for d, _ in step.probes] == ["d1"]
    assert w.sched.step().probes == []  # one in flight at a time
    got = []
    for _ in range(3):
        (daemon, p), = step.probes
        got.append(w.sched.reply("d1", w.answer("d1", p)))
        step = w.sched.step()
    assert [len(g.estimates) for g in got] == [0, 0, 1]
    est = got[-1].estimates[0]
    assert est.offset_s == pytest.approx(2.5 + (100e-6 - 300e-6) / 2, abs=1e-12)
    assert est.uncertainty_s == pytest.approx(200e-6, abs=1e-12)
    assert abs(est.offset_s - 2.5) <= est.uncertainty_s and not est.agrees
    assert est.measured_at == pytest.approx((w.mono + EPOCH_NS) / NS)
    assert w.sched.offsets()["d1"]["offset_s"] == est.offset_s
    assert step.probes == []  # the next round waits every_s
    w.advance(59.0)
    assert w.sched.step().probes == []
    w.advance(1.0)
    assert [d for d, _ in w.sched.step().probes] == ["d1"]


def test_replies_count_only_for_the_probe_and_daemon_they_answer() -> None:
    w = World()
    w.sched.join("d1")
    w.sched.join("d2")
    probes = dict(w.sched.step().probes)
    # d2 answering d1's probe, a made-up probe id, a reply for a daemon never probed: all ignored
    assert not w.sched.reply("d2", w.answer("d2", probes["d1"])).estimates
    assert not w.sched.reply("d1", TimeReply(session_nonce="s", probe_id="clk999", received_at_ns=1, replied_at_ns=1)).estimates
    assert not w.sched.reply("d9", w.answer("d9", probes["d1"])).estimates
    assert w.sched.step().probes == []  # both still wait on their real probe
    w.sched.reply("d1", w.answer("d1", probes["d1"]))
    assert [d for d, _ in w.sched.step().probes] == ["d1"]


def test_step_one_sends_only_that_daemons_next_probe_and_times_it_out_like_step() -> None:
    w = World()
    w.sched.join("d1")
    (_, p1), = w.sched.step().probes
    w.sched.join("d2")  # due now, but step_one after d1's reply visits d1 only
    w.sched.reply("d1", w.answer("d1", p1))
    assert [d for d, _ in w.sched.step_one("d1").probes] == ["d1"]
    assert w.sched.step_one("d1").probes == []  # one in flight at a time
    assert w.sched.step_one("d9").probes == []  # unknown: nothing
    assert [d for d, _ in w.sched.step().probes] == ["d2"]
    w.advance(1.0)  # d1's probe times out: given up and the next one sent, as step() does
    (daemon, p2), = w.sched.step_one("d1").probes
    assert daemon == "d1" and p2.probe_id != p1.probe_id


def test_unanswered_probes_time_out_and_a_silent_round_is_reported_not_estimated() -> None:
    w = World()
    w.sched.join("d1")
    sent = 0
    silent: list[str] = []
    for _ in range(20):
        step = w.sched.step()
        sent += len(step.probes)
        silent += step.silent
        w.advance(1.0)
    assert silent == ["d1"]
    assert sent == 6  # 2 x probes, then the round is given up
    assert "d1" not in w.sched.offsets()
    # a late reply to a probe given up counts for nothing
    assert not w.sched.reply("d1", TimeReply(session_nonce="s", probe_id="clk6", received_at_ns=1, replied_at_ns=2)).estimates


def test_daemons_that_left_or_are_no_longer_connected_are_not_probed() -> None:
    w = World()
    w.sched.join("d1")
    w.sched.join("d2")
    w.sched.leave("d1")
    assert [d for d, _ in w.sched.step(connected={"d1", "d2"}).probes] == ["d2"]
    w.sched.join("d3")
    assert w.sched.step(connected={"d1"}).probes == []  # d2 and d3 are gone from the core
    w.sched.join("d3")  # a re-join starts a fresh round
    assert [d for d, _ in w.sched.step().probes] == ["d3"]


def test_bad_schedule_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="every_s"):
        ClockSchedule(0.0)
    with pytest.raises(ValueError, match="clock_probe_every_s"):
        FleetSettings(clock_probe_every_s=0)
    assert FleetSettings().clock_probe_every_s == 300.0


def test_clock_file_is_written_whole_and_read_back(tmp_path: Path) -> None:
    w = World(theta_ns=-1_000_000_000)
    w.sched.join("d1")
    for _ in range(3):
        (_, p), = w.sched.step().probes
        w.sched.reply("d1", w.answer("d1", p))
    path = write_clock_file(tmp_path, w.sched.offsets(), 300.0)
    doc = json.loads(path.read_text())
    assert doc["method"] == "cristian" and set(doc["daemons"]) == {"d1"}
    assert read_clock_offsets(tmp_path)["d1"]["offset_s"] == pytest.approx(-1.0 - 100e-6, abs=1e-12)
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left
    (tmp_path / "clock.json").write_text("{not json")
    assert read_clock_offsets(tmp_path) == {}
    assert read_clock_offsets(tmp_path / "none") == {}


# ---------------------------------------------------------------------- wire and daemon


def test_time_messages_round_trip_and_hostile_ones_are_refused() -> None:
    msg = TimeReply(session_nonce="n", probe_id="clk1", received_at_ns=EPOCH_NS, replied_at_ns=EPOCH_NS + 5)
    assert decode(encode(msg)) == msg
    assert decode(encode(TimeProbe(probe_id="clk1", sent_at_ns=EPOCH_NS))).type == "TIME_PROBE"
    base = {"type": "TIME_REPLY", "session_nonce": "n", "probe_id": "clk1", "received_at_ns": 10, "replied_at_ns": 10}
    for bad, where in [({"replied_at_ns": 9}, "before"), ({"received_at_ns": -1}, "received_at_ns"),
                       ({"replied_at_ns": 2**63}, "replied_at_ns"), ({"received_at_ns": 1.5}, "received_at_ns"),
                       ({"probe_id": "x" * 201}, "probe_id"), ({"extra": 1}, "extra")]:
        with pytest.raises(ProtocolError, match=where):
            decode(json.dumps({**base, **bad}).encode())


def test_the_daemon_stamps_its_handling_and_adds_only_the_planted_test_offset() -> None:
    p = TimeProbe(probe_id="clk1", sent_at_ns=EPOCH_NS)
    reply = time_reply(p, "sess", read_at_ns=EPOCH_NS, read_mono_ns=0, offset_ns=2_500_000_000)
    assert reply.probe_id == "clk1" and reply.session_nonce == "sess"
    assert reply.received_at_ns == EPOCH_NS + 2_500_000_000
    assert reply.replied_at_ns >= reply.received_at_ns


def test_the_planted_offset_is_test_only_and_checked() -> None:
    assert planted_clock_offset_ns({}) == 0
    assert planted_clock_offset_ns({TEST_CLOCK_OFFSET_ENV: "-1.25"}) == -1_250_000_000
    for bad in ("soon", "nan", "inf", "1e9"):
        with pytest.raises(ServetuneError, match=TEST_CLOCK_OFFSET_ENV):
            planted_clock_offset_ns({TEST_CLOCK_OFFSET_ENV: bad})
