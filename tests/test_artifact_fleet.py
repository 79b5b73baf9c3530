"""Artifacts over the wire, end to end: a real coordinator (``sweep --no-local-daemon``) and real
``daemon start`` processes on loopback, CURVE on, the ``openai`` backend against the FAKE endpoint
of tests/fakes (the only fake: no GPU here). A remote daemon's batch log and raw samples land in the
coordinator's blob store and index, verified, and the dashboard's trial inspector reads them from
there with the daemon's workdir gone; an upload cut by a SIGKILL of the daemon or of the
coordinator resumes with the missing chunks only. The fleet invariants are checked after each."""

from __future__ import annotations

import json
import re
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.artifact_spool import ArtifactSpool
from dashboards.app.state import trial_files
from servetune.artifact_index import attempt_artifacts, experiment_blob_store, read_artifact
from servetune.artifacts import load_manifest
from tests.fakes.openai_server import FakeOpenAIServer
from tests.fleet_harness import FAST, Fleet, acked_submissions, check_invariants, wait_for

pytestmark = pytest.mark.timeout(120)

#: Small chunks, one per heartbeat interval (0.25 s): a 20 KB artifact takes seconds to cross,
#: the window the interruption tests cut it in. Both are documented `daemon start` flags.
SLOW_UPLOAD = ("--artifact-chunk-size", "4096", "--upload-bytes-per-interval", "1")
SLOW_TIMINGS = {**FAST, "--heartbeat-interval": "0.25"}


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with FakeOpenAIServer(token_delay_ms=5.0, ttft_ms=5.0) as server:
        yield server.base_url


@pytest.fixture
def make_fleet(tmp_path: Path, endpoint: str) -> Iterator[type[Fleet]]:
    made: list[Fleet] = []

    def make(**kw: object) -> Fleet:
        f = Fleet(tmp_path, endpoint, **kw)  # type: ignore[arg-type]
        made.append(f)
        return f

    yield make  # type: ignore[misc]
    for f in made:
        left = f.close()
        assert not left, f"processes left behind: {left}"


def _finish(fleet: Fleet, timeout_s: float = 90) -> str:
    code, _out, log = fleet.wait_coordinator(timeout_s)
    assert code == 0, f"exit {code}:\n{log[-4000:]}"
    for proc in fleet.daemons.values():
        if proc.poll() is None:
            proc.wait(timeout=15)
    return log


def _invariants(fleet: Fleet) -> None:
    acked: set[str] = set()
    for path in fleet.daemon_log_paths():
        acked |= acked_submissions(path.read_text(errors="replace"))
    problems = check_invariants(fleet, acked)
    assert not problems, "\n".join(problems)


def _all_stored_and_verified(fleet: Fleet) -> list[tuple[dict[str, object], dict[str, object]]]:
    """Every ok attempt has its batch log and samples in the store, from its daemon's key, verified;
    returns (attempt, {kind: record}) pairs."""
    out = []
    ok = [a for a in fleet.attempts() if a["status"] == "ok"]
    assert ok
    for a in ok:
        recs = {r.kind: r for r in attempt_artifacts(fleet.folder, str(a["trial_id"]), int(a["attempt"]))}
        assert {"client_log", "samples"} <= set(recs), f"attempt {a['trial_id']}/{a['attempt']}: {sorted(recs)}"
        for r in recs.values():
            assert r.daemon == a["daemon_key_id"]
            read_artifact(fleet.folder, r)  # every chunk and the whole file verified
        record = json.loads((fleet.folder / str(a["result_path"])).read_text())
        lines = read_artifact(fleet.folder, recs["samples"]).decode().splitlines()
        assert len(lines) == len(record["outcome"]["samples"])
        assert [json.loads(x) for x in lines] == record["outcome"]["samples"]
        out.append((a, recs))
    assert experiment_blob_store(fleet.folder).verify_all() == []
    return out


