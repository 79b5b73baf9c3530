"""The coordinator's artifact adapter: the receiver over the experiment's blob store, its index, the attempt owners.

:class:`ArtifactSink` carries out the control core's :class:`~coordinator.control.ReceiveArtifact`
(the core has already checked that the message came from a live session under that session's
CURVE key, exactly as for a RESULT). It hands the message to the pure
:class:`~coordinator.artifact_receiver.ArtifactReceiver`, whose ``known_attempt`` asks the store
whether the attempt was granted to that key (``attempts.daemon_key_id``): running or finished,
since artifacts are offered after their RESULT; records each artifact the receiver reports whole
and verified in ``<experiment>/artifacts/index.sqlite`` with the daemon's key id; and returns the
replies for the adapter to send.

The sweep queues them (:meth:`enqueue`) and carries them out (:meth:`pump`) after the pass's
group commit and after the pass's sends (ACKs, RENEWED), so a chunk's write and fsync never delay
the answer to a RESULT (HEARTBEATs are answered before the pass's other messages anyway). A 256 KiB
chunk's write, fsync included, took about 2 ms here (local disk, median of 30), so one pump carries
out at most :attr:`SinkPolicy.max_per_pump` messages and leaves the rest queued for the next pass
or tick: a burst of chunks from many daemons delays the next HEARTBEAT by at most that many writes.
The queue is bounded (:attr:`SinkPolicy.max_queued`); a message beyond it is refused non-final at
once (the daemon offers again). At the daemons' default pacing (4 chunks per heartbeat interval
each) a fleet of 100 daemons uploading at once still outruns one loop, so large fleets should
lower ``daemon start --upload-bytes-per-interval``. The per-attempt upload budget is charged in
the index (``upload_charges``), so a restarted coordinator does not grant it again. At start it clears temporary files a
crash left in the blob store; :meth:`expire` (from the sweep's tick) forgets idle uploads.

Draining: the core finishes when every result is in, but the last attempts' artifacts are still
on their way. :meth:`draining` keeps the sweep's loop running while an upload is open or queued, or while
an artifact message came within :attr:`SinkPolicy.quiet_s`, for at most
``FleetSettings.artifact_drain_s`` after the last result. What does not arrive by then stays
spooled on its daemon's node and is offered to the next sweep of the experiment that daemon joins.
"""

from __future__ import annotations

import logging
import sqlite3
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from coordinator.artifact_receiver import ArtifactReceiver, ReceiverPolicy
from coordinator.control import ReceiveArtifact
from coordinator.store import Store
from servetune.artifact_index import ArtifactConflictError, ArtifactIndex, experiment_blob_store
from servetune.artifact_messages import ArtifactMissing, ArtifactOffer, ArtifactRefused, ToDaemon
from servetune.blobs import LocalBlobStore
from servetune.keys import key_id

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SinkPolicy:
    #: After the last result, the sweep waits for artifact traffic this quiet before it ends.
    quiet_s: float = 2.0
    #: ... but no longer than this after the last result (``FleetSettings.artifact_drain_s``).
    drain_max_s: float = 60.0
    #: Artifact messages carried out per :meth:`ArtifactSink.pump` (each chunk about 2 ms of disk).
    max_per_pump: int = 8
    #: Artifact messages waiting at most; one beyond is refused non-final (offered again later).
    max_queued: int = 1024


class _IndexCharges:
    """The receiver's :class:`~coordinator.artifact_receiver.ChargeBook` over the artifact index,
    charging the key id of the sender of the message being handled."""

    def __init__(self, sink: ArtifactSink):
        self._sink = sink

    def charges(self, trial_id: str, attempt: int) -> dict[str, int]:
        try:
            return self._sink.index.charges(trial_id, attempt)
        except sqlite3.Error as exc:
            raise OSError(str(exc)) from exc

    def charge(self, trial_id: str, attempt: int, manifest_sha256: str, size: int) -> None:
        try:
            self._sink.index.charge(trial_id, attempt, manifest_sha256, size, self._sink._sender_key_id or "")
        except sqlite3.Error as exc:
            raise OSError(str(exc)) from exc


