"""The daemon's artifact spool: a finished attempt's artifacts kept on the node until confirmed.

The batch runner test measures :mod:`tests.fakes.openai_server` (FAKE: it stands in for vLLM) through
the ``openai`` backend, so it starts no server and has no server log or ``/metrics``; the server
log path is checked by handing the runner a server record directly.
"""

from __future__ import annotations

import json
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.artifact_receiver import ArtifactReceiver
from daemon.artifact_spool import PENDING_FILE, ArtifactSpool
from daemon.artifact_upload import Uploads
from daemon.batch import BatchContext, BatchRunner
from servetune import artifact_messages as am
from servetune.artifacts import CHUNK_SIZE, assemble
from servetune.blobs import LocalBlobStore
from servetune.manifest import plan_grid
from servetune.messages import Grant, GrantedTrial, Result
from servetune.result import Fingerprint, RequestSample, ServerInfo
from servetune.spec import parse_spec
from tests.fakes.openai_server import FakeOpenAIServer

TRIAL = "c" * 64


def test_a_growing_log_is_spooled_as_it_stood_and_stays_pending_across_restarts(tmp_path: Path) -> None:
    log_file = tmp_path / "server-b1.log"
    log_file.write_bytes(b"x" * (CHUNK_SIZE + 100))
    spool = ArtifactSpool.for_workdir(tmp_path / "work")
    manifest = spool.add_file(TRIAL, 1, log_file, "server_log", "server.log")
    with log_file.open("ab") as fh:
        fh.write(b"the next trial's lines\n")  # the batch's server goes on logging
    assert manifest.size == CHUNK_SIZE + 100 and manifest.name == "server.log"
    samples = spool.add_bytes(TRIAL, 1, b'{"a": 1}\n', "samples", "samples.jsonl")
    with (tmp_path / "work" / "artifacts" / PENDING_FILE).open("a") as fh:
        fh.write('{"trial_id": "torn')  # a crash mid-append
    restarted = ArtifactSpool.for_workdir(tmp_path / "work")
    assert [(p.trial_id, p.attempt, p.manifest) for p in restarted.pending()] == [(TRIAL, 1, manifest),
                                                                               (TRIAL, 1, samples)]
    source = restarted.source(manifest)
    assert b"".join(source.read(d) for d in manifest.chunks) == b"x" * (CHUNK_SIZE + 100)
    restarted.mark_stored(TRIAL, 1, manifest.digest())
    assert [p.manifest for p in ArtifactSpool.for_workdir(tmp_path / "work").pending()] == [samples]


def test_a_restarted_daemon_uploads_what_its_spool_still_holds(tmp_path: Path) -> None:
    log_file = tmp_path / "server.log"
    log_file.write_bytes(b"vllm says hello\n" * 50_000)
    ArtifactSpool.for_workdir(tmp_path / "work").add_file(TRIAL, 2, log_file, "server_log")
    log_file.unlink()  # the node cleaned its logs: the spool still has the bytes
    spool = ArtifactSpool.for_workdir(tmp_path / "work")  # a new daemon process
    uploads = Uploads()
    receiver = ArtifactReceiver(LocalBlobStore(tmp_path / "coordinator" / "blobs"))
    outbox = [m for p in spool.pending() for m in uploads.add(p.trial_id, p.attempt, p.manifest,
                                                               spool.source(p.manifest), "s1", 0.0)]
    stored = []
    while outbox:
        out = receiver.handle(outbox.pop(0), 0.0)
        stored += out.stored
        for reply in out.replies:
            outbox += uploads.on_message(reply, 0.0)
            if isinstance(reply, am.ArtifactStored):
                spool.mark_stored(reply.trial_id, reply.epoch, reply.manifest_sha256)
    (done,) = stored
    assert assemble(receiver.store, done.manifest) == b"vllm says hello\n" * 50_000
    assert spool.pending() == []


SPEC = textwrap.dedent(
    """
    name: spool-test
    model: {{source: path, path: "{model}", served_name: fake}}
    backend: {{kind: openai, base_url: "{url}", scrape_metrics: false}}
    budgets: {{trial_timeout_s: 60, drain_timeout_s: 5}}
    load_points:
      - {{name: quick, max_concurrency: 2, num_requests: 6, input_len: 8, output_len: 4}}
    """
)


@pytest.fixture
def fake_endpoint() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as fake:
        yield fake


def _grant(tmp_path: Path, url: str) -> Grant:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"vocab_size": 1000}))
    spec = parse_spec(SPEC.format(model=model, url=url))
    batch = plan_grid(spec).batches[0]
    return Grant(batch_id="b1", epoch=1, ttl_s=600, model=spec.model, backend=spec.backend, budgets=spec.budgets,
                 config=batch.config, trials=[GrantedTrial(trial_id=t.trial_id, attempt=1, manifest=t)
                                              for t in batch.trials])


def _fingerprint() -> Fingerprint:
    return Fingerprint(hostname="test", cpu_model="test", cpu_count=1, cpu_isa="none", ram_gib=1.0, os="linux",
                       kernel="test", python="3", servetune_version="0", hardware_class="cpu-test")


@pytest.mark.timeout(120)
def test_the_batch_runner_spools_a_finished_attempts_artifacts_only_when_given_a_spool(
        tmp_path: Path, fake_endpoint: FakeOpenAIServer) -> None:
    grant = _grant(tmp_path, fake_endpoint.base_url)
    (trial,) = grant.trials
    sent: list[object] = []
    BatchRunner(BatchContext(tmp_path / "plain", _fingerprint(), None), sent.append, threading.Event()).run(grant)
    assert not (tmp_path / "plain" / "artifacts").exists()
    spool = ArtifactSpool.for_workdir(tmp_path / "work")
    runner = BatchRunner(BatchContext(tmp_path / "work", _fingerprint(), None, spool=spool), sent.append,
                         threading.Event())
    runner.run(grant)
    (result,) = [m for m in sent[len(sent) // 2:] if isinstance(m, Result)]
    (pending,) = spool.pending()
    assert (pending.trial_id, pending.attempt, pending.manifest.kind) == (trial.trial_id, 1, "samples")
    lines = assemble(spool.store, pending.manifest).decode().splitlines()
    assert [RequestSample.model_validate_json(line) for line in lines] == result.outcome.samples
    assert len(lines) >= 6
    # a vLLM server's record names its log: the log is spooled as it stands
    log_file = tmp_path / "server-b1.log"
    log_file.write_text("INFO: KV cache size: 4096 tokens\n")
    runner._keep_artifacts(trial, ServerInfo(argv=["vllm"], log_path=str(log_file)))
    assert [p.manifest.name for p in spool.pending()] == ["samples.jsonl", "server.log"]
