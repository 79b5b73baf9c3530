"""The artifact upload as two pure cores (daemon uploader, coordinator receiver) joined by a fake link.

No sockets: every message crosses through :func:`servetune.artifact_messages.encode`/``decode``
(the real frames), the clock is a number the test advances, and "killing" a daemon or restarting
the coordinator means dropping an instance and making a new one over the same files and store.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from coordinator.artifact_receiver import ArtifactReceiver, ReceiverPolicy, StoredArtifact
from daemon.artifact_upload import Pacer, PacingPolicy, Uploads
from servetune import artifact_messages as am
from servetune import messages as wire_messages
from servetune.artifacts import CHUNK_SIZE, ArtifactManifest, BytesChunks, FileChunks, assemble, manifest_for_file
from servetune.blobs import LocalBlobStore, sha256_hex

TRIAL = "a" * 64


class Link:
    """Carries frames between one daemon's uploads and a receiver; ``drop`` decides which to lose."""

    def __init__(self, uploads: Uploads, receiver: ArtifactReceiver):
        self.uploads, self.receiver = uploads, receiver
        self.now = 0.0
        self.to_coordinator: list[bytes] = []
        self.sent_chunks: list[tuple[float, am.ArtifactChunk]] = []
        self.replies: list[am.ArtifactMessage] = []
        self.stored: list[StoredArtifact] = []
        self.drop: Callable[[am.ArtifactMessage], bool] = lambda msg: False

    def send(self, msgs: list[am.ToCoordinator]) -> None:
        for m in msgs:
            if isinstance(m, am.ArtifactChunk):
                self.sent_chunks.append((self.now, m))
            self.to_coordinator.append(wire_messages.encode(m))

    def deliver(self) -> None:
        """Hand every queued frame to the receiver, and its answers back to the uploads."""
        while self.to_coordinator:
            msg = wire_messages.decode(self.to_coordinator.pop(0))
            if self.drop(msg):
                continue
            assert isinstance(msg, (am.ArtifactOffer, am.ArtifactChunk))
            out = self.receiver.handle(msg, self.now)
            self.stored += out.stored
            for reply in out.replies:
                back = wire_messages.decode(wire_messages.encode(reply))
                assert isinstance(back, (am.ArtifactMissing, am.ArtifactStored, am.ArtifactRefused))
                self.replies.append(back)
                if not self.drop(back):
                    self.send(self.uploads.on_message(back, self.now))

    def run(self, until: float = 600.0) -> None:
        """Deliver and tick at each next wake-up until no upload is left (or ``until``)."""
        self.deliver()
        while len(self.uploads) and self.now < until:
            wake = self.uploads.next_wakeup(self.now)
            assert wake is not None
            self.now = max(self.now, wake)
            self.send(self.uploads.tick(self.now))
            self.deliver()


def _file(tmp_path: Path, n_chunks: float, name: str = "server.log") -> Path:
    path = tmp_path / "node" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(int(n_chunks * CHUNK_SIZE)))
    return path


def _start(link: Link, path: Path, session: str = "s1", epoch: int = 1) -> ArtifactManifest:
    manifest = manifest_for_file(path, "server_log")
    link.send(link.uploads.add(TRIAL, epoch, manifest, FileChunks(path, manifest), session, link.now))
    return manifest


@pytest.fixture
def store(tmp_path: Path) -> LocalBlobStore:
    return LocalBlobStore(tmp_path / "experiment" / "artifacts" / "blobs")


def test_an_upload_sends_every_chunk_once_and_ends_verified(tmp_path: Path, store: LocalBlobStore) -> None:
    path = _file(tmp_path, 11.5)
    link = Link(Uploads(), ArtifactReceiver(store))
    manifest = _start(link, path)
    link.run()
    (done,) = link.uploads.finished
    assert done.phase == "stored" and done.chunks_sent == 12 and done.bytes_sent == path.stat().st_size
    (stored,) = link.stored
    assert (stored.trial_id, stored.epoch, stored.manifest_sha256) == (TRIAL, 1, manifest.digest())
    assert assemble(store, stored.manifest) == path.read_bytes()
    assert store.has(manifest.digest())  # the manifest is stored too


