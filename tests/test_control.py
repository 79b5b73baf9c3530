"""The coordinator's control core: pure logic, an injected clock, no sockets and no store.

Each test drives :class:`coordinator.control.ControlCore` with messages and ticks and checks the
instructions it returns: grants and epochs, renewals, suspicion, expiry and re-grant with
epoch + 1 to the same hardware class, idempotent results, restarts under an old id, orphans after
a coordinator restart, daemon errors, the retry budget and the no-daemon deadline."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from coordinator.control import (
    Accept,
    BeginAttempts,
    CloseAttempts,
    ControlCore,
    DaemonLeft,
    Instruction,
    NoDaemon,
    Notice,
    Send,
    orphans_from,
)
from coordinator.fleet import FleetSettings, fleet_settings
from coordinator.leases import BatchWork
from servetune.errors import SpecError
from servetune.manifest import plan_grid
from servetune.messages import (
    Ack,
    BatchError,
    Bye,
    Capabilities,
    Conflict,
    Grant,
    Heartbeat,
    Hello,
    LeaseRef,
    Message,
    NoWork,
    Ready,
    Rejoin,
    Renewed,
    Result,
    Revoked,
    Shutdown,
    Stale,
    Welcome,
)
from servetune.result import Fingerprint, TrialOutcome
from servetune.spec import ExperimentSpec, parse_spec
from servetune.states import LeaseState, StateError, check_lease

SPEC = """
name: ctl
engine: {grid: {max_num_seqs: [2, 4]}, fixed: {max_model_len: 256}}
load_points:
  - {name: a, request_rate: 1, num_requests: 2, input_len: 8, output_len: 8}
  - {name: b, request_rate: 1, num_requests: 2, input_len: 8, output_len: 8}
