"""Device advertisement and GPU sets: the NVML path with the FAKE NVML (no GPU exists here), the
CPU path read for real on this machine, and the pure GPU-set allocation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from daemon.cli import main as cli_main
from daemon.devices import CPU_ONLY, probe_devices
from daemon.fingerprint import collect_fingerprint
from daemon.gpusets import GPUSetError, gpu_sets
from daemon.nvml import NVML_MODULE_ENV
from servetune.result import GPULink
from tests.fakes import fake_nvml
from tests.fakes.fake_nvml import NVML_TOPOLOGY_SINGLE, NVML_TOPOLOGY_SYSTEM, FakeGPU

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _fresh_fingerprint():
    collect_fingerprint.cache_clear()
    yield
    collect_fingerprint.cache_clear()


def four_gpus() -> list[FakeGPU]:
    """FAKE: two NVLink pairs (0-1 and 2-3, 18 links each), PCIe between the pairs."""
    return [
        FakeGPU(nvlinks={1: 18}, processes=[(4242, 1024)]),
        FakeGPU(nvlinks={0: 18}),
        FakeGPU(nvlinks={3: 18}),
        FakeGPU(nvlinks={2: 18}),
    ]


def test_nvml_path_advertises_models_memory_versions_and_topology(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvml.install(monkeypatch, four_gpus(), paths={(0, 2): NVML_TOPOLOGY_SYSTEM, (0, 1): NVML_TOPOLOGY_SINGLE})
    dev = probe_devices()
    assert dev.nvml == "ok"
    assert dev.accelerator == "4x NVIDIA H100 80GB HBM3"
    assert dev.hardware_class == "4xH100-80GB"
    assert dev.driver_version == "550.54.15" and dev.cuda_driver_version == "12.4"
    assert [g.memory_total_mib for g in dev.gpus] == [81559] * 4
    assert dev.gpus[0].memory_used_mib == 1024 and dev.gpus[0].processes[0].pid == 4242
    assert dev.gpus[1].processes == []
    links = {(link.a, link.b): link for link in dev.topology.links}
    assert len(links) == 6
    assert links[(0, 1)].nvlinks == 18 and links[(2, 3)].nvlinks == 18
    assert links[(0, 2)].nvlinks == 0 and links[(0, 2)].path == "system (across sockets)"
    assert links[(0, 1)].path == "single PCIe switch" and links[(1, 3)].path == "host bridge"
    assert dev.interconnect == "NVLink (some pairs) + PCIe"
    assert dev.gpu_sets == ["0"]
    json.loads(dev.model_dump_json())  # JSON-able


def test_topology_rides_on_the_fingerprint(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvml.install(monkeypatch, [FakeGPU(nvlinks={1: 12}), FakeGPU(nvlinks={0: 12})])
    fp = collect_fingerprint()
    assert fp.gpu_topology is not None
    assert fp.gpu_topology.interconnect == "NVLink"
    assert fp.gpu_topology.links[0].nvlinks == 12
    assert fp.gpus[0].compute_capability == "9.0"


def test_single_pcie_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvml.install(monkeypatch, [FakeGPU(name="NVIDIA L4", memory_mib=23034)])
    dev = probe_devices()
    assert dev.interconnect == "single GPU" and dev.topology.links == []
    assert dev.hardware_class == "1xL4-22GB"


def test_cpu_path_for_real() -> None:
    """This machine has no GPU: read for real, it says so plainly."""
    dev = probe_devices()
    assert dev.accelerator == CPU_ONLY
    assert dev.gpus == [] and dev.topology is None
    assert dev.nvml != "ok" and ("NVML" in dev.nvml or "nvidia-ml-py" in dev.nvml)
    assert dev.cpu_count >= 1 and dev.ram_gib > 0
    assert dev.hardware_class.startswith("cpu-")
    assert dev.gpu_sets == [""]


def test_no_nvml_bindings_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NVML_MODULE_ENV, "no_such_nvml_module_here")
    dev = probe_devices()
    assert "no NVML bindings" in dev.nvml and dev.accelerator == CPU_ONLY


def test_probe_prints_json_for_real_on_this_cpu_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["probe", "--workdir", str(tmp_path / "w")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["devices"]["accelerator"] == CPU_ONLY
    assert doc["preflight"]["ok"] is True


def test_probe_command_with_the_fake_nvml_in_a_child_process(tmp_path: Path) -> None:
    cfg = tmp_path / "gpus.json"
    cfg.write_text(json.dumps([{"name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "processes": [[999, 30000]]}]))
    env = {**os.environ, "PYTHONPATH": str(REPO), NVML_MODULE_ENV: "tests.fakes.fake_nvml", "FAKE_NVML_CONFIG": str(cfg)}
    out = subprocess.run([sys.executable, "-m", "daemon", "probe", "--workdir", str(tmp_path / "w")],
                         capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert out.returncode == 0, out.stderr  # probe reports; it does not judge
    doc = json.loads(out.stdout)
    assert doc["devices"]["accelerator"] == "1x NVIDIA A100-SXM4-80GB"
    assert doc["devices"]["gpus"][0]["processes"] == [{"pid": 999, "used_mib": 30000}]
    assert doc["preflight"]["ok"] is False  # the FAKE GPU runs someone else's process
    assert "pid 999" in doc["preflight"]["summary"]


# ----------------------------------------------------------------------------- GPU sets (pure)


def _links(nvlinked: set[tuple[int, int]], n: int) -> list[GPULink]:
    return [GPULink(a=a, b=b, nvlinks=18 if (a, b) in nvlinked else 0, path="host bridge")
            for a in range(n) for b in range(a + 1, n)]


def test_sets_are_disjoint_and_prefer_nvlink() -> None:
    links = _links({(0, 3), (1, 2)}, 4)
    sets = gpu_sets(range(4), links, tensor_parallel_size=2, max_concurrency=2)
    assert [s.cuda_visible_devices for s in sets] == ["0,3", "1,2"]
    assert all(s.nvlink and not s.shared for s in sets)
    assert not set(sets[0].gpus) & set(sets[1].gpus)


def test_nvlink_set_wins_over_lower_indices() -> None:
    sets = gpu_sets(range(8), _links({(5, 6), (4, 5), (4, 6)}, 8), tensor_parallel_size=3)
    assert sets[0].cuda_visible_devices == "4,5,6" and sets[0].nvlink


def test_pcie_path_breaks_ties_without_nvlink() -> None:
    links = [GPULink(a=0, b=1, path="system (across sockets)"), GPULink(a=0, b=2, path="single PCIe switch"),
             GPULink(a=1, b=2, path="host bridge")]
    assert gpu_sets(range(3), links, 2)[0].cuda_visible_devices == "0,2"


def test_too_few_gpus_fewer_sets_without_cotenancy() -> None:
    sets = gpu_sets([0, 1, 2], [], tensor_parallel_size=2, max_concurrency=3)
    assert [s.cuda_visible_devices for s in sets] == ["0,1"]


def test_cotenancy_only_when_declared() -> None:
    sets = gpu_sets([0], [], 1, max_concurrency=3, co_tenancy=True)
    assert [s.cuda_visible_devices for s in sets] == ["0", "0", "0"] and all(s.shared for s in sets)
    assert len(gpu_sets([0], [], 1, max_concurrency=3)) == 1
    assert [s.shared for s in gpu_sets([0, 1], [], 1, max_concurrency=2, co_tenancy=True)] == [False, False]


def test_cpu_only_node_is_one_device() -> None:
    assert [s.cuda_visible_devices for s in gpu_sets([], [], 1, max_concurrency=4)] == [""]
    assert len(gpu_sets([], [], 1, max_concurrency=2, co_tenancy=True)) == 2


def test_tensor_parallel_larger_than_node() -> None:
    with pytest.raises(GPUSetError, match="tensor_parallel_size 4 needs 4 GPUs; this node has 2"):
        gpu_sets([0, 1], [], 4)


def test_many_gpus_greedy_stays_disjoint() -> None:
    n = 64
    sets = gpu_sets(range(n), _links({(i, i + 1) for i in range(0, n, 2)}, n), 2, max_concurrency=32)
    assert len(sets) == 32
    assert sorted(g for s in sets for g in s.gpus) == list(range(n))
    assert all(s.nvlink for s in sets)


def test_server_env_pins_the_set_in_nvml_order() -> None:
    from daemon.gpusets import GPUSet, server_env

    assert server_env(GPUSet((2, 3)), {}, {}) == {"CUDA_VISIBLE_DEVICES": "2,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert server_env(GPUSet((2, 3)), {"CUDA_VISIBLE_DEVICES": "0"}, {}) == {}, "the spec's own choice wins"
    assert server_env(GPUSet((2, 3)), {}, {"CUDA_VISIBLE_DEVICES": "1"}) == {}, "the operator's restriction wins"
    assert server_env(None, {}, {}) == {} and server_env(GPUSet(()), {}, {}) == {}
