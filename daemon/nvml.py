"""NVML through ``pynvml`` (the ``nvidia-ml-py`` package): the one place the daemon talks to it.

:func:`nvml_session` opens NVML (``nvmlInit``/``nvmlShutdown``; NVML counts the openings, so
sessions may nest and run on several threads) and yields the module, or ``None`` with the reason
where there is no NVML: no ``pynvml`` installed, no driver (a CPU-only node), or an init error.
The readers take that module and never raise for one GPU that does not support a query: its
reading is ``None``. :func:`with_nvml` runs a session and a reader on a worker thread within a
deadline (``SERVETUNE_NVML_DEADLINE_S``, default 10 s): a wedged driver makes NVML calls block
for minutes (``nvidia-smi`` hangs the same way), and the daemon must keep answering its
coordinator; a call past its deadline reads as "NVML did not answer", and while it is still stuck
no second one is started.

``SERVETUNE_TEST_NVML_MODULE`` (test-only) names another module to use instead of ``pynvml``:
the tests' FAKE NVML (``tests/fakes/fake_nvml.py``), since no GPU exists where they run.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from servetune.errors import ServetuneError
from servetune.result import GPUInfo, GPULink, GPUTopology

log = logging.getLogger(__name__)

#: Test-only: a module to import instead of ``pynvml`` (the tests' fake NVML).
NVML_MODULE_ENV = "SERVETUNE_TEST_NVML_MODULE"
MIB = 1024 * 1024
_MAX_NVLINKS = 36  # NVML_NVLINK_MAX_LINKS of nvidia-ml-py 13

#: NVML_TOPOLOGY_* levels (the common ancestor of two GPUs) in words.
PATH_NAMES = {0: "internal", 10: "single PCIe switch", 20: "multiple PCIe switches", 30: "host bridge",
              40: "NUMA node", 50: "system (across sockets)"}


@dataclass(frozen=True)
class NvmlStatus:
    """Whether NVML answered here, and if not, why (for the record: never a guess)."""

    available: bool
    reason: str = ""
    #: NVML was there but did not answer within its deadline (a driver is loaded: not a CPU-only node)
    hung: bool = False


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def load_module() -> tuple[Any | None, str]:
    """The NVML module (``pynvml``, or the test override) and an empty reason, or None and why not."""
    name = os.environ.get(NVML_MODULE_ENV) or "pynvml"
    try:
        return importlib.import_module(name), ""
    except ImportError as exc:
        return None, f"no NVML bindings ({name} not importable: {exc}); install nvidia-ml-py"


@contextmanager
def nvml_session() -> Iterator[tuple[Any | None, NvmlStatus]]:
    """``(module, status)``: the module is None (and ``status.reason`` says why) without NVML."""
    nvml, reason = load_module()
    if nvml is None:
        yield None, NvmlStatus(False, reason)
        return
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        yield None, NvmlStatus(False, f"NVML did not initialise ({exc}): no NVIDIA driver on this node")
        return
    try:
        yield nvml, NvmlStatus(True)
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception as exc:
            log.debug("nvmlShutdown: %s", exc)


T = TypeVar("T")
DEADLINE_ENV = "SERVETUNE_NVML_DEADLINE_S"
DEFAULT_DEADLINE_S = 10.0
_stuck_lock = threading.Lock()
_stuck: threading.Thread | None = None  # the worker of a call that ran past its deadline, while it lives


class NvmlNotAnswering(ServetuneError):
    """NVML is there but does not answer: this node's GPUs cannot be told, so it cannot say what it is."""


def deadline_s() -> float:
    """The NVML deadline in seconds (``SERVETUNE_NVML_DEADLINE_S``; a bad value is the default, logged)."""
    raw = os.environ.get(DEADLINE_ENV, "")
    try:
        value = float(raw) if raw else DEFAULT_DEADLINE_S
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        log.warning("%s=%r is not a positive number of seconds; using %.0f s", DEADLINE_ENV, raw, DEFAULT_DEADLINE_S)
        return DEFAULT_DEADLINE_S
    return value


def with_nvml(work: Callable[[Any], T], timeout_s: float | None = None) -> tuple[T | None, NvmlStatus]:
    """``(work(nvml), status)`` inside an NVML session, or ``(None, status)`` without NVML or past the
    deadline. An exception from ``work`` is raised here, as if it had run on this thread."""
    global _stuck
    limit = deadline_s() if timeout_s is None else timeout_s
    with _stuck_lock:
        if _stuck is not None and _stuck.is_alive():
            return None, NvmlStatus(False, "an earlier NVML call is still not answering (a hung driver?)", hung=True)
        _stuck = None
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            with nvml_session() as (nvml, status):
                box["status"] = status
                if nvml is not None:
                    box["value"] = work(nvml)
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=run, name="servetune-nvml", daemon=True)
    worker.start()
    worker.join(limit)
    if worker.is_alive():
        with _stuck_lock:
            _stuck = worker
        log.warning("NVML did not answer within %.1f s; treating it as unavailable until it does", limit)
        return None, NvmlStatus(False, f"NVML did not answer within {limit:g} s (a hung driver?)", hung=True)
    if "error" in box:
        raise box["error"]
    return box.get("value"), box["status"]


