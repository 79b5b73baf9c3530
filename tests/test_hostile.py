"""A hostile peer against a live coordinator (``sweep --no-local-daemon``, the ``openai`` backend
against the FAKE endpoint of tests/fakes): hypothesis-fuzzed frames, schema-valid hostile messages
under a real session (forged epochs, wrong session nonces, trials it does not hold), huge ints, NaN,
oversized frames, multi-frame messages and routing ids that are not daemon ids. The coordinator
stays up, no trial's state changes, the peer's impossible results are kept as ``parse`` failures
(ACKed, raw payload kept, never ranked), and an honest daemon's results are the only ones ranked.
The store's invariants (tests/fleet_harness.py) hold at the end."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.store import Store
from coordinator.summary import collect_summaries
from servetune import messages as msgs
from servetune.keys import coordinator_dir, daemon_dir, load_pair
from servetune.result import RequestSample, TrialOutcome
from servetune.wire import MAX_MESSAGE_BYTES
from tests.fakes.keys import fleet_home
from tests.fakes.openai_server import FakeOpenAIServer
from tests.fleet_harness import FAST, Fleet, acked_submissions, check_invariants, wait_for
from tests.test_bounds import near_valid
from tests.test_fleet_faults import Scripted, _fingerprint

pytestmark = pytest.mark.timeout(120)
MS = 1_000_000
#: A coordinator busy writing its dataset for 2 s looks silent to a daemon on FAST timings, which then
#: reconnects and can miss the final SHUTDOWN: let such a daemon give up soon (exit 6), not after 30 s.
QUICK_EXIT = ("--coordinator-lost", "5")


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with FakeOpenAIServer(token_delay_ms=2.0, ttft_ms=2.0) as server:
        # a long TTL: the hostile peer's lease must outlive the barrage (nothing may expire it)
        f = Fleet(tmp_path, server.base_url, repeats=3, requests=4, timings=dict(FAST, **{"--lease-ttl": "30"}))
        try:
            yield f
        finally:
            left = f.close()
            assert not left, f"processes left behind: {left}"


def _sample(i: int, **kw: Any) -> RequestSample:
    send = 10 * MS + i * 100 * MS
    base: dict[str, Any] = dict(index=i, scheduled_ns=send, send_ns=send, first_token_ns=send + 5 * MS,
                                end_ns=send + 50 * MS, token_ns=[send + 5 * MS, send + 50 * MS],
                                prompt_tokens=8, output_tokens=16)
    base.update(kw)
    return RequestSample(**base)


#: The issue's impossible results, each with the words its parse failure must hold.
IMPOSSIBLE: list[tuple[TrialOutcome, str]] = [
    (TrialOutcome(status="ok", samples=[_sample(0, end_ns=1 * MS), _sample(1)], window_s=1.0, started_at_us=1,
                  finished_at_us=2), "end_ns 1000000 is before send_ns 10000000"),
    (TrialOutcome(status="ok", samples=[_sample(0, output_tokens=-16), _sample(1)], window_s=1.0,
                  started_at_us=1, finished_at_us=2), "output_tokens -16"),
    (TrialOutcome(status="ok", samples=[_sample(0), _sample(1)], window_s=1e-300, started_at_us=1,
                  finished_at_us=2), "window_s 1e-300 is shorter than"),  # 5e300 tok/s
    (TrialOutcome(status="ok", samples=[_sample(0, first_token_ns=900 * MS), _sample(1)], window_s=1.0,
                  started_at_us=1, finished_at_us=2), "first_token_ns 900000000 is outside"),
]


def _raw_dealer(ctx: zmq.Context[zmq.Socket[bytes]], address: str, identity: bytes | None,
                home: Path) -> zmq.Socket[bytes]:
    """A DEALER with the fleet's admitted CURVE key (so its frames pass ZAP and reach the decoder)
    and any routing id, or ZeroMQ's generated one (``identity`` None)."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    pair = load_pair(daemon_dir(home))
    sock.setsockopt(zmq.CURVE_SERVERKEY, load_pair(coordinator_dir(home)).public.encode("ascii"))
    sock.setsockopt(zmq.CURVE_PUBLICKEY, pair.public.encode("ascii"))
    sock.setsockopt(zmq.CURVE_SECRETKEY, pair.secret.encode("ascii"))
    sock.connect(address)
    return sock