"""

SETTINGS = FleetSettings(heartbeat_interval_s=1.0, lease_ttl_s=10.0, lease_grace_s=2.0, suspect_after_missed=3,
                         daemon_wait_s=60.0, max_transport_retries=3)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def fingerprint(hw: str = "cpu-test") -> Fingerprint:
    return Fingerprint(hostname="node", cpu_model="test", cpu_count=1, cpu_isa="none", ram_gib=1.0, os="linux",
                       kernel="test", python="3", servetune_version="0", hardware_class=hw)


def spec() -> ExperimentSpec:
    return parse_spec(SPEC)


def work() -> list[BatchWork]:
    return [BatchWork(batch=b, trials=b.trials) for b in plan_grid(spec()).batches]


def core(clock: Clock, **kw: Any) -> ControlCore:
    return ControlCore(spec=spec(), work=kw.pop("work", None) or work(), settings=kw.pop("settings", SETTINGS),
                       clock=clock, **kw)


def hello(d: str, nonce: str, hw: str = "cpu-test", held: list[tuple[str, int]] = (), seq: int = 0) -> Hello:  # type: ignore[assignment]
    return Hello(daemon_id=d, session_nonce=nonce, pid=1, capabilities=Capabilities(fingerprint=fingerprint(hw)),
                 seq=seq, held=[LeaseRef(trial_id=t, epoch=e) for t, e in held])


def sent(out: list[Instruction], kind: type[Any] = object) -> list[Message]:
    return [i.msg for i in out if isinstance(i, Send) and isinstance(i.msg, kind)]


def join(c: ControlCore, d: str, nonce: str, hw: str = "cpu-test") -> Grant:
    out = c.handle(d, hello(d, nonce, hw))
    welcome = sent(out, Welcome)
    assert welcome and welcome[0].lease_ttl_s == SETTINGS.lease_ttl_s  # type: ignore[attr-defined]
    out = c.handle(d, Ready(session_nonce=nonce))
    begins = [i for i in out if isinstance(i, BeginAttempts)]
    grants = sent(out, Grant)
    assert len(begins) == 1 and len(grants) == 1
    assert out.index(begins[0]) < out.index(next(i for i in out if isinstance(i, Send))), "persist before GRANT"
    return grants[0]  # type: ignore[return-value]


def result(nonce: str, grant: Grant, i: int = 0, sub: str = "s1", kind: str | None = None) -> Result:
    t = grant.trials[i]
    outcome = TrialOutcome(status="failed" if kind else "ok", failure_kind=kind, started_at_us=1, finished_at_us=2)  # type: ignore[arg-type]
    return Result(session_nonce=nonce, batch_id=grant.batch_id, trial_id=t.trial_id, epoch=t.attempt,
                  submission_id=sub, outcome=outcome)


def refs(grant: Grant) -> list[LeaseRef]:
    return [LeaseRef(trial_id=t.trial_id, epoch=t.attempt) for t in grant.trials]


def test_grant_persists_attempts_first_and_results_are_idempotent() -> None:
    clock = Clock()
    c = core(clock)
    g = join(c, "d1", "n1")
    assert [t.attempt for t in g.trials] == [1, 1] and g.ttl_s == SETTINGS.lease_ttl_s
    out = c.handle("d1", result("n1", g, 0, "s1"))
    accepts = [i for i in out if isinstance(i, Accept)]
    assert len(accepts) == 1 and out.index(accepts[0]) < out.index(next(i for i in out if isinstance(i, Send)))
    assert isinstance(sent(out)[0], Ack)
    # a replay gets the same ACK and is not accepted twice; another payload for the attempt is a CONFLICT
    replay = c.handle("d1", result("n1", g, 0, "s1"))
    assert not [i for i in replay if isinstance(i, Accept)] and isinstance(sent(replay)[0], Ack)
    assert isinstance(sent(c.handle("d1", result("n1", g, 0, "s2")))[0], Conflict)
    # a result for an epoch never granted is STALE
    stale = result("n1", g, 1).model_copy(update={"epoch": 7})
    assert isinstance(sent(c.handle("d1", stale))[0], Stale)


def test_results_already_in_the_store_are_acked_on_replay() -> None:
    clock = Clock()
    g0 = Grant  # noqa: F841 (only the shape of a result is needed)
    first = work()[0]
    t = first.trials[0].trial_id
    c = core(clock, attempts={t: 1}, accepted={(t, 1): "old-sub"})
    c.handle("d1", hello("d1", "n1"))
    replay = Result(session_nonce="n1", batch_id=first.batch_id, trial_id=t, epoch=1, submission_id="old-sub",
                    outcome=TrialOutcome(status="ok", started_at_us=1, finished_at_us=2))
    out = c.handle("d1", replay)
    assert isinstance(sent(out)[0], Ack) and not [i for i in out if isinstance(i, Accept)]


def test_heartbeats_renew_and_an_unknown_session_is_told_to_rejoin() -> None:
    clock = Clock()
    c = core(clock)
    g = join(c, "d1", "n1")
    for _ in range(30):  # 30 s of heartbeats keep a 10 s lease alive
        clock.t += 1.0
        out = c.handle("d1", Heartbeat(session_nonce="n1", seq=1, leases=refs(g)))
        renewed = sent(out, Renewed)
        assert renewed and len(renewed[0].leases) == 2 and renewed[0].seq == 1  # type: ignore[attr-defined]
        assert not [i for i in c.tick() if isinstance(i, CloseAttempts)]
    out = c.handle("d1", Heartbeat(session_nonce="other", seq=2, leases=refs(g)))
    assert isinstance(sent(out)[0], Rejoin)
    out = c.handle("zz", Ready(session_nonce="n9"))
    assert isinstance(sent(out)[0], Rejoin)
    # a lease the daemon names that is not its own is REVOKED
    bogus = LeaseRef(trial_id="f" * 64, epoch=1)
    out = c.handle("d1", Heartbeat(session_nonce="n1", seq=3, leases=[bogus]))
    assert sent(out, Revoked)[0].leases == [bogus]  # type: ignore[attr-defined]


def test_silent_daemon_is_suspected_then_its_lease_regranted_with_next_epoch_same_hardware() -> None:
    clock = Clock()
    c = core(clock)
    g = join(c, "d1", "n1", hw="gpu-a")
    c.handle("d2", hello("d2", "n2", hw="gpu-b"))
    c.handle("d3", hello("d3", "n3", hw="gpu-a"))
    clock.t += 3.5
    notices = [i for i in c.tick() if isinstance(i, Notice)]
    assert any("d1 suspected" in n.text for n in notices)
    assert c.leases.get(g.batch_id).state is LeaseState.SUSPECT  # type: ignore[union-attr]
    assert not [i for i in c.tick() if isinstance(i, Notice) and "suspected" in i.text], "suspicion is said once"
    c.handle("d2", Heartbeat(session_nonce="n2", seq=1))
    c.handle("d3", Heartbeat(session_nonce="n3", seq=1))
    clock.t += 8.0  # 11.5 s: past the TTL, within the grace
    assert not [i for i in c.tick() if isinstance(i, CloseAttempts)]
    c.handle("d2", Heartbeat(session_nonce="n2", seq=2))
    c.handle("d3", Heartbeat(session_nonce="n3", seq=2))
    clock.t += 1.0  # 12.5 s > TTL + grace
    out = c.tick()
    closed = [i for i in out if isinstance(i, CloseAttempts)]
    assert len(closed) == 1 and {t for t, _ in closed[0].pairs} == {t.trial_id for t in g.trials}
    assert "lease expired" in closed[0].reason and "d1" in closed[0].reason
    # the re-grant goes to the daemon of the same hardware class, first in line, with epoch + 1
    other = c.handle("d2", Ready(session_nonce="n2"))
    regrant_b = sent(other, Grant)
    assert not regrant_b or regrant_b[0].batch_id != g.batch_id  # type: ignore[attr-defined]
    regrant = sent(c.handle("d3", Ready(session_nonce="n3")), Grant)[0]
    assert regrant.batch_id == g.batch_id and [t.attempt for t in regrant.trials] == [2, 2]  # type: ignore[attr-defined]
    # the fenced daemon's late result is STALE, and it must rejoin (its session was forgotten or not)
    late = c.handle("d1", result("n1", g, 0, "late"))
    assert isinstance(sent(late)[0], (Stale, Rejoin))


def test_new_process_with_an_old_id_never_keeps_a_dead_lease() -> None:
    clock = Clock()
    c = core(clock)
    g = join(c, "d1", "n1")
    out = c.handle("d1", hello("d1", "n1-restarted"))
    closed = [i for i in out if isinstance(i, CloseAttempts)]
    assert closed and "restarted" in closed[0].reason
    regrant = sent(c.handle("d1", Ready(session_nonce="n1-restarted")), Grant)[0]
    assert regrant.batch_id == g.batch_id and regrant.trials[0].attempt == 2  # type: ignore[attr-defined]


def test_reconnect_holding_the_lease_keeps_it() -> None:
    clock = Clock()
    c = core(clock)
    g = join(c, "d1", "n1")
    clock.t += 5.0
    out = c.handle("d1", hello("d1", "n1-again", held=[(t.trial_id, t.attempt) for t in g.trials], seq=9))
    assert not [i for i in out if isinstance(i, CloseAttempts)]
    renewed = sent(out, Renewed)[0]
    assert renewed.seq == 9 and len(renewed.leases) == 2  # type: ignore[attr-defined]
    assert isinstance(sent(c.handle("d1", result("n1-again", g, 0)))[0], Ack)


def test_orphans_after_a_coordinator_restart_are_adopted_or_expire() -> None:
    clock = Clock()
    w = work()
    first = w[0]
    running = [(m.trial_id, 1, "d1", first.batch_id) for m in first.trials]
    running.append(("a" * 64, 1, "d9", "b9999-none"))
    orphans, rest, unmatched = orphans_from(running, w)
    assert len(orphans) == 1 and unmatched == [("a" * 64, 1)]
    assert all(x.batch_id != first.batch_id for x in rest)
    c = core(clock, work=rest, orphans=orphans, attempts={m.trial_id: 1 for m in first.trials})
    assert not c.finished
    out = c.handle("d1", hello("d1", "n-new", held=[(m.trial_id, 1) for m in first.trials]))
    assert len(sent(out, Renewed)[0].leases) == 2  # type: ignore[attr-defined]
    res = Result(session_nonce="n-new", batch_id=first.batch_id, trial_id=first.trials[0].trial_id, epoch=1,
                 submission_id="x", outcome=TrialOutcome(status="ok", started_at_us=1, finished_at_us=2))
    assert [i for i in c.handle("d1", res) if isinstance(i, Accept)]
    # a second restart where nobody comes back: the orphan is revoked after TTL + grace and queued again
    clock2 = Clock()
    c2 = core(clock2, work=rest, orphans=orphans, attempts={m.trial_id: 1 for m in first.trials})
    clock2.t += 12.5
    closed = [i for i in c2.tick() if isinstance(i, CloseAttempts)]
    assert closed and "orphaned lease not adopted" in closed[0].reason
    c2.handle("d5", hello("d5", "n5"))
    g = sent(c2.handle("d5", Ready(session_nonce="n5")), Grant)[0]
    assert g.batch_id == first.batch_id and g.trials[0].attempt == 2  # type: ignore[attr-defined]


def test_daemon_error_is_transport_with_traceback_and_retry_budget_ends_in_a_hole() -> None:
    clock = Clock()
    c = core(clock, work=work()[:1])
    for round_ in range(3):
        nonce = f"n{round_}"
        c.handle("d1", hello("d1", nonce))
        g = sent(c.handle("d1", Ready(session_nonce=nonce)), Grant)[0]
        assert g.trials[0].attempt == round_ + 1  # type: ignore[attr-defined]
        out = c.handle("d1", BatchError(session_nonce=nonce, batch_id=g.batch_id, epoch=g.epoch,  # type: ignore[attr-defined]
                                        error="KeyError: 'x'", traceback_tail="File batch.py, line 3"))
        closed = [i for i in out if isinstance(i, CloseAttempts)]
        assert closed and "daemon error on d1" in closed[0].reason and "batch.py" in closed[0].reason
    assert c.given_up and c.finished
    assert isinstance(sent(c.handle("d1", Ready(session_nonce="n2")))[0], Shutdown)


def test_a_daemon_cannot_claim_transport() -> None:
    from servetune.errors import ProtocolError
    from servetune.messages import decode, encode

    clock = Clock()
    c = core(clock)
    g = join(c, "d1", "n1")
    good = result("n1", g, 0, kind="measurement")
    frame = encode(good).replace(b'"measurement"', b'"transport"')
    with pytest.raises(ProtocolError, match="transport"):
        decode(frame)


def test_bye_and_idle_daemon_without_its_lease_requeue_work() -> None:
    clock = Clock()
    c = core(clock)
    c.handle("d1", hello("d1", "n1"))
    g = sent(c.handle("d1", Ready(session_nonce="n1", seq=4)), Grant)[0]
    assert g.seq == 4  # type: ignore[attr-defined]
    # a READY that crossed the GRANT (the daemon has not seen it: answered_seq < 4), however late,
    # and one from a daemon still holding the lease (its results await their ACKs): NO_WORK
    clock.t += 8.0
    assert isinstance(sent(c.handle("d1", Ready(session_nonce="n1", seq=5, answered_seq=0)))[0], NoWork)
    assert isinstance(sent(c.handle("d1", Ready(session_nonce="n1", seq=6, answered_seq=4, held=refs(g)[1:])))[0],
                      NoWork)
    # one that got the GRANT and holds none of it dropped the batch: revoked at once and re-granted
    out = c.handle("d1", Ready(session_nonce="n1", seq=7, answered_seq=4))
    assert [i for i in out if isinstance(i, CloseAttempts)] and "dropped the batch" in out[0].reason  # type: ignore[attr-defined]
    g2 = sent(c.handle("d1", Ready(session_nonce="n1", seq=8, answered_seq=4)), Grant)[0]
    assert g2.batch_id == g.batch_id and g2.trials[0].attempt == 2  # type: ignore[attr-defined]
    out = c.handle("d1", Bye(session_nonce="n1", reason="signal SIGTERM"))
    assert [i for i in out if isinstance(i, CloseAttempts)] and [i for i in out if isinstance(i, DaemonLeft)]
    assert "d1" not in c.daemons


def test_no_daemon_for_daemon_wait_ends_the_sweep() -> None:
    clock = Clock()
    c = core(clock)
    clock.t += 59.0
    assert not [i for i in c.tick() if isinstance(i, NoDaemon)]
    clock.t += 2.0
    out = c.tick()
    assert [i for i in out if isinstance(i, NoDaemon)] and c.stopping and c.finished
    # a daemon that dies mid-batch: forgotten after TTL + grace; the wait starts again from then
    clock2 = Clock()
    c2 = core(clock2)
    join(c2, "d1", "n1")
    clock2.t += 13.0
    out = c2.tick()
    assert [i for i in out if isinstance(i, CloseAttempts)] and [i for i in out if isinstance(i, DaemonLeft)]
    clock2.t += 59.0
    assert not [i for i in c2.tick() if isinstance(i, NoDaemon)]
    clock2.t += 2.0
    assert [i for i in c2.tick() if isinstance(i, NoDaemon)]


def test_lease_state_machine_refuses_illegal_moves() -> None:
    assert check_lease(LeaseState.ACTIVE, LeaseState.SUSPECT) is LeaseState.SUSPECT
    with pytest.raises(StateError, match="released to active"):
        check_lease(LeaseState.RELEASED, LeaseState.ACTIVE)


def test_fleet_settings_validate_and_never_touch_the_spec_hash(tmp_path) -> None:  # type: ignore[no-untyped-def]
    before = spec().spec_hash()
    path = tmp_path / "fleet.yaml"
    path.write_text("lease_ttl_s: 4\nheartbeat_interval_s: 0.5\n")
    s = fleet_settings(path, lease_grace_s=1.0)
    assert (s.lease_ttl_s, s.heartbeat_interval_s, s.lease_grace_s) == (4, 0.5, 1.0)
    assert spec().spec_hash() == before
    path.write_text("lease_ttl: 4\n")
    with pytest.raises(SpecError, match="lease_ttl"):
        fleet_settings(path)
    with pytest.raises(SpecError, match="at least twice"):
        fleet_settings(None, lease_ttl_s=1.0, heartbeat_interval_s=1.0)


def test_an_idle_ready_waits_and_gets_a_revoked_lease_at_the_tick_that_expires_it() -> None:
    clock = Clock()
    c = core(clock, work=work()[:1])
    g = join(c, "d1", "n1")
    c.handle("d2", hello("d2", "n2"))
    # no work left: d2's READY is kept waiting, not answered NO_WORK at once
    assert c.handle("d2", Ready(session_nonce="n2", seq=4)) == []
    clock.t += 0.5
    assert not sent(c.tick())
    clock.t += 0.6  # its wait (one heartbeat interval) is over: NO_WORK, ask again at once
    assert [m.retry_after_s for m in sent(c.tick(), NoWork)] == [0.0]  # type: ignore[attr-defined]
    assert c.handle("d2", Ready(session_nonce="n2", seq=5)) == []
    for _ in range(12):  # d1 stays silent; d2 keeps asking, as an idle daemon does
        clock.t += 1.0
        c.handle("d2", Heartbeat(session_nonce="n2", seq=1))
        out = c.tick()
        if [i for i in out if isinstance(i, CloseAttempts)]:
            break
        for m in sent(out, NoWork):
            assert m.retry_after_s == 0.0  # type: ignore[attr-defined]
            c.handle("d2", Ready(session_nonce="n2", seq=6))
    # the tick that revokes d1's expired lease grants it to d2's waiting READY, epoch + 1
    assert clock.t - 1000.0 > SETTINGS.lease_ttl_s + SETTINGS.lease_grace_s
    regrant = sent(out, Grant)
    assert len(regrant) == 1 and regrant[0].batch_id == g.batch_id  # type: ignore[attr-defined]
    assert regrant[0].seq == 6 and [t.attempt for t in regrant[0].trials] == [2, 2]  # type: ignore[attr-defined]
    begins = [i for i in out if isinstance(i, BeginAttempts)]
    assert begins and begins[0].daemon_id == "d2"
    assert out.index(begins[0]) < out.index(next(i for i in out if isinstance(i, Send) and i.msg is regrant[0]))
    assert [lease.batch_id for lease in c.leases.held_by("d2")] == [g.batch_id] and not c.leases.held_by("d1")


def test_a_waiting_ready_of_a_gone_session_is_dropped_and_one_after_stop_gets_shutdown() -> None:
    clock = Clock()
    c = core(clock, work=work()[:1])
    join(c, "d1", "n1")
    c.handle("d2", hello("d2", "n2"))
    c.handle("d3", hello("d3", "n3"))
    assert c.handle("d2", Ready(session_nonce="n2", seq=1)) == []
    assert c.handle("d3", Ready(session_nonce="n3", seq=1)) == []
    c.handle("d2", hello("d2", "n2-new"))  # a new session: the old READY is answered by nobody
    c.stop()
    out = c.tick()
    assert [(i.daemon_id, type(i.msg)) for i in out if isinstance(i, Send)] == [("d3", Shutdown)]
    assert not c.waiting


def test_grant_budget_keeps_readies_waiting_in_order_until_a_pass_with_budget() -> None:
    """Admission control: with the pass's GRANT budget spent, READYs that find work wait (unanswered,
    oldest first, a repeated READY keeping its place) and are granted by the next tick with budget."""
    clock = Clock()
    c = core(clock)  # 2 configs x 2 load points: 2 batches
    for d in ("d1", "d2", "d3"):
        c.handle(d, hello(d, f"n-{d}"))
    c.grant_budget = 1
    assert len(sent(c.handle("d1", Ready(session_nonce="n-d1", seq=1)), Grant)) == 1
    assert c.grant_budget == 0
    assert c.handle("d2", Ready(session_nonce="n-d2", seq=1)) == []  # work is queued, no budget: waits
    assert c.handle("d3", Ready(session_nonce="n-d3", seq=1)) == []
    assert c.handle("d2", Ready(session_nonce="n-d2", seq=2)) == []  # asks again: keeps its place
    assert list(c.waiting) == ["d2", "d3"]
    clock.t += 5.0  # far past the waits' one interval: still no NO_WORK while work waits for budget
    assert not sent(c.tick())
    c.grant_budget = 1
    out = [(i.daemon_id, i.msg) for i in c.tick() if isinstance(i, Send)]
    # the oldest waiting READY gets the last batch; then the queue is empty and d3's wait is long over
    assert [(d, type(m), getattr(m, "seq", None)) for d, m in out] == [("d2", Grant, 2), ("d3", NoWork, None)]
    assert c.grant_budget == 0 and not c.waiting


def test_a_daemon_out_of_service_at_join_is_said_so_on_the_console() -> None:
    """Its preflight failed (daemon.preflight): the coordinator says why, rather than a silent wait."""
    c = core(Clock())
    msg = hello("d1", "n1")
    msg = msg.model_copy(update={"capabilities": msg.capabilities.model_copy(
        update={"out_of_service": "GPU 0 runs another process (pid 4242)"})})
    notes = [i.text for i in c.handle("d1", msg) if isinstance(i, Notice)]
    assert any("daemon d1 is out of service: GPU 0 runs another process (pid 4242)" in n for n in notes), notes
    assert not any("out of service" in i.text for i in c.handle("d2", hello("d2", "n2")) if isinstance(i, Notice))


def test_a_silent_daemon_is_suspected_by_the_threshold_not_a_tick_after_it() -> None:
    """With ticks every ``check_every_s``, suspicion comes at the last tick before silence would
    pass ``suspect_after_s`` (3 intervals): by 3 s of silence, never a tick late, never earlier."""
    clock = Clock()
    c = core(clock)
    c.check_every_s = 0.1
    join(c, "d1", "n1")
    clock.t += 2.85
    assert not [i for i in c.tick() if isinstance(i, Notice) and "suspected" in i.text]
    clock.t += 0.1  # 2.95 s: the next tick (3.05 s) would be late
    assert [i for i in c.tick() if isinstance(i, Notice) and "d1 suspected" in i.text]


def test_a_trial_already_queued_or_leased_is_not_queued_again(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    planned = work()
    assert len(planned) == 2 and all(len(w.trials) == 2 for w in planned)
    c = core(clock, work=planned[:1])
    g = join(c, "d1", "n1")  # the first batch is leased, nothing is queued
    with caplog.at_level(logging.WARNING, logger="coordinator.control"):
        mixed = BatchWork(batch=planned[1].batch, trials=planned[0].trials[:1] + planned[1].trials)
        assert c.add(mixed) and c.queued == 1  # only its two new trials
        assert [t.trial_id for w in c.queue for t in w.trials] == [t.trial_id for t in planned[1].trials]
        assert not c.add(planned[0]) and not c.add(planned[1]), "every trial already leased or queued"
    assert c.queued == 1 and caplog.text.count("already queued or leased; not queued again") == 3
    c.handle("d1", result("n1", g, 0, "s1"))
    c.handle("d1", result("n1", g, 1, "s2"))
    assert c.leases.for_trial(g.trials[0].trial_id) is None
    assert c.add(planned[0]), "a finished trial may be queued again (a retry is the caller's decision)"
    assert c.queued == 2