class ArtifactSink:
    """See the module docstring. Used by the sweep's loop thread only."""

    def __init__(self, folder: Path, store: Store, policy: SinkPolicy | None = None,
                 receiver_policy: ReceiverPolicy | None = None):
        self.policy = policy or SinkPolicy()
        self._store = store
        blobs = experiment_blob_store(folder)
        if isinstance(blobs, LocalBlobStore):
            removed = blobs.remove_temporaries()
            if removed:
                log.info("removed %d temporary file(s) a stopped coordinator left in %s", removed, blobs.root)
        self.index = ArtifactIndex.open(folder)
        self.receiver = ArtifactReceiver(blobs, receiver_policy, known_attempt=self._known_attempt,
                                         charges=_IndexCharges(self))
        self._sender_key_id: str | None = None
        self._last_message: float | None = None
        self._queue: deque[ReceiveArtifact] = deque()
        #: messages refused because the queue was full
        self.refused_busy = 0

    def close(self) -> None:
        counters = self.receiver.counters
        if counters:
            log.info("artifact receiver: %s", " ".join(f"{k}={v}" for k, v in sorted(counters.items())))
        self.index.close()

    def enqueue(self, ins: ReceiveArtifact, now: float) -> list[ToDaemon]:
        """Queue one :class:`ReceiveArtifact` for :meth:`pump`; returns the replies to send now
        (a non-final refusal when the queue is full, else none)."""
        self._last_message = now
        if len(self._queue) < self.policy.max_queued:
            self._queue.append(ins)
            return []
        self.refused_busy += 1
        msg = ins.msg
        digest = msg.manifest.digest() if isinstance(msg, ArtifactOffer) else msg.manifest_sha256
        if self.refused_busy == 1 or self.refused_busy % 1000 == 0:
            log.warning("artifact queue full (%d messages): refused %d message(s) so far, offered again later",
                        len(self._queue), self.refused_busy)
        return [ArtifactRefused(trial_id=msg.trial_id, epoch=msg.epoch, manifest_sha256=digest,
                                chunk_sha256=None if isinstance(msg, ArtifactOffer) else msg.sha256,
                                reason="over_budget", detail="the coordinator is busy: offer again later",
                                final=False)]

    @property
    def queued(self) -> int:
        return len(self._queue)

    def pump(self, now: float) -> list[tuple[str, ToDaemon]]:
        """Carry out up to :attr:`SinkPolicy.max_per_pump` queued messages, oldest first; returns
        (daemon id, reply) pairs to send."""
        out: list[tuple[str, ToDaemon]] = []
        for _ in range(min(self.policy.max_per_pump, len(self._queue))):
            ins = self._queue.popleft()
            out += [(ins.daemon_id, reply) for reply in self.handle(ins, now)]
        return out

    def handle(self, ins: ReceiveArtifact, now: float) -> list[ToDaemon]:
        """Carry out one :class:`ReceiveArtifact`; returns the replies to send to ``ins.daemon_id``."""
        self._last_message = now
        self._sender_key_id = key_id(ins.key) if ins.key else None
        try:
            out = self.receiver.handle(ins.msg, now)
        finally:
            self._sender_key_id = None
        if isinstance(ins.msg, ArtifactOffer):
            for reply in out.replies:
                if isinstance(reply, ArtifactMissing):
                    log.info("artifact %s (%s) of trial %s attempt %d: asking daemon %s for %d of its %d chunk(s)",
                             ins.msg.manifest.name, reply.manifest_sha256[:12], reply.trial_id[:12], reply.epoch,
                             ins.daemon_id, len(reply.missing), len(set(ins.msg.manifest.chunks)))
        for art in out.stored:
            try:
                self.index.record(art.trial_id, art.epoch, art.manifest, daemon=key_id(ins.key) if ins.key else "")
            except ArtifactConflictError as exc:
                log.warning("artifact not indexed: %s", exc)
            else:
                log.info("stored %s (%d bytes) of trial %s attempt %d from daemon %s", art.manifest.name,
                         art.manifest.size, art.trial_id[:12], art.epoch, ins.daemon_id)
        return out.replies

    def expire(self, now: float) -> None:
        n = self.receiver.expire(now)
        if n:
            log.info("forgot %d idle artifact upload(s)", n)

    def draining(self, now: float, finished_at: float) -> bool:
        """Whether a sweep whose last result came at ``finished_at`` should still wait for artifacts."""
        if now - finished_at > self.policy.drain_max_s:
            if self.receiver.open_uploads:
                log.warning("%d artifact upload(s) unfinished after %.0f s; they stay on their daemons' nodes",
                            self.receiver.open_uploads, self.policy.drain_max_s)
            return False
        last = max(finished_at, self._last_message or finished_at)
        return self.receiver.open_uploads > 0 or bool(self._queue) or now - last < self.policy.quiet_s

    def _known_attempt(self, trial_id: str, epoch: int, session_nonce: str) -> bool:
        owner = self._store.attempt_key_id(trial_id, epoch)
        return owner is not None and owner == self._sender_key_id
