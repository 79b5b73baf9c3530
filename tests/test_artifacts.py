"""The blob store contract (over every implementation), artifact manifests and chunking, the index."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

from servetune import artifact_messages as am
from servetune import messages as wire_messages
from servetune.artifact_index import (
    ArtifactConflictError,
    ArtifactIndex,
    attempt_artifacts,
    experiment_blob_store,
    read_artifact,
    read_text,
)
from servetune.artifacts import (
    CHUNK_SIZE,
    MAX_CHUNK_SIZE,
    MAX_CHUNKS,
    ArtifactError,
    ArtifactManifest,
    FileChunks,
    assemble,
    check_artifact,
    load_manifest,
    manifest_for_bytes,
    manifest_for_file,
    put_file,
)
from servetune.blobs import BlobCorruptedError, BlobError, BlobNotFoundError, BlobStore, LocalBlobStore, sha256_hex
from servetune.errors import ProtocolError
from servetune.wire import MAX_MESSAGE_BYTES

Corrupt = Callable[[str, bytes], None]


def _local(tmp_path: Path) -> tuple[BlobStore, Corrupt]:
    store = LocalBlobStore(tmp_path / "blobs")

    def corrupt(digest: str, data: bytes) -> None:
        (tmp_path / "blobs" / digest[:2] / digest).write_bytes(data)

    return store, corrupt


#: Every BlobStore implementation, with a way to damage a stored blob behind its back.
IMPLEMENTATIONS = {"local": _local}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def store_and_corrupt(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[BlobStore, Corrupt]:
    return IMPLEMENTATIONS[request.param](tmp_path)


@pytest.fixture
def store(store_and_corrupt: tuple[BlobStore, Corrupt]) -> BlobStore:
    return store_and_corrupt[0]


# ---------------------------------------------------------------------------------- the contract


def test_put_has_get_round_trip_and_put_is_idempotent(store: BlobStore) -> None:
    data = b"server log line\n" * 100
    digest = store.put(data)
    assert digest == sha256_hex(data)
    assert store.has(digest) and store.get(digest) == data
    assert store.put(data, digest) == digest
    assert list(store.digests()) == [digest]
    assert not store.has(sha256_hex(b"other"))
    assert store.missing([digest, sha256_hex(b"x"), sha256_hex(b"x")]) == [sha256_hex(b"x")]


def test_a_put_whose_bytes_do_not_match_the_claimed_digest_stores_nothing(store: BlobStore) -> None:
    claimed = sha256_hex(b"what the manifest says")
    with pytest.raises(BlobCorruptedError, match=claimed):
        store.put(b"something else", claimed)
    assert not store.has(claimed) and not store.has(sha256_hex(b"something else"))
    assert list(store.digests()) == []


def test_get_of_an_absent_blob_names_the_digest(store: BlobStore) -> None:
    digest = sha256_hex(b"never stored")
    with pytest.raises(BlobNotFoundError, match=digest):
        store.get(digest)


def test_corruption_is_detected_on_read_and_by_verify(store_and_corrupt: tuple[BlobStore, Corrupt]) -> None:
    store, corrupt = store_and_corrupt
    good, bad = store.put(b"intact"), store.put(b"will rot")
    corrupt(bad, b"will r0t")
    with pytest.raises(BlobCorruptedError, match=bad) as info:
        store.get(bad)
    assert info.value.digest == bad and info.value.actual == sha256_hex(b"will r0t")
    assert store.verify(good) and not store.verify(bad)
    assert store.verify_all() == [bad]


@pytest.mark.parametrize("digest", ["../../etc/passwd", "AB" * 32, "ab" * 31, "", "ab" * 32 + "/x"])
def test_a_digest_that_is_not_a_sha256_never_reaches_the_backend(store: BlobStore, digest: str) -> None:
    for op in (store.has, store.get):
        with pytest.raises(BlobError, match="not a sha256"):
            op(digest)
    with pytest.raises(BlobError):
        store.put(b"x", digest)


def test_an_interrupted_write_leaves_no_visible_blob(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalBlobStore(tmp_path / "blobs")
    data = os.urandom(10_000)
    digest = sha256_hex(data)

    def killed(fd: int) -> None:  # only the first 4 KiB reached the disk, then the process died
        os.ftruncate(fd, 4096)
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", killed)
    monkeypatch.setattr(Path, "unlink", lambda self, missing_ok=False: None)  # a killed process cleans nothing
    with pytest.raises(KeyboardInterrupt):
        store.put(data)
    monkeypatch.undo()
    leftovers = [p for p in (tmp_path / "blobs").rglob("*") if p.is_file()]
    assert len(leftovers) == 1 and leftovers[0].stat().st_size == 4096  # the partial file is there ...
    assert not store.has(digest) and list(store.digests()) == []  # ... and is no blob
    with pytest.raises(BlobNotFoundError):
        store.get(digest)
    assert store.remove_temporaries() == 1
    assert store.put(data) == digest and store.get(digest) == data


# ---------------------------------------------------------------------------------- manifests


@pytest.mark.parametrize("size", [0, 1, CHUNK_SIZE, CHUNK_SIZE + 1, 3 * CHUNK_SIZE - 7])
def test_a_file_is_cut_into_chunks_and_put_back_together(store: BlobStore, tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    path = tmp_path / "server.log"
    path.write_bytes(data)
    manifest = put_file(store, path, "server_log")
    assert manifest == manifest_for_bytes(data, "server.log", "server_log")
    assert len(manifest.chunks) == -(-size // CHUNK_SIZE)
    assert [length for _, _, length in manifest.spans()] == [len(data[o:o + CHUNK_SIZE])
                                                            for o in range(0, size, CHUNK_SIZE)]
    assert load_manifest(store, manifest.digest()) == manifest
    check_artifact(store, manifest)
    assert assemble(store, manifest) == data


def test_assembly_names_a_missing_or_corrupted_chunk_and_checks_the_whole_file(
        store_and_corrupt: tuple[BlobStore, Corrupt]) -> None:
    store, corrupt = store_and_corrupt
    data = os.urandom(2 * CHUNK_SIZE + 10)
    manifest = manifest_for_bytes(data, "samples.jsonl", "samples")
    store.put(data[:CHUNK_SIZE])
    store.put(data[2 * CHUNK_SIZE:])
    with pytest.raises(BlobNotFoundError, match=manifest.chunks[1]):
        assemble(store, manifest)
    store.put(data[CHUNK_SIZE:2 * CHUNK_SIZE])
    corrupt(manifest.chunks[2], b"rotten")
    with pytest.raises(BlobCorruptedError, match=manifest.chunks[2]):
        check_artifact(store, manifest)
    # valid chunks, but a manifest that lies about the whole file
    store.put(data[2 * CHUNK_SIZE:])
    (tmp := manifest.model_dump())["sha256"] = sha256_hex(b"not this file")
    with pytest.raises(ArtifactError, match="not the manifest's"):
        check_artifact(store, ArtifactManifest.model_validate(tmp))


def test_a_manifest_whose_chunks_do_not_cover_its_size_is_invalid() -> None:
    m = manifest_for_bytes(os.urandom(CHUNK_SIZE + 1), "a.log", "server_log")
    for change in ({"size": 1}, {"chunks": m.chunks[:1]}, {"chunk_size": 10}, {"name": "../x"},
                   {"kind": "core_dump"}, {"chunks": ["zz" * 32, m.chunks[1]]}):
        with pytest.raises(ValidationError):
            ArtifactManifest.model_validate({**m.model_dump(), **change})


def test_a_file_that_changed_since_its_manifest_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "client.log"
    path.write_bytes(b"a" * 5000)
    manifest = manifest_for_file(path, "client_log")
    source = FileChunks(path, manifest)
    assert source.read(manifest.chunks[0]) == b"a" * 5000
    path.write_bytes(b"b" * 5000)
    with pytest.raises(ArtifactError, match="changed since its manifest"):
        source.read(manifest.chunks[0])


# ---------------------------------------------------------------------------------- message bounds


def test_the_largest_chunk_and_manifest_messages_fit_far_under_the_frame_bound() -> None:
    data = os.urandom(MAX_CHUNK_SIZE)
    chunk = am.ArtifactChunk(session_nonce="s" * 200, trial_id="t" * 200, epoch=2**62,
                             manifest_sha256=sha256_hex(b""), sha256=sha256_hex(data), data=data)
    frame = wire_messages.encode(chunk)
    assert len(frame) <= am.CHUNK_MESSAGE_BYTES < MAX_MESSAGE_BYTES // 16
    assert wire_messages.decode(frame) == chunk
    default = wire_messages.encode(chunk.model_copy(update={"data": data[:CHUNK_SIZE]}))
    assert len(default) < 360 * 1024  # what a heartbeat can queue behind
    manifest = ArtifactManifest(name="samples.jsonl", kind="samples", size=MAX_CHUNKS * CHUNK_SIZE,
                                sha256=sha256_hex(b""), chunks=[sha256_hex(b"%d" % i) for i in range(MAX_CHUNKS)])
    offer = wire_messages.encode(am.ArtifactOffer(session_nonce="s", trial_id="t", epoch=1, manifest=manifest))
    assert len(offer) < 1024 * 1024


@pytest.mark.parametrize("data", ['"not base64!"', '"' + "A" * (4 * (MAX_CHUNK_SIZE // 3) + 8) + '"', "12"])
def test_chunk_data_that_is_not_bounded_base64_is_refused(data: str) -> None:
    frame = ('{"type":"ARTIFACT_CHUNK","session_nonce":"s","trial_id":"t","epoch":1,'
             f'"manifest_sha256":"{"a" * 64}","sha256":"{"b" * 64}","data":{data}}}')
    with pytest.raises(ProtocolError, match="data"):
        wire_messages.decode(frame.encode())


# ---------------------------------------------------------------------------------- the index


def test_the_index_records_an_attempts_artifacts_once_and_reads_them_back(tmp_path: Path) -> None:
    assert ArtifactIndex.open_readonly(tmp_path) is None and attempt_artifacts(tmp_path, "t1", 1) == []
    store = experiment_blob_store(tmp_path)
    log_file = tmp_path / "server.log"
    log_file.write_text("INFO: KV cache size: 1024 tokens\n" * 20_000)
    manifest = put_file(store, log_file, "server_log")
    with ArtifactIndex.open(tmp_path) as index:
        rec = index.record("t1", 2, manifest, daemon="d1", stored_at_us=5)
        assert index.record("t1", 2, manifest, daemon="d1") == rec  # idempotent
        other = manifest_for_bytes(b"another server log", "server.log", "server_log")
        with pytest.raises(ArtifactConflictError, match="already has server.log"):
            index.record("t1", 2, other)
    assert attempt_artifacts(tmp_path, "t1", 1) == []
    (got,) = attempt_artifacts(tmp_path, "t1", 2)
    assert (got.kind, got.size, got.manifest_sha256, got.daemon) == ("server_log", manifest.size, manifest.digest(), "d1")
    assert read_artifact(tmp_path, got) == log_file.read_bytes()
    tail = read_text(tmp_path, got, max_chars=100)
    assert tail.startswith("... (earlier lines cut)") and tail.endswith("tokens\n")
    blob = tmp_path / "artifacts" / "blobs" / manifest.chunks[1][:2] / manifest.chunks[1]
    blob.write_bytes(b"bit rot")
    with pytest.raises(BlobCorruptedError, match=manifest.chunks[1]):
        read_artifact(tmp_path, got)


def test_a_file_growing_while_it_is_stored_is_stored_as_it_was_when_opened(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path / "blobs")
    path = tmp_path / "server.log"
    first = os.urandom(2 * CHUNK_SIZE + 10)
    path.write_bytes(first)
    put = store.put

    def put_while_the_server_logs(data: bytes, digest: str | None = None) -> str:
        with path.open("ab") as fh:
            fh.write(b"a line logged meanwhile\n")
        return put(data, digest)

    store.put = put_while_the_server_logs  # type: ignore[method-assign]
    manifest = put_file(store, path, "server_log")
    assert manifest.size == len(first) and assemble(store, manifest) == first
