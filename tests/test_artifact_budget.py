"""The coordinator's artifact budget and pacing: an attempt's upload charges live in the artifact
index, so a restarted coordinator (a new sink over the same folder) does not grant an attempt its
byte budget again; and the sink carries out at most a few artifact messages per loop pass, the
rest waiting (bounded) for the next pass, so a burst of chunks cannot hold up heartbeats."""

from __future__ import annotations

import os
from pathlib import Path

from coordinator.artifact_receiver import ReceiverPolicy
from coordinator.artifact_sink import ArtifactSink, SinkPolicy
from coordinator.control import ReceiveArtifact
from coordinator.store import Store
from servetune.artifact_index import ArtifactIndex, attempt_artifacts
from servetune.artifact_messages import ArtifactChunk, ArtifactMissing, ArtifactOffer, ArtifactRefused, ArtifactStored
from servetune.keys import key_id
from tests.test_artifact_wiring import KEY_A, _store_with_attempt, offer


def _chunks(o: ArtifactOffer, data: bytes, size: int = 4096) -> list[ReceiveArtifact]:
    return [ReceiveArtifact("d1", KEY_A, ArtifactChunk(
        session_nonce="n1", trial_id=o.trial_id, epoch=o.epoch, manifest_sha256=o.manifest.digest(), sha256=digest,
        data=data[i * size:(i + 1) * size])) for i, digest in enumerate(o.manifest.chunks)]


def test_an_attempts_upload_budget_survives_a_coordinator_restart(tmp_path: Path) -> None:
    store = _store_with_attempt(tmp_path, KEY_A, finished=True)
    budget = ReceiverPolicy(max_bytes_per_attempt=15_000)
    first, second = offer("n1", data=os.urandom(10_000)), offer("n1", data=os.urandom(10_000))
    try:
        sink = ArtifactSink(tmp_path, store, receiver_policy=budget)
        try:
            (reply,) = sink.handle(ReceiveArtifact("d1", KEY_A, first), 1.0)
            assert isinstance(reply, ArtifactMissing)  # 10,000 of 15,000 bytes charged
        finally:
            sink.close()
        index = ArtifactIndex.open(tmp_path)
        try:
            assert index.charges("t1", 1) == {first.manifest.digest(): 10_000}
        finally:
            index.close()
        # the coordinator restarts: a new sink over the same folder
        sink = ArtifactSink(tmp_path, store, receiver_policy=budget)
        try:
            (refused,) = sink.handle(ReceiveArtifact("d1", KEY_A, second), 2.0)
            assert isinstance(refused, ArtifactRefused) and refused.reason == "over_budget" and refused.final, refused
            # the upload charged before the restart goes on (charged once, not again)
            (again,) = sink.handle(ReceiveArtifact("d1", KEY_A, first), 2.0)
            assert isinstance(again, ArtifactMissing)
        finally:
            sink.close()
    finally:
        store.close()


def _sink(tmp_path: Path, n_chunks: int, policy: SinkPolicy) -> tuple[Store, ArtifactSink, ArtifactOffer, bytes]:
    """A sink over a store with one finished attempt of KEY_A, and an offer of ``n_chunks`` 4 KiB chunks."""
    data = os.urandom(n_chunks * 4096)
    store = _store_with_attempt(tmp_path, KEY_A, finished=True)
    return store, ArtifactSink(tmp_path, store, policy), offer("n1", data=data), data


def test_the_sink_carries_out_a_few_messages_per_pump_and_the_rest_later(tmp_path: Path) -> None:
    store, sink, o, data = _sink(tmp_path, 20, SinkPolicy(max_per_pump=4, max_queued=30))
    try:
        assert sink.enqueue(ReceiveArtifact("d1", KEY_A, o), 1.0) == []
        assert sink.queued == 1 and sink.receiver.open_uploads == 0  # nothing carried out yet
        (d, missing), = sink.pump(1.0)
        assert d == "d1" and isinstance(missing, ArtifactMissing) and len(missing.missing) == 20
        for ins in _chunks(o, data):
            assert sink.enqueue(ins, 1.5) == []
        written = []
        replies = []
        while sink.queued:
            assert sink.draining(2.0, 0.0), "the sweep must wait while messages are queued"
            replies += sink.pump(2.0)
            written.append(sink.receiver.counters.get("chunks_written", 0))
        assert written == [4, 8, 12, 16, 20]  # at most max_per_pump chunk writes per pump
        assert [type(r) for _, r in replies] == [ArtifactStored]
        assert attempt_artifacts(tmp_path, "t1", 1)[0].daemon == key_id(KEY_A)
    finally:
        sink.close()
        store.close()


def test_a_full_queue_refuses_at_once_non_final(tmp_path: Path) -> None:
    store, sink, o, data = _sink(tmp_path, 5, SinkPolicy(max_per_pump=2, max_queued=3))
    try:
        chunks = _chunks(o, data)
        assert [sink.enqueue(c, 1.0) for c in chunks[:3]] == [[], [], []]
        (busy,) = sink.enqueue(chunks[3], 1.0)
        assert isinstance(busy, ArtifactRefused) and not busy.final and busy.chunk_sha256 == o.manifest.chunks[3]
        (offer_busy,) = sink.enqueue(ReceiveArtifact("d1", KEY_A, o), 1.0)
        assert isinstance(offer_busy, ArtifactRefused) and offer_busy.chunk_sha256 is None and not offer_busy.final
        assert sink.queued == 3 and sink.refused_busy == 2
    finally:
        sink.close()
        store.close()
