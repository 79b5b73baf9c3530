"""The coordinator's control core: what to send, which results count, when a lease is lost.

Pure logic in the style of dask's worker state machine: the socket loop (:mod:`coordinator.sweep`)
feeds it stimuli (``handle(daemon_id, message)``, ``tick()``) and carries out the instructions it
returns, in order. It owns no socket, no store and no clock (``clock`` is injected), so every fault
path is unit-tested with a fake clock (``tests/test_control.py``).

Contract (the protocol rules are in :mod:`servetune.messages`):

- A batch is leased to one daemon at a time. Granting returns :class:`BeginAttempts` (persist it)
  before the :class:`Send` of the GRANT.
- A result is accepted once per (trial, epoch): :class:`Accept` (make it durable) comes before the
  :class:`Send` of its ACK. A replay of the accepted submission is ACKed again, another submission
  for it gets CONFLICT, anything not current gets STALE. Results already in the store when the
  core starts (``accepted``) count the same way, so a replay after a coordinator restart is ACKed.
- Only this core decides ``transport``: a lease revoked because it expired (TTL + grace without
  a heartbeat), its daemon left, came back as a new process, or reported a daemon error closes
  its outstanding attempts as ``transport`` (:class:`CloseAttempts`, with the reason) and queues
  the trials again, first in line, for a daemon of the same hardware class, with epoch + 1,
  until a trial has lost ``max_transport_retries`` attempts in this sweep; then it stays a hole.
- Every such loss is a :class:`~coordinator.retries.RetryEvent` (a line of ``retries.jsonl``) and a
  failure for its daemon's circuit breaker (:mod:`coordinator.breaker`): an open breaker gets no
  work, a half-open one exactly one batch (its probe); an accepted result is a success. A class
  with no daemon in service for two cool-downs has its queued work drained (:class:`Drained`).
- A daemon silent for ``suspect_after_missed`` heartbeat intervals is reported once as suspect
  (:class:`Notice`), by then at the latest (the tick before, when the next tick would be late); one silent for TTL + grace is forgotten (a later message from it gets REJOIN).
- With no daemon connected for ``daemon_wait_s`` the core stops and returns :class:`NoDaemon`.
- An idle daemon's READY that finds no work is kept waiting (for up to one heartbeat interval,
  below the daemon's READY re-send interval) rather than answered NO_WORK at once: work that
  appears meanwhile (a lease revoked at expiry, a daemon that left, a rate sweep's follow-ups) is
  granted to the oldest waiting READY of a matching hardware class at the next :meth:`tick`, the
  one that revoked it. A READY that waited its interval out gets NO_WORK with ``retry_after_s=0``
  (ask again at once), so an idle daemon has a READY waiting nearly all the time.
- Where and when work goes is the fleet policy's (:mod:`coordinator.policy`): one queue per
  hardware class, at most ``max_concurrency`` batches per daemon, resource groups (the fleet
  file's ``groups``, a daemon's own, the implicit group of a non-loopback ``openai`` endpoint)
  holding at most ``group_max_concurrency`` between members, taking turns round-robin. A READY
  the policy does not allow now waits like one that found no work.
- Engine args (:mod:`servetune.vllm_args`): a daemon whose HELLO lists the engine flags its vLLM
  accepts is never granted a ``vllm`` batch whose config needs a flag missing there; the batch stays
  queued for a connected daemon that may run it (one that accepts it, or one that did not say, whose
  configs are not checked: a Notice says so at its HELLO). When no connected daemon may, its trials
  are closed as ``config`` failures when a READY reaches them (:class:`BeginAttempts`, then an :class:`Accept` per
  trial of a result made here, naming the flags and the vLLM version, attributed to the daemon that
  refused it): never started, never re-queued, run again only with ``--retry-failed``.
- After a coordinator restart, attempts found ``running`` in the store are given back as
  ``orphans``: leases that their daemon adopts by listing them in its HELLO within the TTL, or
  that are revoked like any other expired lease.
- Identity: a session is bound to the CURVE public key (``key``, as ZAP reported it) it was opened
  with. A message on that routing id under another key, including a HELLO while the session is
  live, is refused (:class:`Refused`, nothing else happens). :meth:`ControlCore.revoke_key` (the
  key was removed from the allow-list) forgets that key's sessions and fences their leases. An
  orphaned lease is adopted only by a session of the key it was granted to (``Orphan.key_id``).
- Artifacts: an ARTIFACT_OFFER or ARTIFACT_CHUNK passes the same session and key checks as a
  RESULT (another key: :class:`Refused`; an unknown session: REJOIN) and becomes
  :class:`ReceiveArtifact`; which attempts that key may upload for, and the bytes, are the
  adapter's receiver's business. The core never waits for artifacts: :attr:`finished` is about
  results only.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from coordinator.breaker import BreakerBoard, BreakerChanged, Drained, ServiceWatch, drain_reason
from coordinator.fleet import FleetSettings, merge_groups
from coordinator.leases import BatchWork, Lease, LeaseTable
from coordinator.policy import ClassQueues, FleetPolicy, shared_endpoint
from coordinator.retries import RetryEvent, RetryLedger
from coordinator.targets import Failover, TargetBook, failover_work
from servetune.artifact_messages import ArtifactChunk, ArtifactOffer
from servetune.errors import SpecError, SpecIssue
from servetune.keys import key_id
from servetune.manifest import TrialManifest
from servetune.messages import (
    Ack,
    BatchError,
    Bye,
    Conflict,
    Grant,
    GrantedTrial,
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
    grant_bounds_problem,
)
from servetune.result import Fingerprint, TrialOutcome
from servetune.spec import ExperimentSpec
from servetune.states import LeaseState
from servetune.vllm_args import AcceptedArgs, config_flags, missing_flags, refusal_text

log = logging.getLogger(__name__)

#: Daemons of a ``vllm`` sweep that join without saying which engine args their vLLM accepts are
#: each named in a warning up to this many; later ones at INFO level.
UNCHECKED_WARNINGS = 3

#: The submission id of a result the core makes for a trial it refused (``servetune.vllm_args``).
REFUSED_SUBMISSION = "refused-by-coordinator"

# ---------------------------------------------------------------------- instructions


@dataclass(frozen=True)
class Send:
    daemon_id: str
    msg: Message


@dataclass(frozen=True)
class BeginAttempts:
    """Open these attempts as ``running`` (numbers chosen by the core) before the GRANT goes out."""

    daemon_id: str
    batch_id: str
    attempts: dict[str, int]


@dataclass(frozen=True)
class Accept:
    """Make this result durable before its ACK is sent."""

    daemon_id: str
    result: Result
    manifest: TrialManifest


@dataclass(frozen=True)
class CloseAttempts:
    """Close these running attempts as ``transport`` failures with ``reason``."""

    pairs: list[tuple[str, int]]
    reason: str


@dataclass(frozen=True)
class Transition:
    trial_id: str | None
    epoch: int | None
    batch_id: str
    phase: str
    detail: str


@dataclass(frozen=True)
class Notice:
    """Something a person watching the sweep should see (logged and shown in the progress line)."""

    level: int
    text: str


@dataclass(frozen=True)
class DaemonJoined:
    daemon_id: str
    hardware_class: str
    hostname: str
    pid: int


@dataclass(frozen=True)
class DaemonLeft:
    daemon_id: str
    reason: str


@dataclass(frozen=True)
class NoDaemon:
    waited_s: float


@dataclass(frozen=True)
class Refused:
    """A message refused because its CURVE key is not its session's (count and log it)."""

    daemon_id: str
    key: str
    reason: str


