"""The trial inspector's logs come from the artifact store when it holds them, else from local files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dashboards.app import state
from servetune.artifact_index import ArtifactIndex, experiment_blob_store
from servetune.artifacts import put_file

WAVE1 = Path(__file__).parent / "data" / "wave1" / "wave1-openai"
TRIAL = "d7abafe61ce6dc6c54b0a5bdd90ea4f8fe4c81de36c1b61b7fd733b762bc8a9c"  # ok at attempt 1


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return Path(shutil.copytree(WAVE1, tmp_path / "wave1-openai"))


def _upload(folder: Path, tmp_path: Path, name: str, kind: str, text: str, attempt: int = 1) -> None:
    """What the coordinator does once an upload is verified: blobs in the store, a row in the index."""
    path = tmp_path / "node" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    manifest = put_file(experiment_blob_store(folder), path, kind)  # type: ignore[arg-type]
    with ArtifactIndex.open(folder) as index:
        index.record(TRIAL, attempt, manifest, daemon="gpu-node-7")


def test_the_inspector_reads_a_remote_daemons_logs_from_the_store(folder: Path, tmp_path: Path) -> None:
    before = state.trial_files(folder, TRIAL)
    assert before.record is not None and "no server log found" in before.server_log  # nothing on this machine
    _upload(folder, tmp_path, "server.log", "server_log", "INFO vllm: KV cache size: 4096 tokens\n")
    _upload(folder, tmp_path, "client.log", "client_log", "2026-12-01 10:00:00,000 loadgen: 32 requests\n")
    _upload(folder, tmp_path, "server-old.log", "server_log", "an earlier attempt's log\n", attempt=2)
    files = state.trial_files(folder, TRIAL)
    assert files.server_log == "INFO vllm: KV cache size: 4096 tokens\n"
    assert files.server_log_path.startswith("artifact store: server.log") and "gpu-node-7" in files.server_log_path
    assert files.client_log == "2026-12-01 10:00:00,000 loadgen: 32 requests\n"
    assert files.client_log_path.startswith("artifact store: client.log")


def test_a_stored_log_that_fails_verification_falls_back_to_the_local_file(folder: Path, tmp_path: Path) -> None:
    _upload(folder, tmp_path, "server.log", "server_log", "stored copy\n")
    (rec,) = ArtifactIndex.open(folder).for_attempt(TRIAL, 1)
    blobs = folder / "artifacts" / "blobs"
    for blob in blobs.rglob("*"):
        if blob.is_file() and blob.name != rec.manifest_sha256:
            blob.write_bytes(b"rotten")
    local = folder / "daemon" / "logs" / "server-b0000-8dfa14db-1.log"
    local.parent.mkdir(parents=True)
    local.write_text("local copy\n")
    files = state.trial_files(folder, TRIAL)
    assert (files.server_log, files.server_log_path) == ("local copy\n", str(local))
