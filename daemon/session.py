"""The daemon's side of protocol 2 (:mod:`servetune.messages`): a pure state machine.

:class:`DaemonSession` owns every protocol fact a daemon process keeps: its session nonce, the
``seq`` counter and when each recent seq was sent, whether the coordinator welcomed it, the
heartbeat interval and lease TTL it learned, the leases it holds, the batches that run, the
results not yet answered, and the timers (HELLO and READY retries, heartbeats, silence,
reconnect back-off, coordinator lost). It does no I/O: no sockets, no threads, no clock. Each
input takes ``now`` (seconds on a monotonic clock) and returns a list of instructions, which the
adapter (:mod:`daemon.agent`) executes **in order**.

Inputs:

- :meth:`~DaemonSession.start` once, with the socket just opened; :meth:`~DaemonSession.on_connected`
  after each :class:`Reconnect` has reopened it.
- :meth:`~DaemonSession.on_tick` first in every loop iteration, **before** the worker's messages
  are passed to :meth:`~DaemonSession.on_outgoing`: a lease past its deadline is dropped (and its
  batch fenced) before anything for it could be sent, e.g. by a daemon resumed after SIGSTOP.
- :meth:`~DaemonSession.on_message` for every decoded coordinator message.
- :meth:`~DaemonSession.on_outgoing` for every STATE, RESULT and BATCH_ERROR the batch worker
  produced, then :meth:`~DaemonSession.on_batch_done` when its batch returned.
- :meth:`~DaemonSession.on_stop_requested` on a signal (or the parent dying).
- :meth:`~DaemonSession.set_out_of_service` when a preflight failed (a reason) or passed again (None):
  out of service, no READY is sent and HELLO's capabilities carry the reason (:mod:`daemon.preflight`).

Rules (the contract of :mod:`servetune.messages`, seen from the daemon):

- **Slots.** Up to ``slots.capacity`` batches run at once (:mod:`daemon.slots`; the daemon
  advertises it as ``max_concurrency``), each on its own GPU set. A READY goes only while a slot is
  free and a single-GPU set would be free, saying how many in ``free_slots``. A granted batch whose
  ``tensor_parallel_size`` finds no free set waits (its leases held and listed in every heartbeat,
  so the coordinator renews them) until a running batch ends, oldest grant first; it is dropped if
  its lease expires or is revoked first. No READY is sent while one waits.

- **Sessions.** A new nonce on every HELLO (start, reconnect, REJOIN), stamped on every message
  sent, including results re-sent from an earlier session. A HELLO not answered is re-sent with
  the same nonce, with back-off. A REJOIN while a HELLO is already awaiting its WELCOME answers a
  message of the previous session and is ignored.
- **Leases** are held per trial, ``LeaseRef(trial_id, epoch)``, from GRANT until the result's
  ACK/STALE/CONFLICT (or REVOKED, expiry, or the batch ending without a result for it). A GRANT's
  leases run from when the READY whose ``seq`` it echoes was sent (the earliest unanswered READY
  when it names none of this session); a READY unanswered for ``retry_after_s`` is sent again
  (a message can be lost when a connection drops); a RENEWED extends a lease to the
  send time of the seq it echoes plus its ``ttl_s`` (never shortening it). Every HEARTBEAT
  (every ``heartbeat_interval_s`` once welcomed, busy or idle) lists them all.
- **Fencing.** A lease past its deadline drops every lease of its batch and their unanswered
  results, and aborts that batch if it runs. A REVOKED lease is dropped; its batch is
  aborted if the revoked trial had not submitted its result yet. A message for a lease not held
  is never sent: the daemon submits nothing for a trial it no longer holds.
- **Results** are kept (re-stamped) until answered and re-sent after every WELCOME, and when
  unanswered for ``retry_after_s`` (then with a doubling interval); those of the
  running batch are all kept, those of finished batches up to ``SessionPolicy.kept_results``
  (the oldest beyond is dropped with a warning, and its lease with it).
- **Silence.** Once welcomed, nothing heard for ``max(3 x heartbeat interval, 2 s)`` makes the
  connection suspect: :class:`Reconnect` with exponential back-off and jitter, then HELLO with a
  new nonce and the leases still valid. Leases are not dropped for that; only their deadlines
  end them. Nothing heard for ``coordinator_lost_s`` (also before any WELCOME) ends the daemon
  with :attr:`~servetune.exitcodes.ExitCode.LOST_COORDINATOR`.
- **Stalls.** A gap between ticks longer than ``SessionPolicy.stall_s`` (the process was stopped
  or starved) does not count as coordinator silence: the daemon could not listen. Lease deadlines
  are absolute and still fence.
- **Exit.** SHUTDOWN -> ``OK``, a stop request -> ``INTERRUPTED``, lost -> ``LOST_COORDINATOR``;
  each aborts the running batches first and says BYE.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from daemon.gpusets import GPUSet
from daemon.slots import SlotPool
from servetune.exitcodes import ExitCode
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
    State,
    Welcome,
)

#: What the batch worker hands to :meth:`DaemonSession.on_outgoing`.
Outgoing = State | Result | BatchError
#: What the session may ask the adapter to send.
OutMessage = Hello | Ready | Heartbeat | State | Result | BatchError | Bye

FENCE_EXPIRED = "lease expired: could not renew within TTL"


# --------------------------------------------------------------------------- instructions


@dataclass(frozen=True)
class Send:
    """Send ``msg`` to the coordinator now (non-blocking; a failed send is logged, not retried)."""

    msg: OutMessage


@dataclass(frozen=True)
class StartBatch:
    """Hand ``grant`` to an idle batch worker (one is: the session runs at most its slots' capacity)
    with the GPU set it claimed (``gpu_set``: None on a CPU-only node, or all GPUs when it needs more
    than the node has)."""

    grant: Grant
    gpu_set: GPUSet | None = None
    #: GPUs of the set another running batch uses (declared co-tenancy): its preflight skips them.
    co_tenanted: tuple[int, ...] = ()


@dataclass(frozen=True)
class AbortBatch:
    """Fence: stop batch ``batch_id`` now (kill its vLLM, cancel its load); whatever it still
    produces is dropped by :meth:`DaemonSession.on_outgoing`."""

    batch_id: str
    reason: str


@dataclass(frozen=True)
class Reconnect:
    """Close the DEALER now (linger 0) and open a new one with the same routing id after
    ``delay_s``; then call :meth:`DaemonSession.on_connected`. Keep ticking meanwhile."""

    delay_s: float


@dataclass(frozen=True)
class Exit:
    """Stop the daemon with ``code`` (the BYE and any abort come before it in the same list)."""

    code: ExitCode
    reason: str


@dataclass(frozen=True)
class Log:
    """A line for the daemon's log (``level`` as in :mod:`logging`)."""

    level: int
    text: str


Instruction = Send | StartBatch | AbortBatch | Reconnect | Exit | Log


# --------------------------------------------------------------------------- policy and state


@dataclass(frozen=True)
class SessionPolicy:
    """Every timing and bound of the daemon's side of the protocol, in one place (seconds)."""

    default_heartbeat_s: float = 1.0  # until a WELCOME says otherwise
    default_lease_ttl_s: float = 30.0
    hello_retry_s: float = 2.0  # first re-send of an unanswered HELLO; doubles up to hello_retry_max_s
    hello_retry_max_s: float = 16.0
    suspect_heartbeats: float = 3.0  # silence of this many heartbeat intervals ...
    suspect_min_s: float = 2.0  # ... and at least this long makes the connection suspect
    reconnect_first_s: float = 0.5  # reconnect back-off: doubles up to reconnect_max_s
    reconnect_max_s: float = 8.0
    reconnect_jitter: float = 0.25  # each delay is scaled by a factor in [1 - j, 1 + j)
    retry_heartbeats: float = 3.0  # re-send a READY or RESULT unanswered for this many heartbeat intervals,
    retry_min_s: float = 1.0  # ... and at least this long; a result's re-sends back off (doubling) ...
    retry_max_s: float = 15.0  # ... up to this
    stall_s: float = 5.0  # a gap between ticks this long is a stall of this process, not silence
    seq_memory: int = 1024  # send times remembered (most recent seqs)
    kept_results: int = 32  # unanswered results of finished batches kept for re-sending


@dataclass
class HeldLease:
    """One lease this daemon holds: its batch, its local deadline, whether its result was submitted."""

    ref: LeaseRef
    batch_id: str
    deadline: float
    submitted: bool = False


def _new_nonce() -> str:
    return uuid.uuid4().hex


class DaemonSession:
    """The daemon's protocol state machine (see the module docstring for the rules).

    Not thread-safe: one adapter thread calls it. Each input returns the instructions to execute,
    in order; after an :class:`Exit` every input returns nothing.

    Args:
        daemon_id: the daemon's id (also its routing id).
        pid: this process's id, for HELLO.
        capabilities: what HELLO advertises.
        coordinator_lost_s: nothing heard for this long ends the daemon (``LOST_COORDINATOR``).
        policy: timings and bounds.
        nonce_factory: a fresh session nonce per call (a valid wire id).
        rng: uniform floats in [0, 1), for the reconnect jitter.
        slots: the daemon's slots and GPU sets (:mod:`daemon.slots`); default: one slot on the
            fingerprint's GPUs with ``capabilities.max_concurrency`` asked, no co-tenancy.
    """

    def __init__(
        self,
        daemon_id: str,
        pid: int,
        capabilities: Capabilities,
        *,
        coordinator_lost_s: float = 300.0,
        policy: SessionPolicy | None = None,
        nonce_factory: Callable[[], str] = _new_nonce,
        rng: Callable[[], float] = random.random,
        slots: SlotPool | None = None,
    ) -> None:
        self.daemon_id = daemon_id
        self.pid = pid
        self.capabilities = capabilities
        self.coordinator_lost_s = coordinator_lost_s
        self.policy = policy or SessionPolicy()
        self._nonce_factory = nonce_factory
        self._rng = rng
        self.nonce = ""
        self.welcomed = False
        self.heartbeat_interval_s = self.policy.default_heartbeat_s
        self.lease_ttl_s = self.policy.default_lease_ttl_s
        self.slots = slots or SlotPool.for_fingerprint(capabilities.fingerprint, capabilities.max_concurrency)
        #: Batches handed to a worker (by id, with their GPU claim), and those granted that wait for GPUs.
        self.running: dict[str, GPUSet | None] = {}
        self.waiting: list[Grant] = []
        self.exited = False
        self._leases: dict[LeaseRef, HeldLease] = {}
        self._unanswered: OrderedDict[str, Result] = OrderedDict()
        self._resend_at: dict[str, tuple[float, float]] = {}  # submission -> (next re-send, interval)
        self._pending_errors: list[BatchError] = []
        self._seq = 0
        self._seq_sent: OrderedDict[int, float] = OrderedDict()
        self._connected = False
        self._ever_welcomed = False
        self._connected_at = 0.0
        self._last_heard = 0.0
        self._last_tick: float | None = None
        self._hello_sent_at = 0.0
        self._hello_retry = self.policy.hello_retry_s
        self._next_heartbeat = 0.0
        self._ready_since: float | None = None  # when the earliest unanswered READY was sent
        self._ready_last: float | None = None  # when a READY was last sent (this session)
        self._ready_seqs: set[int] = set()  # seqs of the unanswered READYs of this session
        self._answered_seq = 0  # the seq of the last READY of this session a GRANT answered
        self._next_ready = 0.0  # NO_WORK's retry_after_s
        self._reconnect_base = self.policy.reconnect_first_s
        self.last_ready_sent_at: float | None = None
        #: Why this daemon asks for no work (a failed preflight, :mod:`daemon.preflight`); None: in service.
        self.out_of_service: str | None = capabilities.out_of_service

    # ------------------------------------------------------------------ read-only views

    @property
    def running_batch(self) -> str | None:
        """The batch running (the oldest, when several run); None when none does."""
        return next(iter(self.running), None)

    @property
    def free_slots(self) -> int:
        """Batches more this daemon could start now (0 while a granted one waits for GPUs)."""
        return 0 if self.waiting else self.slots.free_slots()

    @property
    def connected(self) -> bool:
        return self._connected

    def held(self, now: float) -> list[LeaseRef]:
        """The leases held and still valid at ``now``."""
        return [lease.ref for lease in self._leases.values() if lease.deadline > now]

    def lease(self, ref: LeaseRef) -> HeldLease | None:
        return self._leases.get(ref)

    @property
    def unanswered(self) -> list[str]:
        """Submission ids of the results sent (or to be sent) and not yet answered, oldest first."""
        return list(self._unanswered)

    @property
    def suspect_after_s(self) -> float:
        return max(self.policy.suspect_heartbeats * self.heartbeat_interval_s, self.policy.suspect_min_s)

    @property
    def retry_after_s(self) -> float:
        """How long a READY or RESULT waits for its answer before it is sent again."""
        return max(self.policy.retry_heartbeats * self.heartbeat_interval_s, self.policy.retry_min_s)

    def sent_at(self, seq: int) -> float | None:
        return self._seq_sent.get(seq)

    # ------------------------------------------------------------------ inputs

    def start(self, now: float) -> list[Instruction]:
        """The socket is open: say HELLO."""
        self._connected = True
        self._connected_at = now
        self._last_heard = now
        self._last_tick = now
        return self._hello(now)

    def on_connected(self, now: float) -> list[Instruction]:
        """The adapter reopened the socket after a :class:`Reconnect`: HELLO with a new nonce."""
        if self.exited:
            return []
        self._connected = True
        self._connected_at = now
        return self._hello(now)

    def on_message(self, msg: Message, now: float) -> list[Instruction]:
        """A decoded message from the coordinator."""
        if self.exited:
            return []
        self._last_heard = now
        match msg:
            case Welcome():
                return self._on_welcome(msg, now)
            case Grant():
                return self._on_grant(msg, now)
            case NoWork():
                self._ready_since = None
                self._ready_seqs.clear()
                self._next_ready = now + msg.retry_after_s
                return []
            case Renewed():
                return self._on_renewed(msg)
            case Revoked():
                return self._on_revoked(msg)
            case Ack() | Stale() | Conflict():
                return self._on_answer(msg)
            case Rejoin():
                return self._on_rejoin(msg, now)
            case Shutdown():
                return self._exit(ExitCode.OK, f"coordinator: {msg.reason}")
            case _:
                return [Log(logging.WARNING, f"unexpected {type(msg).__name__} from the coordinator; ignored")]

    def on_tick(self, now: float) -> list[Instruction]:
        """Timers: lost coordinator, lease expiry (fencing), silence, HELLO/HEARTBEAT/READY."""
        if self.exited:
            return []
        out: list[Instruction] = []
        if self._last_tick is not None and now - self._last_tick > self.policy.stall_s:
            gap = now - self._last_tick
            # this process could not listen: the gap is not the coordinator's silence
            self._last_heard += gap
            self._connected_at += gap
            out.append(Log(logging.WARNING, f"the daemon did not run for {gap:.1f} s (stopped or starved); "
                                            "leases past their deadline are fenced now"))
        self._last_tick = now
        if now - self._last_heard >= self.coordinator_lost_s:
            return out + self._exit(ExitCode.LOST_COORDINATOR,
                                    f"no word from the coordinator for {now - self._last_heard:.0f} s "
                                    f"(--coordinator-lost {self.coordinator_lost_s:g})")
        out += self._expire(now)
        if not self._connected:
            return out
        silent = now - max(self._last_heard, self._connected_at)
        if self._ever_welcomed and silent >= self.suspect_after_s:
            return out + self._reconnect(silent)
        if not self.welcomed:
            if now - self._hello_sent_at >= self._hello_retry:
                self._hello_retry = min(self._hello_retry * 2, self.policy.hello_retry_max_s)
                out += self._send_hello(now, resend=True)
            return out
        if now >= self._next_heartbeat:
            self._next_heartbeat = now + self.heartbeat_interval_s
            out.append(Send(Heartbeat(session_nonce=self.nonce, seq=self._next_seq(now),
                                      leases=[lease.ref for lease in self._leases.values()])))
        out += self._maybe_ready(now)
        out += self._resend_results(now)
        return out

    def on_outgoing(self, msg: Outgoing, now: float) -> list[Instruction]:
        """A message the batch worker produced: sent only while its lease is held and unexpired."""
        if self.exited:
            return []
        if isinstance(msg, Result):
            lease = self._leases.get(LeaseRef(trial_id=msg.trial_id, epoch=msg.epoch))
            if lease is None or lease.batch_id != msg.batch_id or lease.deadline <= now:
                return [Log(logging.WARNING, f"result for trial {msg.trial_id[:12]} epoch {msg.epoch} dropped: "
                                             "its lease is no longer held, the daemon submits nothing for it")]
            lease.submitted = True
            stamped = msg.model_copy(update={"session_nonce": self.nonce})
            self._unanswered[stamped.submission_id] = stamped
            self._resend_at[stamped.submission_id] = (now + self.retry_after_s, self.retry_after_s)
            out: list[Instruction] = self._bound_results()
            if self._can_send():
                out.append(Send(stamped))
            return out
        if not self._holds(msg.batch_id, msg.trial_id if isinstance(msg, State) else None, msg.epoch, now):
            what = f"trial {msg.trial_id[:12]}" if isinstance(msg, State) and msg.trial_id else f"batch {msg.batch_id}"
            level = logging.WARNING if isinstance(msg, BatchError) else logging.DEBUG
            return [Log(level, f"{msg.type} for {what} dropped: no lease held, the daemon submits nothing for it")]
        stamped_msg = msg.model_copy(update={"session_nonce": self.nonce})
        if self._can_send():
            return [Send(stamped_msg)]
        if isinstance(stamped_msg, BatchError):
            self._pending_errors.append(stamped_msg)  # sent after the next WELCOME
        return []

    def on_batch_done(self, batch_id: str, now: float) -> list[Instruction]:
        """The worker finished ``batch_id``: leases of it that never got a result are released."""
        if self.exited:
            return []
        out: list[Instruction] = []
        if batch_id in self.running:
            del self.running[batch_id]
            self.slots.release(batch_id)
        orphans = [ref for ref, lease in self._leases.items() if lease.batch_id == batch_id and not lease.submitted]
        for ref in orphans:
            del self._leases[ref]
        if orphans:
            out.append(Log(logging.INFO, f"batch {batch_id} ended without a result for {_trials(orphans)}; "
                                         "their leases are released"))
        return out + self._start_waiting() + self._maybe_ready(now)

    def set_out_of_service(self, reason: str | None, now: float) -> list[Instruction]:
        """A preflight failed (``reason``) or passed again (None): no READY is sent while out of
        service; the next HELLO carries the reason; back in service, a READY goes at once."""
        if self.exited or reason == self.out_of_service:
            return []
        self.out_of_service = reason
        self.capabilities = self.capabilities.model_copy(update={"out_of_service": reason})
        if reason is not None:
            return [Log(logging.ERROR, f"out of service, asking for no work: {reason}")]
        return [Log(logging.INFO, "back in service: preflight passed"), *self._maybe_ready(now)]

    def on_stop_requested(self, reason: str, now: float) -> list[Instruction]:
        """A signal (or the parent dying): abort, BYE, exit ``INTERRUPTED``."""
        if self.exited:
            return []
        return self._exit(ExitCode.INTERRUPTED, reason)

    # ------------------------------------------------------------------ messages

    def _on_welcome(self, msg: Welcome, now: float) -> list[Instruction]:
        if msg.session_nonce != self.nonce or self.welcomed:
            return [Log(logging.DEBUG, f"WELCOME for session {msg.session_nonce} ignored (this is {self.nonce})")]
        self.welcomed = self._ever_welcomed = True
        self.heartbeat_interval_s = msg.heartbeat_interval_s
        self.lease_ttl_s = msg.lease_ttl_s
        self._reconnect_base = self.policy.reconnect_first_s
        self._hello_retry = self.policy.hello_retry_s
        self._next_heartbeat = now + self.heartbeat_interval_s
        self._ready_since = self._ready_last = None
        self._next_ready = now
        out: list[Instruction] = [Log(logging.INFO, f"welcomed by {msg.coordinator_id} (session {self.nonce}, "
                                                    f"heartbeat {msg.heartbeat_interval_s:g} s, "
                                                    f"lease TTL {msg.lease_ttl_s:g} s)")]
        for sid, result in self._unanswered.items():
            stamped = result.model_copy(update={"session_nonce": self.nonce})
            self._unanswered[sid] = stamped
            self._resend_at[sid] = (now + self.retry_after_s, self.retry_after_s)
            out.append(Send(stamped))
        for error in self._pending_errors:
            out.append(Send(error.model_copy(update={"session_nonce": self.nonce})))
        self._pending_errors.clear()
        return out + self._maybe_ready(now)

    def _on_grant(self, grant: Grant, now: float) -> list[Instruction]:
        if grant.seq in self._ready_seqs:
            self._answered_seq = max(self._answered_seq, grant.seq)  # answered, whether taken or refused
        if not self.welcomed:
            return [Log(logging.WARNING, f"GRANT {grant.batch_id} refused: it answers a READY of an earlier session")]
        if grant.batch_id in self.running or any(w.batch_id == grant.batch_id for w in self.waiting):
            return [Log(logging.WARNING, f"GRANT {grant.batch_id} ignored: already granted")]
        if len(self.running) + len(self.waiting) >= self.slots.capacity:
            busy = ", ".join([*self.running, *(w.batch_id for w in self.waiting)])
            return [Log(logging.ERROR, f"GRANT {grant.batch_id} refused: busy with batch {busy} "
                                       f"(all {self.slots.capacity} slot(s))")]
        if grant.seq in self._ready_seqs:
            since: float | None = self._seq_sent.get(grant.seq)
        else:  # a GRANT that names no READY of this session: from the earliest one unanswered
            since = self._ready_since if self._ready_since is not None else self._ready_last
        if since is None:
            return [Log(logging.ERROR, f"GRANT {grant.batch_id} refused: no READY was sent in this session")]
        deadline = since + grant.ttl_s
        if deadline <= now:
            return [Log(logging.WARNING, f"GRANT {grant.batch_id} refused: its lease ran out before it arrived "
                                         f"(ttl {grant.ttl_s:g} s from the READY sent {now - since:.1f} s ago)")]
        self._ready_since = None
        self._ready_seqs.clear()
        for trial in grant.trials:
            ref = LeaseRef(trial_id=trial.trial_id, epoch=trial.attempt)
            self._leases[ref] = HeldLease(ref=ref, batch_id=grant.batch_id, deadline=deadline)
        self.waiting.append(grant)
        return [Log(logging.INFO, f"granted batch {grant.batch_id}: {len(grant.trials)} trial(s), "
                                  f"config {grant.config.label()}"),
                *self._start_waiting()]

    def _start_waiting(self) -> list[Instruction]:
        """Start the granted batches waiting for GPUs, oldest first, while each finds a free set
        (a batch that finds none waits, and so do those granted after it: no overtaking, so a
        batch needing many GPUs is not starved by smaller ones)."""
        out: list[Instruction] = []
        while self.waiting and not self.exited:
            grant = self.waiting[0]
            claim = self.slots.claim(grant.batch_id, grant.config.args.tensor_parallel_size, grant.co_tenancy)
            if claim is None:
                out.append(Log(logging.INFO, f"batch {grant.batch_id} waits for "
                                             f"{grant.config.args.tensor_parallel_size or 1} free GPU(s): "
                                             f"batch(es) {', '.join(self.running)} hold them"))
                break
            self.waiting.pop(0)
            self.running[grant.batch_id] = claim.gpu_set
            where = (f"GPUs {claim.gpu_set.cuda_visible_devices}{' (shared: co-tenancy)' if claim.shared else ''}"
                     if claim.gpu_set is not None else "this node's devices")
            out += [Log(logging.INFO, f"starting batch {grant.batch_id} on {where}"),
                    StartBatch(grant, claim.gpu_set, claim.co_tenanted)]
        return out

    def _drop_waiting(self, batch_id: str) -> bool:
        """Forget granted batch ``batch_id`` that waits for GPUs (fenced before it started)."""
        kept = [w for w in self.waiting if w.batch_id != batch_id]
        dropped = len(kept) != len(self.waiting)
        self.waiting = kept
        return dropped

    def _on_renewed(self, msg: Renewed) -> list[Instruction]:
        sent = self._seq_sent.get(msg.seq)
        if sent is None:
            return [Log(logging.DEBUG, f"RENEWED for unknown seq {msg.seq} ignored")]
        for ref in msg.leases:
            lease = self._leases.get(ref)
            if lease is not None:
                lease.deadline = max(lease.deadline, sent + msg.ttl_s)
        return []

    def _on_revoked(self, msg: Revoked) -> list[Instruction]:
        out: list[Instruction] = []
        fenced: list[str] = []
        dropped: list[LeaseRef] = []
        unsubmitted = False
        for ref in msg.leases:
            lease = self._leases.pop(ref, None)
            if lease is None:
                continue
            dropped.append(ref)
            self._drop_results({ref})
            unsubmitted = unsubmitted or not lease.submitted
            if not lease.submitted and lease.batch_id not in fenced:
                fenced.append(lease.batch_id)
        if dropped:
            # a submitted result's lease revoked is routine (a heartbeat crossed its ACK)
            level = logging.WARNING if unsubmitted else logging.INFO
            out.append(Log(level, f"coordinator revoked {_trials(dropped)}: {msg.reason}"))
        for batch_id in fenced:
            if batch_id in self.running:
                out.append(AbortBatch(batch_id, f"lease revoked: {msg.reason}"))
            elif self._drop_waiting(batch_id):  # never started: its other leases go with it
                for ref in [r for r, lease in self._leases.items() if lease.batch_id == batch_id]:
                    del self._leases[ref]
                out.append(Log(logging.WARNING, f"batch {batch_id} dropped before it started: lease revoked"))
        return out

    def _on_answer(self, msg: Ack | Stale | Conflict) -> list[Instruction]:
        result = self._unanswered.pop(msg.submission_id, None)
        self._resend_at.pop(msg.submission_id, None)
        if result is None:
            return [Log(logging.DEBUG, f"{msg.type} for unknown submission {msg.submission_id} ignored")]
        self._leases.pop(LeaseRef(trial_id=result.trial_id, epoch=result.epoch), None)
        if isinstance(msg, Ack):
            return [Log(logging.INFO, f"result for trial {msg.trial_id[:12]} epoch {result.epoch} acknowledged "
                                      f"(submission {msg.submission_id})")]
        return [Log(logging.WARNING, f"result for trial {msg.trial_id[:12]} epoch {result.epoch} refused "
                                     f"({msg.type}): {msg.reason}")]

    def _on_rejoin(self, msg: Rejoin, now: float) -> list[Instruction]:
        if msg.session_nonce is not None and msg.session_nonce != self.nonce:
            return [Log(logging.DEBUG, f"REJOIN for an earlier session {msg.session_nonce} ignored")]
        if not self.welcomed and msg.session_nonce is None:
            return [Log(logging.DEBUG, f"REJOIN ignored: HELLO for session {self.nonce} is already on its way")]
        return [Log(logging.INFO, f"coordinator asks to rejoin: {msg.reason}")] + self._hello(now)

    # ------------------------------------------------------------------ helpers

    def _next_seq(self, now: float) -> int:
        self._seq += 1
        self._seq_sent[self._seq] = now
        while len(self._seq_sent) > self.policy.seq_memory:
            self._seq_sent.popitem(last=False)
        return self._seq

    def _hello(self, now: float) -> list[Instruction]:
        """A new session: new nonce, not welcomed, HELLO listing the leases still valid."""
        self.nonce = self._nonce_factory()
        self.welcomed = False
        self._hello_retry = self.policy.hello_retry_s
        self._ready_since = self._ready_last = None
        self._ready_seqs.clear()
        self._answered_seq = 0
        return self._send_hello(now, resend=False)

    def _send_hello(self, now: float, resend: bool) -> list[Instruction]:
        self._hello_sent_at = now
        held = self.held(now)
        hello = Hello(daemon_id=self.daemon_id, session_nonce=self.nonce, pid=self.pid,
                      capabilities=self.capabilities, seq=self._next_seq(now), held=held)
        text = f"{'re-sending ' if resend else ''}HELLO (session {self.nonce}, {len(held)} lease(s) held)"
        return [Log(logging.INFO if not resend else logging.DEBUG, text), Send(hello)]

    def _maybe_ready(self, now: float) -> list[Instruction]:
        free = self.free_slots
        if not self._can_send() or free < 1 or now < self._next_ready or self.out_of_service is not None:
            return []
        if self._ready_since is not None and self._ready_last is not None:
            if now - self._ready_last < self.retry_after_s:
                return []  # the last READY is still waiting for its answer
        else:
            self._ready_since = now
        self._ready_last = self.last_ready_sent_at = now
        seq = self._next_seq(now)
        self._ready_seqs.add(seq)
        return [Send(Ready(session_nonce=self.nonce, seq=seq, answered_seq=self._answered_seq, free_slots=free,
                           held=self.held(now)))]

    def _resend_results(self, now: float) -> list[Instruction]:
        """Results unanswered past their retry time are sent again (answers are idempotent), each
        with its interval doubled up to ``retry_max_s``."""
        if not self._can_send():
            return []
        out: list[Instruction] = []
        for sid, result in self._unanswered.items():
            due, interval = self._resend_at.get(sid, (now, self.retry_after_s))
            if now < due:
                continue
            interval = min(interval * 2, self.policy.retry_max_s)
            self._resend_at[sid] = (now + interval, interval)
            stamped = result.model_copy(update={"session_nonce": self.nonce})
            self._unanswered[sid] = stamped
            out += [Log(logging.INFO, f"re-sending the unanswered result for trial {result.trial_id[:12]}"),
                    Send(stamped)]
        return out

    def _can_send(self) -> bool:
        return self._connected and self.welcomed

    def _holds(self, batch_id: str, trial_id: str | None, epoch: int, now: float) -> bool:
        if trial_id is not None:
            lease = self._leases.get(LeaseRef(trial_id=trial_id, epoch=epoch))
            return lease is not None and lease.batch_id == batch_id and lease.deadline > now
        return any(lease.batch_id == batch_id and lease.deadline > now for lease in self._leases.values())

    def _expire(self, now: float) -> list[Instruction]:
        batches = {lease.batch_id for lease in self._leases.values() if lease.deadline <= now}
        out: list[Instruction] = []
        for batch_id in sorted(batches):
            refs = {ref for ref, lease in self._leases.items() if lease.batch_id == batch_id}
            expired = [ref for ref in refs if self._leases[ref].deadline <= now]
            for ref in refs:
                del self._leases[ref]
            self._drop_results(refs)
            out.append(Log(logging.WARNING, f"{FENCE_EXPIRED}: {_trials(expired)} of batch {batch_id}; "
                                            f"fencing: {len(refs)} lease(s) dropped, nothing more is submitted"))
            if batch_id in self.running:
                out.append(AbortBatch(batch_id, FENCE_EXPIRED))
            elif self._drop_waiting(batch_id):
                out.append(Log(logging.WARNING, f"batch {batch_id} dropped before it started (it waited for GPUs)"))
        return out

    def _drop_results(self, refs: set[LeaseRef]) -> None:
        for sid in [sid for sid, r in self._unanswered.items() if LeaseRef(trial_id=r.trial_id, epoch=r.epoch) in refs]:
            del self._unanswered[sid]
            self._resend_at.pop(sid, None)

    def _bound_results(self) -> list[Instruction]:
        """Results of finished batches beyond ``kept_results``: the oldest go, with their leases."""
        finished = [sid for sid, r in self._unanswered.items() if r.batch_id not in self.running]
        out: list[Instruction] = []
        for sid in finished[: max(0, len(finished) - self.policy.kept_results)]:
            result = self._unanswered.pop(sid)
            self._resend_at.pop(sid, None)
            self._leases.pop(LeaseRef(trial_id=result.trial_id, epoch=result.epoch), None)
            out.append(Log(logging.WARNING, f"unanswered result for trial {result.trial_id[:12]} dropped: more than "
                                            f"{self.policy.kept_results} results of finished batches are waiting"))
        return out

    def _reconnect(self, silent: float) -> list[Instruction]:
        base = self._reconnect_base
        self._reconnect_base = min(base * 2, self.policy.reconnect_max_s)
        jitter = self.policy.reconnect_jitter
        delay = base * (1 - jitter + 2 * jitter * self._rng())
        self._connected = self.welcomed = False
        return [Log(logging.WARNING, f"nothing heard from the coordinator for {silent:.1f} s: reconnecting in "
                                     f"{delay:.2f} s; leases stay valid until their deadlines"),
                Reconnect(delay)]

    def _exit(self, code: ExitCode, reason: str) -> list[Instruction]:
        self.exited = True
        out: list[Instruction] = [Log(logging.INFO if code == ExitCode.OK else logging.WARNING,
                                      f"exiting ({code.name}): {reason}")]
        for batch_id in self.running:
            out.append(AbortBatch(batch_id, f"daemon exiting: {reason}"))
        if self._connected and self.nonce:
            out.append(Send(Bye(session_nonce=self.nonce, reason=reason[:1000])))
        out.append(Exit(code, reason))
        return out


def _trials(refs: list[LeaseRef]) -> str:
    names = ", ".join(f"{ref.trial_id[:12]}@{ref.epoch}" for ref in refs[:5])
    more = f" and {len(refs) - 5} more" if len(refs) > 5 else ""
    return f"trial(s) {names}{more}"