@dataclass(frozen=True)
class ReceiveArtifact:
    """An ARTIFACT_OFFER or ARTIFACT_CHUNK of a live session under its own key: hand it to the
    artifact receiver (:mod:`coordinator.artifact_receiver`), which asks whether ``key`` produced
    the attempt (finished attempts count: artifacts follow their RESULT), and send its replies."""

    daemon_id: str
    key: str
    msg: ArtifactOffer | ArtifactChunk


@dataclass(frozen=True)
class FailedOver:
    """A drained batch moved to an interchangeable class (the spec's ``hardware.failover_to``) and
    queued: record the moved trials in the store (before any instruction after this one, which may
    grant them), and each original as a hole with its reason (which names the trial standing in)."""

    failover: Failover


Instruction = (
    Send | BeginAttempts | Accept | CloseAttempts | Transition | Notice | DaemonJoined | DaemonLeft | NoDaemon
    | Refused | ReceiveArtifact | BreakerChanged | Drained | RetryEvent | FailedOver
)


# ---------------------------------------------------------------------- state


@dataclass
class DaemonSession:
    daemon_id: str
    session_nonce: str
    hardware_class: str
    pid: int
    last_seen: float
    suspect: bool = False
    key: str = ""
    #: What its HELLO said: the node's fingerprint, and the engine flags its vLLM accepts (None: not said).
    fingerprint: Fingerprint | None = None
    engine_args: AcceptedArgs | None = None

    def __post_init__(self) -> None:
        self.accepted_flags = frozenset(self.engine_args.flags) if self.engine_args is not None else None


@dataclass(frozen=True)
class WaitingReady:
    """A READY that found no work, kept to be answered when work appears (or NO_WORK at ``until``)."""

    seq: int
    session_nonce: str
    until: float


@dataclass(frozen=True)
class Orphan:
    """A lease found running in the store after a coordinator restart."""

    daemon_id: str
    work: BatchWork
    attempts: dict[str, int]
    #: The key id of the daemon it was granted to (None: not recorded); only that key adopts it.
    key_id: str | None = None


