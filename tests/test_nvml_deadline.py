"""A wedged NVIDIA driver makes NVML calls block for minutes; the daemon's NVML reads have a deadline,
say so when it passes, and start no second call while one is still stuck. The driver here is the
FAKE NVML (no GPU exists where the tests run) with a memory query that blocks until released."""

from __future__ import annotations

import threading
import time

import pytest

import daemon.nvml as nvml_mod
from daemon.devices import probe_devices
from daemon.fingerprint import collect_fingerprint
from daemon.nvml import NvmlNotAnswering
from daemon.preflight import check_gpus_idle
from servetune.exitcodes import ExitCode
from tests.fakes import fake_nvml
from tests.fakes.fake_nvml import FakeGPU


@pytest.fixture
def wedged(monkeypatch: pytest.MonkeyPatch):
    """One FAKE GPU whose memory query hangs until the test ends; a 0.5 s NVML deadline."""
    fake_nvml.install(monkeypatch, [FakeGPU()])
    release = threading.Event()
    fake_nvml.STATE.hang = release
    monkeypatch.setenv(nvml_mod.DEADLINE_ENV, "0.5")
    collect_fingerprint.cache_clear()
    yield release
    release.set()
    deadline = time.monotonic() + 10
    while nvml_mod._stuck is not None and nvml_mod._stuck.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    collect_fingerprint.cache_clear()


def test_a_hung_read_returns_at_its_deadline_and_says_why(wedged: threading.Event) -> None:
    t0 = time.monotonic()
    value, status = nvml_mod.with_nvml(nvml_mod.read_use)
    assert time.monotonic() - t0 < 3
    assert value is None and status.hung and not status.available
    assert "did not answer within 0.5 s" in status.reason


def test_no_second_call_starts_while_one_is_stuck(wedged: threading.Event) -> None:
    nvml_mod.with_nvml(nvml_mod.read_use)
    before = threading.active_count()
    t0 = time.monotonic()
    value, status = nvml_mod.with_nvml(nvml_mod.read_use)
    assert time.monotonic() - t0 < 0.4, "the second call waited for its 0.5 s deadline again"
    assert value is None and status.hung and "still not answering" in status.reason
    assert threading.active_count() == before, "a second worker thread was started"
    # once the driver answers again, NVML is read again
    wedged.set()
    nvml_mod._stuck.join(5)  # type: ignore[union-attr]
    fake_nvml.STATE.hang = None
    value, status = nvml_mod.with_nvml(nvml_mod.read_use)
    assert status.available and value is not None and len(value) == 1


def test_preflight_fails_the_gpu_check_rather_than_calling_a_hung_node_cpu_only(wedged: threading.Event) -> None:
    check = check_gpus_idle(None)
    assert check.status == "failed", check
    assert "NVML does not answer" in check.detail and "did not answer within" in check.detail


def test_a_node_whose_nvml_hangs_refuses_to_name_a_hardware_class(wedged: threading.Event) -> None:
    """Not "CPU-only": a daemon that joined as a CPU class on a GPU node would measure the wrong thing."""
    t0 = time.monotonic()
    with pytest.raises(NvmlNotAnswering, match="did not answer within 0.5 s.*cannot say which hardware class"):
        probe_devices()
    assert time.monotonic() - t0 < 5


def test_daemon_probe_exits_nonzero_naming_the_hang(wedged: threading.Event, capsys: pytest.CaptureFixture[str],
                                                    caplog: pytest.LogCaptureFixture) -> None:
    from daemon.cli import main

    assert main(["probe"]) == ExitCode.ERROR
    assert capsys.readouterr().out == "", "nothing half-written on stdout"
    assert "did not answer within" in caplog.text


def test_an_error_inside_the_read_reaches_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvml.install(monkeypatch, [FakeGPU()])

    def boom(nvml: object) -> None:
        raise RuntimeError("driver said no")

    with pytest.raises(RuntimeError, match="driver said no"):
        nvml_mod.with_nvml(boom)


def test_a_bad_deadline_setting_falls_back_to_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for bad in ("abc", "-1", "0", "inf", "nan"):
        monkeypatch.setenv(nvml_mod.DEADLINE_ENV, bad)
        assert nvml_mod.deadline_s() == nvml_mod.DEFAULT_DEADLINE_S
    monkeypatch.setenv(nvml_mod.DEADLINE_ENV, "2.5")
    assert nvml_mod.deadline_s() == 2.5
