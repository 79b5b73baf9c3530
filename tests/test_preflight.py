"""Preflight: each check for real on this CPU-only machine and with the FAKE NVML (a busy GPU fails),
the session out of service (no READY, the reason in HELLO), the batch worker answering a grant it
cannot take with a BATCH_ERROR and coming back after a re-check, and the coordinator recording that
as a daemon error, never as a measurement of the config."""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from pathlib import Path

import pytest

import daemon.agent as agent_mod
from daemon.agent import BatchDone, BatchWorker, DaemonAgent, DaemonOptions, ServiceChange
from daemon.batch import BatchContext, BatchRunner
from daemon.preflight import (
    Preflight,
    VllmCheck,
    batch_preflight,
    check_disk,
    check_gpus_idle,
    check_model,
    hf_hub_cache,
)
from servetune.exitcodes import ExitCode
from servetune.messages import BatchError, Bye, Capabilities, Heartbeat, Hello, Ready, Rejoin, Result, Shutdown, Welcome
from servetune.spec import ModelSpec
from tests import test_daemon_agent
from tests.fakes import fake_nvml
from tests.fakes.fake_nvml import FakeGPU
from tests.test_daemon_agent import ScriptedCoordinator
from tests.test_daemon_session import FP, grant, sent, welcomed

coordinator = test_daemon_agent.coordinator  # the scripted coordinator fixture, shared

# ----------------------------------------------------------------------------- checks


def test_cpu_node_passes_for_real(tmp_path: Path) -> None:
    result = Preflight(workdir=tmp_path / "w").run()
    assert result.ok, result.reasons
    by_name = {c.name: c for c in result.checks}
    assert by_name["disk"].status == "ok" and by_name["gpus_idle"].status == "skipped"
    assert "no GPU to check" in by_name["gpus_idle"].detail
    assert (tmp_path / "w").is_dir()


def test_disk_threshold_fails_naming_the_path(tmp_path: Path) -> None:
    check = check_disk(tmp_path, min_free_bytes=10**18)
    assert check.status == "failed"
    assert str(tmp_path) in check.detail and "GiB needed for logs" in check.detail
    assert check_disk(tmp_path, min_free_bytes=1).status == "ok"


def test_busy_gpu_fails_with_the_foreign_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvml.install(monkeypatch, [FakeGPU(), FakeGPU(processes=[(31337, 40000)])])
    check = check_gpus_idle(None)
    assert check.status == "failed"
    assert "GPU 1 runs another compute process: pid 31337 (40000 MiB)" in check.detail
    assert "GPU 1 has 40000 of 81559 MiB in use" in check.detail
    assert check_gpus_idle([0]).status == "ok", "only the GPUs the batch will use count"
    assert check_gpus_idle([1], own_pids=[31337]).status == "failed", "memory still in use"


def test_own_process_and_idle_gpus_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvml.install(monkeypatch, [FakeGPU(used_mib=500, processes=[(os.getpid(), 100)])])
    check = check_gpus_idle(None, own_pids=[os.getpid()])
    assert check.status == "ok" and check.detail == "GPU(s) 0 idle"


