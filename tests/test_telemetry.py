"""GPU telemetry over a measurement window: with the FAKE NVML (no GPU exists here) the sampler's
summary, bounded series and stop deadline; for real on this CPU-only machine, nothing sampled and
the record says so; and through the batch runner, the summary on the RESULT, the readings as an
artifact and the topology on the fingerprint."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.artifact_spool import ArtifactSpool
from daemon.batch import BatchContext, BatchRunner
from daemon.fingerprint import collect_fingerprint
from daemon.telemetry import TelemetrySampler
from servetune.artifacts import assemble
from servetune.messages import Result
from tests.fakes import fake_nvml
from tests.fakes.fake_nvml import FakeGPU
from tests.fakes.openai_server import FakeOpenAIServer
from tests.test_artifact_spool import _fingerprint, _grant


def _wait_for_calls(n: int, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while fake_nvml.STATE.calls < n and time.monotonic() < end:
        time.sleep(0.005)


def test_summary_covers_every_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvml.install(monkeypatch, [FakeGPU(power_w=100.0, temperature_c=40, sm_clock_mhz=1980, used_mib=1000),
                                    FakeGPU(power_w=50.0)])
    sampler = TelemetrySampler(interval_s=0.005)
    sampler.start()
    _wait_for_calls(200)
    fake_nvml.STATE.gpus[0].power_w = 300.0
    fake_nvml.STATE.gpus[0].sm_clock_mhz = 1400
    fake_nvml.STATE.gpus[0].temperature_c = 70
    before = fake_nvml.STATE.calls
    _wait_for_calls(before + 200)
    record = sampler.stop()
    s = record.summary
    assert s.sampled and s.note == "" and s.interval_s == 0.005
    g0, g1 = s.gpus
    assert (g0.index, g1.index) == (0, 1)
    assert g0.n >= 10 and g0.n == g1.n
    assert g0.power_w_max == 300.0 and 100.0 < g0.power_w_mean < 300.0
    assert g0.temperature_c_max == 70 and g0.sm_clock_mhz_min == 1400
    assert g0.memory_used_mib_max == 1000 and g1.power_w_mean == 50.0
    points = [p for p in record.samples if p["gpu"] == 0]
    assert len(points) == g0.n, "nothing thinned below max_points"
    assert all(a["t_ns"] < b["t_ns"] for a, b in zip(points, points[1:], strict=False))
    assert {p["power_w"] for p in points} == {100.0, 300.0}


def test_only_the_trials_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvml.install(monkeypatch, [FakeGPU(), FakeGPU(), FakeGPU()])
    sampler = TelemetrySampler([2], interval_s=0.005)
    sampler.start()
    _wait_for_calls(20)
    record = sampler.stop()
    assert [g.index for g in record.summary.gpus] == [2]
    assert {p["gpu"] for p in record.samples} == {2}


def test_series_is_bounded_and_summary_still_counts_all(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvml.install(monkeypatch, [FakeGPU()])
    sampler = TelemetrySampler(interval_s=0.0005, max_points=8)
    sampler.start()
    _wait_for_calls(5 * 200)
    record = sampler.stop()
    n = record.summary.gpus[0].n
    assert n > 40
    assert 4 <= len(record.samples) < 8
    t = [p["t_ns"] for p in record.samples]
    assert t == sorted(t)


def test_unsupported_reading_is_none_never_made_up(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvml.install(monkeypatch, [FakeGPU(power_supported=False)])
    sampler = TelemetrySampler(interval_s=0.005)
    sampler.start()
    _wait_for_calls(20)
    record = sampler.stop()
    g = record.summary.gpus[0]
    assert g.power_w_mean is None and g.power_w_max is None and g.temperature_c_max == 35
    assert all("power_w" not in p for p in record.samples)


def test_cpu_node_for_real_samples_nothing_and_says_so() -> None:
    sampler = TelemetrySampler(interval_s=0.01)
    sampler.start()
    record = sampler.stop()
    assert not record.summary.sampled and record.summary.gpus == [] and record.samples == []
    assert record.summary.note.startswith("nothing sampled: ")
    assert "NVML" in record.summary.note or "nvidia-ml-py" in record.summary.note


def test_stop_has_a_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvml.install(monkeypatch, [FakeGPU()])
    release = threading.Event()
    slow = fake_nvml.nvmlDeviceGetPowerUsage

    def hang(handle: int) -> int:  # the FAKE driver call hangs
        release.wait(10)
        return slow(handle)

    monkeypatch.setattr(fake_nvml, "nvmlDeviceGetPowerUsage", hang)
    sampler = TelemetrySampler(interval_s=0.01)
    sampler.start()
    time.sleep(0.05)
    t0 = time.monotonic()
    record = sampler.stop(deadline_s=0.2)
    assert time.monotonic() - t0 < 2.0
    assert "did not stop within 0.2 s" in record.summary.note
    release.set()


@pytest.fixture
def fake_endpoint() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as fake:
        yield fake


@pytest.mark.timeout(120)
def test_batch_runner_keeps_telemetry_and_topology_with_the_trial(
        tmp_path: Path, fake_endpoint: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvml.install(monkeypatch, [FakeGPU(nvlinks={1: 18}), FakeGPU(nvlinks={0: 18})])
    collect_fingerprint.cache_clear()
    try:
        fp = collect_fingerprint()
    finally:
        collect_fingerprint.cache_clear()
    grant = _grant(tmp_path, fake_endpoint.base_url)
    sent: list[object] = []
    spool = ArtifactSpool.for_workdir(tmp_path / "work")
    BatchRunner(BatchContext(tmp_path / "work", fp, None, spool=spool), sent.append, threading.Event()).run(grant)
    (result,) = [m for m in sent if isinstance(m, Result)]
    out = result.outcome
    assert out.status == "ok", out.error
    assert out.fingerprint is not None and out.fingerprint.gpu_topology is not None
    assert out.fingerprint.gpu_topology.interconnect == "NVLink"
    assert out.gpu_telemetry is not None and out.gpu_telemetry.sampled
    assert [g.index for g in out.gpu_telemetry.gpus] == [0], "the trial's GPU set (tensor_parallel_size 1)"
    (tele,) = [p for p in spool.pending() if p.manifest.name == "gpu_telemetry.json"]
    points = json.loads(assemble(spool.store, tele.manifest))
    assert len(points) == out.gpu_telemetry.gpus[0].n >= 1
    assert Result.model_validate_json(result.model_dump_json()) == result  # fits the wire


@pytest.mark.timeout(120)
def test_batch_runner_on_a_cpu_node_records_that_nothing_was_sampled(
        tmp_path: Path, fake_endpoint: FakeOpenAIServer) -> None:
    grant = _grant(tmp_path, fake_endpoint.base_url)
    sent: list[object] = []
    BatchRunner(BatchContext(tmp_path / "w", _fingerprint(), None), sent.append, threading.Event()).run(grant)
    (result,) = [m for m in sent if isinstance(m, Result)]
    tele = result.outcome.gpu_telemetry
    assert tele is not None and not tele.sampled and tele.gpus == [] and "nothing sampled" in tele.note