def _store_state(fleet: Fleet) -> tuple[list[Any], list[Any]]:
    attempts = fleet.query("SELECT trial_id, attempt, status, failure_kind, error, daemon_id, batch_id, submission_id,"
                           " finished_at_us FROM attempts ORDER BY trial_id, attempt")
    transitions = fleet.query("SELECT * FROM transitions ORDER BY rowid")
    return attempts, transitions


def _frame(msg: Any, **changes: Any) -> bytes:
    doc = json.loads(msgs.encode(msg))
    doc.update(changes)
    return json.dumps(doc, separators=(",", ":")).encode()


def _replace(frame: bytes, old: bytes, new: bytes) -> bytes:
    assert old in frame, (old, frame[:300])
    return frame.replace(old, new)


def _forged_under_a_real_session(mallory: Scripted, grant: msgs.Grant) -> list[bytes]:
    """Schema-valid (or nearly) hostile messages from the lease holder's own routing id."""
    t0, t1 = grant.trials
    nonce, batch = mallory.nonce, grant.batch_id
    ok = TrialOutcome(status="ok", samples=[_sample(0), _sample(1)], window_s=1.0, started_at_us=1, finished_at_us=2)
    result = msgs.Result(session_nonce=nonce, batch_id=batch, trial_id=t0.trial_id, epoch=t0.attempt,
                    submission_id="forged", outcome=ok)
    state = msgs.State(session_nonce=nonce, batch_id=batch, trial_id=t0.trial_id, epoch=t0.attempt, phase="done")
    return [
        _frame(state, epoch=2**70),  # took the coordinator down (OverflowError in SQLite)
        _frame(state, epoch=t0.attempt + 5),  # a forged epoch: not the current attempt
        _frame(state, trial_id="f" * 64),  # a trial it does not hold
        _frame(state, session_nonce="forged-nonce"),  # a wrong session: REJOIN
        _frame(result, epoch=t0.attempt + 1, submission_id="forged-epoch"),  # STALE
        _frame(result, epoch=2**63, submission_id="huge-epoch"),  # over SQLite's range: dropped
        # out-of-bounds outcomes are judged like any RESULT (a parse failure): for an attempt that is
        # not current, STALE (the lease holder's own is kept: test_an_out_of_bounds_result_...)
        _frame(result, submission_id="huge-time", epoch=t0.attempt + 1,
               outcome={**json.loads(ok.model_dump_json()), "started_at_us": 2**70, "finished_at_us": 2**70 + 1}),
        _frame(result, batch_id="other-batch", submission_id="other-batch"),  # STALE
        _frame(result, trial_id="e" * 64, submission_id="not-held"),  # STALE
        _frame(result, session_nonce="forged-nonce", submission_id="wrong-nonce"),  # REJOIN, never accepted
        _replace(_frame(result, submission_id="nan", trial_id="e" * 64), b'"window_s":1.0', b'"window_s":NaN'),
        _replace(_frame(result, submission_id="inf", session_nonce="forged-nonce"), b'"window_s":1.0',
                 b'"window_s":1e999'),  # REJOIN
        _frame(result, submission_id="transport", outcome={**json.loads(ok.model_dump_json()), "status": "failed",
                                                           "failure_kind": "transport"}),  # refused at decode
        _frame(result, submission_id="x" * 10_000),
        _frame(state, detail="d" * (8 * 1024 * 1024)),  # within the frame bound, over the field bound
        _frame(msgs.Heartbeat(session_nonce=nonce, seq=10**6,
                         leases=[msgs.LeaseRef(trial_id="f" * 64, epoch=1), msgs.LeaseRef(trial_id=t1.trial_id, epoch=9)])),
        _frame(msgs.Heartbeat(session_nonce=nonce, seq=1, leases=[]), seq=-1),
        _frame(msgs.Ready(session_nonce=nonce, seq=99, held=[msgs.LeaseRef(trial_id=t.trial_id, epoch=t.attempt)
                                                        for t in grant.trials])),  # holding: NO_WORK
        _frame(msgs.BatchError(session_nonce=nonce, batch_id="not-its-batch", epoch=1, error="forged")),
        _frame(msgs.BatchError(session_nonce="forged-nonce", batch_id=batch, epoch=1, error="forged")),
        _frame(msgs.Bye(session_nonce="forged-nonce", reason="forged")),
        b'{"type":"STATE"' + b"," * 1000 + b"}",
        b"[" * 100_000,
    ]


