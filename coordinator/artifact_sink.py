"""The coordinator's artifact adapter: the receiver over the experiment's blob store, its index, the attempt owners.

:class:`ArtifactSink` carries out the control core's :class:`~coordinator.control.ReceiveArtifact`
(the core has already checked that the message came from a live session under that session's
CURVE key, exactly as for a RESULT). It hands the message to the pure
:class:`~coordinator.artifact_receiver.ArtifactReceiver`, whose ``known_attempt`` asks the store
whether the attempt was granted to that key (``attempts.daemon_key_id``): running or finished,
since artifacts are offered after their RESULT; records each artifact the receiver reports whole
and verified in ``<experiment>/artifacts/index.sqlite`` with the daemon's key id; and returns the
replies for the adapter to send.

The sweep runs it after the pass's group commit and after the pass's sends (ACKs, RENEWED), so
a chunk's write and fsync never delay the answer to a RESULT (HEARTBEATs are answered before the
pass's other messages anyway). A 256 KiB chunk's write, fsync included, took about 2 ms here (local
disk, median of 30): at the daemons' default pacing (4 chunks per heartbeat interval each) a fleet
of 100 daemons uploading at once would take most of the loop's time, so large fleets should lower
``daemon start --upload-bytes-per-interval``. At start it clears temporary files a
crash left in the blob store; :meth:`expire` (from the sweep's tick) forgets idle uploads.

Draining: the core finishes when every result is in, but the last attempts' artifacts are still
on their way. :meth:`draining` keeps the sweep's loop running while an upload is open, or while
an artifact message came within :attr:`SinkPolicy.quiet_s`, for at most
``FleetSettings.artifact_drain_s`` after the last result. What does not arrive by then stays
spooled on its daemon's node and is offered to the next sweep of the experiment that daemon joins.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from coordinator.artifact_receiver import ArtifactReceiver, ReceiverPolicy
from coordinator.control import ReceiveArtifact
from coordinator.store import Store
from servetune.artifact_index import ArtifactConflictError, ArtifactIndex, experiment_blob_store
from servetune.artifact_messages import ArtifactMissing, ArtifactOffer, ToDaemon
from servetune.blobs import LocalBlobStore
from servetune.keys import key_id

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SinkPolicy:
    #: After the last result, the sweep waits for artifact traffic this quiet before it ends.
    quiet_s: float = 2.0
    #: ... but no longer than this after the last result (``FleetSettings.artifact_drain_s``).
    drain_max_s: float = 60.0


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
        self.receiver = ArtifactReceiver(blobs, receiver_policy, known_attempt=self._known_attempt)
        self.index = ArtifactIndex.open(folder)
        self._sender_key_id: str | None = None
        self._last_message: float | None = None

    def close(self) -> None:
        counters = self.receiver.counters
        if counters:
            log.info("artifact receiver: %s", " ".join(f"{k}={v}" for k, v in sorted(counters.items())))
        self.index.close()

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
        return self.receiver.open_uploads > 0 or now - last < self.policy.quiet_s

    def _known_attempt(self, trial_id: str, epoch: int, session_nonce: str) -> bool:
        owner = self._store.attempt_key_id(trial_id, epoch)
        return owner is not None and owner == self._sender_key_id
