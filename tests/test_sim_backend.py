"""The `sim` backend end to end: a small sweep through the real coordinator and a child daemon,
SIMULATED (no vLLM anywhere), plus the spec rules of the backend."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

import analysis
from servetune.errors import SpecError
from servetune.spec import parse_spec
from tests.conftest import cli_env, coordinator_cmd

SPEC = textwrap.dedent(
    """
    name: simsweep
    model: {source: tiny}
    backend: {kind: sim}
    engine:
      grid: {max_num_seqs: [2, 32], gpu_memory_utilization: [0.9]}
      configs:
        - {max_num_seqs: 64, env: {VLLM_CPU_KVCACHE_SPACE: "0.0005"}}
    load_points:
      - {name: c32, max_concurrency: 32, num_requests: 64, input_len: 128, output_len: 32}
    """
)


def test_spec_rules_for_the_sim_backend() -> None:
    spec = parse_spec(SPEC)
    assert spec.backend.kind == "sim" and spec.backend.sim_target() == "sim:cpu-tiny/tiny"
    with pytest.raises(SpecError, match="is not a sim profile; profiles: A100-80G"):
        parse_spec(SPEC.replace("{kind: sim}", "{kind: sim, profile: B300}"))
    with pytest.raises(SpecError, match="only apply to backend.kind 'sim'"):
        parse_spec(SPEC.replace("{kind: sim}", "{kind: vllm, profile: H200}"))
    other = parse_spec(SPEC.replace("{kind: sim}", "{kind: sim, profile: H200, model_shape: llama-3-8b}"))
    assert other.spec_hash() != spec.spec_hash()


def test_a_sim_sweep_through_the_coordinator_and_a_daemon(tmp_path: Path, tiny_cache: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    proc = subprocess.run(coordinator_cmd("sweep", str(spec), "--results-root", str(tmp_path / "runs")),
                          capture_output=True, text=True, timeout=300, env=cli_env(tiny_cache))
    assert proc.returncode == 0, proc.stderr[-3000:]
    label = "SIMULATED (profile cpu-tiny: uncalibrated (rough figures from DESIGN.md tiny-model runs, not fitted))"
    assert f"{label}: every figure below is the simulated vLLM's" in proc.stdout
    assert proc.stdout.count(f"{label} load point c32") == 1, "the ranked table's title says SIMULATED"
    ds = analysis.load("simsweep", results_root=tmp_path / "runs")
    assert ds.attrs["simulated"] == label
    assert set(ds.backend.values) == {"sim"}
    assert set(ds.hardware_class.values) == {"sim-1xcpu-tiny"}
    status = dict(zip(ds.param_max_num_seqs.values.tolist(), ds.status.values.tolist()))
    assert status == {2: "ok", 32: "ok", 64: "failed"}
    failed = ds.where(ds.status == "failed", drop=True)
    assert list(failed.failure_kind.values) == ["measurement"]
    assert "KV cache too small for max_model_len (2048)" in str(failed.error.values[0])
    assert "the estimated maximum model length is 1040" in str(failed.error.values[0])
    ok = ds.where(ds.status == "ok", drop=True)
    assert all(int(n) == 64 for n in ok.n_completed.values)
    thr = dict(zip(ok.param_max_num_seqs.values.tolist(), ok.output_throughput.values.tolist()))
    assert thr[32] > 2 * thr[2], thr
    assert not (tmp_path / "runs" / "simsweep" / "daemon" / "servers.jsonl").exists(), "no server may be started"