def _finish(fleet: Fleet, timeout_s: float = 90) -> tuple[int, str, str]:
    code, out, log = fleet.wait_coordinator(timeout_s)
    for proc in fleet.daemons.values():  # told SHUTDOWN: they exit by themselves
        if proc.poll() is None:
            proc.wait(timeout=20)  # at the latest QUICK_EXIT's 5 s after the coordinator's end
    return code, out, log


def _renew(mallory: Scripted, held: list[msgs.LeaseRef], timeout_s: float = 30) -> msgs.Renewed:
    """Send a HEARTBEAT listing ``held`` and wait for the RENEWED that answers it (by its seq)."""
    mallory.seq += 1
    seq = mallory.seq + 10_000
    mallory.send(msgs.Heartbeat(session_nonce=mallory.nonce, seq=seq, leases=held))
    while True:
        answer = mallory.recv((msgs.Renewed,), timeout_s)
        assert isinstance(answer, msgs.Renewed)
        if answer.seq == seq:
            return answer


def _lease(mallory: Scripted) -> msgs.Grant:
    """Join as ``mallory`` (the fleet's admitted key) and take a batch of two trials."""
    mallory.send(msgs.Hello(daemon_id="mallory", session_nonce=mallory.nonce, pid=1,
                            capabilities=msgs.Capabilities(fingerprint=_fingerprint())))
    assert isinstance(mallory.recv((msgs.Welcome,), 60), msgs.Welcome)
    mallory.send(msgs.Ready(session_nonce=mallory.nonce, seq=1))
    grant = mallory.recv((msgs.Grant,))
    assert isinstance(grant, msgs.Grant) and len(grant.trials) == 2
    return grant