def _wait_mid_upload(fleet: Fleet, min_chunks: int = 4) -> tuple[str, int]:
    """Wait until the coordinator holds some but not all chunks of a spooled artifact of at least
    ``min_chunks`` chunks; returns (its manifest digest, its chunk count)."""
    spool = ArtifactSpool.for_workdir(fleet.tmp / "daemon")
    store = experiment_blob_store(fleet.folder)

    def partial() -> tuple[str, int] | None:
        for art in spool.pending():
            chunks = set(art.manifest.chunks)
            if len(chunks) >= min_chunks and 0 < len(chunks) - len(store.missing(sorted(chunks))) < len(chunks) - 1:
                return art.manifest.digest(), len(chunks)
        return None

    return wait_for(partial, 60, "an artifact upload half-way", poll_s=0.02)  # type: ignore[no-any-return]


def test_a_remote_daemons_batch_log_and_samples_reach_the_store_and_the_inspector(make_fleet: type[Fleet]) -> None:
    fleet = make_fleet(repeats=1)
    fleet.start_coordinator()
    fleet.start_daemon("d1")
    _finish(fleet)
    shutil.rmtree(fleet.tmp / "daemon")  # nothing of the node is left to read: the store alone
    for a, recs in _all_stored_and_verified(fleet):
        files = trial_files(fleet.folder, str(a["trial_id"]))
        assert files.client_log_path.startswith("artifact store: batch.log"), files.client_log_path
        assert "batch" in files.client_log and "daemon." in files.client_log
        assert files.client_log == read_artifact(fleet.folder, recs["client_log"]).decode()
    _invariants(fleet)


def test_a_daemon_killed_mid_upload_resumes_with_the_missing_chunks_only(make_fleet: type[Fleet]) -> None:
    fleet = make_fleet(repeats=2, requests=60, timings=dict(SLOW_TIMINGS))
    fleet.start_coordinator()
    d1 = fleet.start_daemon("d1", None, *SLOW_UPLOAD)
    digest, n_chunks = _wait_mid_upload(fleet)
    d1.send_signal(signal.SIGKILL)
    d1.wait(timeout=10)
    time.sleep(0.5)
    fleet.start_daemon("d1", None, *SLOW_UPLOAD)  # the same workdir: its spool still lists the artifact
    _finish(fleet)
    sent = re.findall(rf"artifact \S+ \({digest[:12]}\) of trial \S+ attempt \d+ stored by the coordinator "
                      rf"\((\d+) chunk\(s\) sent\)", fleet.daemon_log("d1"))
    assert len(sent) == 1, fleet.daemon_log("d1")[-3000:]
    assert 0 < int(sent[0]) < n_chunks, (sent, n_chunks)  # the restarted daemon sent only what was missing
    _all_stored_and_verified(fleet)
    _invariants(fleet)


def test_a_coordinator_killed_mid_upload_is_resumed_by_its_restart(make_fleet: type[Fleet]) -> None:
    fleet = make_fleet(repeats=3, requests=60, timings=dict(SLOW_TIMINGS))
    coordinator = fleet.start_coordinator()
    fleet.start_daemon("d1", None, *SLOW_UPLOAD)
    digest, n_chunks = _wait_mid_upload(fleet)
    had = n_chunks - len(experiment_blob_store(fleet.folder).missing(load_manifest(
        ArtifactSpool.for_workdir(fleet.tmp / "daemon").store, digest).chunks))
    coordinator.send_signal(signal.SIGKILL)
    coordinator.wait(timeout=10)
    fleet.poll_coordinator()
    fleet.start_coordinator()
    log = _finish(fleet)
    assert any(r.manifest_sha256 == digest for a in fleet.attempts()
               for r in attempt_artifacts(fleet.folder, str(a["trial_id"]), int(a["attempt"])))
    _all_stored_and_verified(fleet)
    # the restarted coordinator asked only for what its store lacked
    asked = [int(n) for n, total in re.findall(rf"artifact \S+ \({digest[:12]}\) of trial \S+ attempt \d+: asking "
                                               rf"daemon d1 for (\d+) of its (\d+) chunk\(s\)", log)]
    assert asked and max(asked) <= n_chunks - had, (asked, n_chunks, had)
    _invariants(fleet)