def test_memory_mostly_used_fails_without_a_process(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvml.install(monkeypatch, [FakeGPU(used_mib=20000)])
    assert "20000 of 81559 MiB in use" in check_gpus_idle(None).detail


def test_gpus_seen_but_nvml_silent_fails() -> None:
    check = check_gpus_idle(None, expect_gpus=True)  # this machine: no NVML answers
    assert check.status == "failed" and "cannot be known" in check.detail


def test_missing_gpu_index_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvml.install(monkeypatch, [FakeGPU()])
    assert "GPU 3 does not exist" in check_gpus_idle([3]).detail


def test_model_path_and_hub_cache(tmp_path: Path) -> None:
    model = tmp_path / "m"
    assert check_model(ModelSpec(source="path", path=str(model))).status == "failed"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert check_model(ModelSpec(source="path", path=str(model))).status == "ok"
    cache = tmp_path / "hub"
    hub = ModelSpec(source="hub", id="org/name")
    missing = check_model(hub, cache)
    assert missing.status == "failed" and "'org/name' is not in the Hugging Face cache" in missing.detail
    snap = cache / "models--org--name" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    assert check_model(hub, cache).status == "ok"
    pinned = ModelSpec(source="hub", id="org/name", revision="v2")
    assert check_model(pinned, cache).status == "failed"
    (cache / "models--org--name" / "refs").mkdir()
    (cache / "models--org--name" / "refs" / "v2").write_text("abc123\n")
    assert check_model(pinned, cache).status == "ok"
    assert check_model(ModelSpec()).status == "ok"  # tiny: generated on demand


def test_hf_cache_location_follows_the_environment(tmp_path: Path) -> None:
    assert hf_hub_cache({"HF_HUB_CACHE": str(tmp_path / "a")}) == tmp_path / "a"
    assert hf_hub_cache({"HF_HOME": str(tmp_path / "h")}) == tmp_path / "h" / "hub"
    assert hf_hub_cache({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "huggingface" / "hub"


def test_vllm_version_mismatch_fails_without_importing_it() -> None:
    check = VllmCheck(expected="0.0.1")()
    assert check.status == "failed"
    assert "expected 0.0.1 (--expect-vllm-version)" in check.detail or "not installed" in check.detail
    check = VllmCheck(advertised="0.0.2")()
    assert check.status == "failed"
    assert "when it joined" in check.detail or "not installed" in check.detail
    assert VllmCheck(launch=["apptainer"])().status == "skipped"


def test_batch_preflight_checks_by_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvml.install(monkeypatch, [FakeGPU(processes=[(999, 30000)])])
    pf = Preflight(workdir=tmp_path, vllm=VllmCheck(launch=["x"]))
    g = grant()
    result = batch_preflight(pf, g, FP)
    assert not result.ok and result.reasons[0].startswith("gpus_idle: GPU 0 runs another compute process")
    assert [c.name for c in result.checks] == ["disk", "gpus_idle", "vllm", "model"]
    sim = g.model_copy(update={"backend": g.backend.model_copy(update={"kind": "sim", "profile": "a100-80gb"})})
    assert [c.name for c in batch_preflight(pf, sim, FP).checks] == ["disk"]


def started_worker(pf: Preflight, vllm_python: str | None = None) -> tuple[queue.Queue[object], BatchWorker]:
    """A real batch runner and worker with preflight ``pf``, re-checking as the agent does; started."""
    outbox: queue.Queue[object] = queue.Queue()
    ctx = BatchContext(workdir=pf.workdir, fingerprint=FP, server_cpus=None, preflight=pf, vllm_python=vllm_python)
    runner = BatchRunner(ctx, outbox.put, threading.Event())
    worker = BatchWorker(runner, outbox,  # type: ignore[arg-type]
                         recheck=lambda g: batch_preflight(pf, g, FP) if g else pf.run())
    worker.start()
    return outbox, worker


class CountingVllmCheck(VllmCheck):
    """The real version checks; ``import vllm`` answered from ``answers`` (a problem, or "" for ok)
    and counted, so a test sees when the check imports."""

    def __init__(self, answers: list[str]):
        super().__init__()
        self.answers = answers
        self.imports = 0

    def _import(self, python: str) -> str:
        self.imports += 1
        return self.answers.pop(0)


def test_a_batch_defers_the_import_to_its_server_start_which_proves_it() -> None:
    """Importing vLLM costs 5-20 s: before a batch the server start is the proof, not a second import."""
    check = CountingVllmCheck([])
    deferred = check(defer_import=True)
    assert deferred.status == "ok" and "checked by the server start" in deferred.detail and check.imports == 0
    check.started()  # the server reached ready
    assert check().status == "ok" and "imports in" in check().detail and check.imports == 0
    assert check.after_failed_start() is None and check.imports == 0, "a proven vLLM: a failed start is the config's"


def test_a_failed_start_imports_once_and_a_failed_import_is_not_remembered() -> None:
    check = CountingVllmCheck(["`import vllm` failed: ImportError", ""])
    check(defer_import=True)
    failed = check.after_failed_start()  # the start failed and so does the import: the daemon's fault
    assert failed is not None and failed.status == "failed" and "ImportError" in failed.detail
    assert check(defer_import=True).detail.endswith("(its import is checked by the server start)")
    assert check.after_failed_start() is None and check.imports == 2, "repaired: the next import passes"
    assert check.after_failed_start() is None and check.imports == 2, "proven now: no import after the first"


def test_a_recheck_out_of_service_imports_at_once(tmp_path: Path) -> None:
    check = CountingVllmCheck(["`import vllm` failed: ImportError"])
    pf = Preflight(workdir=tmp_path, vllm=check)
    result = batch_preflight(pf, grant(), FP)  # what the agent's re-check calls: no deferral
    assert not result.ok and check.imports == 1 and "vllm: `import vllm` failed" in result.reasons[0]


@pytest.mark.timeout(120)
def test_a_vllm_that_does_not_import_is_a_daemon_error_after_the_failed_start_never_a_measurement(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """For real: an interpreter whose vLLM metadata is intact but whose ``import vllm`` raises (a
    shadowing package on PYTHONPATH). The server start fails, the import check names it, the batch is
    a BATCH_ERROR and the daemon goes out of service; no trial becomes a measurement failure."""
    monkeypatch.setattr(agent_mod, "PREFLIGHT_RECHECK_S", 3600.0)
    shadow = tmp_path / "shadow" / "vllm"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('FAKE broken vLLM: a shadowing package')\n")
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={shadow.parent} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    check = VllmCheck(python=str(python))
    assert check(defer_import=True).status == "ok", "the metadata alone passes: the import is deferred"
    outbox, worker = started_worker(Preflight(workdir=tmp_path, vllm=check), vllm_python=str(python))
    try:
        worker.submit(grant())
        seen: list[object] = []
        while not any(isinstance(m, BatchDone) for m in seen):
            seen.append(outbox.get(timeout=90))
        errors = [m for m in seen if isinstance(m, BatchError)]
        assert errors and "daemon out of service: preflight failed: vllm: `import vllm`" in errors[0].error
        assert "FAKE broken vLLM" in errors[0].error
        assert any(isinstance(m, ServiceChange) and m.reason for m in seen)
        assert not any(isinstance(m, Result) for m in seen), "never a result, so never a measurement failure"
        assert (tmp_path / "servers.jsonl").exists(), "the server start was tried (the deferred proof)"
    finally:
        assert worker.close(10)


# ----------------------------------------------------------------------------- out of service


def test_out_of_service_sends_no_ready_and_says_why_in_hello() -> None:
    d = welcomed(answer="renew")
    out = d.feed(d.s.set_out_of_service("preflight failed: disk: full", d.now))
    assert not sent(out, Ready)
    assert not sent(d.until(20.0), Ready), "no work asked for while out of service"
    assert d.s.capabilities.out_of_service == "preflight failed: disk: full"
    d.message(Rejoin(reason="x"))
    hellos = [m for _, i in d.log for m in [getattr(i, "msg", None)] if isinstance(m, Hello)]
    assert hellos[-1].capabilities.out_of_service == "preflight failed: disk: full"
    d.welcome()
    assert not sent(d.until(25.0), Ready)
    out = d.feed(d.s.set_out_of_service(None, d.now))
    assert sent(out, Ready), "back in service: asks for work at once"


def test_a_failed_batch_preflight_is_a_batch_error_then_a_recheck_restores_service(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_mod, "PREFLIGHT_RECHECK_S", 0.05)
    fake_nvml.install(monkeypatch, [FakeGPU(processes=[(999, 30000)])])
    outbox, worker = started_worker(Preflight(workdir=tmp_path, vllm=VllmCheck(launch=["x"])))
    try:
        worker.submit(grant())
        error = outbox.get(timeout=10)
        assert isinstance(error, BatchError) and error.batch_id == "b1"
        assert "daemon out of service: preflight failed: gpus_idle: GPU 0 runs another compute process" in error.error
        change = outbox.get(timeout=10)
        assert isinstance(change, ServiceChange) and change.reason and "pid 999" in change.reason
        assert isinstance(outbox.get(timeout=10), BatchDone)
        assert not (tmp_path / "servers.jsonl").exists(), "no server was started"
        fake_nvml.STATE.gpus[0].processes.clear()  # the other tenant leaves
        back = outbox.get(timeout=10)
        assert isinstance(back, ServiceChange) and back.reason is None
        leftovers = []
        while not outbox.empty():
            leftovers.append(outbox.get())
        assert not any(isinstance(m, Result) for m in leftovers), "never a result"
    finally:
        assert worker.close(10)


def test_the_coordinator_records_it_as_a_daemon_error_not_a_measurement() -> None:
    from coordinator.control import Accept, CloseAttempts
    from tests.test_control import Clock, core, join

    clock = Clock()
    c = core(clock)
    g = join(c, "d1", "n1")
    out = c.handle("d1", BatchError(session_nonce="n1", batch_id=g.batch_id, epoch=g.epoch,
                                    error="daemon out of service: preflight failed: disk: full"))
    closes = [i for i in out if isinstance(i, CloseAttempts)]
    assert closes and "preflight failed" in closes[0].reason
    assert not [i for i in out if isinstance(i, Accept)], "no result recorded for the config"


def test_capabilities_carry_the_reason() -> None:
    caps = Capabilities(fingerprint=FP, out_of_service="preflight failed: x")
    assert Capabilities.model_validate_json(caps.model_dump_json()).out_of_service == "preflight failed: x"


@pytest.mark.skipif(not Path("/usr/bin/python3").is_file(), reason="needs a second interpreter")
def test_an_interpreter_without_vllm_fails_the_vllm_check_for_real() -> None:
    check = VllmCheck(python="/usr/bin/python3")()
    assert check.status == "failed" and "not installed for /usr/bin/python3" in check.detail


@pytest.mark.timeout(60)
def test_a_daemon_failing_preflight_at_join_says_why_asks_nothing_and_returns_to_service(
        coordinator: ScriptedCoordinator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real agent on loopback: HELLO carries the reason, no READY while out of service, READY
    once a re-check passes (here: the disk threshold lowered, as if space had been freed)."""
    monkeypatch.setattr(agent_mod, "PREFLIGHT_RECHECK_S", 0.2)
    pf = Preflight(workdir=tmp_path / "work", min_free_disk_bytes=10**18)
    agent = DaemonAgent(DaemonOptions(coordinator=coordinator.address, workdir=tmp_path / "work", server_cpus=[0],
                                      daemon_id="preflight-test", coordinator_lost_s=30, preflight=pf,
                                      **coordinator.agent_keys()))
    codes: list[ExitCode] = []
    thread = threading.Thread(target=lambda: codes.append(agent.run()), daemon=True)
    thread.start()
    try:
        hello = coordinator.expect(Hello, 15)
        reason = hello.capabilities.out_of_service
        assert reason is not None and reason.startswith("preflight failed: disk: ") and "GiB needed for logs" in reason
        coordinator.send(Welcome(session_nonce=hello.session_nonce, coordinator_id="scripted",
                                 heartbeat_interval_s=0.2, lease_ttl_s=5.0))
        coordinator.expect(Heartbeat, 5)
        t0 = time.monotonic()
        time.sleep(1.0)
        assert coordinator.since(t0, Ready) == [], "out of service: no work asked for"
        pf.min_free_disk_bytes = 1
        coordinator.expect(Ready, 10)
        coordinator.send(Shutdown(reason="test done"))
        coordinator.expect(Bye, 5)
        thread.join(timeout=15)
        assert codes == [ExitCode.OK]
    finally:
        agent.request_stop("test over")
        thread.join(timeout=15)
