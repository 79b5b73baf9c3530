"""FAKE NVML: a stand-in for the ``pynvml`` module (``nvidia-ml-py``) for tests. No GPU exists here.

It is a FAKE, named as one: it answers the handful of NVML calls servetune makes
(:mod:`daemon.nvml`) from a configured set of made-up GPUs, with the call shapes and error class of
the real module (``nvidia-ml-py`` 13). Nothing in it measures anything.

Inject it in-process with :func:`install` (puts this module in ``sys.modules["pynvml"]``; pass
pytest's ``monkeypatch`` so it is undone), or in a child process with
``SERVETUNE_TEST_NVML_MODULE=tests.fakes.fake_nvml`` plus ``FAKE_NVML_CONFIG=/path/to/gpus.json``
(a JSON list of :class:`FakeGPU` fields, ``nvlinks`` as ``{"1": 18}``, and optionally
``{"gpus": [...], "paths": {"0-1": 10}}``).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_NVLINK_MAX_LINKS = 36
NVML_FEATURE_ENABLED = 1
NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_SYSTEM = 50
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_LIBRARY_NOT_FOUND = 12

MIB = 1024 * 1024


class NVMLError(Exception):
    """As ``pynvml.NVMLError``: carries ``value``, the NVML return code."""

    def __init__(self, value: int, text: str = ""):
        super().__init__(text or f"fake NVML error {value}")
        self.value = value


@dataclass
class FakeProcess:
    pid: int
    usedGpuMemory: int  # bytes, the real field name


@dataclass
class FakeGPU:
    """One made-up GPU. ``nvlinks``: other GPU index -> active NVLink links to it."""

    name: str = "NVIDIA H100 80GB HBM3"
    memory_mib: int = 81559
    used_mib: int = 0
    compute_capability: tuple[int, int] = (9, 0)
    processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, used MiB)
    nvlinks: dict[int, int] = field(default_factory=dict)
    power_w: float = 70.0
    temperature_c: float = 35.0
    sm_clock_mhz: float = 1980.0
    power_supported: bool = True


@dataclass
class _Memory:
    total: int
    free: int
    used: int


@dataclass
class _Pci:
    busId: str


@dataclass
class _State:
    gpus: list[FakeGPU] = field(default_factory=list)
    #: (a, b) with a < b -> NVML topology level; unset pairs are NVML_TOPOLOGY_HOSTBRIDGE
    paths: dict[tuple[int, int], int] = field(default_factory=dict)
    driver: str = "550.54.15"
    cuda: int = 12040
    library_found: bool = True
    initialised: int = 0
    calls: int = 0
    #: a wedged driver: every memory query blocks until this event is set (None: answers at once)
    hang: threading.Event | None = None


STATE = _State()


def configure(gpus: list[FakeGPU], *, paths: dict[tuple[int, int], int] | None = None, driver: str = "550.54.15",
              cuda: int = 12040, library_found: bool = True) -> None:
    """Replace the fake node's GPUs (and their PCIe paths, driver and CUDA versions)."""
    global STATE
    STATE = _State(gpus=list(gpus), paths=dict(paths or {}), driver=driver, cuda=cuda, library_found=library_found)


def install(monkeypatch: Any, gpus: list[FakeGPU], **kwargs: Any) -> Any:
    """Configure the fake and put it in ``sys.modules["pynvml"]`` through ``monkeypatch``."""
    configure(gpus, **kwargs)
    monkeypatch.setitem(sys.modules, "pynvml", sys.modules[__name__])
    return sys.modules[__name__]


