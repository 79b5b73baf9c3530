"""FAKE daemons with an instant backend: many ZeroMQ DEALERs in one process, one poller loop.

Run as a child process (``python -m benchmarks.coordinator.clients --address ... --count N``),
pinned by its parent to the client core. Each fake daemon has its own routing id and speaks
protocol 2 as :mod:`servetune.messages` states it: HELLO (a :class:`~servetune.result.Fingerprint`
of hardware class ``fake-bench``), WELCOME (the heartbeat interval and TTL are taken from it),
READY (a new ``seq``, ``answered_seq``: the last READY a GRANT answered, ``held``); on a GRANT
(valid from the READY whose ``seq`` it echoes; one that arrives after that READY + TTL is refused,
as the real daemon does) it answers at once with one ok RESULT per trial (four fake request
samples and a one-second window, enough for the coordinator's ``summarize``) and a READY; a
HEARTBEAT every interval listing every lease held (granted, result not yet answered with
ACK/STALE/CONFLICT); a lease whose deadline passes unrenewed is dropped (fenced) and its result no
longer re-sent; a READY or RESULT unanswered for three heartbeat intervals is sent again (results
backing off to 15 s, as ``daemon.session.SessionPolicy``); RENEWED, REVOKED, NO_WORK (READY again
after ``retry_after_s``), SHUTDOWN (BYE, done) and REJOIN (a new session, HELLO listing the leases
still held, unanswered results re-sent after the WELCOME). Nothing is measured: no vLLM, no load,
no HTTP. CURVE is on, as for real daemons: the fleet's key pair and the coordinator key come from
``$SERVETUNE_HOME`` (the benchmark makes one per run). Not mimicked: the real daemon's reconnect when the coordinator is silent for three
intervals (a policy of ``daemon/session.py``, not a protocol rule).

The dead-daemon probe: ``--probe-after-s T`` arms the fleet T seconds after the first HELLO; the
first fake daemon to take a GRANT after that freezes (a hung process: it sends nothing more,
no result, no heartbeat, and reads nothing) while holding that lease.

What it records (``--out`` JSON, written on exit, SIGTERM included): ACK times, grant latencies
(the READY a GRANT answers -> GRANT received; and from the first READY of that wait), heartbeat
round trips (HEARTBEAT sent -> RENEWED received), every GRANT that carries a trial at attempt > 1
(a re-grant), the probe's victim, and per daemon whether it was welcomed, how long it went without
a RENEWED, REJOINs, REVOKEDs, STALEs, CONFLICTs, GRANTs refused as late, re-sends, and leases
fenced before their result was answered. Times are ``time.monotonic()`` (shared by every process on the
machine) and, where compared with the coordinator's log, ``time.time()``.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import resource
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import zmq

from servetune.errors import ProtocolError
from servetune.keys import daemon_dir, load_pair, pinned_coordinator_key, servetune_home
from servetune.messages import (
    Ack,
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
    TimeProbe,
    TimeReply,
    Welcome,
    decode,
    encode,
)
from servetune.result import Fingerprint, RequestSample, TrialOutcome
from servetune.wire import configure_dealer

FAKE_HARDWARE_CLASS = "fake-bench"
HELLO_RESEND_S = 5.0
#: As daemon.session.SessionPolicy: a READY or RESULT unanswered for 3 heartbeat intervals (at least
#: 1 s) is sent again, a result's re-sends doubling up to 15 s.
RETRY_HEARTBEATS = 3.0
RETRY_MIN_S = 1.0
RETRY_MAX_S = 15.0
PROGRESS_EVERY_S = 2.0
PROGRESS_PREFIX = "[progress] "  # echoed by the parent (benchmarks.loadgen.procs.Child)


def fake_fingerprint() -> Fingerprint:
    """The fingerprint every FAKE daemon reports: named as a fake, one hardware class."""
    return Fingerprint(
        hostname="fake-daemon", cpu_model="FAKE (benchmarks/coordinator)", cpu_count=1, cpu_isa="none",
        ram_gib=1.0, os="fake", kernel="fake", python=sys.version.split()[0], servetune_version="fake",
        hardware_class=FAKE_HARDWARE_CLASS,
    )


def fake_outcome(fingerprint: Fingerprint) -> TrialOutcome:
    """An ok outcome from the instant backend: four requests of four tokens in a 1 s window."""
    t0 = 1_000_000_000
    samples = []
    for i in range(4):
        send = t0 + i * 250_000_000
        tokens = [send + 5_000_000 + k * 1_000_000 for k in range(4)]
        samples.append(RequestSample(index=i, scheduled_ns=send, send_ns=send, first_token_ns=tokens[0],
                                     end_ns=tokens[-1], token_ns=tokens, prompt_tokens=128, output_tokens=4))
    now_us = time.time_ns() // 1000
    return TrialOutcome(status="ok", samples=samples, window_s=1.0, offered_rate=4.0, fingerprint=fingerprint,
                        started_at_us=now_us, finished_at_us=now_us)


@dataclass
class HeldLease:
    epoch: int
    batch_id: str
    deadline: float  # monotonic: TTL after the message whose answer last renewed it (fenced after it)


@dataclass
class Unanswered:
    frame: bytes
    trial_id: str
    resend_at: float
    interval: float


@dataclass
class FakeDaemon:
    """Protocol state of one FAKE daemon (its socket lives in the fleet)."""

    index: int
    daemon_id: str
    session: str = ""
    seq: int = 0
    welcomed: bool = False
    done: bool = False
    frozen: bool = False
    heartbeat_s: float = 1.0
    ttl_s: float = 30.0
    held: dict[str, HeldLease] = field(default_factory=dict)  # trial_id -> lease
    unanswered: dict[str, Unanswered] = field(default_factory=dict)  # submission_id -> RESULT to re-send
    answered: set[str] = field(default_factory=set)  # submission ids answered (ACK, STALE or CONFLICT)
    ready_sent: dict[int, float] = field(default_factory=dict)  # seq -> send time of READYs not yet answered
    ready_since: float | None = None  # the first READY of the current wait for work
    ready_last: float = 0.0
    answered_seq: int = 0  # the seq of the last READY of this session a GRANT answered
    hello_sent_at: float = 0.0
    sent: dict[int, float] = field(default_factory=dict)  # seq -> send time (HELLO, HEARTBEAT)
    last_send_wall: float = 0.0
    last_send_mono: float = 0.0
    welcomed_at: float | None = None
    last_renewed: float | None = None
    max_renewed_gap: float = 0.0
    renewed: int = 0
    heartbeats: int = 0
    rejoins: int = 0
    revoked: int = 0  # REVOKED for a lease still held (no answer to its result yet)
    revoked_answered: int = 0  # REVOKED for a lease no longer held (answered or fenced already)
    stale: int = 0
    conflict: int = 0
    lapsed: int = 0  # leases fenced: their deadline passed before their result was answered
    late_grants: int = 0  # GRANTs refused: their lease had run out before they arrived
    ready_resends: int = 0
    grants_unmatched: int = 0  # GRANTs whose seq names no READY still waiting (a NO_WORK crossed them)
    result_resends: int = 0
    grants: int = 0

    @property
    def retry_s(self) -> float:
        """A READY or RESULT unanswered this long is sent again (daemon.session.SessionPolicy)."""
        return max(RETRY_HEARTBEATS * self.heartbeat_s, RETRY_MIN_S)

    def new_session(self) -> None:
        self.session = uuid.uuid4().hex[:16]
        self.welcomed = False
        self.answered_seq = 0
        self.ready_sent.clear()
        self.ready_since = None


class FakeFleet:
    """``count`` FAKE daemons dialling ``address``, driven by one :class:`zmq.Poller` loop."""

    def __init__(self, address: str, count: int, first_index: int, probe_after_s: float | None,
                 deadline_s: float, name_prefix: str = "fake") -> None:
        self.address = address
        self.deadline_s = deadline_s
        self.probe_after_s = probe_after_s
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.ctx.set(zmq.MAX_SOCKETS, max(1024, 2 * count + 64))
        self.fingerprint = fake_fingerprint()
        self.outcome = fake_outcome(self.fingerprint)
        self.daemons = [FakeDaemon(i, f"{name_prefix}-{i:05d}") for i in range(first_index, first_index + count)]
        self.socks: list[zmq.Socket[bytes]] = []
        self.by_sock: dict[zmq.Socket[bytes], FakeDaemon] = {}
        self.poller = zmq.Poller()
        self.timers: list[tuple[float, int, int, str]] = []  # (due, tiebreak, position, kind)
        self._tie = 0
        self.stop = False
        self.started_mono = 0.0
        # records
        self.ack_mono: list[float] = []
        self.grant_latency_s: list[float] = []  # from the READY the GRANT answers (its seq)
        self.grant_wait_s: list[float] = []  # from the first READY of that wait for work
        self.hb_rtt_s: list[float] = []
        self.regrants: list[dict[str, Any]] = []
        self.victim: dict[str, Any] | None = None
        self.unexpected: list[str] = []
        self.no_work = 0
        self.shutdown_reasons: dict[str, int] = {}

    # ------------------------------------------------------------------ sockets and timers

    def _send(self, d: FakeDaemon, frame: bytes) -> None:
        try:
            self.socks[self._pos(d)].send(frame, zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            self.unexpected.append(f"{d.daemon_id}: send failed: {exc}")
            return
        d.last_send_mono = time.monotonic()
        d.last_send_wall = time.time()

    def _pos(self, d: FakeDaemon) -> int:
        return d.index - self.daemons[0].index

    def _at(self, due: float, d: FakeDaemon, kind: str) -> None:
        self._tie += 1
        heapq.heappush(self.timers, (due, self._tie, self._pos(d), kind))

    def _next_seq(self, d: FakeDaemon, now: float) -> int:
        d.seq += 1
        d.sent[d.seq] = now
        if len(d.sent) > 1024:  # remember the most recent send times only
            for old in sorted(d.sent)[:-1024]:
                del d.sent[old]
        return d.seq

    def _refs(self, d: FakeDaemon) -> list[LeaseRef]:
        return [LeaseRef(trial_id=t, epoch=lease.epoch) for t, lease in d.held.items()]

    # ------------------------------------------------------------------ protocol: daemon -> coordinator

    def _hello(self, d: FakeDaemon) -> None:
        d.new_session()
        now = time.monotonic()
        hello = Hello(daemon_id=d.daemon_id, session_nonce=d.session, pid=os.getpid(),
                      capabilities=Capabilities(fingerprint=self.fingerprint), seq=self._next_seq(d, now),
                      held=self._refs(d))
        d.hello_sent_at = now
        self._send(d, encode(hello))
        self._at(now + HELLO_RESEND_S, d, "hello")

    def _ready(self, d: FakeDaemon, now: float) -> None:
        """READY (a new seq); re-sent by the "ready" timer while it gets no answer."""
        if d.ready_since is None:
            d.ready_since = now
        d.ready_last = now
        seq = self._next_seq(d, now)
        d.ready_sent[seq] = now
        self._send(d, encode(Ready(session_nonce=d.session, seq=seq, answered_seq=d.answered_seq, free_slots=1,
                                   held=self._refs(d))))
        self._at(now + d.retry_s, d, "ready")

    def _heartbeat(self, d: FakeDaemon, now: float) -> None:
        d.heartbeats += 1
        self._send(d, encode(Heartbeat(session_nonce=d.session, seq=self._next_seq(d, now), leases=self._refs(d))))

    def _fence(self, d: FakeDaemon, now: float) -> None:
        """Leases past their deadline are dropped, their results no longer re-sent (fencing)."""
        for trial, lease in list(d.held.items()):
            if now >= lease.deadline:
                del d.held[trial]
                d.lapsed += 1
                for sid, u in list(d.unanswered.items()):
                    if u.trial_id == trial:
                        del d.unanswered[sid]

    # ------------------------------------------------------------------ protocol: coordinator -> daemon

    def handle(self, d: FakeDaemon, msg: Message) -> None:
        now = time.monotonic()
        if isinstance(msg, Welcome):
            if msg.session_nonce != d.session or d.welcomed:
                return
            d.welcomed = True
            d.welcomed_at = d.welcomed_at or now
            d.heartbeat_s, d.ttl_s = msg.heartbeat_interval_s, msg.lease_ttl_s
            d.last_renewed = now
            for u in d.unanswered.values():  # results not yet answered are re-sent after every WELCOME
                self._send(d, u.frame)
            self._at(now + d.heartbeat_s * (0.5 + (d.index % 97) / 97), d, "heartbeat")  # staggered phases
            self._ready(d, now)
        elif isinstance(msg, Grant):
            self._grant(d, msg, now)
        elif isinstance(msg, Renewed):
            sent = d.sent.get(msg.seq)
            if sent is not None:
                self.hb_rtt_s.append(now - sent)
                for ref in msg.leases:
                    lease = d.held.get(ref.trial_id)
                    if lease is not None and lease.epoch == ref.epoch:
                        lease.deadline = max(lease.deadline, sent + msg.ttl_s)
            if d.last_renewed is not None:
                d.max_renewed_gap = max(d.max_renewed_gap, now - d.last_renewed)
            d.last_renewed = now
            d.renewed += 1
        elif isinstance(msg, Revoked):
            for ref in msg.leases:
                lease = d.held.get(ref.trial_id)
                if lease is not None and lease.epoch == ref.epoch:
                    del d.held[ref.trial_id]
                    d.revoked += 1
                else:
                    d.revoked_answered += 1
        elif isinstance(msg, (Ack, Stale, Conflict)):
            self._answered(d, msg, now)
        elif isinstance(msg, NoWork):
            self.no_work += 1
            d.ready_sent.clear()  # answered: ask again after retry_after_s
            d.ready_since = None
            self._at(now + msg.retry_after_s, d, "ready-after-no-work")
        elif isinstance(msg, Shutdown):
            self.shutdown_reasons[msg.reason] = self.shutdown_reasons.get(msg.reason, 0) + 1
            self._send(d, encode(Bye(session_nonce=d.session, reason="FAKE daemon: coordinator said SHUTDOWN")))
            d.done = True
            self.poller.unregister(self.socks[self._pos(d)])
        elif isinstance(msg, Rejoin):
            d.rejoins += 1
            self._hello(d)
        elif isinstance(msg, TimeProbe):  # answered at once, as daemon.agent does (coordinator/clock.py)
            t = time.time_ns()
            self._send(d, encode(TimeReply(session_nonce=d.session, probe_id=msg.probe_id, received_at_ns=t,
                                           replied_at_ns=max(t, time.time_ns()))))
        else:
            self.unexpected.append(f"{d.daemon_id}: unexpected {type(msg).__name__}")

    def _grant(self, d: FakeDaemon, grant: Grant, now: float) -> None:
        since = d.ready_sent.get(grant.seq)
        if since is None:
            # A GRANT that names no READY still waiting: a NO_WORK (which carries no seq) answered an
            # older, re-sent READY and cleared the wait. As daemon/session.py: from the earliest READY
            # still unanswered, else from the last READY sent.
            d.grants_unmatched += 1
            since = d.ready_since if d.ready_since is not None else (d.ready_last or None)
        if since is None or not d.welcomed:
            self.unexpected.append(f"{d.daemon_id}: GRANT {grant.batch_id} answers no READY of this session")
            return
        d.answered_seq = max(d.answered_seq, grant.seq)
        self.grant_latency_s.append(now - since)
        self.grant_wait_s.append(now - (d.ready_since if d.ready_since is not None else since))
        deadline = since + grant.ttl_s
        if deadline <= now:  # its lease ran out before it arrived: refuse it, keep asking
            d.late_grants += 1
            return
        d.grants += 1
        d.ready_sent.clear()
        d.ready_since = None
        if any(gt.attempt > 1 for gt in grant.trials):
            self.regrants.append({"daemon_id": d.daemon_id, "batch_id": grant.batch_id, "mono": now,
                                  "wall": time.time(), "trials": [[gt.trial_id, gt.attempt] for gt in grant.trials]})
        if self.probe_after_s is not None and self.victim is None and now - self.started_mono >= self.probe_after_s:
            self._freeze(d, grant, now)
            return
        for gt in grant.trials:
            d.held[gt.trial_id] = HeldLease(gt.attempt, grant.batch_id, deadline)
        for gt in grant.trials:  # the instant backend: every trial is done at once
            submission = f"{d.daemon_id}.{gt.trial_id[:16]}.{gt.attempt}"
            frame = encode(Result(session_nonce=d.session, batch_id=grant.batch_id, trial_id=gt.trial_id,
                                  epoch=gt.attempt, submission_id=submission, outcome=self.outcome))
            d.unanswered[submission] = Unanswered(frame, gt.trial_id, now + d.retry_s, d.retry_s)
            self._send(d, frame)
        self._at(now + d.retry_s, d, "resend")
        self._ready(d, now)

    def _freeze(self, d: FakeDaemon, grant: Grant, now: float) -> None:
        d.frozen = True
        self.poller.unregister(self.socks[self._pos(d)])
        self.victim = {
            "daemon_id": d.daemon_id, "batch_id": grant.batch_id, "epoch": grant.epoch,
            "trials": [[gt.trial_id, gt.attempt] for gt in grant.trials],
            "grant_mono": now, "grant_wall": time.time(),
            "last_send_mono": d.last_send_mono, "last_send_wall": d.last_send_wall,
            "heartbeat_s": d.heartbeat_s, "ttl_s": d.ttl_s,
        }
        self.say(f"probe: {d.daemon_id} froze holding {grant.batch_id} (epoch {grant.epoch}); its last message "
                 f"went {now - d.last_send_mono:.3f} s ago")

    def _answered(self, d: FakeDaemon, msg: Ack | Stale | Conflict, now: float) -> None:
        if msg.submission_id in d.answered:
            return  # the answer to a re-sent result, already counted
        d.answered.add(msg.submission_id)
        d.unanswered.pop(msg.submission_id, None)
        lease = d.held.get(msg.trial_id)
        if lease is not None and msg.submission_id.endswith(f".{lease.epoch}"):
            del d.held[msg.trial_id]
        if isinstance(msg, Ack):
            self.ack_mono.append(now)
        elif isinstance(msg, Stale):
            d.stale += 1
        else:
            d.conflict += 1

    # ------------------------------------------------------------------ timers

    def _fire(self, d: FakeDaemon, kind: str, now: float) -> None:
        if d.done or d.frozen:
            return
        if kind == "hello":
            if not d.welcomed and now - d.hello_sent_at >= HELLO_RESEND_S:
                self._hello(d)  # no WELCOME yet: a new session, HELLO again
        elif not d.welcomed:
            return
        elif kind == "heartbeat":
            self._fence(d, now)
            self._heartbeat(d, now)
            self._at(now + d.heartbeat_s, d, "heartbeat")
        elif kind == "ready":  # the last READY is still unanswered after retry_s: send it again
            if d.ready_since is not None and now - d.ready_last >= d.retry_s - 1e-6:
                d.ready_resends += 1
                self._ready(d, now)
        elif kind == "ready-after-no-work":
            if d.ready_since is None:
                self._ready(d, now)
        elif kind == "resend":
            due = [u for u in d.unanswered.values() if u.resend_at <= now]
            for u in due:
                u.interval = min(2 * u.interval, RETRY_MAX_S)
                u.resend_at = now + u.interval
                d.result_resends += 1
                self._send(d, u.frame)  # the session on a re-sent RESULT is still this one: no REJOIN between
            if d.unanswered:
                self._at(min(u.resend_at for u in d.unanswered.values()), d, "resend")

    def say(self, text: str) -> None:
        print(f"{PROGRESS_PREFIX}{text}", flush=True)

    def run(self) -> None:
        # CURVE as for real daemons: every fake daemon uses the one admitted key pair of
        # $SERVETUNE_HOME (one key, many sessions) and pins the coordinator key found there.
        home = servetune_home()
        pair, server_key = load_pair(daemon_dir(home)), pinned_coordinator_key(home)
        for d in self.daemons:
            sock = self.ctx.socket(zmq.DEALER)
            configure_dealer(sock, d.daemon_id, zmq, public_key=pair.public, secret_key=pair.secret,
                             server_key=server_key)
            sock.connect(self.address)
            self.socks.append(sock)
            self.by_sock[sock] = d
            self.poller.register(sock, zmq.POLLIN)
        self.started_mono = time.monotonic()
        for d in self.daemons:
            self._hello(d)
        deadline = self.started_mono + self.deadline_s
        next_progress = self.started_mono + PROGRESS_EVERY_S
        acks_at_progress = 0
        while not self.stop:
            now = time.monotonic()
            if now > deadline:
                self.say(f"deadline of {self.deadline_s:.0f} s reached: stopping")
                break
            if all(d.done or d.frozen for d in self.daemons):
                break
            wait = 0.05 if not self.timers else min(0.05, max(0.0, self.timers[0][0] - now))
            for sock, _ in self.poller.poll(math.ceil(wait * 1000)):
                d = self.by_sock[sock]
                while not (d.done or d.frozen):
                    try:
                        frame = sock.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    try:
                        msg = decode(frame)
                    except ProtocolError as exc:
                        self.unexpected.append(f"{d.daemon_id}: undecodable frame: {exc}")
                        continue
                    self.handle(d, msg)
            now = time.monotonic()
            while self.timers and self.timers[0][0] <= now:
                _, _, pos, kind = heapq.heappop(self.timers)
                self._fire(self.daemons[pos], kind, now)
            if now >= next_progress:
                welcomed = sum(d.welcomed for d in self.daemons)
                rate = (len(self.ack_mono) - acks_at_progress) / PROGRESS_EVERY_S
                acks_at_progress = len(self.ack_mono)
                next_progress = now + PROGRESS_EVERY_S
                self.say(f"t={now - self.started_mono:5.1f} s: {welcomed}/{len(self.daemons)} welcomed, "
                         f"{len(self.ack_mono)} results ACKed ({rate:.0f}/s), {len(self.grant_latency_s)} grants, "
                         f"{sum(d.done for d in self.daemons)} shut down")
        for sock in self.socks:
            sock.close(linger=0)
        self.ctx.term()

    def record(self) -> dict[str, Any]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "started_mono": self.started_mono,
            "ack_mono": self.ack_mono,
            "grant_latency_s": self.grant_latency_s,
            "grant_wait_s": self.grant_wait_s,
            "hb_rtt_s": self.hb_rtt_s,
            "regrants": self.regrants,
            "victim": self.victim,
            "unexpected": self.unexpected[:50],
            "n_unexpected": len(self.unexpected),
            "no_work": self.no_work,
            "shutdown_reasons": self.shutdown_reasons,
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "daemons": [
                {
                    "daemon_id": d.daemon_id, "welcomed": d.welcomed, "done": d.done, "frozen": d.frozen,
                    "welcomed_after_s": (d.welcomed_at - self.started_mono) if d.welcomed_at else None,
                    "max_renewed_gap_s": d.max_renewed_gap, "renewed": d.renewed, "heartbeats": d.heartbeats,
                    "rejoins": d.rejoins, "revoked": d.revoked, "revoked_answered": d.revoked_answered,
                    "stale": d.stale, "conflict": d.conflict, "lapsed": d.lapsed, "late_grants": d.late_grants,
                    "ready_resends": d.ready_resends, "grants_unmatched": d.grants_unmatched, "result_resends": d.result_resends, "grants": d.grants,
                    "held_at_end": len(d.held), "unanswered_at_end": len(d.unanswered),
                }
                for d in self.daemons
            ],
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.coordinator.clients", description=__doc__)
    ap.add_argument("--address", required=True, help="the coordinator's ROUTER, e.g. tcp://127.0.0.1:5555")
    ap.add_argument("--count", type=int, required=True, help="FAKE daemons in this process")
    ap.add_argument("--first-index", type=int, default=0, help="index of the first (routing ids fake-NNNNN)")
    ap.add_argument("--probe-after-s", type=float, default=None, help="freeze the first daemon granted after this")
    ap.add_argument("--deadline-s", type=float, required=True, help="stop after this long whatever happens")
    ap.add_argument("--out", required=True, help="JSON of what was recorded")
    args = ap.parse_args(argv)
    fleet = FakeFleet(args.address, args.count, args.first_index, args.probe_after_s, args.deadline_s)

    def _stop(signum: int, frame: object) -> None:
        fleet.stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        fleet.run()
    finally:
        tmp = f"{args.out}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(fleet.record(), fh)
        os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
