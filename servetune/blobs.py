"""Content-addressed blob stores: bytes named by their sha256, verified on write and on read.

The contract (:class:`BlobStore`) is small so that other backends (an object store, a network
filesystem) and retention can plug in later; :class:`LocalBlobStore` keeps blobs under an
experiment's folder. ``digests`` and ``delete`` are what a retention policy needs (list, then remove
what no artifact references). Blobs say nothing about which trial they belong to: that metadata lives apart,
in :mod:`servetune.artifact_index` (SQLite). Chunking and per-artifact manifests are in
:mod:`servetune.artifacts`.
"""

from __future__ import annotations

import abc
import hashlib
import logging
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

from servetune.errors import ServetuneError

log = logging.getLogger(__name__)

DIGEST_PATTERN = r"^[0-9a-f]{64}$"
_DIGEST = re.compile(DIGEST_PATTERN)


class BlobError(ServetuneError):
    """A blob store refused or failed an operation; ``digest`` names the blob concerned."""

    def __init__(self, digest: str, message: str):
        self.digest = digest
        super().__init__(f"blob {digest}: {message}")


class BlobNotFoundError(BlobError, KeyError):
    """No blob with that digest is stored."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class BlobCorruptedError(BlobError):
    """Bytes do not hash to the digest they are stored (or offered) under."""

    def __init__(self, digest: str, actual: str, where: str):
        self.actual = actual
        super().__init__(digest, f"{where}: the data hashes to {actual}, not to its digest")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_digest(digest: str) -> str:
    """``digest`` if it is a lower-case hex sha256, else :class:`BlobError` (never a path)."""
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise BlobError(str(digest)[:80], "not a sha256 hex digest")
    return digest


class BlobStore(abc.ABC):
    """Bytes stored under their sha256 (lower-case hex).

    Contract every backend keeps:

    - ``put`` is idempotent: the same bytes give the same digest, and a blob's content never
      changes (only its digest's bytes are ever stored under it). A blob is visible to
      ``has``/``get`` only when complete (no reader ever sees part of a blob) and only after its
      bytes were checked against its digest. A ``put`` over a stored blob that went bad repairs it.
    - ``get`` verifies the digest of what it read and raises :class:`BlobCorruptedError` naming
      the digest when the stored bytes went bad; it never returns bytes that do not match.
    - Digests are validated (:func:`check_digest`) before they touch a backend, so a digest from
      the wire can never name a path or key outside the store.
    - Thread-safety: a backend may be used from several threads and processes at once (writes of
      the same blob race harmlessly: both are the same bytes). Instances own no open handles.
    """

    @abc.abstractmethod
    def put(self, data: bytes, digest: str | None = None) -> str:
        """Store ``data``; returns its digest.

        Args:
            data: the bytes.
            digest: the digest the caller claims for ``data`` (e.g. from a manifest or the wire).
        Raises:
            BlobCorruptedError: ``data`` does not hash to ``digest``; nothing is stored.
        """

    @abc.abstractmethod
    def has(self, digest: str) -> bool:
        """Whether a complete blob is stored under ``digest`` (not re-verified)."""

    @abc.abstractmethod
    def get(self, digest: str) -> bytes:
        """The bytes of ``digest``, verified.

        Raises:
            BlobNotFoundError: no such blob.
            BlobCorruptedError: the stored bytes no longer hash to ``digest``.
        """

    @abc.abstractmethod
    def digests(self) -> Iterator[str]:
        """Every stored digest (any order)."""

    @abc.abstractmethod
    def delete(self, digest: str) -> bool:
        """Remove the blob ``digest`` (for retention); True when it was stored. Idempotent; a blob
        is gone whole or not at all (``has``/``get`` never see part of one). The store does not
        know which artifacts use a blob: a caller deletes only what nothing references
        (:func:`servetune.artifact_index.unreferenced_blobs`), while no upload is under way."""

    def verify(self, digest: str) -> bool:
        """True when ``digest`` is stored and intact; False when it is stored but corrupted.

        Raises:
            BlobNotFoundError: no such blob.
        """
        try:
            self.get(digest)
        except BlobCorruptedError as exc:
            log.warning("%s", exc)
            return False
        return True

    def verify_all(self) -> list[str]:
        """Check every blob; returns the digests of the corrupted ones (empty when all are intact)."""
        return sorted(d for d in self.digests() if not self.verify(d))

    def missing(self, digests: list[str]) -> list[str]:
        """The distinct digests of ``digests`` not stored, in first-seen order."""
        seen: set[str] = set()
        out = []
        for d in digests:
            if d not in seen:
                seen.add(d)
                if not self.has(d):
                    out.append(d)
        return out


class LocalBlobStore(BlobStore):
    """Blobs as files ``<root>/<first two hex digits>/<digest>`` (e.g. ``<experiment>/artifacts/blobs``).

    A write goes to a temporary file in the blob's folder (its name starts with ``.tmp-``, which
    never matches a digest), is fsynced, then renamed into place, and the folder is fsynced: a
    crash leaves either the whole blob or a temporary file that ``has``/``get``/``digests`` never
    see. :meth:`remove_temporaries` clears those left behind.
    """

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)

    def _path(self, digest: str) -> Path:
        check_digest(digest)
        return self.root / digest[:2] / digest

    def put(self, data: bytes, digest: str | None = None) -> str:
        actual = sha256_hex(data)
        if digest is not None and check_digest(digest) != actual:
            raise BlobCorruptedError(digest, actual, "refused on write")
        path = self._path(actual)
        if self._intact(path, actual):
            return actual
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _fsync_dir(path.parent)
        return actual

    @staticmethod
    def _intact(path: Path, digest: str) -> bool:
        try:
            return sha256_hex(path.read_bytes()) == digest
        except FileNotFoundError:
            return False

    def has(self, digest: str) -> bool:
        return self._path(digest).is_file()

    def get(self, digest: str) -> bytes:
        path = self._path(digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise BlobNotFoundError(digest, f"not in the store at {self.root}") from None
        actual = sha256_hex(data)
        if actual != digest:
            raise BlobCorruptedError(digest, actual, f"corrupted on disk at {path}")
        return data

    def digests(self) -> Iterator[str]:
        if not self.root.is_dir():
            return
        for sub in sorted(self.root.iterdir()):
            if sub.is_dir() and len(sub.name) == 2:
                for f in sorted(sub.iterdir()):
                    if _DIGEST.match(f.name) and f.name.startswith(sub.name) and f.is_file():
                        yield f.name

    def delete(self, digest: str) -> bool:
        path = self._path(digest)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        _fsync_dir(path.parent)
        return True

    def remove_temporaries(self) -> int:
        """Delete temporary files left by interrupted writes; returns how many. Call it only while
        no write is under way (e.g. when the coordinator starts)."""
        n = 0
        if self.root.is_dir():
            for tmp in self.root.glob("*/.tmp-*"):
                tmp.unlink(missing_ok=True)
                n += 1
        return n


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # not every platform opens folders
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