def test_chunks_the_store_already_has_never_cross_again(tmp_path: Path, store: LocalBlobStore) -> None:
    first = _file(tmp_path, 4, "a.log")
    second = tmp_path / "node" / "b.log"
    second.write_bytes(first.read_bytes()[:3 * CHUNK_SIZE] + os.urandom(100))
    link = Link(Uploads(), ArtifactReceiver(store))
    _start(link, first)
    link.run()
    _start(link, second, epoch=2)
    link.run()
    assert [u.chunks_sent for u in link.uploads.finished] == [4, 1]


def test_a_daemon_killed_mid_upload_resends_only_the_missing_chunks(tmp_path: Path, store: LocalBlobStore) -> None:
    path = _file(tmp_path, 10)
    receiver = ArtifactReceiver(store)
    pacing = PacingPolicy(bytes_per_interval=3 * CHUNK_SIZE)
    link = Link(Uploads(Pacer(pacing)), receiver)
    _start(link, path)
    link.deliver()
    link.now = 1.0
    link.send(link.uploads.tick(link.now))  # 3 + 3 chunks out, then the daemon dies
    link.deliver()
    assert len(link.sent_chunks) == 6 and link.uploads.finished == []
    # a new daemon process: new uploads, new session, a manifest made again from the same file
    link2 = Link(Uploads(Pacer(pacing)), receiver)
    link2.now = 5.0
    _start(link2, path, session="s2")
    link2.run()
    (done,) = link2.uploads.finished
    assert done.phase == "stored" and done.chunks_sent == 4
    manifest = manifest_for_file(path, "server_log")
    assert sorted(m.sha256 for _, m in link2.sent_chunks) == sorted(manifest.chunks[6:])
    assert receiver.counters["chunks_written"] == 10


def test_a_coordinator_restarted_mid_upload_resumes_from_its_store(tmp_path: Path, store: LocalBlobStore) -> None:
    path = _file(tmp_path, 8)
    pacing = PacingPolicy(bytes_per_interval=2 * CHUNK_SIZE)
    link = Link(Uploads(Pacer(pacing)), ArtifactReceiver(store))
    _start(link, path)
    link.deliver()  # offer answered, the first 2 chunks written
    link.now = 1.0
    link.send(link.uploads.tick(link.now))  # 2 more sent, but the coordinator dies before reading them
    in_flight = list(link.to_coordinator)
    link.to_coordinator.clear()
    # a new coordinator process: a new receiver over the same folder
    restarted = ArtifactReceiver(LocalBlobStore(store.root))
    link.receiver = restarted
    link.to_coordinator = in_flight  # the old session's chunks still arrive: refused, not written
    link.deliver()
    assert restarted.counters == {"refused_not_requested": 2}
    assert all(r.final is False for r in link.replies if isinstance(r, am.ArtifactRefused))
    link.now = 2.0
    link.send(link.uploads.restart("s2", link.now))  # the daemon's REJOIN + HELLO: a new session asks again
    link.run()
    (done,) = link.uploads.finished
    assert done.phase == "stored"
    assert restarted.counters["chunks_written"] == 6  # the 2 written before the restart never crossed again
    assert len(link.stored) == 1 and assemble(store, link.stored[0].manifest) == path.read_bytes()


def test_a_lost_answer_is_asked_for_again(tmp_path: Path, store: LocalBlobStore) -> None:
    path = _file(tmp_path, 2)
    link = Link(Uploads(Pacer(PacingPolicy(answer_timeout_s=5.0))), ArtifactReceiver(store))
    lost: list[str] = []

    def drop_first_missing(msg: am.ArtifactMessage) -> bool:
        if isinstance(msg, (am.ArtifactMissing, am.ArtifactStored)) and msg.type not in lost:
            lost.append(msg.type)
            return True
        return False

    link.drop = drop_first_missing
    _start(link, path)
    link.run()
    assert lost == ["ARTIFACT_MISSING", "ARTIFACT_STORED"]
    assert link.uploads.finished[0].phase == "stored"
    assert link.now >= 10.0  # two answer timeouts
    assert len(link.sent_chunks) == 2  # the re-offers found nothing missing the second time


