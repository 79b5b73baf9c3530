"""The daemon's protocol core (:class:`daemon.session.DaemonSession`): pure, with a fake clock.

No sockets and no threads: each test feeds events with explicit times and checks the instructions.
:class:`Driver` plays the adapter where a test needs one (it ticks, and reopens the socket after a
:class:`Reconnect`'s delay).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence

import pytest

from daemon.session import (
    FENCE_EXPIRED,
    AbortBatch,
    DaemonSession,
    Exit,
    Instruction,
    Log,
    Reconnect,
    Send,
    SessionPolicy,
    StartBatch,
)
from servetune.exitcodes import ExitCode
from servetune.manifest import EngineConfig, TrialManifest
from servetune.messages import (
    Ack,
    BatchError,
    Bye,
    Capabilities,
    Conflict,
    Grant,
    GrantedTrial,
    Heartbeat,
    Hello,
    LeaseRef,
    NoWork,
    Ready,
    Rejoin,
    Renewed,
    Result,
    Revoked,
    Shutdown,
    Stale,
    State,
    Welcome,
)
from servetune.result import Fingerprint, TrialOutcome
from servetune.spec import BackendSpec, Budgets, LoadPoint, ModelSpec

FP = Fingerprint(hostname="test", cpu_model="test", cpu_count=1, cpu_isa="none", ram_gib=1.0, os="linux",
                 kernel="test", python="3", servetune_version="0", hardware_class="cpu-test")


def session(coordinator_lost_s: float = 300.0, rng_value: float = 0.5, **policy: float) -> DaemonSession:
    counter = itertools.count(1)
    return DaemonSession("d1", 4242, Capabilities(fingerprint=FP), coordinator_lost_s=coordinator_lost_s,
                         policy=SessionPolicy(**policy),  # type: ignore[arg-type]
                         nonce_factory=lambda: f"n{next(counter)}", rng=lambda: rng_value)


def grant(batch_id: str = "b1", trials: Sequence[str] = ("t1", "t2"), attempt: int = 1, ttl_s: float = 10.0) -> Grant:
    def manifest(i: int) -> TrialManifest:
        return TrialManifest(experiment="s", model={"source": "tiny"}, backend="vllm",
                             config_id=EngineConfig().config_id, engine=EngineConfig(),
                             load_point=LoadPoint(name=f"lp{i}", num_requests=1, max_concurrency=1))

    return Grant(batch_id=batch_id, epoch=attempt, ttl_s=ttl_s, model=ModelSpec(), backend=BackendSpec(),
                 budgets=Budgets(), config=EngineConfig(),
                 trials=[GrantedTrial(trial_id=t, attempt=attempt, manifest=manifest(i)) for i, t in enumerate(trials)])


def result(trial_id: str, batch_id: str = "b1", epoch: int = 1, sid: str | None = None) -> Result:
    return Result(session_nonce="unstamped", batch_id=batch_id, trial_id=trial_id, epoch=epoch,
                  submission_id=sid or f"sub-{trial_id}", outcome=TrialOutcome(status="ok", started_at_us=0,
                                                                               finished_at_us=1))


def ref(trial_id: str, epoch: int = 1) -> LeaseRef:
    return LeaseRef(trial_id=trial_id, epoch=epoch)


def sent(instructions: list[Instruction], kind: type | None = None) -> list:  # type: ignore[type-arg]
    msgs = [i.msg for i in instructions if isinstance(i, Send)]
    return [m for m in msgs if kind is None or isinstance(m, kind)]


def only(instructions: list[Instruction], kind: type) -> list:  # type: ignore[type-arg]
    return [i for i in instructions if isinstance(i, kind)]


def logs(instructions: list[Instruction]) -> str:
    return "\n".join(i.text for i in instructions if isinstance(i, Log))


class Driver:
    """Plays the adapter: ticks every ``step`` s and reopens the socket after a Reconnect's delay.

    ``answer`` plays a live coordinator's answer to each HEARTBEAT, at once: ``"renew"`` renews
    every lease listed, ``"none"`` renews none (but is heard), ``"silent"`` says nothing.
    """

    def __init__(self, s: DaemonSession, now: float = 0.0, step: float = 0.1, answer: str = "silent",
                 ttl_s: float = 10.0):
        self.s, self.now, self.step, self.answer, self.ttl_s = s, now, step, answer, ttl_s
        self.reopen_at: float | None = None
        self.log: list[tuple[float, Instruction]] = []

    def feed(self, instructions: list[Instruction]) -> list[Instruction]:
        out = list(instructions)
        for ins in instructions:
            self.log.append((self.now, ins))
            if isinstance(ins, Reconnect):
                self.reopen_at = self.now + ins.delay_s
            if isinstance(ins, Send) and isinstance(ins.msg, Heartbeat) and self.answer != "silent":
                leases = ins.msg.leases if self.answer == "renew" else []
                out += self.message(Renewed(seq=ins.msg.seq, leases=leases, ttl_s=self.ttl_s))
        return out

    def start(self) -> list[Instruction]:
        return self.feed(self.s.start(self.now))

    def message(self, msg: object) -> list[Instruction]:
        return self.feed(self.s.on_message(msg, self.now))  # type: ignore[arg-type]

    def until(self, t_end: float) -> list[Instruction]:
        out: list[Instruction] = []
        while self.now < t_end - 1e-9 and not self.s.exited:
            self.now = round(self.now + self.step, 6)
            out += self.feed(self.s.on_tick(self.now))
            if self.reopen_at is not None and self.now >= self.reopen_at:
                self.reopen_at = None
                out += self.feed(self.s.on_connected(self.now))
        return out

    def welcome(self, heartbeat_s: float = 1.0, ttl_s: float = 10.0) -> list[Instruction]:
        return self.message(Welcome(session_nonce=self.s.nonce, coordinator_id="c", heartbeat_interval_s=heartbeat_s,
                                    lease_ttl_s=ttl_s))


def welcomed(heartbeat_s: float = 1.0, answer: str = "silent", **kw: float) -> Driver:
    d = Driver(session(**kw), answer=answer)
    d.start()
    d.welcome(heartbeat_s=heartbeat_s)
    return d


# --------------------------------------------------------------------------- joining


def test_hello_then_welcome_then_ready() -> None:
    d = Driver(session())
    hello = sent(d.start())
    assert len(hello) == 1 and isinstance(hello[0], Hello)
    assert (hello[0].daemon_id, hello[0].session_nonce, hello[0].pid, hello[0].held) == ("d1", "n1", 4242, [])
    assert not sent(d.until(1.0)), "nothing but HELLO before the WELCOME"
    assert not sent(d.message(Welcome(session_nonce="someone-else", coordinator_id="c")))
    out = d.welcome()
    assert [type(m) for m in sent(out)] == [Ready] and sent(out)[0].session_nonce == "n1"
    assert "welcomed by c" in logs(out)
    assert not sent(d.until(0.9), Ready), "one READY until it is answered"
    d.message(NoWork(retry_after_s=2.0))
    assert not sent(d.until(2.9), Ready)
    assert len(sent(d.until(3.1), Ready)) == 1, "READY again after NO_WORK's retry_after_s"


def test_hello_resent_with_backoff_until_welcome_and_no_reconnect_before_one() -> None:
    d = Driver(session(), step=0.1)
    d.start()
    d.until(40.0)
    times = [t for t, i in d.log if isinstance(i, Send) and isinstance(i.msg, Hello)]
    assert times == pytest.approx([0.0, 2.0, 6.0, 14.0, 30.0])  # 2, 4, 8, 16, 16 s apart
    assert {i.msg.session_nonce for _, i in d.log if isinstance(i, Send)} == {"n1"}, "a re-send keeps its nonce"
    assert not [i for _, i in d.log if isinstance(i, Reconnect)]


def test_every_message_carries_the_current_session_nonce() -> None:
    d = welcomed()
    d.message(grant())
    out = d.feed(d.s.on_outgoing(State(session_nonce="unstamped", batch_id="b1", epoch=1, phase="server_ready"), 0.0))
    out += d.feed(d.s.on_outgoing(result("t1"), 0.0))
    out += d.until(1.1)
    assert {m.session_nonce for m in sent(out)} == {"n1"} and len(sent(out)) == 3


# --------------------------------------------------------------------------- heartbeats and renewal


def test_heartbeats_every_interval_busy_or_idle_listing_every_lease() -> None:
    d = welcomed(heartbeat_s=0.5, answer="renew")
    idle = sent(d.until(2.05), Heartbeat)
    assert len(idle) == 4 and all(h.leases == [] for h in idle)
    d.message(grant(trials=("t1", "t2")))
    busy = sent(d.until(4.05), Heartbeat)
    assert len(busy) == 4 and all(h.leases == [ref("t1"), ref("t2")] for h in busy)
    beats = [(t, i.msg) for t, i in d.log if isinstance(i, Send) and isinstance(i.msg, Heartbeat)]
    assert [b - a for (a, _), (b, _) in zip(beats, beats[1:])] == pytest.approx([0.5] * 7)
    seqs = [m.seq for _, m in beats]
    assert seqs == sorted(set(seqs)), "a fresh seq per heartbeat"
    assert all(d.s.sent_at(m.seq) == pytest.approx(t) for t, m in beats)
    d.feed(d.s.on_outgoing(result("t1"), d.now))
    assert sent(d.until(4.6), Heartbeat)[-1].leases == [ref("t1"), ref("t2")], "a submitted result keeps its lease"
    d.message(Ack(trial_id="t1", submission_id="sub-t1"))
    assert sent(d.until(5.1), Heartbeat)[-1].leases == [ref("t2")], "until it is answered"


def test_grant_lease_runs_from_the_ready_and_renewed_extends_from_the_seq_send_time() -> None:
    d = welcomed(heartbeat_s=1.0, answer="none")  # READY sent at t=0
    d.until(3.0)
    d.message(grant(ttl_s=10.0))  # arrives at t=3
    lease = d.s.lease(ref("t1"))
    assert lease is not None and lease.deadline == pytest.approx(10.0), "from the READY, not the GRANT"
    d.until(4.0)
    beat = sent([i for t, i in d.log if t == pytest.approx(4.0)], Heartbeat)[0]
    d.until(7.0)
    d.message(Renewed(seq=beat.seq, leases=[ref("t1")], ttl_s=10.0))  # answered at t=7 to the beat sent at t=4
    assert d.s.lease(ref("t1")).deadline == pytest.approx(14.0)  # type: ignore[union-attr]
    assert d.s.lease(ref("t2")).deadline == pytest.approx(10.0), "only the leases listed"  # type: ignore[union-attr]
    d.message(Renewed(seq=beat.seq - 2, leases=[ref("t1")], ttl_s=10.0))
    assert d.s.lease(ref("t1")).deadline == pytest.approx(14.0), "an older answer never shortens"  # type: ignore[union-attr]
    out = d.message(Renewed(seq=99_999, leases=[ref("t1"), ref("t2")], ttl_s=100.0))
    assert "unknown seq" in logs(out) and d.s.lease(ref("t2")).deadline == pytest.approx(10.0)  # type: ignore[union-attr]


# --------------------------------------------------------------------------- fencing


def test_an_expired_lease_fences_its_batch_and_nothing_more_is_sent_for_it() -> None:
    d = welcomed(heartbeat_s=1.0, answer="none")
    d.message(grant(trials=("t1", "t2"), ttl_s=5.0))  # deadline t=5, never renewed
    assert not only(d.until(4.9), AbortBatch)
    out = d.until(5.0)
    assert only(out, AbortBatch) == [AbortBatch("b1", FENCE_EXPIRED)]
    assert "t1@1" in logs(out) and "t2@1" in logs(out) and FENCE_EXPIRED in logs(out)
    late = d.feed(d.s.on_outgoing(result("t1"), d.now))
    assert not sent(late) and "submits nothing" in logs(late)
    assert not sent(d.feed(d.s.on_outgoing(State(session_nonce="u", batch_id="b1", trial_id="t2", epoch=1,
                                                 phase="done"), d.now)))
    assert sent(d.until(6.05), Heartbeat)[-1].leases == []
    assert not sent(d.until(7.0), Ready), "the batch still runs until the worker says it is done"
    assert sent(d.feed(d.s.on_batch_done("b1", d.now)), Ready)


def test_a_daemon_resumed_after_a_stall_fences_before_it_sends_anything_stale() -> None:
    d = welcomed(heartbeat_s=1.0)
    d.message(grant(trials=("t1",), ttl_s=5.0))
    d.until(1.0)
    # SIGSTOP for 60 s; meanwhile the worker produced a result. The adapter ticks first:
    out = d.feed(d.s.on_tick(61.0))
    assert only(out, AbortBatch) and "did not run for 60.0 s" in logs(out)
    assert not only(out, Exit) and not only(out, Reconnect), "a stall is not the coordinator's silence"
    assert not sent(d.feed(d.s.on_outgoing(result("t1"), 61.0)))


def test_revoked_aborts_only_when_the_trial_has_not_submitted_its_result() -> None:
    d = welcomed()
    d.message(grant(trials=("t1", "t2")))
    d.feed(d.s.on_outgoing(result("t1"), 0.0))
    out = d.message(Revoked(seq=0, leases=[ref("t1")], reason="re-granted"))
    assert not only(out, AbortBatch) and "re-granted" in logs(out)
    assert d.s.unanswered == [] and d.s.lease(ref("t1")) is None
    out = d.message(Revoked(seq=0, leases=[ref("t2")], reason="daemon declared dead"))
    assert only(out, AbortBatch) == [AbortBatch("b1", "lease revoked: daemon declared dead")]
    assert not only(d.message(Revoked(seq=0, leases=[ref("t2"), ref("t9")], reason="again")), AbortBatch)


def test_a_batch_that_ends_without_a_result_releases_those_leases() -> None:
    d = welcomed()
    d.message(grant(trials=("t1", "t2")))
    d.feed(d.s.on_outgoing(result("t1"), 0.0))
    out = d.feed(d.s.on_batch_done("b1", 0.5))
    assert "t2@1" in logs(out) and sent(out, Ready)
    assert d.s.held(0.5) == [ref("t1")]


# --------------------------------------------------------------------------- results


def test_unanswered_results_are_resent_after_a_new_welcome_and_dropped_on_answers() -> None:
    d = welcomed(heartbeat_s=0.2)
    d.message(grant(trials=("t1", "t2", "t3"), ttl_s=60.0))
    first = [sent(d.feed(d.s.on_outgoing(result(t), 0.0)))[0] for t in ("t1", "t2", "t3")]
    assert [m.session_nonce for m in first] == ["n1"] * 3
    out = d.until(2.6)  # silence: reconnect after 2 s, reopened 0.5 s later
    hello = sent(out, Hello)[-1]
    assert hello.session_nonce == "n2" and hello.held == [ref("t1"), ref("t2"), ref("t3")]
    # unanswered for retry_after_s (1 s here), each was sent again in the old session ...
    assert {m.submission_id for m in sent(out, Result) if m.session_nonce == "n1"} == {"sub-t1", "sub-t2", "sub-t3"}
    after_hello = out[out.index(next(i for i in out if isinstance(getattr(i, "msg", None), Hello))):]
    assert not sent(after_hello, Result), "... and in the new session they wait for its WELCOME"
    again = sent(d.welcome(heartbeat_s=0.2), Result)
    assert [(m.submission_id, m.session_nonce) for m in again] == [("sub-t1", "n2"), ("sub-t2", "n2"),
                                                                    ("sub-t3", "n2")]
    d.message(Ack(trial_id="t1", submission_id="sub-t1"))
    d.message(Stale(trial_id="t2", submission_id="sub-t2", reason="re-granted"))
    out = d.message(Conflict(trial_id="t3", submission_id="sub-t3", reason="another result was accepted"))
    assert "CONFLICT" in logs(out) and d.s.unanswered == []
    assert d.s.held(d.now) == []
    assert not sent(d.welcome(), Result), "a second WELCOME of the same session changes nothing"


def test_results_of_finished_batches_are_bounded() -> None:
    d = welcomed(kept_results=2)
    for i in range(4):
        d.message(grant(batch_id=f"b{i}", trials=(f"t{i}",), ttl_s=60.0))
        d.feed(d.s.on_outgoing(result(f"t{i}", batch_id=f"b{i}"), d.now))
        out = d.feed(d.s.on_batch_done(f"b{i}", d.now))
    d.message(grant(batch_id="b9", trials=("t9",), ttl_s=60.0))
    out = d.feed(d.s.on_outgoing(result("t9", batch_id="b9"), d.now))
    assert d.s.unanswered == ["sub-t2", "sub-t3", "sub-t9"], "the running batch's results are all kept"
    assert "dropped" in logs(out) and d.s.lease(ref("t1")) is None


def test_a_batch_error_is_sent_while_a_lease_of_its_batch_is_held() -> None:
    d = welcomed()
    d.message(grant())
    err = BatchError(session_nonce="u", batch_id="b1", epoch=1, error="KeyError: 'x'", traceback_tail="Traceback")
    assert [m.session_nonce for m in sent(d.feed(d.s.on_outgoing(err, 0.0)))] == ["n1"]
    other = err.model_copy(update={"batch_id": "b-unknown"})
    out = d.feed(d.s.on_outgoing(other, 0.0))
    assert not sent(out) and "submits nothing" in logs(out)


# --------------------------------------------------------------------------- connection


def test_coordinator_silence_reconnects_with_growing_backoff_keeping_valid_leases() -> None:
    d = welcomed(heartbeat_s=0.2)  # suspect after max(0.6, 2) s
    d.message(grant(trials=("t1",), ttl_s=100.0))
    d.until(40.0)
    reconnects = [(t, i.delay_s) for t, i in d.log if isinstance(i, Reconnect)]
    assert reconnects[0][0] == pytest.approx(2.0)
    assert [delay for _, delay in reconnects] == pytest.approx([0.5, 1, 2, 4, 8, 8, 8])
    hellos = [i.msg for _, i in d.log if isinstance(i, Send) and isinstance(i.msg, Hello)]
    assert [h.session_nonce for h in hellos] == [f"n{k}" for k in range(1, 8)], "a new nonce per reconnect"
    assert all(h.held == [ref("t1")] for h in hellos[1:]), "leases stay valid through the silence"
    assert d.s.running_batch == "b1" and not only([i for _, i in d.log], AbortBatch)
    assert sent(d.until(45.5), Hello)[-1].session_nonce == "n8"  # reopened after the last 8 s
    d.welcome(heartbeat_s=0.2)
    d.until(d.now + 2.1)
    assert [i.delay_s for _, i in d.log if isinstance(i, Reconnect)][-1] == pytest.approx(0.5), "reset by WELCOME"


@pytest.mark.parametrize("rng_value, factor", [(0.0, 0.75), (0.999999, 1.25)])
def test_reconnect_jitter_comes_from_the_injected_rng(rng_value: float, factor: float) -> None:
    d = Driver(session(rng_value=rng_value))
    d.start()
    d.welcome(heartbeat_s=0.2)
    delays = [i.delay_s for i in d.until(6.0) if isinstance(i, Reconnect)]
    assert delays[:2] == pytest.approx([0.5 * factor, 1.0 * factor], rel=1e-4)


def test_rejoin_says_hello_at_once_with_a_new_nonce_and_the_leases_held() -> None:
    d = welcomed()
    d.message(grant(trials=("t1",)))
    out = d.message(Rejoin(reason="unknown session"))
    hello = sent(out, Hello)
    assert not only(out, Reconnect) and len(hello) == 1
    assert hello[0].session_nonce == "n2" and hello[0].held == [ref("t1")]
    assert not sent(d.message(Rejoin(reason="answers an older message")), Hello), "that HELLO is on its way"
    assert not sent(d.until(1.5), Heartbeat), "no heartbeat until the new session is welcomed"


def test_lost_coordinator_exits_after_coordinator_lost_s_even_without_a_first_welcome() -> None:
    d = Driver(session(coordinator_lost_s=10.0), step=0.5)
    d.start()
    assert not only(d.until(9.5), Exit)
    out = d.until(10.0)
    assert only(out, Exit) == [Exit(ExitCode.LOST_COORDINATOR, only(out, Exit)[0].reason)]
    assert isinstance(sent(out)[-1], Bye) and "--coordinator-lost 10" in only(out, Exit)[0].reason
    assert d.s.on_tick(11.0) == [] and d.s.on_message(Welcome(session_nonce="n1", coordinator_id="c"), 11.0) == []


def test_lost_coordinator_aborts_the_running_batch_first() -> None:
    d = welcomed(heartbeat_s=0.2, coordinator_lost_s=20.0)
    d.message(grant(ttl_s=1000.0))
    out = d.until(30.0)
    kinds = [type(i) for i in out if not isinstance(i, (Log, Send, Reconnect))]
    assert kinds[-2:] == [AbortBatch, Exit] and only(out, Exit)[0].code == ExitCode.LOST_COORDINATOR
    assert d.now == pytest.approx(20.0)


def test_shutdown_aborts_says_bye_and_exits_ok() -> None:
    d = welcomed()
    d.message(grant())
    out = [i for i in d.message(Shutdown(reason="sweep done")) if not isinstance(i, Log)]
    assert out == [AbortBatch("b1", "daemon exiting: coordinator: sweep done"),
                   Send(Bye(session_nonce="n1", reason="coordinator: sweep done")),
                   Exit(ExitCode.OK, "coordinator: sweep done")]
    assert d.s.on_outgoing(result("t1"), 1.0) == []


def test_a_stop_request_exits_interrupted() -> None:
    d = welcomed()
    out = d.s.on_stop_requested("signal SIGTERM", 0.5)
    assert sent(out) == [Bye(session_nonce="n1", reason="signal SIGTERM")]
    assert only(out, Exit) == [Exit(ExitCode.INTERRUPTED, "signal SIGTERM")]


def test_a_grant_while_busy_is_refused() -> None:
    d = welcomed()
    assert only(d.message(grant(batch_id="b1", trials=("t1",))), StartBatch)
    out = d.message(grant(batch_id="b2", trials=("t2",)))
    assert not only(out, StartBatch) and "busy with batch b1" in logs(out)
    assert d.s.held(0.0) == [ref("t1")]
    assert [i.level for i in out if isinstance(i, Log)] == [logging.ERROR]


def test_a_grant_before_the_welcome_is_refused() -> None:
    d = Driver(session())
    d.start()
    assert not only(d.message(grant()), StartBatch) and d.s.held(0.0) == []


def test_an_unanswered_result_is_sent_again_with_back_off() -> None:
    d = welcomed(heartbeat_s=0.2, answer="renew")
    d.message(grant(trials=("t1",), ttl_s=60.0))
    d.feed(d.s.on_outgoing(result("t1"), d.now))
    times = []
    for _ in range(80):  # 8 s of ticks, the coordinator answering heartbeats but not the result
        out = d.until(d.now + 0.1)
        if sent(out, Result):
            times.append(round(d.now, 1))
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert len(times) >= 3 and all(g2 > g1 for g1, g2 in zip(gaps, gaps[1:])), times
    d.message(Ack(trial_id="t1", submission_id="sub-t1"))
    assert not sent(d.until(d.now + 5.0), Result)


def test_an_unanswered_ready_is_sent_again_and_a_grant_runs_from_the_ready_it_answers() -> None:
    d = welcomed(heartbeat_s=0.2, answer="none")
    readies = [(t, i.msg) for t, i in d.log if isinstance(i, Send) and isinstance(i.msg, Ready)]
    assert len(readies) == 1
    d.until(d.now + 1.05)  # unanswered for retry_after_s (max(3 x 0.2 s, 1 s)): sent again, new seq
    readies = [(t, i.msg) for t, i in d.log if isinstance(i, Send) and isinstance(i.msg, Ready)]
    assert len(readies) == 2 and readies[1][1].seq != readies[0][1].seq
    second_at, second = readies[1]
    d.until(second_at + 0.5)
    g = grant(trials=("t1",), ttl_s=2.0).model_copy(update={"seq": second.seq})
    out = d.message(g)
    assert [i for i in out if isinstance(i, StartBatch)], logs(out)
    lease = d.s.lease(ref("t1"))
    assert lease is not None and abs(lease.deadline - (second_at + 2.0)) < 1e-6, "from the READY it answers"
