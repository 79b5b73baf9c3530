"""A finished attempt's artifacts, kept on the node until the coordinator confirms it has them.

When an attempt ends, the batch runner (:mod:`daemon.batch`) snapshots its artifacts into the spool:
the vLLM server log as it stands (it is the batch's log and still grows), the raw per-request
samples (JSON lines) and the server-metric series (JSON). Each becomes chunks plus a manifest in a
:class:`~servetune.blobs.LocalBlobStore` under ``<workdir>/artifacts/blobs``; ``pending.jsonl`` lists
the artifacts not yet confirmed, so a daemon restarted on the node still knows what to upload.
Uploads read their chunks from here (:meth:`ArtifactSpool.source`), never from a log that has
moved on since.

The daemon's agent (:mod:`daemon.agent`) uploads what is pending (:mod:`daemon.artifact_upload`)
and calls :meth:`ArtifactSpool.mark_stored` when the coordinator answers ARTIFACT_STORED; it
notices new artifacts by :attr:`ArtifactSpool.changes`. Blobs are never deleted (retention comes
with the blob store's delete). A daemon uses a spool only when its
:class:`~daemon.batch.BatchContext` is given one (``daemon start`` always gives it one).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from servetune.artifacts import (
    CHUNK_SIZE,
    ArtifactKind,
    ArtifactManifest,
    StoreChunks,
    load_manifest,
    put_bytes,
    put_file,
)
from servetune.blobs import LocalBlobStore
from servetune.errors import ServetuneError

log = logging.getLogger(__name__)

PENDING_FILE = "pending.jsonl"


@dataclass(frozen=True)
class SpooledArtifact:
    trial_id: str
    attempt: int
    manifest: ArtifactManifest


class ArtifactSpool:
    """See the module docstring. One daemon process owns a spool (appends are not locked).
    ``chunk_size``: the chunk size of new artifacts (``daemon start --artifact-chunk-size``)."""

    def __init__(self, root: str | os.PathLike[str], chunk_size: int = CHUNK_SIZE):
        self.root = Path(root)
        self.store = LocalBlobStore(self.root / "blobs")
        self.chunk_size = chunk_size
        #: Incremented by every artifact added (another thread may read it to notice new artifacts).
        self.changes = 0

    @classmethod
    def for_workdir(cls, workdir: str | os.PathLike[str], chunk_size: int = CHUNK_SIZE) -> ArtifactSpool:
        return cls(Path(workdir) / "artifacts", chunk_size)

    def add_file(self, trial_id: str, attempt: int, path: str | os.PathLike[str], kind: ArtifactKind,
                 name: str | None = None) -> ArtifactManifest:
        """Snapshot a file (its bytes as of now) as an artifact of the attempt."""
        manifest = put_file(self.store, path, kind, name, self.chunk_size)
        self._append({"trial_id": trial_id, "attempt": attempt, "manifest": manifest.digest()})
        self.changes += 1
        return manifest

    def add_bytes(self, trial_id: str, attempt: int, data: bytes, kind: ArtifactKind, name: str) -> ArtifactManifest:
        manifest = put_bytes(self.store, data, name, kind, self.chunk_size)
        self._append({"trial_id": trial_id, "attempt": attempt, "manifest": manifest.digest()})
        self.changes += 1
        return manifest

    def mark_stored(self, trial_id: str, attempt: int, manifest_sha256: str) -> None:
        """The coordinator confirmed the artifact (ARTIFACT_STORED): no longer pending."""
        self._append({"trial_id": trial_id, "attempt": attempt, "manifest": manifest_sha256, "stored": True})

    def pending(self) -> list[SpooledArtifact]:
        """Artifacts spooled and not confirmed, in the order they were spooled. A line or a manifest
        that cannot be read (a torn last line after a crash, a rotten blob) is logged and skipped."""
        path = self.root / PENDING_FILE
        if not path.is_file():
            return []
        order: dict[tuple[str, int, str], bool] = {}
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            try:
                entry = json.loads(line)
                key = (str(entry["trial_id"]), int(entry["attempt"]), str(entry["manifest"]))
            except (ValueError, KeyError, TypeError):
                log.warning("%s line %d is unreadable; skipped", path, n)
                continue
            if entry.get("stored"):
                order.pop(key, None)
            else:
                order.setdefault(key, True)
        out = []
        for trial_id, attempt, digest in order:
            try:
                out.append(SpooledArtifact(trial_id, attempt, load_manifest(self.store, digest)))
            except ServetuneError as exc:
                log.warning("spooled artifact of trial %s attempt %d is unreadable: %s", trial_id[:12], attempt, exc)
        return out

    def source(self, manifest: ArtifactManifest) -> StoreChunks:
        """Where an upload of ``manifest`` reads its chunks."""
        return StoreChunks(self.store, manifest)

    def _append(self, entry: dict[str, object]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        line = (json.dumps(entry, sort_keys=True) + "\n").encode("utf-8")
        with open(self.root / PENDING_FILE, "a+b") as fh:
            if fh.seek(0, os.SEEK_END) > 0:
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) != b"\n":  # a line torn by a crash: start a new one
                    line = b"\n" + line
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
