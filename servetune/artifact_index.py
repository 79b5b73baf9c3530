"""Which artifact belongs to which trial and attempt: an SQLite index kept apart from the blobs.

Layout inside an experiment folder (next to ``experiment.sqlite``, which it does not touch)::

    artifacts/index.sqlite      this index (WAL)
    artifacts/blobs/ab/abcd...  the blobs: chunks and manifests (servetune.blobs.LocalBlobStore)

Table ``artifacts``, one row per artifact of an attempt, written once:

=================  =======================================================================
trial_id, attempt  the attempt (``attempt`` is the lease epoch it ran under)
name               the artifact's name within the attempt (``server.log``); primary key with the two above
kind               server_log / client_log / daemon_log / samples / metric_series
manifest_sha256    the blob holding the manifest (chunk digests, size, whole-file sha256)
size, sha256       the file's size and whole-file digest (copied from the manifest for queries)
daemon             who produced it: the daemon's key id once CURVE lands, its session until then
stored_at_us       when the coordinator verified it (microseconds since the epoch)
=================  =======================================================================

Table ``upload_charges``, one row per artifact the coordinator agreed to take for an attempt
(``trial_id, attempt, manifest_sha256`` the key; ``size`` the bytes charged; ``daemon`` the key id
that offered it; ``charged_at_us``): the per-attempt upload budget, kept here so that a restarted
coordinator goes on charging where the last one stopped instead of granting the budget again.

The coordinator is the only writer (:meth:`ArtifactIndex.record`); readers (analysis, the
dashboard) open it read-only through :func:`attempt_artifacts` and :func:`read_artifact`. It is its
own file so that the experiment store's schema and its writer's locks stay untouched. The blob
store behind the reader is chosen in one place (:func:`experiment_blob_store`) so another backend
can replace the local one.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from servetune.artifacts import ArtifactKind, ArtifactManifest, assemble, load_manifest
from servetune.blobs import BlobStore, LocalBlobStore
from servetune.errors import ServetuneError

ARTIFACTS_DIR = "artifacts"
INDEX_FILE = "index.sqlite"
BLOBS_DIR = "blobs"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS artifacts (
    trial_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    name TEXT NOT NULL,
    kind TEXT NOT NULL,
    manifest_sha256 TEXT NOT NULL,
    size INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    daemon TEXT NOT NULL DEFAULT '',
    stored_at_us INTEGER NOT NULL,
    PRIMARY KEY (trial_id, attempt, name)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS artifacts_by_manifest ON artifacts (manifest_sha256);
CREATE TABLE IF NOT EXISTS upload_charges (
    trial_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    manifest_sha256 TEXT NOT NULL,
    size INTEGER NOT NULL,
    daemon TEXT NOT NULL DEFAULT '',
    charged_at_us INTEGER NOT NULL,
    PRIMARY KEY (trial_id, attempt, manifest_sha256)
) WITHOUT ROWID;
"""
_COLUMNS = "trial_id, attempt, name, kind, manifest_sha256, size, sha256, daemon, stored_at_us"


class ArtifactConflictError(ServetuneError):
    """An attempt already has an artifact of that name with another manifest (rows are written once)."""


@dataclass(frozen=True)
class ArtifactRecord:
    trial_id: str
    attempt: int
    name: str
    kind: ArtifactKind
    manifest_sha256: str
    size: int
    sha256: str
    daemon: str
    stored_at_us: int


def artifacts_dir(folder: str | os.PathLike[str]) -> Path:
    return Path(folder) / ARTIFACTS_DIR


def experiment_blob_store(folder: str | os.PathLike[str]) -> BlobStore:
    """The blob store of the experiment in ``folder``."""
    return LocalBlobStore(artifacts_dir(folder) / BLOBS_DIR)


