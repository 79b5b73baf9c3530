"""The blob store's retention contract: ``digests`` lists, ``delete`` removes a whole blob (idempotent,
never a path outside the store), and :func:`unreferenced_blobs` names exactly the blobs no indexed
artifact uses, keeping chunks shared with an indexed one and freeing nothing when a manifest is
unreadable."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from servetune.artifact_index import ArtifactIndex, experiment_blob_store, read_artifact, unreferenced_blobs
from servetune.artifacts import manifest_for_bytes, put_manifest
from servetune.blobs import BlobError, BlobNotFoundError, LocalBlobStore


def test_delete_removes_a_whole_blob_once(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path)
    a, b = store.put(b"alpha"), store.put(b"beta")
    assert sorted(store.digests()) == sorted([a, b])
    assert store.delete(a) is True
    assert not store.has(a) and list(store.digests()) == [b]
    with pytest.raises(BlobNotFoundError):
        store.get(a)
    assert store.delete(a) is False  # idempotent
    assert store.get(b) == b"beta"
    with pytest.raises(BlobError, match="not a sha256"):
        store.delete("../" + b)  # a digest never names a path
    assert store.put(b"alpha") == a and store.get(a) == b"alpha"  # put after delete stores it again



def test_unreferenced_blobs_are_those_no_indexed_artifact_uses(tmp_path: Path) -> None:
    store = experiment_blob_store(tmp_path)
    assert isinstance(store, LocalBlobStore)
    shared = os.urandom(4096)
    kept_data = shared + os.urandom(4096)
    gone_data = shared + os.urandom(4096)  # its first chunk is also the kept artifact's
    kept = manifest_for_bytes(kept_data, "kept.jsonl", "samples", chunk_size=4096)
    gone = manifest_for_bytes(gone_data, "gone.jsonl", "samples", chunk_size=4096)
    for manifest, data in ((kept, kept_data), (gone, gone_data)):
        for i, digest in enumerate(manifest.chunks):
            store.put(data[i * 4096:(i + 1) * 4096], digest)
        put_manifest(store, manifest)
    with ArtifactIndex.open(tmp_path) as index:
        rec = index.record("t1", 1, kept)
    garbage = unreferenced_blobs(tmp_path)
    assert set(garbage) == {gone.digest(), gone.chunks[1]}, garbage
    for digest in garbage:
        assert store.delete(digest)
    assert read_artifact(tmp_path, rec) == kept_data  # what is indexed still reads, verified
    assert unreferenced_blobs(tmp_path) == []
    # a manifest that cannot be read might use anything: nothing is freed
    store.put(b"stray")
    store.delete(kept.digest())
    assert unreferenced_blobs(tmp_path) == []