@dataclass
class ControlCore:
    """One sweep's control state. ``attempts``: the highest attempt number of every trial in the
    store; ``accepted``: (trial, epoch) -> submission id of finished attempts that have one."""

    spec: ExperimentSpec
    work: Sequence[BatchWork]
    settings: FleetSettings = field(default_factory=FleetSettings)
    coordinator_id: str = "coordinator"
    attempts: dict[str, int] = field(default_factory=dict)
    accepted: dict[tuple[str, int], str] = field(default_factory=dict)
    orphans: Sequence[Orphan] = ()
    clock: Callable[[], float] = time.monotonic
    #: Wall clock, only to say *when* in a drained trial's reason (decisions use ``clock``).
    wall_clock: Callable[[], float] = time.time
    #: A resumed sweep: filter target label -> the class it was bound to before
    #: (:func:`coordinator.targets.prior_bindings`); preferred for ``recovery_after_s`` after start.
    preferred_bindings: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_grant_bounds(self.spec, [(w.batch.config, w.trials) for w in [*self.work, *(o.work for o in self.orphans)]])
        #: Work waiting, one queue per hardware class; who may take it when: :mod:`coordinator.policy`.
        self.queue = ClassQueues(self.work)
        hw = self.spec.hardware
        self.policy = FleetPolicy(merge_groups(self.settings.groups, hw.groups if hw else ()),
                                  shared_endpoint(self.spec.backend), self.clock,
                                  turn_wait_s=2 * self.settings.heartbeat_interval_s, co_tenancy=bool(hw and hw.co_tenancy))
        self.leases = LeaseTable()
        self.targets = TargetBook(  # which daemons measure this spec (coordinator.targets)
            self.spec.hardware, preferred=dict(self.preferred_bindings),
            prefer_until=self.clock() + self.settings.recovery_after_s if self.preferred_bindings else None)
        self.daemons: dict[str, DaemonSession] = {}
        self.stopping = False
        self.lost: Counter[str] = Counter()  # trial -> attempts lost to transport this sweep
        self.given_up: set[str] = set()
        #: Per-daemon circuit breakers, the drain of classes out of service, every retry (coordinator.breaker).
        self.breaker = BreakerBoard(self.settings.breaker_failures, self.settings.recovery_after_s)
        self.service = ServiceWatch(2 * self.settings.recovery_after_s, first_wait_s=self.settings.daemon_wait_s)
        self.retries = RetryLedger()
        self._attempts = dict(self.attempts)
        self._accepted = dict(self.accepted)
        now = self.clock()
        self._no_daemon_since: float | None = now
        self._no_daemon_reported = False
        self._orphan_keys = {o.work.batch_id: o.key_id for o in self.orphans if o.key_id}
        self._needed: dict[str, tuple[str, ...]] = {}  # batch -> the engine flags its config passes
        self._unchecked_joins = 0  # daemons of a vllm sweep that did not say which engine args they accept
        self.waiting: dict[str, WaitingReady] = {}  # daemon -> its READY waiting for work, oldest first
        #: Admission control, set by the adapter before each pass: how many more GRANTs this pass
        #: may make (None: no limit). A READY that finds work but no budget waits, as one that
        #: finds none, and is granted, oldest first, by a later tick with budget (a READY handled in a
        #: pass with budget left is granted at once; see ``coordinator.sweep.GRANTS_PER_PASS``).
        self.grant_budget: int | None = None
        #: How often the adapter calls :meth:`tick` (0: unknown). A daemon is suspected at the first
        #: tick after which it would be silent past ``suspect_after_s`` by the next one, so that the
        #: suspicion comes *by* ``suspect_after_s`` of silence, not up to a tick later.
        self.check_every_s = 0.0
        for orphan in self.orphans:
            lease = Lease(
                batch_id=orphan.work.batch_id, daemon_id=orphan.daemon_id, work=orphan.work,
                attempts=dict(orphan.attempts), outstanding={m.trial_id for m in orphan.work.trials},
                granted_at=now, renewed_at=now, ttl_s=self.settings.lease_ttl_s, state=LeaseState.ORPHANED,
            )
            self.leases.add(lease)

    # ------------------------------------------------------------------ queries

    @property
    def finished(self) -> bool:
        return not self.queue and not len(self.leases)

    @property
    def queued(self) -> int:
        return len(self.queue)

    def knows(self, daemon_id: str, session_nonce: str) -> bool:
        """Whether ``daemon_id`` is connected with this session (its messages need no HELLO first)."""
        d = self.daemons.get(daemon_id)
        return d is not None and d.session_nonce == session_nonce

    def hardware_class(self, daemon_id: str) -> str | None:
        d = self.daemons.get(daemon_id)
        return d.hardware_class if d else None

    def key_of(self, daemon_id: str) -> str:
        """The CURVE public key the session of ``daemon_id`` was opened with ("" if none)."""
        d = self.daemons.get(daemon_id)
        return d.key if d else ""

    # ------------------------------------------------------------------ stimuli

    def handle(self, daemon_id: str, msg: Message, key: str = "") -> list[Instruction]:
        """One message from the daemon whose routing id is ``daemon_id``, sent under the CURVE
        public key ``key`` (its identity; a session opened under one key accepts no other)."""
        now = self.clock()
        session = self.daemons.get(daemon_id)
        if session is not None and session.key != key:
            return [Refused(daemon_id, key, f"routing id {daemon_id!r} belongs to a live session of another key; "
                                            f"{type(msg).__name__} refused")]
        if isinstance(msg, Hello):
            return self._hello(daemon_id, msg, now, key)
        nonce = getattr(msg, "session_nonce", None)
        if session is None or nonce != session.session_nonce:
            if isinstance(msg, Bye):
                return []
            return [Send(daemon_id, Rejoin(session_nonce=nonce, reason="unknown session: say HELLO"))]
        session.last_seen = now
        if session.suspect:
            session.suspect = False
            out: list[Instruction] = [Notice(logging.INFO, f"daemon {daemon_id} is heard from again")]
        else:
            out = []
        if isinstance(msg, Heartbeat):
            out += self._heartbeat(session, msg, now)
        elif isinstance(msg, Ready):
            out += self._ready(session, msg, now)
        elif isinstance(msg, State):
            out += self._state(session, msg)
        elif isinstance(msg, Result):
            out += self._result(session, msg, now)
        elif isinstance(msg, BatchError):
            out += self._batch_error(session, msg)
        elif isinstance(msg, (ArtifactOffer, ArtifactChunk)):
            out.append(ReceiveArtifact(daemon_id, key, msg))
        elif isinstance(msg, Bye):
            prefix = "interrupted: " if msg.reason.startswith("signal ") else ""
            out += self._forget(daemon_id, f"{prefix}daemon {daemon_id} left: {msg.reason}")
            out.append(DaemonLeft(daemon_id, msg.reason))
        else:
            out.append(Notice(logging.WARNING, f"unexpected {type(msg).__name__} from daemon {daemon_id}; ignored"))
        return out

    def tick(self) -> list[Instruction]:
        """Time passed: suspect silent daemons, revoke expired leases, forget dead daemons, and end
        the wait when no daemon has been connected for ``daemon_wait_s``."""
        now = self.clock()
        s = self.settings
        out: list[Instruction] = []
        for d in list(self.daemons.values()):
            silent = now - d.last_seen
            if not d.suspect and silent + self.check_every_s > s.suspect_after_s:
                d.suspect = True
                for lease in self.leases.held_by(d.daemon_id):
                    if lease.state is LeaseState.ACTIVE:
                        lease.move(LeaseState.SUSPECT)
                out.append(Notice(logging.WARNING, f"daemon {d.daemon_id} suspected: no heartbeat for {silent:.1f} s "
                                                   f"(leases revoked after {s.revoke_after_s:g} s)"))
        for lease in self.leases.expired(now, s.lease_grace_s):
            silent = now - lease.renewed_at
            what = "orphaned lease not adopted" if lease.state is LeaseState.ORPHANED else "lease expired"
            out += self._revoke(lease, f"{what}: no heartbeat from daemon {lease.daemon_id} for {silent:.1f} s "
                                       f"(TTL {s.lease_ttl_s:g} s + grace {s.lease_grace_s:g} s)")
        for d in list(self.daemons.values()):
            if now - d.last_seen > s.revoke_after_s and not self.leases.held_by(d.daemon_id):
                del self.daemons[d.daemon_id]
                self.policy.leave(d.daemon_id)
                out.append(Notice(logging.WARNING, f"daemon {d.daemon_id} presumed dead after "
                                                   f"{now - d.last_seen:.1f} s of silence"))
                out.append(DaemonLeft(d.daemon_id, "presumed dead (no heartbeat)"))
        if self.daemons:
            self._no_daemon_since = None
        elif self._no_daemon_since is None:
            self._no_daemon_since = now
        elif not self.finished and not self._no_daemon_reported and now - self._no_daemon_since > s.daemon_wait_s:
            self._no_daemon_reported = True
            waited = now - self._no_daemon_since
            out += self.abort(f"no daemon connected for {waited:.0f} s (--daemon-wait {s.daemon_wait_s:g})")
            out.append(NoDaemon(waited))
        out += self.breaker.tick(now)
        present = {d.hardware_class for d in self.daemons.values()}
        out += [Notice(logging.INFO, n) for n in self.targets.settle(now, present, self.queue, self.leases)]
        out += self._drain(now)
        out += self._serve_waiting(now)
        return out

    def _serve_waiting(self, now: float) -> list[Instruction]:
        """Grant queued work to waiting READYs (oldest first); answer those whose wait is over."""
        out: list[Instruction] = []
        for daemon_id, w in list(self.waiting.items()):
            d = self.daemons.get(daemon_id)
            if d is None or d.session_nonce != w.session_nonce or self.leases.held_by(daemon_id):
                del self.waiting[daemon_id]  # gone, a new session, or granted since: nothing to answer
                continue
            if self.stopping or self.finished:
                del self.waiting[daemon_id]
                out.append(Send(daemon_id, Shutdown(reason="no more work")))
                continue
            if self.queue and self.breaker.may_grant(daemon_id, now):  # an open breaker: no work
                if not self._may_grant():
                    continue  # work is there, this pass's budget is not: it stays waiting, unanswered
                work = None
                if self._policy_allows(d):
                    work, refused = self._take(d)
                    out += refused
                if work is not None:
                    del self.waiting[daemon_id]
                    out += self._grant(d, work, w.seq, now)
                    continue
            if now >= w.until:
                del self.waiting[daemon_id]
                out.append(Send(daemon_id, NoWork(retry_after_s=0.0)))
        return out

    def _drain(self, now: float) -> list[Instruction]:
        """Queued work of every hardware class out of service for two cool-downs (no connected
        daemon of it with a closed breaker, no probe of it in flight) becomes holes, with why
        (:class:`Drained`); work no class has taken yet, once every known class is drained."""
        if self.stopping:
            return []
        in_service: dict[str, bool] = {}
        for d in self.daemons.values():
            in_service[d.hardware_class] = in_service.get(d.hardware_class, False) or self.breaker.closed(d.daemon_id)
        probing = {lease.work.hardware_class or "" for lease in self.leases if self.breaker.probing(lease.daemon_id)}
        if self.daemons or self.service.known:
            # a target class no daemon of which ever joined is out of service too (once any daemon
            # has joined: before that, the sweep's no-daemon wait applies)
            for w in self.queue:
                if w.hardware_class is not None:
                    in_service.setdefault(w.hardware_class, False)
        self.service.update(now, in_service, probing)
        drained = self.service.drained
        if not drained or not self.queue:
            return []
        everything = drained >= self.service.known
        gone: dict[str | None, list[str]] = {}
        up = {c for c, ok in in_service.items() if ok}
        out: list[Instruction] = []
        for cls in [*sorted(drained), *([None] if everything else [])]:
            trials: list[str] = []
            for w in self.queue.drain(cls):
                # where the spec declares hardware interchangeable, the batch moves (new trial ids,
                # tagged failover-from:CLASS) and its originals stay holes that say where they went
                fo = failover_work(self.targets.hardware, w, up, source=cls) if cls is not None else None
                if fo is not None:  # queued at once (this tick may grant it): the sweep records its trials first
                    self.queue.append(fo.moved)
                    out.append(FailedOver(fo))
                else:
                    trials += [m.trial_id for m in w.trials]
            if trials:
                gone[cls] = trials
        for cls, trials in gone.items():
            since = self.service.out_since[cls] if cls is not None else self.service.all_out_since()
            name = cls if cls is not None else ", ".join(sorted(self.service.known))
            reason = drain_reason(name, self.wall_clock() - (now - (now if since is None else since)))
            out.append(Drained(cls, tuple(trials), reason))
        return out

    def retry_warning(self, trial_id: str) -> str | None:
        """The warning a result of ``trial_id`` carries when attempts of it were lost in this sweep."""
        return self.retries.warning(trial_id, self.settings.max_transport_retries)

    def add(self, work: BatchWork) -> bool:
        """Queue a batch planned during the sweep (a rate sweep's follow-ups, an SLA search's next
        round, an adaptive planner's asks); False when stopping, or when every trial of it is
        already queued or under a live lease. A trial already queued or leased is left out of
        ``work`` (logged): a caller that plans the same trial twice must not run it twice (each
        extra attempt costs a server start). A waiting READY gets it at the next :meth:`tick`."""
        if self.stopping:
            return False
        queued = {t.trial_id for w in self.queue for t in w.trials}
        todo = tuple(t for t in work.trials if t.trial_id not in queued and self.leases.for_trial(t.trial_id) is None)
        if len(todo) < len(work.trials):
            log.warning("batch %s: %d of its %d trial(s) are already queued or leased; not queued again",
                        work.batch_id, len(work.trials) - len(todo), len(work.trials))
            if not todo:
                return False
            work = replace(work, trials=todo)
        self.queue.append(self.targets.pin(work))
        return True

    def stop(self) -> int:
        """Grant nothing more; returns how many queued batches are left unrun (they stay holes)."""
        self.stopping = True
        left = len(self.queue)
        self.queue.clear()
        return left

    def abort(self, reason: str) -> list[Instruction]:
        """Stop and revoke every live lease (no re-grant): their attempts close as transport."""
        self.stop()
        out: list[Instruction] = []
        for lease in self.leases:
            out += self._revoke(lease, reason)
        return out

    def daemon_lost(self, daemon_id: str, reason: str) -> list[Instruction]:
        """The adapter knows a daemon is gone (the local child exited)."""
        out = self._forget(daemon_id, reason)
        out.append(DaemonLeft(daemon_id, reason))
        return out

    def revoke_key(self, key: str, reason: str) -> list[Instruction]:
        """``key`` is no longer admitted: forget every session opened with it and fence its leases
        (their attempts close as transport and are queued again for other daemons)."""
        out: list[Instruction] = []
        for d in [d for d in self.daemons.values() if d.key == key]:
            out += self._forget(d.daemon_id, f"daemon {d.daemon_id}: {reason}")
            out.append(DaemonLeft(d.daemon_id, reason))
        return out

    def shutdown_all(self, reason: str) -> list[Instruction]:
        return [Send(d, Shutdown(reason=reason)) for d in self.daemons]

    # ------------------------------------------------------------------ handlers

    def _hello(self, daemon_id: str, msg: Hello, now: float, key: str) -> list[Instruction]:
        if msg.daemon_id != daemon_id:
            return [Notice(logging.WARNING, f"HELLO from routing id {daemon_id!r} names daemon {msg.daemon_id!r}; "
                                            "ignored")]
        fp = msg.capabilities.fingerprint
        old = self.daemons.get(daemon_id)
        if old is not None and old.session_nonce == msg.session_nonce:
            old.last_seen = now
            return [Send(daemon_id, self._welcome(msg.session_nonce))]  # a re-sent HELLO
        admission = self.targets.admit(fp, self.queue, self.leases, who=f"{daemon_id}/{msg.session_nonce}", now=now)
        out: list[Instruction] = [Notice(logging.INFO, note) for note in admission.notes]
        if admission.refusal is not None:  # outside the spec's hardware targets (coordinator.targets)
            why = f"refused work: {admission.refusal}"
            said = [] if admission.repeated else [Notice(logging.WARNING, f"daemon {daemon_id} {why}")]
            return [*out, *said, Send(daemon_id, Shutdown(reason=why))]
        held = {(r.trial_id, r.epoch) for r in msg.held}
        renewed: list[LeaseRef] = []
        revoked: list[LeaseRef] = []
        for lease in self.leases.held_by(daemon_id):
            if self._foreign(lease, key):
                out.append(Notice(logging.WARNING, f"daemon {daemon_id} (key {key_id(key)}) cannot adopt orphaned lease "
                                                   f"{lease.batch_id}: it was granted to key {self._orphan_keys[lease.batch_id]}"))
                continue
            mine = [(t, e) for t, e in lease.outstanding_pairs() if (t, e) in held]
            if mine and len(mine) == len(lease.outstanding):
                self.leases.renew(lease, now)
                renewed += [LeaseRef(trial_id=t, epoch=e) for t, e in mine]
            else:
                why = "restarted" if old is None or not msg.held else "reconnected"
                out += self._revoke(lease, f"daemon {daemon_id} {why} as a new session without lease {lease.batch_id}")
        known = {(r.trial_id, r.epoch) for r in renewed}  # and accepted ones: their replay gets an ACK
        revoked += [LeaseRef(trial_id=t, epoch=e) for t, e in sorted(held - known) if (t, e) not in self._accepted]
        caps = msg.capabilities
        self.daemons[daemon_id] = DaemonSession(daemon_id, msg.session_nonce, fp.hardware_class, msg.pid, now,
                                                key=key, fingerprint=fp, engine_args=caps.engine_args)
        self._no_daemon_since = None
        self.service.known.add(fp.hardware_class)
        self.service.served.add(fp.hardware_class)  # its daemons have started: the cool-down rule applies
        out.append(DaemonJoined(daemon_id, fp.hardware_class, fp.hostname, msg.pid))
        if self.spec.backend.kind == "vllm" and old is None:  # said when it joins, not on every reconnect
            if caps.engine_args is None:
                # a warning for the first few; a fleet of hundreds says the rest at INFO (-v), not a wall of them
                self._unchecked_joins += 1
                level = logging.WARNING if self._unchecked_joins <= UNCHECKED_WARNINGS else logging.INFO
                more = (f" ({self._unchecked_joins} such daemons so far; the next at INFO level, -v)"
                        if self._unchecked_joins == UNCHECKED_WARNINGS else "")
                out.append(Notice(level, f"daemon {daemon_id} did not say which engine args its vLLM "
                                         f"({fp.vllm_version or 'version unknown'}) accepts: configs are not "
                                         f"checked against it before they run there{more}"))
            else:
                out.append(Notice(logging.INFO, f"daemon {daemon_id}: vLLM {caps.engine_args.vllm_version} accepts "
                                                f"{len(caps.engine_args.flags)} long options"))
        joined = self.policy.join(daemon_id, fp.hardware_class, caps.max_concurrency, caps.group,
                                  caps.group_max_concurrency, devices=len(fp.gpus))
        out += [Notice(logging.INFO, note) for note in joined.notes]
        if caps.out_of_service:  # its preflight failed (daemon.preflight): it asks for no work until it passes
            out.append(Notice(logging.WARNING, f"daemon {daemon_id} is out of service: {caps.out_of_service}"))
        out.append(Send(daemon_id, self._welcome(msg.session_nonce)))
        if renewed:
            out.append(Send(daemon_id, Renewed(seq=msg.seq, leases=renewed, ttl_s=self.settings.lease_ttl_s)))
            out.append(Notice(logging.INFO, f"daemon {daemon_id} rejoined holding {len(renewed)} lease(s): renewed"))
        if revoked:
            out.append(Send(daemon_id, Revoked(seq=msg.seq, leases=revoked, reason="not a current lease of this daemon")))
        return out

    def _foreign(self, lease: Lease, key: str) -> bool:
        """An orphaned lease granted to another key than ``key`` (it is not this session's to adopt)."""
        want = self._orphan_keys.get(lease.batch_id)
        return lease.state is LeaseState.ORPHANED and want is not None and want != (key_id(key) if key else "")

    def _welcome(self, nonce: str) -> Welcome:
        return Welcome(session_nonce=nonce, coordinator_id=self.coordinator_id,
                       heartbeat_interval_s=self.settings.heartbeat_interval_s, lease_ttl_s=self.settings.lease_ttl_s)

    def _heartbeat(self, d: DaemonSession, msg: Heartbeat, now: float) -> list[Instruction]:
        renewed: list[LeaseRef] = []
        revoked: list[LeaseRef] = []
        touched: set[str] = set()
        for ref in msg.leases:
            lease = self.leases.current(d.daemon_id, ref.trial_id, ref.epoch)
            if lease is None and (ref.trial_id, ref.epoch) in self._accepted:
                continue  # the heartbeat crossed this result's ACK: nothing to renew or revoke
            if lease is None or lease.state is LeaseState.ORPHANED:
                revoked.append(ref)
            else:
                renewed.append(ref)
                if lease.batch_id not in touched:
                    touched.add(lease.batch_id)
                    self.leases.renew(lease, now)
        out: list[Instruction] = [Send(d.daemon_id, Renewed(seq=msg.seq, leases=renewed, ttl_s=self.settings.lease_ttl_s))]
        if revoked:
            out.append(Send(d.daemon_id, Revoked(seq=msg.seq, leases=revoked, reason="not a current lease of this daemon")))
        return out

    def _ready(self, d: DaemonSession, msg: Ready, now: float) -> list[Instruction]:
        self.policy.asked(d.daemon_id)
        said: list[Instruction] = []
        out = self._answer_ready(d, msg, now, said)
        if out is not None:
            self.waiting.pop(d.daemon_id, None)  # answered: nothing of it waits any more
            return out
        # No work for it now (or no budget this pass): it waits. A newer READY replaces one still
        # waiting in its place in the queue (oldest first), so asking again never sends it back.
        self.waiting[d.daemon_id] = WaitingReady(msg.seq, d.session_nonce, now + self.settings.heartbeat_interval_s)
        return said

    def _answer_ready(self, d: DaemonSession, msg: Ready, now: float, said: list[Instruction]) -> list[Instruction] | None:
        """What answers ``msg`` now, or None when it must wait for work (then ``said`` gets what
        is to be carried out meanwhile: batches refused on the way)."""
        out: list[Instruction] = []
        held = {(r.trial_id, r.epoch) for r in msg.held}
        kept = 0
        for lease in self.leases.held_by(d.daemon_id):
            # An idle daemon that holds this lease waits for ACKs of its results: wait too. One that
            # got the GRANT (its READY says a GRANT answered that READY) but holds none of it dropped
            # the batch: revoke it now. Otherwise the GRANT is still on its way or was lost with a
            # connection: its expiry (TTL + grace without renewal) decides.
            mine = any(pair in held for pair in lease.outstanding_pairs())
            if not mine and lease.state is not LeaseState.ORPHANED and 0 < lease.ready_seq <= msg.answered_seq:
                out += self._revoke(lease, f"daemon {d.daemon_id} is idle without lease {lease.batch_id} "
                                           "(it dropped the batch it was granted)")
            else:
                kept += 1
        if kept >= self.policy.slots(d.daemon_id):  # every slot it has holds a lease
            return [*out, Send(d.daemon_id, NoWork(retry_after_s=self.settings.heartbeat_interval_s))]
        if out:
            return [*out, Send(d.daemon_id, NoWork(retry_after_s=0.0))]
        work = None
        if self._may_grant() and self.breaker.may_grant(d.daemon_id, now) and self._policy_allows(d):
            work, refused = self._take(d)
            out += refused
        if work is None:
            if self.stopping or self.finished:
                return [*out, Send(d.daemon_id, Shutdown(reason="no more work"))]
            said += out  # batches refused: said now, while the READY itself waits for work
            return None
        return [*out, *self._grant(d, work, msg.seq, now)]

    def _may_grant(self) -> bool:
        return self.grant_budget is None or self.grant_budget > 0

    def _policy_allows(self, d: DaemonSession) -> bool:
        """The fleet policy lets ``d`` take a batch now (a free slot; its group's room and turn)."""
        return self.policy.why_wait(d.daemon_id, lambda x: len(self.leases.held_by(x)), self.queue.has_work) is None

    def _grant(self, d: DaemonSession, work: BatchWork, ready_seq: int, now: float) -> list[Instruction]:
        """Lease ``work`` to ``d`` in answer to its READY ``ready_seq``: persist, then send the GRANT."""
        if self.grant_budget is not None:
            self.grant_budget -= 1
        self.policy.granted(d.daemon_id)
        attempts = {}
        for m in work.trials:
            self._attempts[m.trial_id] = self._attempts.get(m.trial_id, 0) + 1
            attempts[m.trial_id] = self._attempts[m.trial_id]
        pinned = work if work.hardware_class else BatchWork(work.batch, work.trials, d.hardware_class)
        self.leases.add(Lease(
            batch_id=work.batch_id, daemon_id=d.daemon_id, work=pinned, attempts=attempts,
            outstanding={m.trial_id for m in work.trials}, granted_at=now, renewed_at=now,
            ttl_s=self.settings.lease_ttl_s, ready_seq=ready_seq,
        ))
        grant = Grant(
            batch_id=work.batch_id, epoch=max(attempts.values()), ttl_s=self.settings.lease_ttl_s, seq=ready_seq,
            model=self.spec.model, backend=self.spec.backend, budgets=self.spec.budgets, config=work.batch.config,
            trials=[GrantedTrial(trial_id=m.trial_id, attempt=attempts[m.trial_id], manifest=m) for m in work.trials],
            co_tenancy=self.policy.co_tenancy,
        )
        return [*self.breaker.granted(d.daemon_id, now), BeginAttempts(d.daemon_id, work.batch_id, attempts),
                Send(d.daemon_id, grant)]

    def _take(self, d: DaemonSession) -> tuple[BatchWork | None, list[Instruction]]:
        """The next batch ``d`` may run (its class's queue, then unpinned work), and the closing of
        every queued batch it could take whose flags its vLLM does not accept and no other connected
        daemon may run (all of them at once: refused before any of its trials would have run)."""
        if self.stopping:
            return None, []
        accepted = d.engine_args
        if accepted is None or self.spec.backend.kind != "vllm":
            return self.queue.take(d.hardware_class), []
        out: list[Instruction] = []
        chosen: BatchWork | None = None
        refused: list[tuple[BatchWork, list[str]]] = []
        # in take()'s order up to the first batch it may run: a READY costs the batches ahead of
        # that one, not the whole queue (those behind are judged when a READY reaches them)
        for work in self.queue.candidates(d.hardware_class):
            missing = self._missing(d, work)
            if not missing:
                chosen = work
                break
            if not any(self._may_run(e, work) for e in self.daemons.values() if e is not d):
                refused.append((work, missing))
        for work, missing in refused:
            self.queue.remove(work)
            out += self._refuse(d, accepted, work, missing)
        if chosen is not None:
            self.queue.remove(chosen)
        return chosen, out

    def _may_run(self, d: DaemonSession, work: BatchWork) -> bool:
        """Whether ``d`` could be granted ``work``: its class (or unpinned work) and a vLLM that
        accepts its flags, or did not say which it accepts (then it is not checked)."""
        if work.hardware_class is not None and work.hardware_class != d.hardware_class:
            return False
        return d.engine_args is None or not self._missing(d, work)

    def _missing(self, d: DaemonSession, work: BatchWork) -> list[str]:
        """The flags ``work``'s config would pass that ``d``'s vLLM does not accept (a batch's flags
        are worked out once: a waiting READY looks at the whole queue on every tick)."""
        needed = self._needed.get(work.batch_id)
        if needed is None:
            needed = self._needed[work.batch_id] = tuple(config_flags(work.batch.config.args))
        return [] if d.accepted_flags is None else missing_flags(needed, d.accepted_flags)

    def _refuse(self, d: DaemonSession, accepted: AcceptedArgs, work: BatchWork, missing: list[str]) -> list[Instruction]:
        """Close ``work``'s trials as ``config`` failures without running them: attempts opened for
        ``d`` (whose vLLM refused it last), each with a result made here saying why."""
        reason = refusal_text(missing, accepted, d.daemon_id)
        at_us = int(self.wall_clock() * 1_000_000)
        attempts: dict[str, int] = {}
        for m in work.trials:
            self._attempts[m.trial_id] = self._attempts.get(m.trial_id, 0) + 1
            attempts[m.trial_id] = self._attempts[m.trial_id]
        out: list[Instruction] = [
            Notice(logging.INFO, f"{reason.splitlines()[0]}; no connected daemon's vLLM accepts it: "
                                    f"{len(work.trials)} trial(s) of batch {work.batch_id} closed as config failures"),
            BeginAttempts(d.daemon_id, work.batch_id, attempts),
        ]
        for m in work.trials:
            epoch = attempts[m.trial_id]
            outcome = TrialOutcome(status="failed", failure_kind="config", error=reason, started_at_us=at_us,
                                   finished_at_us=at_us, fingerprint=d.fingerprint)
            result = Result(session_nonce=d.session_nonce, batch_id=work.batch_id, trial_id=m.trial_id, epoch=epoch,
                            submission_id=REFUSED_SUBMISSION, outcome=outcome)
            self._accepted[(m.trial_id, epoch)] = REFUSED_SUBMISSION
            out.append(Accept(d.daemon_id, result, m))
        return out

    def _state(self, d: DaemonSession, msg: State) -> list[Instruction]:
        if msg.trial_id is not None:
            ok = self.leases.current(d.daemon_id, msg.trial_id, msg.epoch) is not None
        else:
            lease = self.leases.get(msg.batch_id)
            ok = lease is not None and lease.daemon_id == d.daemon_id
        if not ok:
            return []
        return [Transition(msg.trial_id, msg.epoch if msg.trial_id else None, msg.batch_id, msg.phase, msg.detail)]

    def _result(self, d: DaemonSession, msg: Result, now: float) -> list[Instruction]:
        key = (msg.trial_id, msg.epoch)
        done = self._accepted.get(key)
        if done is not None:
            if done == msg.submission_id:
                return [Send(d.daemon_id, Ack(trial_id=msg.trial_id, submission_id=msg.submission_id))]
            return [Send(d.daemon_id, Conflict(trial_id=msg.trial_id, submission_id=msg.submission_id,
                                               reason="a different result was already accepted for this attempt"))]
        lease = self.leases.current(d.daemon_id, msg.trial_id, msg.epoch)
        if lease is None or lease.batch_id != msg.batch_id or self._foreign(lease, d.key):
            return [Send(d.daemon_id, Stale(trial_id=msg.trial_id, submission_id=msg.submission_id,
                                            reason="not the current attempt of a trial leased to this daemon"))]
        if lease.state is LeaseState.ORPHANED:
            self.leases.renew(lease, now)
        manifest = lease.manifest(msg.trial_id)
        self._accepted[key] = msg.submission_id
        self.leases.resolve(lease, msg.trial_id, msg.submission_id, now)
        return [*self.breaker.success(d.daemon_id, now), Accept(d.daemon_id, msg, manifest),
                Send(d.daemon_id, Ack(trial_id=msg.trial_id, submission_id=msg.submission_id))]

    def _batch_error(self, d: DaemonSession, msg: BatchError) -> list[Instruction]:
        lease = self.leases.get(msg.batch_id)
        if lease is None or lease.daemon_id != d.daemon_id:
            return [Notice(logging.WARNING, f"daemon error on {d.daemon_id} for batch {msg.batch_id} it does not hold: "
                                            f"{msg.error}")]
        tail = msg.traceback_tail.strip()
        reason = f"daemon error on {d.daemon_id}: {msg.error}" + (f"\n{tail}" if tail else "")
        return [Notice(logging.ERROR, f"daemon {d.daemon_id} crashed in batch {msg.batch_id}: {msg.error}"),
                *self._revoke(lease, reason)]

    # ------------------------------------------------------------------ endings

    def _forget(self, daemon_id: str, reason: str) -> list[Instruction]:
        self.daemons.pop(daemon_id, None)
        self.policy.leave(daemon_id)
        out: list[Instruction] = []
        for lease in self.leases.held_by(daemon_id):
            out += self._revoke(lease, reason)
        return out

    def _revoke(self, lease: Lease, reason: str) -> list[Instruction]:
        """Close a lease's outstanding attempts as transport and queue them again (first in line,
        same hardware class) unless stopping or a trial's retry budget is spent."""
        pairs = self.leases.revoke(lease)
        out: list[Instruction] = [CloseAttempts(pairs, reason)] if pairs else []
        if self.stopping or not pairs:
            return out
        out += self.breaker.failure(lease.daemon_id, self.clock(), reason.splitlines()[0])
        budget = self.settings.max_transport_retries
        retry: list[TrialManifest] = []
        for m in lease.work.trials:
            if m.trial_id not in lease.outstanding:
                continue
            self.lost[m.trial_id] += 1
            self.retries.lost(m.trial_id, lease.attempts[m.trial_id], lease.daemon_id, reason)
            spent = self.lost[m.trial_id] >= budget
            out.append(RetryEvent("given_up" if spent else "retry", m.trial_id, lease.attempts[m.trial_id],
                                  lease.daemon_id, reason.splitlines()[0], budget))
            if spent:
                self.given_up.add(m.trial_id)
                out.append(Notice(logging.ERROR, f"trial {m.trial_id[:12]} lost {self.lost[m.trial_id]} attempts to "
                                                 "transport or daemon errors in this sweep; left as a hole"))
            else:
                retry.append(m)
        if retry:
            self.queue.appendleft(BatchWork(lease.work.batch, tuple(retry), lease.work.hardware_class))
            out.append(Notice(logging.WARNING, f"{lease.batch_id}: {len(retry)} trial(s) queued again "
                                               f"({reason.splitlines()[0]})"))
        return out