class ArtifactIndex:
    """The index of one experiment. Not thread-safe: one instance per thread (SQLite connection)."""

    def __init__(self, conn: sqlite3.Connection):
        self._conn = conn
        self._conn.row_factory = sqlite3.Row

    @classmethod
    def open(cls, folder: str | os.PathLike[str]) -> ArtifactIndex:
        """Open (creating it if needed) for writing: the coordinator only."""
        path = artifacts_dir(folder) / INDEX_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, timeout=30, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(_SCHEMA)
        return cls(conn)

    @classmethod
    def open_readonly(cls, folder: str | os.PathLike[str]) -> ArtifactIndex | None:
        """Open read-only; None when the experiment has no artifact index yet."""
        path = artifacts_dir(folder) / INDEX_FILE
        if not path.is_file():
            return None
        return cls(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30))

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> ArtifactIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def record(self, trial_id: str, attempt: int, manifest: ArtifactManifest, daemon: str = "",
               stored_at_us: int | None = None) -> ArtifactRecord:
        """Record a verified artifact of an attempt. Idempotent for the same manifest.

        Raises:
            ArtifactConflictError: the attempt already has an artifact of this name with another manifest.
        """
        rec = ArtifactRecord(trial_id, attempt, manifest.name, manifest.kind, manifest.digest(), manifest.size,
                             manifest.sha256, daemon, stored_at_us if stored_at_us is not None
                             else time.time_ns() // 1000)
        self._conn.execute(f"INSERT OR IGNORE INTO artifacts ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?)",
                           (rec.trial_id, rec.attempt, rec.name, rec.kind, rec.manifest_sha256, rec.size,
                            rec.sha256, rec.daemon, rec.stored_at_us))
        have = self.get(trial_id, attempt, manifest.name)
        assert have is not None
        if have.manifest_sha256 != rec.manifest_sha256:
            raise ArtifactConflictError(f"trial {trial_id[:12]} attempt {attempt} already has {manifest.name} as "
                                        f"{have.manifest_sha256}, not {rec.manifest_sha256}")
        return have

    def get(self, trial_id: str, attempt: int, name: str) -> ArtifactRecord | None:
        row = self._conn.execute(f"SELECT {_COLUMNS} FROM artifacts WHERE trial_id=? AND attempt=? AND name=?",
                                 (trial_id, attempt, name)).fetchone()
        return ArtifactRecord(**dict(row)) if row else None

    def charges(self, trial_id: str, attempt: int) -> dict[str, int]:
        """The uploads charged to an attempt so far: manifest digest -> bytes."""
        rows = self._conn.execute("SELECT manifest_sha256, size FROM upload_charges WHERE trial_id=? AND attempt=?",
                                  (trial_id, attempt)).fetchall()
        return {str(r[0]): int(r[1]) for r in rows}

    def charge(self, trial_id: str, attempt: int, manifest_sha256: str, size: int, daemon: str = "") -> None:
        """Charge an upload to an attempt (idempotent: a digest is charged once)."""
        self._conn.execute("INSERT OR IGNORE INTO upload_charges (trial_id, attempt, manifest_sha256, size, daemon, "
                           "charged_at_us) VALUES (?,?,?,?,?,?)",
                           (trial_id, attempt, manifest_sha256, size, daemon, time.time_ns() // 1000))

    def attempts_with_artifacts(self) -> set[tuple[str, int]]:
        """Every (trial, attempt) with at least one artifact indexed."""
        return {(str(r[0]), int(r[1])) for r in self._conn.execute("SELECT DISTINCT trial_id, attempt FROM artifacts")}

    def manifest_digests(self) -> list[str]:
        """The manifest digest of every indexed artifact (distinct)."""
        return [str(r[0]) for r in self._conn.execute("SELECT DISTINCT manifest_sha256 FROM artifacts ORDER BY 1")]

    def for_attempt(self, trial_id: str, attempt: int) -> list[ArtifactRecord]:
        rows = self._conn.execute(f"SELECT {_COLUMNS} FROM artifacts WHERE trial_id=? AND attempt=? ORDER BY name",
                                  (trial_id, attempt)).fetchall()
        return [ArtifactRecord(**dict(r)) for r in rows]


def attempt_artifacts(folder: str | os.PathLike[str], trial_id: str, attempt: int) -> list[ArtifactRecord]:
    """The artifacts recorded for one attempt (empty when none, or the experiment has no index)."""
    index = ArtifactIndex.open_readonly(folder)
    if index is None:
        return []
    with index:
        return index.for_attempt(trial_id, attempt)


def unreferenced_blobs(folder: str | os.PathLike[str], store: BlobStore | None = None) -> list[str]:
    """Blobs of the experiment's store that no indexed artifact uses (neither its manifest nor one
    of its chunks): what a retention policy may delete (``store.delete``). Chunks of an upload in
    flight are not indexed yet: call it only while no coordinator is receiving. A manifest that
    cannot be read (missing, corrupted) might name any blob: then nothing is returned.
    """
    store = store or experiment_blob_store(folder)
    index = ArtifactIndex.open_readonly(folder)
    manifests: list[str] = []
    if index is not None:
        with index:
            manifests = index.manifest_digests()
    keep = set(manifests)
    for digest in manifests:
        try:
            keep.update(load_manifest(store, digest).chunks)
        except (ServetuneError, ValueError):
            return []  # a manifest we cannot read: we cannot tell what it uses, so free nothing
    return sorted(d for d in store.digests() if d not in keep)


def read_artifact(folder: str | os.PathLike[str], record: ArtifactRecord, store: BlobStore | None = None) -> bytes:
    """An artifact's bytes from the experiment's blob store, every chunk and the whole file verified.

    Raises:
        BlobNotFoundError / BlobCorruptedError: a blob is missing or corrupted (names its digest).
        ArtifactError: the chunks do not make the recorded file.
    """
    store = store or experiment_blob_store(folder)
    manifest = load_manifest(store, record.manifest_sha256)
    return assemble(store, manifest)


def read_text(folder: str | os.PathLike[str], record: ArtifactRecord, max_chars: int | None = None) -> str:
    """An artifact as text (UTF-8, undecodable bytes replaced); only its last ``max_chars`` if given."""
    text = read_artifact(folder, record).decode("utf-8", errors="replace")
    if max_chars is not None and len(text) > max_chars:
        return "... (earlier lines cut)\n" + text[-max_chars:]
    return text