def test_a_chunk_damaged_in_transit_is_refused_and_sent_again(tmp_path: Path, store: LocalBlobStore) -> None:
    path = _file(tmp_path, 3)
    link = Link(Uploads(), ArtifactReceiver(store))
    manifest = _start(link, path)
    damaged: list[str] = []
    original = link.receiver.handle

    def flip(msg: am.ToCoordinator, now: float):  # type: ignore[no-untyped-def]
        if isinstance(msg, am.ArtifactChunk) and msg.sha256 == manifest.chunks[1] and not damaged:
            damaged.append(msg.sha256)
            msg = msg.model_copy(update={"data": b"\x00" + msg.data[1:]})
        return original(msg, now)

    link.receiver.handle = flip  # type: ignore[method-assign]
    link.run()
    refused = [r for r in link.replies if isinstance(r, am.ArtifactRefused)]
    assert [(r.reason, r.chunk_sha256, r.final) for r in refused] == [("bad_chunk", manifest.chunks[1], False)]
    assert link.uploads.finished[0].phase == "stored" and len(link.sent_chunks) == 4
    assert link.now == 0.0  # asked again at once, not after the answer timeout
    assert assemble(store, manifest) == path.read_bytes()


def test_a_chunk_that_rotted_at_rest_is_asked_for_again_and_repaired(tmp_path: Path, store: LocalBlobStore) -> None:
    path = _file(tmp_path, 3)
    link = Link(Uploads(), ArtifactReceiver(store))
    manifest = _start(link, path)
    link.run()
    rotten = manifest.chunks[2]
    (store.root / rotten[:2] / rotten).write_bytes(b"rot")
    link2 = Link(Uploads(), ArtifactReceiver(store))  # e.g. after a restart, the same artifact offered again
    _start(link2, path, session="s2")
    link2.run()
    assert [m.sha256 for _, m in link2.sent_chunks] == [rotten]
    assert link2.uploads.finished[0].phase == "stored" and store.verify(rotten)


# ---------------------------------------------------------------------------------- hostile input


def _offer(manifest: ArtifactManifest, epoch: int = 1) -> am.ArtifactOffer:
    return am.ArtifactOffer(session_nonce="s", trial_id=TRIAL, epoch=epoch, manifest=manifest)


def _chunk(manifest: ArtifactManifest, sha: str, data: bytes, epoch: int = 1) -> am.ArtifactChunk:
    return am.ArtifactChunk(session_nonce="s", trial_id=TRIAL, epoch=epoch, manifest_sha256=manifest.digest(),
                            sha256=sha, data=data)


def _manifest(data: bytes) -> ArtifactManifest:
    from servetune.artifacts import manifest_for_bytes

    return manifest_for_bytes(data, "server.log", "server_log")