def _try(call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except Exception as exc:  # NVMLError_NotSupported and friends: no reading, not a failure
        log.debug("%s%s: %s", getattr(call, "__name__", call), args, exc)
        return None


def read_gpu_info(nvml: Any) -> list[GPUInfo]:
    """Every GPU's model, memory, driver and compute capability."""
    driver = _text(nvml.nvmlSystemGetDriverVersion())
    gpus = []
    for i in range(int(nvml.nvmlDeviceGetCount())):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        cc = _try(nvml.nvmlDeviceGetCudaComputeCapability, handle)
        gpus.append(GPUInfo(
            index=i, name=_text(nvml.nvmlDeviceGetName(handle)),
            memory_mib=int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // MIB, driver=driver,
            compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
        ))
    return gpus


def cuda_driver_version(nvml: Any) -> str | None:
    """The CUDA version the driver supports (``12040`` -> ``12.4``)."""
    value = _try(nvml.nvmlSystemGetCudaDriverVersion)
    if value is None:
        return None
    value = int(value)
    return f"{value // 1000}.{(value % 1000) // 10}"


def _nvlinks(nvml: Any, handles: list[Any]) -> dict[tuple[int, int], int]:
    """Active NVLink links per GPU pair (a < b), from each link's remote PCI bus id."""
    bus = {}
    for i, h in enumerate(handles):
        info = _try(nvml.nvmlDeviceGetPciInfo, h)
        if info is not None:
            bus[_text(info.busId).lower()] = i
    seen: dict[tuple[int, int], int] = {}  # (from, to) -> links seen from `from`
    for i, h in enumerate(handles):
        for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", _MAX_NVLINKS))):
            state = _try(nvml.nvmlDeviceGetNvLinkState, h, link)
            if state is None:
                break  # no NVLink on this GPU (or no more links)
            if not state:
                continue
            remote = _try(nvml.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
            j = bus.get(_text(remote.busId).lower()) if remote is not None else None
            if j is not None and j != i:
                seen[(i, j)] = seen.get((i, j), 0) + 1
    # each link is seen from both ends: a pair has the larger of the two counts
    pairs = {(min(i, j), max(i, j)) for i, j in seen}
    return {(a, b): max(seen.get((a, b), 0), seen.get((b, a), 0)) for a, b in pairs}


def interconnect(links: list[GPULink], n_gpus: int) -> str:
    """One phrase for the node's GPU interconnect."""
    if n_gpus == 0:
        return "none (no GPU)"
    if n_gpus == 1:
        return "single GPU"
    nv = sum(1 for link in links if link.nvlinks)
    if nv == len(links):
        return "NVLink"
    if nv:
        return "NVLink (some pairs) + PCIe"
    return "PCIe"


def read_topology(nvml: Any) -> GPUTopology:
    """NVLink links and the PCIe path of every GPU pair, the interconnect and the CUDA version."""
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(int(nvml.nvmlDeviceGetCount()))]
    nv = _nvlinks(nvml, handles)
    links = []
    for a in range(len(handles)):
        for b in range(a + 1, len(handles)):
            level = _try(nvml.nvmlDeviceGetTopologyCommonAncestor, handles[a], handles[b])
            path = PATH_NAMES.get(int(level), f"level {level}") if level is not None else "unknown"
            links.append(GPULink(a=a, b=b, nvlinks=nv.get((a, b), 0), path=path))
    return GPUTopology(cuda_driver_version=cuda_driver_version(nvml), interconnect=interconnect(links, len(handles)),
                       links=links)


@dataclass(frozen=True)
class GPUProcess:
    pid: int
    used_mib: int | None


@dataclass(frozen=True)
class GPUUse:
    """What runs on one GPU now: memory in use and its compute processes."""

    index: int
    memory_total_mib: int
    memory_used_mib: int
    processes: tuple[GPUProcess, ...]


def read_use(nvml: Any) -> list[GPUUse]:
    """Memory in use and compute processes of every GPU."""
    out = []
    for i in range(int(nvml.nvmlDeviceGetCount())):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        mem = nvml.nvmlDeviceGetMemoryInfo(handle)
        procs = _try(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
        out.append(GPUUse(
            index=i, memory_total_mib=int(mem.total) // MIB, memory_used_mib=int(mem.used) // MIB,
            processes=tuple(GPUProcess(int(p.pid), int(p.usedGpuMemory) // MIB
                                       if isinstance(getattr(p, "usedGpuMemory", None), int) else None)
                            for p in procs),
        ))
    return out


@dataclass(frozen=True)
class GPUReading:
    """One telemetry reading of one GPU; None where NVML does not support the query."""

    index: int
    power_w: float | None
    temperature_c: float | None
    sm_clock_mhz: float | None
    memory_used_mib: float | None


def read_telemetry(nvml: Any, indices: list[int]) -> list[GPUReading]:
    """Power (W), temperature (C), SM clock (MHz) and memory used (MiB) of the GPUs ``indices``."""
    temp_sensor = int(getattr(nvml, "NVML_TEMPERATURE_GPU", 0))
    sm_clock = int(getattr(nvml, "NVML_CLOCK_SM", 1))
    out = []
    for i in indices:
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        power = _try(nvml.nvmlDeviceGetPowerUsage, h)
        temp = _try(nvml.nvmlDeviceGetTemperature, h, temp_sensor)
        clock = _try(nvml.nvmlDeviceGetClockInfo, h, sm_clock)
        mem = _try(nvml.nvmlDeviceGetMemoryInfo, h)
        out.append(GPUReading(
            index=i, power_w=power / 1000.0 if power is not None else None,
            temperature_c=float(temp) if temp is not None else None,
            sm_clock_mhz=float(clock) if clock is not None else None,
            memory_used_mib=int(mem.used) / MIB if mem is not None else None,
        ))
    return out