def check_grant_bounds(spec: ExperimentSpec, batches: Iterable[tuple[object, Iterable[object]]]) -> None:
    """Refuse (:class:`SpecError`, naming the field) a spec whose GRANTs would break the wire's
    bounds (:func:`servetune.messages.grant_bounds_problem`); ``batches``: (engine config, trial
    manifests) of each batch. The sweep asks before it writes anything; the core again at start."""
    problem = grant_bounds_problem(spec.model, spec.backend, spec.budgets, batches)
    if problem:
        where, _, what = problem.partition(": ")
        raise SpecError(f"experiment {spec.name!r}", [SpecIssue(where, f"{what}: a GRANT could not carry it to a daemon")])


def orphans_from(running: Iterable[tuple[str, int, str, str]], work: Sequence[BatchWork]) -> tuple[
        list[Orphan], list[BatchWork], list[tuple[str, int]]]:
    """Split running attempts left by a coordinator that died, ``(trial, attempt, daemon, batch)``,
    into orphan leases over the planned ``work``. Returns the orphans, the work without their
    trials, and the attempts that match no planned batch (close those as transport at once)."""
    by_batch = {w.batch_id: w for w in work}
    groups: dict[tuple[str, str], dict[str, int]] = {}
    unmatched: list[tuple[str, int]] = []
    for trial_id, attempt, daemon_id, batch_id in running:
        w = by_batch.get(batch_id)
        if w is None or trial_id not in {m.trial_id for m in w.trials}:
            unmatched.append((trial_id, attempt))
            continue
        groups.setdefault((daemon_id, batch_id), {})[trial_id] = attempt
    orphans: list[Orphan] = []
    taken: dict[str, set[str]] = {}
    for (daemon_id, batch_id), attempts in groups.items():
        w = by_batch[batch_id]
        if batch_id in taken:  # two daemons claim one batch: keep the first, close the other
            unmatched += list(attempts.items())
            continue
        trials = tuple(m for m in w.trials if m.trial_id in attempts)
        orphans.append(Orphan(daemon_id, BatchWork(w.batch, trials, w.hardware_class), attempts))
        taken[batch_id] = set(attempts)
    rest: list[BatchWork] = []
    for w in work:
        left = tuple(m for m in w.trials if m.trial_id not in taken.get(w.batch_id, set()))
        if left:
            rest.append(BatchWork(w.batch, left, w.hardware_class))
    return orphans, rest, unmatched