def test_chunks_that_lie_or_were_not_asked_for_are_refused_and_never_stored(store: LocalBlobStore) -> None:
    data = os.urandom(2 * CHUNK_SIZE)
    manifest = _manifest(data)
    r = ArtifactReceiver(store)
    (missing,) = r.handle(_offer(manifest), 0.0).replies
    assert isinstance(missing, am.ArtifactMissing) and missing.missing == manifest.chunks
    stranger = os.urandom(1000)
    cases = [
        (_chunk(manifest, manifest.chunks[0], data[CHUNK_SIZE:]), "bad_chunk"),  # bytes of another chunk
        (_chunk(manifest, sha256_hex(stranger), stranger), "not_requested"),  # honest bytes nobody asked for
        (_chunk(manifest, manifest.chunks[0], data[:100]), "bad_chunk"),  # wrong length
        (_chunk(_manifest(b"other"), sha256_hex(b"other"), b"other"), "not_requested"),  # no such offer
        (_chunk(manifest, manifest.chunks[0], data[:CHUNK_SIZE], epoch=2), "not_requested"),  # another attempt
    ]
    # a manifest whose one 4 KiB chunk names the digest of 64 KiB: the bytes match, the length does not
    big = os.urandom(64 * 1024)
    short = ArtifactManifest(name="x.log", kind="server_log", size=4096, sha256=sha256_hex(big[:4096]),
                             chunk_size=4096, chunks=[sha256_hex(big)])
    r.handle(_offer(short), 0.0)
    cases.append((_chunk(short, sha256_hex(big), big), "bad_chunk"))
    for msg, reason in cases:
        (reply,) = r.handle(msg, 1.0).replies
        assert isinstance(reply, am.ArtifactRefused) and (reply.reason, reply.final) == (reason, False), msg.sha256
    assert list(store.digests()) == [] and "chunks_written" not in r.counters
    assert r.counters == {"refused_bad_chunk": 3, "refused_not_requested": 3}
    assert r.handle(_chunk(manifest, manifest.chunks[0], data[:CHUNK_SIZE]), 2.0).replies == []
    (done,) = r.handle(_chunk(manifest, manifest.chunks[1], data[CHUNK_SIZE:]), 2.0).replies
    assert isinstance(done, am.ArtifactStored)
    assert r.handle(_chunk(manifest, manifest.chunks[1], data[CHUNK_SIZE:]), 3.0).replies == []  # late duplicate


def test_a_manifest_that_lies_about_the_whole_file_is_refused_for_good(store: LocalBlobStore) -> None:
    data = os.urandom(CHUNK_SIZE + 5)
    honest = _manifest(data)
    liar = ArtifactManifest.model_validate({**honest.model_dump(), "sha256": sha256_hex(b"forged")})
    r = ArtifactReceiver(store)
    r.handle(_offer(liar), 0.0)
    r.handle(_chunk(liar, liar.chunks[0], data[:CHUNK_SIZE]), 0.0)
    out = r.handle(_chunk(liar, liar.chunks[1], data[CHUNK_SIZE:]), 0.0)
    (reply,) = out.replies
    assert isinstance(reply, am.ArtifactRefused) and (reply.reason, reply.final) == ("bad_file", True)
    assert out.stored == [] and not store.has(liar.digest())


def test_offers_over_the_attempts_bounds_or_for_an_unknown_attempt_are_refused(store: LocalBlobStore) -> None:
    policy = ReceiverPolicy(max_bytes_per_attempt=3 * CHUNK_SIZE, max_artifacts_per_attempt=2, max_open_uploads=3)
    r = ArtifactReceiver(store, policy, known_attempt=lambda trial, epoch, session: epoch < 9)
    big, small = _manifest(os.urandom(2 * CHUNK_SIZE)), _manifest(os.urandom(CHUNK_SIZE))
    assert isinstance(r.handle(_offer(big), 0.0).replies[0], am.ArtifactMissing)
    assert isinstance(r.handle(_offer(big), 0.0).replies[0], am.ArtifactMissing)  # asking again is not charged twice
    assert isinstance(r.handle(_offer(small), 0.0).replies[0], am.ArtifactMissing)
    for manifest, why in ((_manifest(b"x"), "at most 2 artifacts"),):
        (reply,) = r.handle(_offer(manifest), 0.0).replies
        assert isinstance(reply, am.ArtifactRefused) and reply.final and why in reply.detail
    (reply,) = r.handle(_offer(_manifest(os.urandom(4 * CHUNK_SIZE)), epoch=2), 0.0).replies
    assert isinstance(reply, am.ArtifactRefused) and (reply.reason, reply.final) == ("over_budget", True)
    (reply,) = r.handle(_offer(small, epoch=9), 0.0).replies
    assert isinstance(reply, am.ArtifactRefused) and (reply.reason, reply.final) == ("unknown_attempt", True)
    assert isinstance(r.handle(_offer(small, epoch=3), 0.0).replies[0], am.ArtifactMissing)
    (reply,) = r.handle(_offer(small, epoch=4), 0.0).replies  # a 4th upload in flight: later
    assert isinstance(reply, am.ArtifactRefused) and (reply.reason, reply.final) == ("over_budget", False)
    assert r.expire(700.0) == 3 and r.open_uploads == 0
    assert isinstance(r.handle(_offer(small, epoch=4), 700.0).replies[0], am.ArtifactMissing)


