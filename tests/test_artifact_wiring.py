"""The artifact upload wired into the protocol, without sockets: the control core judges ARTIFACT_*
messages like RESULTs (session and key), the coordinator's sink takes them only for attempts of the
sender's key (finished ones too) and indexes what it stores, a disk that fails a write is a
refusal and never an exception, and the daemon's sender offers again under every new session and
marks what the coordinator stored."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from coordinator.artifact_receiver import ArtifactReceiver
from coordinator.artifact_sink import ArtifactSink
from coordinator.control import ReceiveArtifact, Refused, Send
from coordinator.store import Store
from daemon.artifact_sender import SpoolSender
from daemon.artifact_spool import ArtifactSpool
from servetune import messages as wire
from servetune.artifact_index import attempt_artifacts, read_artifact
from servetune.artifact_messages import ArtifactChunk, ArtifactMissing, ArtifactOffer, ArtifactRefused, ArtifactStored
from servetune.artifacts import manifest_for_bytes
from servetune.blobs import LocalBlobStore
from servetune.keys import key_id
from servetune.messages import Rejoin
from tests.test_control import Clock, core, hello

KEY_A = "A" * 40
KEY_B = "B" * 40


def offer(nonce: str, trial: str = "t1", epoch: int = 1, data: bytes = b"x" * 10_000) -> ArtifactOffer:
    return ArtifactOffer(session_nonce=nonce, trial_id=trial, epoch=epoch,
                         manifest=manifest_for_bytes(data, "samples.jsonl", "samples", chunk_size=4096))


def test_the_artifact_messages_are_protocol_messages_since_version_3() -> None:
    assert wire.PROTOCOL_VERSION >= 3
    msg = offer("n1")
    assert wire.decode(wire.encode(msg)) == msg


def test_the_core_judges_artifact_messages_like_results() -> None:
    clock = Clock()
    c = core(clock)
    c.handle("d1", hello("d1", "n1"), KEY_A)
    ok = c.handle("d1", offer("n1"), KEY_A)
    assert ok == [ReceiveArtifact("d1", KEY_A, offer("n1"))]
    refused = c.handle("d1", offer("n1"), KEY_B)  # the routing id of a live session, another key
    assert len(refused) == 1 and isinstance(refused[0], Refused)
    unknown = c.handle("d1", offer("n0"), KEY_A)  # a session the core does not know: REJOIN, nothing received
    assert len(unknown) == 1 and isinstance(unknown[0], Send) and isinstance(unknown[0].msg, Rejoin)


def _store_with_attempt(folder: Path, key: str, finished: bool) -> Store:
    store = Store.open(folder)
    store.begin_attempts({"t1": 1}, daemon_id="d1", batch_id="b1", spec_hash="s", daemon_key_id=key_id(key))
    if finished:
        store.close_attempts([("t1", 1)], "done here for the test")
    return store


@pytest.mark.parametrize("finished", [False, True])
def test_the_sink_takes_artifacts_of_the_senders_attempts_only_and_indexes_them(tmp_path: Path, finished: bool) -> None:
    store = _store_with_attempt(tmp_path, KEY_A, finished)
    sink = ArtifactSink(tmp_path, store)
    try:
        data = os.urandom(10_000)
        o = offer("n1", data=data)
        other = sink.handle(ReceiveArtifact("d2", KEY_B, o), 1.0)
        assert isinstance(other[0], ArtifactRefused) and other[0].reason == "unknown_attempt" and other[0].final
        missing = sink.handle(ReceiveArtifact("d1", KEY_A, o), 1.0)
        assert isinstance(missing[0], ArtifactMissing) and len(missing[0].missing) == 3
        replies = []
        for i, digest in enumerate(o.manifest.chunks):
            part = data[i * 4096:(i + 1) * 4096]
            replies += sink.handle(ReceiveArtifact("d1", KEY_A, ArtifactChunk(
                session_nonce="n1", trial_id="t1", epoch=1, manifest_sha256=o.manifest.digest(), sha256=digest,
                data=part)), 2.0)
        assert [type(r) for r in replies] == [ArtifactStored]
        (rec,) = attempt_artifacts(tmp_path, "t1", 1)
        assert rec.daemon == key_id(KEY_A) and read_artifact(tmp_path, rec) == data
    finally:
        sink.close()
        store.close()


def test_a_disk_that_fails_a_chunk_write_is_a_refusal_not_a_crash(tmp_path: Path) -> None:
    class FullDisk(LocalBlobStore):
        def put(self, data: bytes, digest: str | None = None) -> str:
            raise OSError(errno.ENOSPC, "No space left on device")

    receiver = ArtifactReceiver(FullDisk(tmp_path))
    data = b"y" * 5000
    o = offer("n1", data=data)
    receiver.handle(o, 0.0)
    out = receiver.handle(ArtifactChunk(session_nonce="n1", trial_id="t1", epoch=1, manifest_sha256=o.manifest.digest(),
                                        sha256=o.manifest.chunks[0], data=data[:4096]), 0.0)
    (reply,) = out.replies
    assert isinstance(reply, ArtifactRefused) and reply.reason == "store_failed" and not reply.final
    assert receiver.counters["refused_store_failed"] == 1


def test_the_sender_offers_under_each_new_session_and_marks_what_was_stored(tmp_path: Path) -> None:
    spool = ArtifactSpool(tmp_path / "spool", chunk_size=4096)
    sender = SpoolSender(spool)
    assert sender.step("n1", False, 1.0, 0.0) == []  # nothing before WELCOME
    m = spool.add_bytes("t1", 1, b"z" * 9000, "samples", "samples.jsonl")
    first = sender.step("n1", True, 0.5, 0.0)
    assert [type(x) for x in first] == [ArtifactOffer] and first[0].session_nonce == "n1"
    assert sender.uploads.pacer.policy.interval_s == 0.5  # paced per heartbeat interval
    again = sender.step("n2", True, 0.5, 0.1)  # a reconnect: the same upload offers again
    assert [(type(x), x.session_nonce) for x in again] == [(ArtifactOffer, "n2")]
    sender.on_message(ArtifactStored(trial_id="t1", epoch=1, manifest_sha256=m.digest()), 0.2)
    assert not sender.busy and spool.pending() == []
    # a new daemon process over the same spool offers only what is still pending
    spool.add_bytes("t2", 1, b"w" * 100, "samples", "samples.jsonl")
    fresh = SpoolSender(ArtifactSpool(tmp_path / "spool"))
    offers = fresh.step("n3", True, 1.0, 0.0)
    assert [x.trial_id for x in offers] == ["t2"]
