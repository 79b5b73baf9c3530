"""The daemon's side of an artifact upload: a pure core (messages in, messages out, injected clock).

One :class:`ArtifactUpload` per artifact of a finished attempt: it offers the manifest, sends the
chunks the coordinator's ARTIFACT_MISSING names, paced by a :class:`Pacer` shared by every upload
of the daemon, and is done when the coordinator answers ARTIFACT_STORED (or refuses it for good).
It asks again (offers the manifest anew) after a reconnect or a REJOIN (:meth:`ArtifactUpload.start`
with the new session), when the coordinator says nothing for ``answer_timeout_s``, and when a chunk
was refused in passing; a daemon that died starts a new upload from the same file, and since the
coordinator answers from what its store already has, only the missing chunks cross again.
:class:`Uploads` routes replies to the uploads they name. No sockets: the daemon's loop calls
:meth:`Uploads.tick` at :meth:`Uploads.next_wakeup` and sends what comes back.

Pacing never stalls heartbeats: at most ``bytes_per_interval`` chunk bytes (raw, before base64's
4/3) go out in any window of ``interval_s`` (the heartbeat interval), so a heartbeat sent after
them queues behind at most that much. A chunk larger than the budget goes out alone, one per window.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Literal, Protocol

from servetune.artifact_messages import (
    ArtifactChunk,
    ArtifactMissing,
    ArtifactOffer,
    ArtifactRefused,
    ArtifactStored,
    ToCoordinator,
    ToDaemon,
)
from servetune.artifacts import CHUNK_SIZE, ArtifactManifest
from servetune.errors import ServetuneError

log = logging.getLogger(__name__)

UploadPhase = Literal["new", "offered", "sending", "sent", "stored", "refused", "failed"]
DONE_PHASES = ("stored", "refused", "failed")


class ChunkSource(Protocol):
    """Where an upload reads its chunks (:class:`servetune.artifacts.FileChunks`, or
    :class:`servetune.artifacts.StoreChunks` over the daemon's spool)."""

    def __contains__(self, digest: str) -> bool: ...

    def length(self, digest: str) -> int: ...

    def read(self, digest: str) -> bytes: ...


@dataclass(frozen=True)
class PacingPolicy:
    #: Raw chunk bytes per heartbeat interval, over all uploads (4 chunks: 1 MiB/s at a 1 s interval,
    #: about 1.4 MB/s with base64: the link must carry that, ~12 Mbit/s, or heartbeats queue; lower it
    #: for a slower link).
    bytes_per_interval: int = 4 * CHUNK_SIZE
    #: The heartbeat interval (the adapter sets it from WELCOME's ``heartbeat_interval_s``).
    interval_s: float = 1.0
    #: Offer again when the coordinator has not answered for this long.
    answer_timeout_s: float = 10.0


class Pacer:
    """A sliding window: a send of ``n`` bytes at ``now`` is allowed when the bytes sent in
    ``(now - interval_s, now]`` plus ``n`` stay within ``bytes_per_interval`` (or nothing was sent
    in that window: a chunk larger than the budget goes alone)."""

    def __init__(self, policy: PacingPolicy | None = None):
        self.policy = policy or PacingPolicy()
        self._sent: deque[tuple[float, int]] = deque()
        self._in_window = 0

    def _trim(self, now: float) -> None:
        while self._sent and self._sent[0][0] <= now - self.policy.interval_s:
            self._in_window -= self._sent.popleft()[1]

    def take(self, n: int, now: float) -> bool:
        """Consume ``n`` bytes of budget at ``now`` if allowed; returns whether it was."""
        self._trim(now)
        if self._sent and self._in_window + n > self.policy.bytes_per_interval:
            return False
        self._sent.append((now, n))
        self._in_window += n
        return True

    def next_free(self, now: float) -> float:
        """When budget next frees up (``now`` if there is some)."""
        self._trim(now)
        return self._sent[0][0] + self.policy.interval_s if self._sent else now


class ArtifactUpload:
    """One artifact of one attempt; see the module docstring."""

    def __init__(self, trial_id: str, epoch: int, manifest: ArtifactManifest, source: ChunkSource, pacer: Pacer):
        self.trial_id, self.epoch, self.manifest = trial_id, epoch, manifest
        self.digest = manifest.digest()
        self.source, self.pacer = source, pacer
        self.phase: UploadPhase = "new"
        self.reason = ""
        self.session = ""
        self.chunks_sent = 0
        self.bytes_sent = 0
        self._queue: deque[str] = deque()
        self._last_sent = 0.0
        self._reask = False

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.trial_id, self.epoch, self.digest)

    @property
    def done(self) -> bool:
        return self.phase in DONE_PHASES

    def start(self, session_nonce: str, now: float) -> list[ToCoordinator]:
        """Offer the manifest under ``session_nonce``: at first, and again after every new session
        (reconnect, REJOIN, coordinator restart). Chunks queued from before are dropped: the
        answer to this offer says what is still missing."""
        if self.done:
            return []
        self.session = session_nonce
        self._queue.clear()
        return [self._offer(now)]

    def on_message(self, msg: ToDaemon, now: float) -> list[ToCoordinator]:
        if self.done or (msg.trial_id, msg.epoch, msg.manifest_sha256) != self.key:
            return []
        if isinstance(msg, ArtifactStored):
            self._finish("stored", "")
            return []
        if isinstance(msg, ArtifactRefused):
            if msg.final:
                self._finish("refused", f"{msg.reason}: {msg.detail}")
            elif msg.chunk_sha256 is not None:
                if self.phase == "sent":  # everything went out: ask at once what is still missing
                    return [self._offer(now)]
                self._reask = True  # ask once the queue drains
            return []
        assert isinstance(msg, ArtifactMissing)
        foreign = [d for d in msg.missing if d not in self.source]
        if foreign:
            log.warning("artifact %s: the coordinator asked for %d chunks not in it; ignored", self.digest[:12],
                        len(foreign))
        self._queue = deque(d for d in msg.missing if d in self.source)
        self._reask = False
        self.phase = "sending"
        self._last_sent = now
        return self.tick(now)

    def tick(self, now: float) -> list[ToCoordinator]:
        """Chunks the pacer allows now, or an offer when an answer is overdue."""
        out: list[ToCoordinator] = []
        if self.phase == "sending":
            while self._queue and self.pacer.take(self.source.length(self._queue[0]), now):
                digest = self._queue.popleft()
                try:
                    data = self.source.read(digest)
                except (ServetuneError, OSError) as exc:  # the file changed, a spooled blob rotted
                    self._finish("failed", str(exc))
                    return out
                out.append(ArtifactChunk(session_nonce=self.session, trial_id=self.trial_id, epoch=self.epoch,
                                         manifest_sha256=self.digest, sha256=digest, data=data))
                self.chunks_sent += 1
                self.bytes_sent += len(data)
                self._last_sent = now
            if not self._queue:
                self.phase = "sent"
                if self._reask:
                    self._reask = False
                    out.append(self._offer(now))
        elif self.phase in ("offered", "sent") and now - self._last_sent >= self.pacer.policy.answer_timeout_s:
            out.append(self._offer(now))
        return out

    def next_wakeup(self, now: float) -> float | None:
        if self.done or self.phase == "new":
            return None
        if self.phase == "sending":
            return self.pacer.next_free(now)
        return self._last_sent + self.pacer.policy.answer_timeout_s

    def _offer(self, now: float) -> ArtifactOffer:
        self.phase = "offered"
        self._last_sent = now
        return ArtifactOffer(session_nonce=self.session, trial_id=self.trial_id, epoch=self.epoch,
                             manifest=self.manifest)

    def _finish(self, phase: UploadPhase, reason: str) -> None:
        self.phase, self.reason = phase, reason
        self._queue.clear()
        if phase != "stored":
            log.warning("artifact %s (%s) of trial %s attempt %d not uploaded: %s", self.manifest.name,
                        self.digest[:12], self.trial_id[:12], self.epoch, reason)