def test_an_upload_ends_refused_on_a_final_refusal_and_failed_when_its_file_changes(
        tmp_path: Path, store: LocalBlobStore) -> None:
    path = _file(tmp_path, 2)
    link = Link(Uploads(), ArtifactReceiver(store, known_attempt=lambda *a: False))
    _start(link, path)
    link.run()
    assert (link.uploads.finished[0].phase, link.sent_chunks) == ("refused", [])
    assert "unknown_attempt" in link.uploads.finished[0].reason
    link = Link(Uploads(), ArtifactReceiver(store))
    manifest = manifest_for_file(path, "server_log")
    path.write_bytes(os.urandom(2 * CHUNK_SIZE))
    link.send(link.uploads.add(TRIAL, 1, manifest, FileChunks(path, manifest), "s", 0.0))
    link.run()
    assert link.uploads.finished[0].phase == "failed" and "changed since" in link.uploads.finished[0].reason


def test_an_upload_ignores_chunks_a_coordinator_asks_for_that_are_not_in_it(store: LocalBlobStore) -> None:
    data = os.urandom(CHUNK_SIZE)
    manifest = _manifest(data)
    uploads = Uploads()
    uploads.add(TRIAL, 1, manifest, BytesChunks(data, manifest), "s", 0.0)
    out = uploads.on_message(am.ArtifactMissing(trial_id=TRIAL, epoch=1, manifest_sha256=manifest.digest(),
                                                missing=[sha256_hex(b"/etc/shadow"), manifest.chunks[0]]), 0.0)
    assert [m.sha256 for m in out if isinstance(m, am.ArtifactChunk)] == manifest.chunks


# ---------------------------------------------------------------------------------- pacing


def _max_in_any_window(sends: list[tuple[float, int]], interval: float) -> int:
    return max(sum(n for t2, n in sends if t <= t2 < t + interval) for t, _ in sends)


def test_pacing_keeps_every_heartbeat_interval_under_its_byte_budget(tmp_path: Path, store: LocalBlobStore) -> None:
    budget = 3 * CHUNK_SIZE
    pacer = Pacer(PacingPolicy(bytes_per_interval=budget, interval_s=1.0))
    link = Link(Uploads(pacer), ArtifactReceiver(store))
    _start(link, _file(tmp_path, 10, "a.log"))
    _start(link, _file(tmp_path, 5, "b.log"))  # two uploads share the daemon's one budget
    link.run()
    assert [u.phase for u in link.uploads.finished] == ["stored", "stored"]
    sends = [(t, len(m.data)) for t, m in link.sent_chunks]
    assert len(sends) == 15
    assert _max_in_any_window(sends, 1.0) <= budget
    assert link.now >= 4.0  # 15 chunks at 3 per second


def test_a_chunk_larger_than_the_budget_goes_out_alone_once_per_interval(tmp_path: Path,
                                                                         store: LocalBlobStore) -> None:
    pacer = Pacer(PacingPolicy(bytes_per_interval=CHUNK_SIZE // 2, interval_s=2.0))
    link = Link(Uploads(pacer), ArtifactReceiver(store))
    _start(link, _file(tmp_path, 4))
    link.run()
    times = [t for t, _ in link.sent_chunks]
    assert link.uploads.finished[0].phase == "stored" and times == [0.0, 2.0, 4.0, 6.0]
