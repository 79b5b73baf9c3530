"""Circuit breakers, the drain of hardware classes out of service, and the retry ledger: pure, with
an injected clock (coordinator/breaker.py, coordinator/retries.py), then wired into the control core
(coordinator/control.py) with messages and ticks, no sockets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coordinator.breaker import BreakerBoard, BreakerChanged, BreakerState, Drained, ServiceWatch, drain_reason
from coordinator.control import Accept, ControlCore
from coordinator.fleet import FleetSettings, fleet_settings
from coordinator.retries import RetryEvent, RetryLedger, RetryLog, read_retries
from servetune.errors import SpecError
from servetune.messages import BatchError, Bye, Grant, Ready
from tests.test_control import Clock, core, hello, result, sent

CLOSED, OPEN, HALF = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN


def test_closed_opens_after_n_consecutive_failures_and_a_success_resets_the_count() -> None:
    b = BreakerBoard(failures=3, recovery_after_s=10.0)
    assert b.failure("d", 1.0, "lost") == [] and b.failure("d", 2.0, "lost") == []
    assert b.success("d", 2.5) == [] and b.get("d").failures == 0  # not consecutive any more
    assert b.failure("d", 3.0, "x") == [] and b.failure("d", 4.0, "x") == []
    (ev,) = b.failure("d", 5.0, "lease expired")
    assert (ev.old, ev.new, ev.at) == (CLOSED, OPEN, 5.0)
    assert ev.line.startswith("DOWN d: breaker open: 3 consecutive transport failures; last: lease expired")
    br = b.get("d")
    assert br.opened_at == 5.0 and br.down_since == 5.0 and len(br.trips) == 1
    assert not b.may_grant("d", 5.0) and not b.closed("d")


def test_open_waits_its_cool_down_then_allows_exactly_one_probe() -> None:
    b = BreakerBoard(failures=1, recovery_after_s=10.0)
    b.failure("d", 100.0, "lost")
    assert not b.may_grant("d", 109.9) and b.tick(109.9) == []
    assert b.may_grant("d", 110.0)
    (ev,) = b.tick(110.0)
    assert (ev.old, ev.new) == (OPEN, HALF) and ev.line.startswith("PROBE d")
    assert b.may_grant("d", 110.0)
    assert b.granted("d", 110.5) == []  # already half-open: the grant is its probe
    assert b.probing("d") and not b.may_grant("d", 111.0) and not b.may_grant("d", 1e9)
    assert b.granted("other", 1.0) == [] and b.may_grant("other", 1.0)  # a closed breaker grants freely


def test_a_grant_at_the_end_of_the_cool_down_before_the_tick_is_the_probe() -> None:
    b = BreakerBoard(failures=1, recovery_after_s=5.0)
    b.failure("d", 0.0, "lost")
    (ev,) = b.granted("d", 6.0)
    assert ev.new is HALF and b.probing("d") and not b.may_grant("d", 6.0)


def test_probe_success_closes_and_clears_down_since() -> None:
    b = BreakerBoard(failures=1, recovery_after_s=5.0)
    b.failure("d", 0.0, "lost")
    b.tick(5.0)
    b.granted("d", 5.0)
    (ev,) = b.success("d", 7.0)
    assert (ev.old, ev.new) == (HALF, CLOSED) and ev.line == "UP d: its probe succeeded; breaker closed"
    br = b.get("d")
    assert br.down_since is None and br.failures == 0 and not br.probe_out and br.trips[-1]["closed_at"] == 7.0
    assert b.may_grant("d", 7.0) and b.closed("d")


def test_probe_failure_reopens_restarting_the_cool_down_and_keeps_down_since() -> None:
    b = BreakerBoard(failures=2, recovery_after_s=5.0)
    b.failure("d", 0.0, "a")
    b.failure("d", 1.0, "b")  # opened at 1
    b.tick(6.0)
    b.granted("d", 6.0)
    (ev,) = b.failure("d", 8.0, "lease expired")
    assert (ev.old, ev.new) == (HALF, OPEN) and "again" in ev.line and "its probe failed" in ev.line
    br = b.get("d")
    assert br.opened_at == 8.0 and br.down_since == 1.0 and len(br.trips) == 2
    assert not b.may_grant("d", 12.9) and b.may_grant("d", 13.0)  # cool-down counted from the re-open
    # a loss while open (a late one of what it held) neither re-opens nor restarts the cool-down
    assert b.failure("d", 9.0, "late") == [] and b.get("d").opened_at == 8.0


def test_a_result_while_open_does_not_close_it() -> None:
    b = BreakerBoard(failures=1, recovery_after_s=5.0)
    b.failure("d", 0.0, "lost")
    assert b.success("d", 1.0) == [] and b.state("d") is OPEN
    b.tick(5.0)
    assert b.success("d", 5.5) == [] and b.state("d") is HALF  # only the probe's result closes it


def test_snapshot_is_json_and_in_wall_clock_time() -> None:
    b = BreakerBoard(failures=1, recovery_after_s=5.0)
    b.failure("d", 10.0, "lost")
    snap = b.snapshot(wall=1_000_010.0, now=10.0)
    json.dumps(snap)
    assert snap["d"]["state"] == "open" and snap["d"]["opened_at"] == 1_000_010.0
    assert snap["d"]["down_since"] == 1_000_010.0 and snap["d"]["trips"][0]["at"] == 1_000_010.0


def test_bad_breaker_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        BreakerBoard(failures=0)
    with pytest.raises(SpecError, match="recovery_after_s"):
        fleet_settings(None, recovery_after_s=0)
    with pytest.raises(SpecError, match="breaker_failures"):
        fleet_settings(None, breaker_failures=0)
    s = FleetSettings()
    assert (s.breaker_failures, s.recovery_after_s) == (3, 30.0)


def test_service_watch_is_due_after_two_cool_downs_not_while_probing_and_once_per_outage() -> None:
    w = ServiceWatch(drain_after_s=10.0)
    assert w.update(0.0, {"A": True, "B": True}, set()) == []
    assert w.update(1.0, {"A": True, "B": False}, set()) == []
    assert w.update(10.9, {"A": True}, set()) == []  # B has no connected daemon: still remembered
    assert w.update(11.0, {"A": True}, {"B"}) == []  # its probe is in flight: wait for it
    assert w.update(11.0, {"A": True}, set()) == [("B", 1.0)]
    assert w.update(30.0, {"A": True}, set()) == []  # drained once per outage
    assert w.all_out_since() is None
    w.update(31.0, {"A": True, "B": True}, set())  # B back: a later outage drains again
    assert "B" not in w.drained
    w.update(40.0, {"A": False, "B": False}, set())
    assert w.update(50.0, {}, set()) == [("A", 40.0), ("B", 40.0)] and w.all_out_since() == 40.0


def test_drain_reason_says_why_and_what_to_do() -> None:
    text = drain_reason("cpu-x", 0.0)
    assert text == "not attempted: no daemon of class cpu-x in service since 1970-01-01 00:00:00 UTC; re-run to retry"


def test_retry_ledger_warning_and_log(tmp_path: Path) -> None:
    ledger = RetryLedger()
    assert ledger.warning("t", 3) is None
    ledger.lost("t", 1, "node-b", "lease expired: no heartbeat\nmore")
    assert ledger.warning("t", 3) == "produced on attempt 2 of 3 after 1 transport failure(s) on node-b"
    ledger.lost("t", 2, "node-c", "daemon error")
    ledger.lost("t", 3, "node-b", "daemon error")
    assert ledger.warning("t", 5) == "produced on attempt 4 of 5 after 3 transport failure(s) on node-b, node-c"
    log = RetryLog(tmp_path)
    log.append([RetryEvent("retry", "t", 1, "node-b", "lease expired", 3)], wall=12.5)
    log.append([RetryEvent("given_up", "t", 3, "node-b", "x", 3)], wall=13.0)
    lines = read_retries(tmp_path)
    assert lines == [{"event": "retry", "trial_id": "t", "attempt": 1, "daemon_id": "node-b",
                      "reason": "lease expired", "time": 12.5, "budget": 3},
                     {"event": "given_up", "trial_id": "t", "attempt": 3, "daemon_id": "node-b", "reason": "x",
                      "time": 13.0}]


# ---------------------------------------------------------------------- wired into the control core

FAST = FleetSettings(heartbeat_interval_s=1.0, lease_ttl_s=10.0, lease_grace_s=2.0, daemon_wait_s=600.0,
                     max_transport_retries=10, breaker_failures=3, recovery_after_s=5.0)


def _grant(c: ControlCore, d: str, nonce: str, seq: int = 1) -> Grant | None:
    grants = sent(c.handle(d, Ready(session_nonce=nonce, seq=seq)), Grant)
    return grants[0] if grants else None  # type: ignore[return-value]


def _crash(c: ControlCore, d: str, nonce: str, g: Grant) -> list[object]:
    return list(c.handle(d, BatchError(session_nonce=nonce, batch_id=g.batch_id, epoch=g.epoch, error="boom")))


def test_core_opens_a_breaker_grants_nothing_then_one_probe_and_closes_on_its_result() -> None:
    clock = Clock()
    c = core(clock, settings=FAST)
    c.handle("d1", hello("d1", "n1"))
    events: list[object] = []
    for i in range(3):
        g = _grant(c, "d1", "n1", seq=i + 1)
        assert g is not None, f"grant {i}"
        events += _crash(c, "d1", "n1", g)
        clock.t += 0.1
    downs = [e for e in events if isinstance(e, BreakerChanged)]
    assert [e.new for e in downs] == [OPEN], "the third consecutive loss opens it, once"
    retries = [e for e in events if isinstance(e, RetryEvent)]
    assert retries and all(e.event == "retry" and e.daemon_id == "d1" for e in retries)
    opened = clock.t - 0.1
    assert _grant(c, "d1", "n1", seq=10) is None, "an open breaker gets no work"
    clock.t = opened + 4.9
    assert not any(isinstance(e, BreakerChanged) for e in c.tick())
    assert _grant(c, "d1", "n1", seq=11) is None
    clock.t = opened + 5.0
    out = c.tick()  # half-open: the READY waiting since is granted its one probe
    assert [e.new for e in out if isinstance(e, BreakerChanged)] == [HALF]
    probes = sent(out, Grant)
    assert len(probes) == 1, "half-open: one probe"
    probe: Grant = probes[0]  # type: ignore[assignment]
    assert _grant(c, "d1", "n1", seq=13) is None and _grant(c, "d1", "n1", seq=14) is None
    out = c.handle("d1", result("n1", probe, 0, sub="p0"))
    ups = [e for e in out if isinstance(e, BreakerChanged)]
    assert [e.new for e in ups] == [CLOSED] and ups[0].line.startswith("UP d1")
    assert any(isinstance(e, Accept) for e in out)
    lost_trial = retries[0].trial_id
    assert c.retry_warning(lost_trial) == "produced on attempt 4 of 10 after 3 transport failure(s) on d1"


def test_core_probe_failure_reopens_and_a_rejoin_does_not_reset_the_breaker() -> None:
    clock = Clock()
    c = core(clock, settings=FAST.model_copy(update={"breaker_failures": 1}))
    c.handle("d1", hello("d1", "n1"))
    g = _grant(c, "d1", "n1")
    assert g is not None
    _crash(c, "d1", "n1", g)
    c.handle("d1", Bye(session_nonce="n1", reason="restart"))
    c.handle("d1", hello("d1", "n2"))  # a new session under the same id
    assert _grant(c, "d1", "n2") is None, "reconnecting never resets a breaker"
    clock.t += 5.0
    probes = sent(c.tick(), Grant)  # the waiting READY gets the probe
    assert len(probes) == 1
    probe: Grant = probes[0]  # type: ignore[assignment]
    assert _grant(c, "d1", "n2", seq=2) is None, "one probe only"
    clock.t += 1.0
    out = _crash(c, "d1", "n2", probe)
    (ev,) = [e for e in out if isinstance(e, BreakerChanged)]
    assert ev.new is OPEN and ev.old is HALF
    b = c.breaker.get("d1")
    assert b.opened_at == clock.t and b.down_since == clock.t - 6.0


def test_core_drains_a_class_out_of_service_for_two_cool_downs_and_finishes_on_the_others() -> None:
    clock = Clock()
    c = core(clock, settings=FAST)
    c.handle("a1", hello("a1", "na", hw="class-a"))
    c.handle("b1", hello("b1", "nb", hw="class-b"))
    gb = _grant(c, "b1", "nb")
    assert gb is not None
    b_trials = {t.trial_id for t in gb.trials}
    c.handle("b1", Bye(session_nonce="nb", reason="node died"))  # its batch is queued again, for class-b only
    gone_at = clock.t
    clock.t += 0.01
    c.tick()
    clock.t = gone_at + 9.9
    assert not any(isinstance(e, Drained) for e in c.tick()), "not before two cool-downs"
    clock.t = gone_at + 10.05
    drained = [e for e in c.tick() if isinstance(e, Drained)]
    assert len(drained) == 1 and drained[0].hardware_class == "class-b"
    assert set(drained[0].trial_ids) == b_trials
    assert "no daemon of class class-b in service since" in drained[0].reason
    assert drained[0].reason.endswith("re-run to retry")
    # class-a goes on with the rest and the sweep finishes
    seq = 1
    while not c.finished:
        g = _grant(c, "a1", "na", seq=seq)
        assert g is not None, "class-a still has work"
        assert not ({t.trial_id for t in g.trials} & b_trials), "no trial moves to another class"
        for i in range(len(g.trials)):
            c.handle("a1", result("na", g, i, sub=f"s{seq}-{i}"))
        seq += 1
    assert c.finished


def test_core_drains_unclaimed_work_once_every_known_class_is_out() -> None:
    clock = Clock()
    c = core(clock, settings=FAST)
    c.handle("a1", hello("a1", "na", hw="class-a"))
    n_queued = sum(len(w.trials) for w in c.queue)
    c.handle("a1", Bye(session_nonce="na", reason="node died"))
    c.tick()
    clock.t += 10.0
    drained = [e for e in c.tick() if isinstance(e, Drained)]
    assert len(drained) == 1 and drained[0].hardware_class is None
    assert len(drained[0].trial_ids) == n_queued and "class class-a" in drained[0].reason
    assert c.finished


def test_core_never_drains_before_any_daemon_joined() -> None:
    clock = Clock()
    c = core(clock, settings=FAST)
    clock.t += 100.0
    assert not any(isinstance(e, Drained) for e in c.tick()) and c.queue


# ---------------------------------------------------------------------- schedule state: store, file, dashboard


def test_schedule_state_is_kept_in_the_store_and_written_to_schedule_json(tmp_path: Path) -> None:
    from coordinator.schedule import ScheduleBook
    from coordinator.store import Store
    from dashboards.app import state
    from dashboards.app.experiments import schedule_html

    clock = Clock()
    store = Store.open(tmp_path / "exp")
    try:
        book = ScheduleBook(store, "exp", FAST, clock=clock)
        board = BreakerBoard(failures=1, recovery_after_s=5.0)
        book.joined("d1", "class-a", "node-1", board)
        board.failure("d1", clock(), "lease expired")
        book.breaker(board, {"d1"})
        book.retried([RetryEvent("retry", "t1", 1, "d1", "lease expired", 10)], board)
        book.drained(Drained("class-b", ("t2", "t3"), drain_reason("class-b", 0.0)))
        book.clock_offsets({"d1": {"offset_s": 0.25, "uncertainty_s": 0.01}})
        doc = json.loads((tmp_path / "exp" / "schedule.json").read_text())
        assert doc["daemons"]["d1"]["breaker"]["state"] == "open" and doc["daemons"]["d1"]["retries"] == 1
        assert doc["daemons"]["d1"]["outcome"].startswith("breaker open (down since")
        assert doc["breaker_trips"][0]["daemon_id"] == "d1" and doc["breaker_trips"][0]["reason"].startswith("1 cons")
        assert doc["retries"] == {"retry": 1, "given_up": 0, "failover": 0}
        assert doc["drained"]["class-b"]["trials"] == 2 and doc["policy"]["drain_after_s"] == 10.0
        assert doc["clock_offsets"] == {"d1": {"offset_s": 0.25, "uncertainty_s": 0.01}}
        assert store.schedule()["daemon:d1"]["breaker"]["state"] == "open"  # the file is written from the store
        book.left("d1", "presumed dead", board)
        book.finished("finished", board)
        live = state.live_status(tmp_path / "exp")
        html = schedule_html(live.schedule)
        assert "data-daemon='d1' data-state='open'" in html and "left: presumed dead" in html
        assert "class-b: 2 trial(s)" in html and "offset_s" in html
    finally:
        store.close()
    assert not list((tmp_path / "exp").glob(".schedule-*")), "no temporary file left behind"


def test_joins_rewrite_schedule_json_at_most_every_write_interval(tmp_path: Path) -> None:
    """Every rewrite holds every daemon: a rewrite per join made 1,000 joins O(daemons**2). The
    store's table changes at once; the file follows at the next flush due."""
    from coordinator.schedule import WRITE_EVERY_S, ScheduleBook
    from coordinator.store import Store

    store = Store.open(tmp_path / "exp")
    try:
        book = ScheduleBook(store, "exp", FAST, clock=Clock())
        board = BreakerBoard(failures=1, recovery_after_s=5.0)
        path = tmp_path / "exp" / "schedule.json"
        for i in range(50):
            book.joined(f"d{i}", "class-a", f"node-{i}", board)
        assert len(json.loads(path.read_text())["daemons"]) == 0, "rewritten per join"
        assert "daemon:d49" in store.schedule()
        book.flush()
        assert len(json.loads(path.read_text())["daemons"]) == 0, "rewritten before the interval passed"
        book._written_at -= WRITE_EVERY_S  # as if the interval had passed
        book.flush()
        assert len(json.loads(path.read_text())["daemons"]) == 50
    finally:
        store.close()