class Uploads:
    """A daemon's uploads in flight, sharing one :class:`Pacer`; finished ones are dropped."""

    def __init__(self, pacer: Pacer | None = None):
        self.pacer = pacer or Pacer()
        self._uploads: dict[tuple[str, int, str], ArtifactUpload] = {}
        self.finished: list[ArtifactUpload] = []

    def add(self, trial_id: str, epoch: int, manifest: ArtifactManifest, source: ChunkSource, session_nonce: str,
            now: float) -> list[ToCoordinator]:
        upload = ArtifactUpload(trial_id, epoch, manifest, source, self.pacer)
        self._uploads.setdefault(upload.key, upload)
        return self._uploads[upload.key].start(session_nonce, now)

    def __len__(self) -> int:
        return len(self._uploads)

    def __contains__(self, key: tuple[str, int, str]) -> bool:
        return key in self._uploads

    def on_message(self, msg: ToDaemon, now: float) -> list[ToCoordinator]:
        upload = self._uploads.get((msg.trial_id, msg.epoch, msg.manifest_sha256))
        out = upload.on_message(msg, now) if upload else []
        self._reap()
        return out

    def restart(self, session_nonce: str, now: float) -> list[ToCoordinator]:
        """A new session (reconnect, REJOIN): every upload offers again."""
        return [m for u in self._uploads.values() for m in u.start(session_nonce, now)]

    def tick(self, now: float) -> list[ToCoordinator]:
        out = [m for u in list(self._uploads.values()) for m in u.tick(now)]
        self._reap()
        return out

    def next_wakeup(self, now: float) -> float | None:
        times = [t for u in self._uploads.values() if (t := u.next_wakeup(now)) is not None]
        return min(times) if times else None

    def _reap(self) -> None:
        for key in [k for k, u in self._uploads.items() if u.done]:
            self.finished.append(self._uploads.pop(key))