def _load_env_config() -> None:
    path = os.environ.get("FAKE_NVML_CONFIG")
    if not path:
        return
    with open(path, encoding="utf-8") as fh:
        raw = json.load(fh)
    items = raw["gpus"] if isinstance(raw, dict) else raw
    gpus = []
    for item in items:
        item = dict(item)
        item["nvlinks"] = {int(k): int(v) for k, v in item.get("nvlinks", {}).items()}
        item["processes"] = [tuple(p) for p in item.get("processes", [])]
        item["compute_capability"] = tuple(item.get("compute_capability", (9, 0)))
        gpus.append(FakeGPU(**item))
    paths = {}
    if isinstance(raw, dict):
        for key, level in raw.get("paths", {}).items():
            a, b = (int(x) for x in key.split("-"))
            paths[(min(a, b), max(a, b))] = int(level)
    configure(gpus, paths=paths)


# ----------------------------------------------------------------------------- the NVML calls


def _gpu(handle: int) -> FakeGPU:
    if STATE.initialised <= 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED, "Uninitialized")
    STATE.calls += 1
    return STATE.gpus[handle]


def nvmlInit() -> None:
    if not STATE.library_found:
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found")
    STATE.initialised += 1


def nvmlShutdown() -> None:
    STATE.initialised = max(0, STATE.initialised - 1)


def nvmlSystemGetDriverVersion() -> str:
    return STATE.driver


def nvmlSystemGetCudaDriverVersion() -> int:
    return STATE.cuda


def nvmlDeviceGetCount() -> int:
    if STATE.initialised <= 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED, "Uninitialized")
    return len(STATE.gpus)


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    if not 0 <= index < nvmlDeviceGetCount():
        raise NVMLError(2, "Invalid Argument")
    return index


def nvmlDeviceGetName(handle: int) -> str:
    return _gpu(handle).name


def nvmlDeviceGetCudaComputeCapability(handle: int) -> tuple[int, int]:
    return _gpu(handle).compute_capability


def nvmlDeviceGetMemoryInfo(handle: int) -> _Memory:
    gpu = _gpu(handle)
    if STATE.hang is not None:
        STATE.hang.wait()
    used = gpu.used_mib + sum(mib for _, mib in gpu.processes)
    return _Memory(total=gpu.memory_mib * MIB, free=(gpu.memory_mib - used) * MIB, used=used * MIB)


def nvmlDeviceGetComputeRunningProcesses(handle: int) -> list[FakeProcess]:
    return [FakeProcess(pid, mib * MIB) for pid, mib in _gpu(handle).processes]


def nvmlDeviceGetPciInfo(handle: int) -> _Pci:
    _gpu(handle)
    return _Pci(busId=f"00000000:{0x18 + handle:02X}:00.0")


def nvmlDeviceGetNvLinkState(handle: int, link: int) -> int:
    gpu = _gpu(handle)
    if not gpu.nvlinks:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED, "Not Supported")
    return NVML_FEATURE_ENABLED if link < sum(gpu.nvlinks.values()) else 0


def nvmlDeviceGetNvLinkRemotePciInfo(handle: int, link: int) -> _Pci:
    gpu = _gpu(handle)
    seen = 0
    for other, count in sorted(gpu.nvlinks.items()):
        if link < seen + count:
            return nvmlDeviceGetPciInfo(other)
        seen += count
    raise NVMLError(NVML_ERROR_NOT_SUPPORTED, "Not Supported")


def nvmlDeviceGetTopologyCommonAncestor(a: int, b: int) -> int:
    _gpu(a), _gpu(b)
    if a == b:
        return NVML_TOPOLOGY_INTERNAL
    return STATE.paths.get((min(a, b), max(a, b)), NVML_TOPOLOGY_HOSTBRIDGE)


def nvmlDeviceGetPowerUsage(handle: int) -> int:
    gpu = _gpu(handle)
    if not gpu.power_supported:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED, "Not Supported")
    return int(gpu.power_w * 1000)  # milliwatts, as NVML


def nvmlDeviceGetTemperature(handle: int, sensor: int) -> int:
    return int(_gpu(handle).temperature_c)


def nvmlDeviceGetClockInfo(handle: int, clock: int) -> int:
    return int(_gpu(handle).sm_clock_mhz)


_load_env_config()
