"""The coordinator's side of an artifact upload: a pure core (messages in, replies out, injected clock).

:class:`ArtifactReceiver` answers ARTIFACT_OFFER with the chunks the blob store lacks (asked from
``has``), writes each ARTIFACT_CHUNK through the store (which verifies its digest on write), and
answers ARTIFACT_STORED once the last chunk makes a file that matches the manifest's size and
whole-file sha256; it then stores the manifest itself and reports a :class:`StoredArtifact` for
the adapter to record in the index (:mod:`servetune.artifact_index`). It never opens a socket.

What it refuses (:data:`servetune.artifact_messages.RefusalReason`):

- an offer for an attempt ``known_attempt`` rejects (wired to the control core: only an attempt
  granted to the sending daemon), final;
- an offer whose artifacts would exceed :attr:`ReceiverPolicy.max_bytes_per_attempt` or
  :attr:`ReceiverPolicy.max_artifacts_per_attempt` (declared sizes are charged when an offer is
  accepted, so chunks written per attempt never exceed the bound), final;
- a chunk no open offer asked for, or one that does not hash to its digest or is not the length
  its manifest gives it: dropped, answered non-final (a later MISSING asks for it again);
- chunks that make another file than the manifest says (size or whole-file sha256), final;
- a chunk or manifest the store cannot write (disk full, I/O error): logged and refused non-final
  (``store_failed``), so the daemon keeps the artifact and offers it again later.

A chunk found corrupted at rest when the file is checked is asked for again (the store's ``put``
repairs it), so a blob that rotted heals on the next upload that contains it.

State is what is in flight (open uploads, bounded, dropped after ``idle_timeout_s``) and a cache
of the bytes charged per attempt. Everything durable is in the store, so a restarted coordinator
(a new receiver over the same store) resumes an upload by answering the next offer from ``has``.
The charges are durable too when a :class:`ChargeBook` is given (the coordinator's is the
artifact index, :meth:`servetune.artifact_index.ArtifactIndex.charge`): an attempt's charges are
read once, at its first offer in this process, and each new charge is written when its offer is
accepted, so a restart does not grant an attempt its budget again. Chunks cost no query.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from servetune.artifact_messages import (
    ArtifactChunk,
    ArtifactMissing,
    ArtifactOffer,
    ArtifactRefused,
    ArtifactStored,
    RefusalReason,
    ToCoordinator,
    ToDaemon,
)
from servetune.artifacts import ArtifactError, ArtifactManifest, check_artifact, put_manifest
from servetune.blobs import BlobCorruptedError, BlobError, BlobStore

log = logging.getLogger(__name__)

AttemptKey = tuple[str, int]
UploadKey = tuple[str, int, str]


class ChargeBook(Protocol):
    """Where the upload charges of attempts are kept (durable across coordinator restarts)."""

    def charges(self, trial_id: str, attempt: int) -> dict[str, int]:
        """manifest digest -> bytes charged so far to the attempt."""
        ...

    def charge(self, trial_id: str, attempt: int, manifest_sha256: str, size: int) -> None:
        """Charge ``size`` bytes for that artifact (once per digest); may raise OSError."""
        ...


class MemoryChargeBook:
    """Charges kept in this process only (tests, and a receiver without an index)."""

    def __init__(self) -> None:
        self._charges: dict[AttemptKey, dict[str, int]] = {}

    def charges(self, trial_id: str, attempt: int) -> dict[str, int]:
        return dict(self._charges.get((trial_id, attempt), {}))

    def charge(self, trial_id: str, attempt: int, manifest_sha256: str, size: int) -> None:
        self._charges.setdefault((trial_id, attempt), {}).setdefault(manifest_sha256, size)


@dataclass(frozen=True)
class ReceiverPolicy:
    max_bytes_per_attempt: int = 4 * 1024**3
    max_artifacts_per_attempt: int = 32
    #: Uploads in flight at once, over every daemon; an offer over it is refused non-final (retry later).
    max_open_uploads: int = 1024
    #: An open upload with no message for this long is forgotten (its chunks stay stored).
    idle_timeout_s: float = 600.0


@dataclass(frozen=True)
class StoredArtifact:
    """An artifact now whole and verified in the store: what the index records."""

    trial_id: str
    epoch: int
    manifest_sha256: str
    manifest: ArtifactManifest
    session_nonce: str


@dataclass
class ReceiverOutput:
    replies: list[ToDaemon] = field(default_factory=list)
    stored: list[StoredArtifact] = field(default_factory=list)


@dataclass
class _Upload:
    manifest: ArtifactManifest
    lengths: dict[str, int]
    asked: set[str]
    last_seen: float


class ArtifactReceiver:
    """See the module docstring. ``known_attempt(trial_id, epoch, session_nonce)`` says whether the
    sender may upload for that attempt (default: every attempt)."""

    def __init__(self, store: BlobStore, policy: ReceiverPolicy | None = None,
                 known_attempt: Callable[[str, int, str], bool] | None = None, charges: ChargeBook | None = None):
        self.store = store
        self.charges: ChargeBook = charges or MemoryChargeBook()
        self.policy = policy or ReceiverPolicy()
        self.known_attempt = known_attempt or (lambda trial_id, epoch, session: True)
        self._open: dict[UploadKey, _Upload] = {}
        self._charged: dict[AttemptKey, dict[str, int]] = {}
        self._done: set[UploadKey] = set()
        #: refusals by reason, chunks and bytes written: for logs and tests
        self.counters: dict[str, int] = {}

    def handle(self, msg: ToCoordinator, now: float) -> ReceiverOutput:
        if isinstance(msg, ArtifactOffer):
            return self._offer(msg, now)
        return self._chunk(msg, now)

    def expire(self, now: float) -> int:
        """Forget open uploads idle for longer than the policy allows; returns how many."""
        stale = [k for k, u in self._open.items() if now - u.last_seen > self.policy.idle_timeout_s]
        for k in stale:
            del self._open[k]
        return len(stale)

    @property
    def open_uploads(self) -> int:
        return len(self._open)

    # ------------------------------------------------------------------------------------ internals

    def _count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def _refuse(self, key: UploadKey, reason: RefusalReason, detail: str, final: bool,
                chunk: str | None = None) -> ReceiverOutput:
        self._count(f"refused_{reason}")
        log.warning("artifact %s of trial %s attempt %d refused (%s): %s", key[2][:12], key[0][:12], key[1],
                    reason, detail)
        return ReceiverOutput(replies=[ArtifactRefused(trial_id=key[0], epoch=key[1], manifest_sha256=key[2],
                                                       chunk_sha256=chunk, reason=reason, detail=detail,
                                                       final=final)])

    def _offer(self, msg: ArtifactOffer, now: float) -> ReceiverOutput:
        manifest = msg.manifest
        key: UploadKey = (msg.trial_id, msg.epoch, manifest.digest())
        if not self.known_attempt(msg.trial_id, msg.epoch, msg.session_nonce):
            return self._refuse(key, "unknown_attempt", "no such attempt of this daemon", final=True)
        if key in self._done:
            return ReceiverOutput(replies=[self._stored_reply(key)])
        charged = self._charged.get((msg.trial_id, msg.epoch))
        if charged is None:
            try:
                charged = self._charged[(msg.trial_id, msg.epoch)] = self.charges.charges(msg.trial_id, msg.epoch)
            except OSError as exc:
                log.error("cannot read the upload charges of trial %s attempt %d: %s", msg.trial_id[:12], msg.epoch, exc)
                return self._refuse(key, "store_failed", f"the coordinator could not read its upload charges: {exc}",
                                    final=False)
        if key[2] not in charged:
            if len(charged) + 1 > self.policy.max_artifacts_per_attempt:
                return self._refuse(key, "over_budget", f"an attempt keeps at most "
                                    f"{self.policy.max_artifacts_per_attempt} artifacts", final=True)
            if sum(charged.values()) + manifest.size > self.policy.max_bytes_per_attempt:
                return self._refuse(key, "over_budget", f"{manifest.size} more bytes would put the attempt over "
                                    f"its {self.policy.max_bytes_per_attempt}-byte bound", final=True)
        upload = self._open.get(key)
        if upload is None and len(self._open) >= self.policy.max_open_uploads:
            return self._refuse(key, "over_budget", f"{len(self._open)} uploads in flight; offer again later",
                                final=False)
        if key[2] not in charged:
            try:
                self.charges.charge(msg.trial_id, msg.epoch, key[2], manifest.size)
            except OSError as exc:
                log.error("cannot record the upload charge of artifact %s: %s", key[2][:12], exc)
                return self._refuse(key, "store_failed", f"the coordinator could not record the upload: {exc}",
                                    final=False)
            charged[key[2]] = manifest.size
        missing = self.store.missing(manifest.chunks)
        if not missing:
            self._open.pop(key, None)
            return self._complete(key, manifest, msg.session_nonce, now)
        if upload is None:
            upload = self._open[key] = _Upload(manifest, _lengths(manifest), set(), now)
        upload.asked = set(missing)
        upload.last_seen = now
        return ReceiverOutput(replies=[ArtifactMissing(trial_id=msg.trial_id, epoch=msg.epoch,
                                                       manifest_sha256=key[2], missing=missing)])

    def _chunk(self, msg: ArtifactChunk, now: float) -> ReceiverOutput:
        key: UploadKey = (msg.trial_id, msg.epoch, msg.manifest_sha256)
        upload = self._open.get(key)
        if upload is None:
            if key in self._done:
                return ReceiverOutput()  # a late duplicate of a chunk already stored
            return self._refuse(key, "not_requested", "no open offer for this artifact (offer it again)",
                                final=False, chunk=msg.sha256)
        upload.last_seen = now
        if msg.sha256 not in upload.asked:
            if msg.sha256 in upload.lengths and self.store.has(msg.sha256):
                return ReceiverOutput()  # a duplicate
            return self._refuse(key, "not_requested", "the last MISSING did not ask for this chunk",
                                final=False, chunk=msg.sha256)
        if len(msg.data) != upload.lengths[msg.sha256]:
            return self._refuse(key, "bad_chunk", f"{len(msg.data)} bytes, the manifest says "
                                f"{upload.lengths[msg.sha256]}", final=False, chunk=msg.sha256)
        try:
            self.store.put(msg.data, msg.sha256)
        except BlobCorruptedError as exc:
            return self._refuse(key, "bad_chunk", str(exc), final=False, chunk=msg.sha256)
        except OSError as exc:  # disk full, a read-only or failing disk: refuse, never crash the coordinator
            log.error("cannot write chunk %s of artifact %s: %s", msg.sha256[:12], key[2][:12], exc)
            return self._refuse(key, "store_failed", f"the coordinator could not store the chunk: {exc}",
                                final=False, chunk=msg.sha256)
        self._count("chunks_written")
        self._count("bytes_written", len(msg.data))
        upload.asked.discard(msg.sha256)
        if upload.asked:
            return ReceiverOutput()
        del self._open[key]
        return self._complete(key, upload.manifest, msg.session_nonce, now)

    def _complete(self, key: UploadKey, manifest: ArtifactManifest, session: str, now: float) -> ReceiverOutput:
        try:
            check_artifact(self.store, manifest)
        except BlobError as exc:  # a chunk went bad (or away) at rest: ask for it again, a put repairs it
            self._count("chunks_reasked")
            self._open[key] = _Upload(manifest, _lengths(manifest), {exc.digest}, now)
            return ReceiverOutput(replies=[ArtifactMissing(trial_id=key[0], epoch=key[1], manifest_sha256=key[2],
                                                           missing=[exc.digest])])
        except ArtifactError as exc:
            return self._refuse(key, "bad_file", str(exc), final=True)
        except OSError as exc:
            log.error("cannot check artifact %s: %s", key[2][:12], exc)
            return self._refuse(key, "store_failed", f"the coordinator could not read its store: {exc}", final=False)
        try:
            put_manifest(self.store, manifest)
        except OSError as exc:
            log.error("cannot store the manifest of artifact %s: %s", key[2][:12], exc)
            return self._refuse(key, "store_failed", f"the coordinator could not store the manifest: {exc}",
                                final=False)
        self._done.add(key)
        self._count("artifacts_stored")
        return ReceiverOutput(replies=[self._stored_reply(key)],
                              stored=[StoredArtifact(key[0], key[1], key[2], manifest, session)])

    @staticmethod
    def _stored_reply(key: UploadKey) -> ArtifactStored:
        return ArtifactStored(trial_id=key[0], epoch=key[1], manifest_sha256=key[2])


def _lengths(manifest: ArtifactManifest) -> dict[str, int]:
    out: dict[str, int] = {}
    for digest, _offset, length in manifest.spans():
        out.setdefault(digest, length)
    return out
