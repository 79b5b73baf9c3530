"""Per-trial artifacts (server log, client log, raw samples, metric series) as sha256 chunks plus a manifest.

An artifact is one file. It is cut into chunks of :data:`CHUNK_SIZE` bytes (the last one shorter),
each stored as a blob under its sha256 (:mod:`servetune.blobs`); its :class:`ArtifactManifest`
(name, kind, total size, whole-file sha256, chunk digests in order) is itself stored as a blob, and
the manifest's digest names the artifact. Which artifact belongs to which trial and attempt is
recorded apart, in :mod:`servetune.artifact_index`.

Why 256 KiB chunks: a chunk crosses the wire as one JSON message (base64, about 342 KiB with its
envelope), far under :data:`servetune.wire.MAX_MESSAGE_BYTES` (64 MiB), and ZeroMQ sends a
connection's messages in order, so a heartbeat queued behind a chunk waits for that chunk only:
0.03 s at 100 Mbit/s and 0.3 s at 10 Mbit/s, inside the 1 s heartbeat interval. The uploader's
pacing (:mod:`daemon.artifact_upload`) bounds how many chunks go out per heartbeat interval.
Larger chunks would mean fewer files and messages but heartbeats late by whole seconds on a slow
link; smaller ones, more per-message overhead (a file and a hash per chunk, about 200 bytes of
envelope, 64 hex digits per chunk in the manifest) for no gain. A 2 GiB artifact
(:data:`MAX_ARTIFACT_BYTES`) has 8,192 chunks and a manifest of about 560 KB: one message too.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from servetune.blobs import DIGEST_PATTERN, BlobStore, sha256_hex
from servetune.canonical import canonical_json
from servetune.errors import ServetuneError

CHUNK_SIZE = 256 * 1024
#: The largest chunk a manifest may declare (4x the default; keeps a chunk message ~1.4 MB).
MAX_CHUNK_SIZE = 1024 * 1024
MIN_CHUNK_SIZE = 4 * 1024
MAX_ARTIFACT_BYTES = 2 * 1024**3
#: Chunks per manifest at most (a manifest is one message: 8,192 digests are about 560 KB).
MAX_CHUNKS = MAX_ARTIFACT_BYTES // CHUNK_SIZE

ArtifactKind = Literal["server_log", "client_log", "daemon_log", "samples", "metric_series"]
Digest = Annotated[str, Field(pattern=DIGEST_PATTERN)]
#: An artifact's name within its attempt, e.g. ``server.log``: a plain file name, never a path.
ArtifactName = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


class ArtifactError(ServetuneError):
    """An artifact is inconsistent: its chunks do not add up to its manifest, or its file changed."""


class ArtifactManifest(BaseModel):
    """What an artifact is made of. Its digest (:meth:`digest`) is the sha256 of its canonical JSON."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    name: ArtifactName
    kind: ArtifactKind
    size: int = Field(ge=0, le=MAX_ARTIFACT_BYTES)
    sha256: Digest = Field(description="of the whole file")
    chunk_size: int = Field(CHUNK_SIZE, ge=MIN_CHUNK_SIZE, le=MAX_CHUNK_SIZE)
    chunks: list[Digest] = Field(default_factory=list, max_length=MAX_CHUNKS)

    @model_validator(mode="after")
    def _chunks_cover_size(self) -> ArtifactManifest:
        expected = -(-self.size // self.chunk_size)
        if expected > MAX_CHUNKS:
            raise ValueError(f"{self.size} bytes in chunks of {self.chunk_size} make {expected} chunks, "
                             f"over the bound of {MAX_CHUNKS}")
        if len(self.chunks) != expected:
            raise ValueError(f"{self.size} bytes in chunks of {self.chunk_size} make {expected} chunks, "
                             f"not {len(self.chunks)}")
        return self

    def canonical_bytes(self) -> bytes:
        return canonical_json(self.model_dump(mode="json")).encode("utf-8")

    def digest(self) -> str:
        return sha256_hex(self.canonical_bytes())

    def chunk_length(self, index: int) -> int:
        return min(self.chunk_size, self.size - index * self.chunk_size)

    def spans(self) -> Iterator[tuple[str, int, int]]:
        """``(digest, offset, length)`` of each chunk in file order."""
        for i, d in enumerate(self.chunks):
            yield d, i * self.chunk_size, self.chunk_length(i)


def manifest_for_bytes(data: bytes, name: str, kind: ArtifactKind, chunk_size: int = CHUNK_SIZE) -> ArtifactManifest:
    chunks = [sha256_hex(data[o:o + chunk_size]) for o in range(0, len(data), chunk_size)]
    return ArtifactManifest(name=name, kind=kind, size=len(data), sha256=sha256_hex(data),
                            chunk_size=chunk_size, chunks=chunks)


def manifest_for_file(path: str | os.PathLike[str], kind: ArtifactKind, name: str | None = None,
                      chunk_size: int = CHUNK_SIZE) -> ArtifactManifest:
    """The manifest of a file, read once in chunks (never whole into memory). ``name`` defaults
    to the file's name.

    Raises:
        ArtifactError: the file is larger than :data:`MAX_ARTIFACT_BYTES`.
    """
    p = Path(path)
    whole = hashlib.sha256()
    chunks: list[str] = []
    size = 0
    with p.open("rb") as fh:
        while block := fh.read(chunk_size):
            size += len(block)
            if size > MAX_ARTIFACT_BYTES:
                raise ArtifactError(f"{p} is over the {MAX_ARTIFACT_BYTES}-byte bound of one artifact")
            whole.update(block)
            chunks.append(sha256_hex(block))
    return ArtifactManifest(name=name or p.name, kind=kind, size=size, sha256=whole.hexdigest(),
                            chunk_size=chunk_size, chunks=chunks)


def put_manifest(store: BlobStore, manifest: ArtifactManifest) -> str:
    """Store the manifest itself as a blob; returns its digest (== ``manifest.digest()``)."""
    return store.put(manifest.canonical_bytes(), manifest.digest())


def load_manifest(store: BlobStore, digest: str) -> ArtifactManifest:
    """The manifest stored under ``digest`` (verified blob, then validated).

    Raises:
        BlobNotFoundError / BlobCorruptedError: from the store.
        ArtifactError: the blob is not a manifest.
    """
    data = store.get(digest)
    try:
        return ArtifactManifest.model_validate_json(data)
    except ValidationError as exc:
        raise ArtifactError(f"blob {digest} is not an artifact manifest: {exc.errors()[0]['msg']}") from None


def put_file(store: BlobStore, path: str | os.PathLike[str], kind: ArtifactKind, name: str | None = None,
             chunk_size: int = CHUNK_SIZE) -> ArtifactManifest:
    """Store a file's chunks and manifest in ``store`` directly (no transfer: a local writer or the
    daemon's spool), in one pass: a file still being appended to (a live server log) is stored as
    the bytes it held when it was opened.

    Raises:
        ArtifactError: the file is larger than :data:`MAX_ARTIFACT_BYTES`.
    """
    p = Path(path)
    whole = hashlib.sha256()
    chunks: list[str] = []
    with p.open("rb") as fh:
        size = left = os.fstat(fh.fileno()).st_size
        if size > MAX_ARTIFACT_BYTES:
            raise ArtifactError(f"{p} is over the {MAX_ARTIFACT_BYTES}-byte bound of one artifact")
        while left > 0 and (block := fh.read(min(chunk_size, left))):
            left -= len(block)
            whole.update(block)
            chunks.append(store.put(block))
    manifest = ArtifactManifest(name=name or p.name, kind=kind, size=size - left, sha256=whole.hexdigest(),
                                chunk_size=chunk_size, chunks=chunks)
    put_manifest(store, manifest)
    return manifest


def put_bytes(store: BlobStore, data: bytes, name: str, kind: ArtifactKind,
              chunk_size: int = CHUNK_SIZE) -> ArtifactManifest:
    """Store bytes as an artifact (chunks and manifest) in ``store`` directly."""
    manifest = manifest_for_bytes(data, name, kind, chunk_size)
    for digest, offset, length in manifest.spans():
        store.put(data[offset:offset + length], digest)
    put_manifest(store, manifest)
    return manifest


def missing_chunks(store: BlobStore, manifest: ArtifactManifest) -> list[str]:
    """The distinct chunk digests of ``manifest`` the store lacks, in file order."""
    return store.missing(manifest.chunks)


def check_artifact(store: BlobStore, manifest: ArtifactManifest) -> None:
    """Verify that the store holds the whole artifact: every chunk intact (read one at a time)
    and together the manifest's size and whole-file sha256.

    Raises:
        BlobNotFoundError / BlobCorruptedError: a chunk is missing or corrupted (names its digest).
        ArtifactError: the chunks do not make the file the manifest describes.
    """
    whole = hashlib.sha256()
    size = 0
    for digest in manifest.chunks:
        data = store.get(digest)
        whole.update(data)
        size += len(data)
    _check_whole(manifest, size, whole.hexdigest())


def _check_whole(manifest: ArtifactManifest, size: int, sha256: str) -> None:
    if size != manifest.size or sha256 != manifest.sha256:
        raise ArtifactError(f"artifact {manifest.name} ({manifest.digest()}): its chunks make {size} bytes "
                            f"hashing to {sha256}, not the manifest's {manifest.size} bytes "
                            f"hashing to {manifest.sha256}")


def assemble(store: BlobStore, manifest: ArtifactManifest) -> bytes:
    """The artifact's bytes: its chunks (each verified by the store) joined, then checked against
    the manifest's size and whole-file sha256.

    Raises:
        BlobNotFoundError / BlobCorruptedError: a chunk is missing or corrupted (names its digest).
        ArtifactError: the chunks do not make the file the manifest describes.
    """
    data = b"".join(store.get(d) for d in manifest.chunks)
    _check_whole(manifest, len(data), sha256_hex(data))
    return data


class FileChunks:
    """Reads the chunks of a manifest from the file it was made from (the uploader's source).

    Each read is checked against the manifest: a file that changed since raises
    :class:`ArtifactError` rather than sending bytes the manifest does not describe.
    """

    def __init__(self, path: str | os.PathLike[str], manifest: ArtifactManifest):
        self.path = Path(path)
        self.manifest = manifest
        self._where: dict[str, tuple[int, int]] = {}
        for digest, offset, length in manifest.spans():
            self._where.setdefault(digest, (offset, length))

    def __contains__(self, digest: str) -> bool:
        return digest in self._where

    def length(self, digest: str) -> int:
        return self._where[digest][1]

    def read(self, digest: str) -> bytes:
        offset, length = self._where[digest]
        with self.path.open("rb") as fh:
            fh.seek(offset)
            data = fh.read(length)
        if sha256_hex(data) != digest:
            raise ArtifactError(f"{self.path} changed since its manifest was made: the chunk at byte {offset} "
                                f"no longer hashes to {digest}")
        return data


class BytesChunks(FileChunks):
    """The same as :class:`FileChunks` for bytes already in memory (tests, small artifacts)."""

    def __init__(self, data: bytes, manifest: ArtifactManifest):
        self.data = data
        super().__init__("<memory>", manifest)

    def read(self, digest: str) -> bytes:
        offset, length = self._where[digest]
        data = self.data[offset:offset + length]
        if sha256_hex(data) != digest:
            raise ArtifactError(f"the chunk at byte {offset} does not hash to {digest}")
        return data


class StoreChunks:
    """The chunks of a manifest read from a blob store (the daemon's spool), verified by the store."""

    def __init__(self, store: BlobStore, manifest: ArtifactManifest):
        self.store = store
        self._lengths = {d: length for d, _offset, length in manifest.spans()}

    def __contains__(self, digest: str) -> bool:
        return digest in self._lengths

    def length(self, digest: str) -> int:
        return self._lengths[digest]

    def read(self, digest: str) -> bytes:
        return self.store.get(digest)
