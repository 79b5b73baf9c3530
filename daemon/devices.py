"""What a daemon advertises about its devices (``daemon probe`` prints it as JSON).

:func:`probe_devices` reads the node for real: the CPU side from the fingerprint
(:mod:`daemon.fingerprint`), the GPUs through NVML (:mod:`daemon.nvml`, the ``nvidia-ml-py``
package): each GPU's model, memory (total and in use), compute processes, the driver and CUDA
versions, the NVLink/PCIe path of every GPU pair and the interconnect in one phrase, and the GPU
sets (:mod:`daemon.gpusets`) it would hand out for single-GPU trials under its ``max_concurrency``.
A node without GPUs says so plainly: ``"accelerator": "none (CPU-only node)"``, and ``nvml`` says
why NVML did not answer. Nothing is guessed: a reading NVML does not give is ``null``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from daemon.fingerprint import collect_fingerprint
from daemon.gpusets import gpu_sets
from daemon.nvml import read_use, with_nvml
from servetune.result import Fingerprint, GPUTopology

CPU_ONLY = "none (CPU-only node)"


class GPUProcessInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pid: int
    used_mib: int | None = None


class GPUDevice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    index: int
    name: str
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    compute_capability: str | None = None
    processes: list[GPUProcessInfo] = Field(default_factory=list, description="compute processes on it now")


class NodeDevices(BaseModel):
    """A node's devices as its daemon advertises them (JSON through ``model_dump_json``)."""

    model_config = ConfigDict(extra="forbid")

    hostname: str
    hardware_class: str
    accelerator: str = Field(description=f"the GPUs in words, or {CPU_ONLY!r}")
    cpu_model: str
    cpu_count: int
    cpu_isa: str
    ram_gib: float
    nvml: str = Field(description="'ok', or why NVML did not answer on this node")
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    interconnect: str
    gpus: list[GPUDevice] = Field(default_factory=list)
    topology: GPUTopology | None = None
    vllm_version: str | None = None
    max_concurrency: int = 1
    co_tenancy: bool = False
    gpu_sets: list[str] = Field(default_factory=list,
                                description="CUDA_VISIBLE_DEVICES of the sets single-GPU trials would get")


def _accelerator(fp: Fingerprint, via_nvml: bool) -> str:
    if not fp.gpus:
        return CPU_ONLY
    names: dict[str, int] = {}
    for gpu in fp.gpus:
        names[gpu.name] = names.get(gpu.name, 0) + 1
    text = " + ".join(f"{n}x {name}" for name, n in names.items())
    return text + ("" if via_nvml else " (nvidia-smi; no NVML)")


def describe(fp: Fingerprint, nvml_status: str, uses: list[GPUDevice] | None = None, max_concurrency: int = 1,
             co_tenancy: bool = False) -> NodeDevices:
    """The advertisement for fingerprint ``fp`` (pure): ``uses`` replaces the GPUs' static facts with
    NVML's live view (memory in use, processes) where it was read."""
    gpus = uses if uses is not None else [
        GPUDevice(index=g.index, name=g.name, memory_total_mib=g.memory_mib, compute_capability=g.compute_capability)
        for g in fp.gpus]
    topology = fp.gpu_topology
    sets = gpu_sets([g.index for g in fp.gpus], topology.links if topology else [], 1, max_concurrency, co_tenancy)
    return NodeDevices(
        hostname=fp.hostname, hardware_class=fp.hardware_class, accelerator=_accelerator(fp, nvml_status == "ok"),
        cpu_model=fp.cpu_model, cpu_count=fp.cpu_count, cpu_isa=fp.cpu_isa, ram_gib=fp.ram_gib, nvml=nvml_status,
        driver_version=fp.gpus[0].driver if fp.gpus else None,
        cuda_driver_version=topology.cuda_driver_version if topology else None,
        interconnect=topology.interconnect if topology else ("none (CPU-only node)" if not fp.gpus else "unknown"),
        gpus=gpus, topology=topology, vllm_version=fp.vllm_version, max_concurrency=max_concurrency,
        co_tenancy=co_tenancy, gpu_sets=[s.cuda_visible_devices for s in sets],
    )


def probe_devices(vllm_python: str | None = None, max_concurrency: int = 1, co_tenancy: bool = False) -> NodeDevices:
    """Read this node's devices now (the fingerprint part is cached per process)."""
    fp = collect_fingerprint(vllm_python)
    raw, status = with_nvml(read_use)
    uses = None
    if raw is not None and fp.gpus:
        by_index = {g.index: g for g in fp.gpus}
        uses = [GPUDevice(index=u.index, name=by_index[u.index].name if u.index in by_index else "unknown",
                          memory_total_mib=u.memory_total_mib, memory_used_mib=u.memory_used_mib,
                          compute_capability=by_index[u.index].compute_capability if u.index in by_index else None,
                          processes=[GPUProcessInfo(pid=p.pid, used_mib=p.used_mib) for p in u.processes])
                for u in raw]
    return describe(fp, "ok" if status.available else status.reason, uses, max_concurrency, co_tenancy)