def test_a_hostile_peer_never_takes_the_coordinator_down_or_changes_a_trial(fleet: Fleet) -> None:
    fleet.start_coordinator()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    mallory = Scripted(fleet.address, fleet.home, "mallory")
    sockets: list[zmq.Socket[bytes]] = []
    try:
        grant = _lease(mallory)
        held = [msgs.LeaseRef(trial_id=t.trial_id, epoch=t.attempt) for t in grant.trials]
        before = _store_state(fleet)
        assert [row[2] for row in before[0]] == ["running", "running"]

        # 1. schema-valid hostile messages and out-of-range values under the lease holder's session
        for frame in _forged_under_a_real_session(mallory, grant):
            mallory.sock.send(frame)
        # 2. routing ids that are not daemon ids (not UTF-8, not a wire id, ZeroMQ-generated)
        bad_ids = [b"\xff\xfe\xfd", b"mallory\xff", "m\u00e4llory".encode("latin-1"), b"bad id!", None]
        for ident in bad_ids:
            sock = _raw_dealer(ctx, fleet.address, ident, fleet.home)
            sockets.append(sock)
            sock.send(msgs.encode(msgs.Hello(daemon_id="mallory", session_nonce="n2", pid=2,
                                   capabilities=msgs.Capabilities(fingerprint=_fingerprint()))))
            sock.send(_frame(msgs.Ready(session_nonce=mallory.nonce, seq=5)))
        # 3. a frame over the size bound (libzmq cuts that connection) and a three-frame message
        big = _raw_dealer(ctx, fleet.address, b"big", fleet.home)
        sockets.append(big)
        big.send(b" " * (MAX_MESSAGE_BYTES + 1))
        big.send_multipart([b"one", b"two"])
        # 4. hypothesis-fuzzed frames from a peer without a session
        fuzzer = _raw_dealer(ctx, fleet.address, b"fuzzer", fleet.home)
        sockets.append(fuzzer)

        @settings(max_examples=150, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
        @given(st.one_of(st.binary(max_size=300), near_valid()))
        def fuzz(frame: bytes) -> None:
            fuzzer.send(frame)

        fuzz()
        renewed = _renew(mallory, held)  # answered after everything above: the coordinator is up
        assert {(r.trial_id, r.epoch) for r in renewed.leases} == {(r.trial_id, r.epoch) for r in held}
        assert fleet.poll_coordinator() is None, "the coordinator exited"
        assert _store_state(fleet) == before, "a hostile message changed a trial's state"

        # 5. the peer's impossible results: ACKed, kept as parse failures, never ranked
        answers = []
        outcomes = iter(IMPOSSIBLE)
        for batch_no in range(2):
            if batch_no:
                mallory.send(msgs.Ready(session_nonce=mallory.nonce, seq=2, answered_seq=1))
                grant = mallory.recv((msgs.Grant,))
                assert isinstance(grant, msgs.Grant)
                fleet.start_daemon("honest", None, *QUICK_EXIT)  # takes the batch that is left
            for t in grant.trials:
                outcome, _ = next(outcomes)
                mallory.send(msgs.Result(session_nonce=mallory.nonce, batch_id=grant.batch_id, trial_id=t.trial_id,
                                    epoch=t.attempt, submission_id=f"mallory-{t.trial_id[:8]}", outcome=outcome))
                answers.append(mallory.recv((msgs.Ack, msgs.Stale, msgs.Conflict)))
        assert all(isinstance(a, msgs.Ack) for a in answers), answers
    finally:
        mallory.close()
        for sock in sockets:
            sock.close(linger=0)
    code, out, log = _finish(fleet)
    assert code == 0, log[-4000:]
    assert "Traceback" not in log, log[-4000:]
    assert log.count("is not a daemon id") >= 2 * len(bad_ids), log[-4000:]

    attempts = fleet.attempts()
    mine = [a for a in attempts if a["daemon_id"] == "mallory"]
    assert len(mine) == 4 and {a["failure_kind"] for a in mine} == {"parse"}, mine
    reasons = " | ".join(a["error"] for a in mine)
    for _, needle in IMPOSSIBLE:
        assert needle in reasons, reasons
    for a in mine:  # the raw payload is kept beside the reason
        record = json.loads((fleet.folder / a["result_path"]).read_text())
        assert record["failure_kind"] == "parse" and record["outcome"]["samples"], record
    assert {a["submission_id"] for a in attempts} >= {f"mallory-{a['trial_id'][:8]}" for a in mine}
    assert not any(str(a["submission_id"]).startswith(("forged", "huge", "other", "not-held", "wrong", "nan", "inf"))
                   for a in attempts)
    honest = [a for a in attempts if a["daemon_id"] == "honest"]
    assert len(honest) == 2 and {a["status"] for a in honest} == {"ok"}, honest

    store = Store.open_readonly(fleet.folder)
    try:
        ranked_ok = {s.trial_id for s in collect_summaries(store) if s.status == "ok"}
    finally:
        store.close()
    assert ranked_ok == {a["trial_id"] for a in honest}, "only the honest daemon's results may be ranked"
    assert "rank" in out
    problems = check_invariants(fleet, acked_submissions(fleet.daemon_log("honest")))
    assert not problems, "\n".join(problems)


def test_the_sweep_is_not_emptied_by_frames_with_bad_routing_ids(fleet: Fleet) -> None:
    """Four non-UTF-8 routing ids once turned every trial into a transport failure while the sweep
    exited 0: now they are dropped and counted, and the honest daemon measures every trial."""
    fleet.repeats = 1
    fleet.spec.write_text(fleet.spec.read_text().replace("repeats: 3", "repeats: 1"))
    fleet.start_coordinator()
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sockets = [_raw_dealer(ctx, fleet.address, bytes([0xff, 0xfe, i]), fleet.home) for i in range(4)]
    try:
        for i, sock in enumerate(sockets):
            sock.send(msgs.encode(msgs.Hello(daemon_id=f"x{i}", session_nonce="n", pid=3,
                                   capabilities=msgs.Capabilities(fingerprint=_fingerprint()))))
            sock.send(msgs.encode(msgs.Ready(session_nonce="n", seq=1)))
        wait_for(lambda: fleet.coordinator_log().count("is not a daemon id") >= 8, 30, "the drops logged")
        fleet.start_daemon("honest", None, *QUICK_EXIT)
        code, _, log = _finish(fleet)
    finally:
        for sock in sockets:
            sock.close(linger=0)
    assert code == 0, log[-4000:]
    attempts = fleet.attempts()
    assert len(attempts) == 2 and {a["status"] for a in attempts} == {"ok"}, attempts
    assert "(8 dropped so far)" in log, log[-3000:]
    assert not check_invariants(fleet)


def test_the_router_drops_and_counts_frames_whose_routing_id_is_not_a_daemon_id(tmp_path: Path) -> None:
    """In process: RouterEndpoint.recv returns only messages from valid daemon ids; the rest are counted."""
    from coordinator.transport import RouterEndpoint
    from coordinator.zap import KeyGate

    home = fleet_home(tmp_path / "home")
    router = RouterEndpoint("tcp://127.0.0.1:0", server=load_pair(coordinator_dir(home)), gate=KeyGate(home))
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    ids: list[bytes | None] = [b"\xff\xfe", b"ok\xc3", b"has space", None, b"d1"]
    socks = [_raw_dealer(ctx, router.address, ident, home) for ident in ids]
    try:
        frame = msgs.encode(msgs.Ready(session_nonce="n", seq=1))
        for sock in socks:
            sock.send(frame)
        socks[-1].send(b"not json")
        socks[-1].send_multipart([b"a", b"b"])
        got = []
        for _ in range(50):
            item = router.recv(100)
            if item is not None:
                got.append(item)
            if sum(router.dropped.values()) >= 6 and got:
                break
        assert [item[0] for item in got] == ["d1"]
        assert router.dropped == {"routing_id": 4, "malformed": 1, "frames": 1}, router.dropped
    finally:
        for sock in socks:
            sock.close(linger=0)
        router.close()


def test_a_renamed_old_connection_of_a_reconnected_daemon_is_named_plainly_not_as_an_intruder(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """libzmq's ROUTER_HANDOVER gives the old connection of a daemon that reconnected under its id a
    generated routing id (first byte 0) and still delivers what was queued on it; that peer announced
    the daemon's id in its handshake. Such a drop says so and is counted ``handover``; a generated id
    whose peer announced none (or a non-daemon id) stays ``routing_id``."""
    from coordinator.transport import RouterEndpoint, routing_id_drop
    from coordinator.zap import KeyGate

    assert routing_id_drop(b"\x00k\x8bEg", "d1") == "handover"
    assert routing_id_drop(b"\x00k\x8bEg", "") == "routing_id"  # a peer that set no routing id
    assert routing_id_drop(b"\x00k\x8bEg", "bad id!") == "routing_id"
    assert routing_id_drop(b"\xff\xfe", "d1") == "routing_id"  # not generated by libzmq
    home = fleet_home(tmp_path / "home")
    router = RouterEndpoint("tcp://127.0.0.1:0", server=load_pair(coordinator_dir(home)), gate=KeyGate(home))
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = _raw_dealer(ctx, router.address, None, home)
    try:
        with caplog.at_level(logging.WARNING, logger="coordinator.transport"):
            router._drop_routing_id(b"\x00k\x8bEg", "d1")
            sock.send(msgs.encode(msgs.Ready(session_nonce="n", seq=1)))  # a real generated id, none announced
            for _ in range(50):
                if router.recv(100) is None and router.dropped["routing_id"]:
                    break
        assert router.dropped == {"handover": 1, "routing_id": 1}, router.dropped
        handover, other = [r.getMessage() for r in caplog.records if r.name == "coordinator.transport"]
        assert "daemon d1's old connection" in handover and "reconnected under the same routing id" in handover
        assert "is not a daemon id" not in handover
        assert "is not a daemon id" in other
    finally:
        sock.close(linger=0)
        router.close()


def test_an_out_of_bounds_result_of_the_lease_holder_is_kept_as_a_parse_failure_and_acked(fleet: Fleet) -> None:
    """A RESULT whose outcome breaks a bound (a time over int64, NaN) from the daemon that holds the
    lease is neither ranked nor dropped (its daemon would re-send it forever): it is kept as a
    ``parse`` failure with the reason and its raw payload, and ACKed; a replay gets the same ACK."""
    fleet.start_coordinator()
    mallory = Scripted(fleet.address, fleet.home, "mallory")
    try:
        grant = _lease(mallory)
        t0, t1 = grant.trials
        ok = TrialOutcome(status="ok", samples=[_sample(0), _sample(1)], window_s=1.0, started_at_us=1, finished_at_us=2)
        result = msgs.Result(session_nonce=mallory.nonce, batch_id=grant.batch_id, trial_id=t0.trial_id,
                             epoch=t0.attempt, submission_id="huge-time", outcome=ok)
        huge = _frame(result, outcome={**json.loads(ok.model_dump_json()), "started_at_us": 2**70})
        nan = _replace(_frame(result, trial_id=t1.trial_id, epoch=t1.attempt, submission_id="nan"),
                       b'"window_s":1.0', b'"window_s":NaN')
        other = _replace(_frame(result, submission_id="nan-too"), b'"window_s":1.0', b'"window_s":NaN')
        answers = []
        for frame in (huge, huge, other, nan):
            mallory.sock.send(frame)
            answers.append(mallory.recv((msgs.Ack, msgs.Stale, msgs.Conflict), 30))
        assert [type(a).__name__ for a in answers] == ["Ack", "Ack", "Conflict", "Ack"], answers
        assert [a.submission_id for a in answers] == ["huge-time", "huge-time", "nan-too", "nan"]  # type: ignore[union-attr]
        fleet.start_daemon("honest", None, *QUICK_EXIT)  # the rest of the sweep
    finally:
        mallory.close()
    code, out, log = _finish(fleet)
    assert code == 0, log[-4000:]
    assert "is out of bounds" in log and "Traceback" not in log, log[-4000:]
    mine = {a["submission_id"]: a for a in fleet.attempts() if a["daemon_id"] == "mallory"}
    assert set(mine) == {"huge-time", "nan"}, mine
    for sub, where in (("huge-time", "outcome.started_at_us"), ("nan", "outcome.window_s")):
        a = mine[sub]
        assert a["failure_kind"] == "parse" and "refused at decode" in a["error"] and where in a["error"], a
        record = json.loads((fleet.folder / a["result_path"]).read_text())
        raw = record["outcome"]["log_tail"]
        assert record["failure_kind"] == "parse" and f'"submission_id":"{sub}"' in raw, record
    store = Store.open_readonly(fleet.folder)
    try:
        ranked_ok = {s.trial_id for s in collect_summaries(store) if s.status == "ok"}
    finally:
        store.close()
    assert not ranked_ok & {t0.trial_id, t1.trial_id}
    problems = check_invariants(fleet, acked_submissions(fleet.daemon_log("honest")))
    assert not problems, "\n".join(problems)
