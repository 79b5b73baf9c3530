"""Configs that cannot fit in device memory are pruned before any trial, by one explicit estimate
(servetune/memfit.py), with the reason recorded and shown; nothing is pruned where the device
memory is unknown. Numbers checked against hand arithmetic. No vLLM: plans, the simulator, the store."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from analysis.report import _design_warnings
from coordinator.cli import main
from coordinator.dataset import build_dataset
from coordinator.planning import plan_experiment
from coordinator.store import Store
from servetune.memfit import (
    PRUNE_MARGIN,
    Device,
    MemoryNeed,
    device_for_class,
    memory_need,
    memory_pruner,
    prune_reason,
    resolve_config,
    shape_from_config,
)
from servetune.sim.engine import SimStartError, start
from servetune.sim.profiles import GIB, get_profile, get_shape
from servetune.spec import parse_spec
from servetune.tiny import TINY_MODEL_CONFIG

#: Meta-Llama-3-8B's config.json (the fields the estimate reads)
LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
             "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
             "max_position_embeddings": 8192, "torch_dtype": "bfloat16", "tie_word_embeddings": False}

# Hand arithmetic, Llama-3-8B in bf16:
#   per layer: q,o 4096*4096*2 + k,v 4096*1024*2 + MLP 3*4096*14336 = 218,103,808 params; x32 = 6,979,321,856
#   embeddings + LM head 128256*4096*2 = 1,050,673,152; total 8,029,995,008 params x 2 B = 16,059,990,016 B (16 GB)
LLAMA_WEIGHTS = 16_059_990_016
#   KV per token: 2 (K,V) x 32 layers x 8 heads x 128 x 2 B = 131,072 B; one 8192-token sequence: 1 GiB
LLAMA_KV_8192 = 8192 * 131_072
#   activations at 8192 batched tokens, 256 seqs: 8192*(2*14336 + 4*4096)*2 + 256*128256*4 (float32 logits)
LLAMA_ACT = 8192 * 45056 * 2 + 256 * 128256 * 4  # 738,197,504 + 131,334,144 = 869,531,648


def _llama_need(util: float, tp: int = 1, kv_cache_dtype: str | None = None) -> MemoryNeed:
    dev = device_for_class("1xH100-80GB" if tp == 1 else f"{tp}xH100-80GB")
    assert isinstance(dev, Device)
    shape = shape_from_config(LLAMA3_8B, "llama-3-8b")
    assert not isinstance(shape, str)
    args = {"max_model_len": 8192, "max_num_seqs": 256, "max_num_batched_tokens": 8192,
            "gpu_memory_utilization": util, "tensor_parallel_size": tp}
    return memory_need(resolve_config(args, {}, dev, shape), dev, shape, 1 if kv_cache_dtype else None)


def test_llama3_8b_estimate_matches_hand_arithmetic() -> None:
    need = _llama_need(0.2)
    assert need.weights == LLAMA_WEIGHTS
    assert need.kv_one_sequence == LLAMA_KV_8192 == GIB
    assert need.kv_every_seat == 256 * LLAMA_KV_8192
    assert need.activations == LLAMA_ACT
    assert need.reserved == 1.5 * GIB
    assert need.memory_bytes == 80 * GIB and need.budget == pytest.approx(16 * GIB)
    total = LLAMA_WEIGHTS + LLAMA_ACT + 1.5 * GIB + GIB  # 19,613,876,224 B = 18.27 GiB
    assert need.need == total
    reason = prune_reason(need)
    assert reason is not None
    assert "needs 18.3 GiB (weights 15.0 + activations 0.8 + reserve 1.5 + KV for one 8192-token sequence 1.0)" in reason
    assert "> 80.0 GiB x 0.20 = 16.0 GiB on 1xH100-80GB" in reason and "256 seats full would hold 256.0 GiB" in reason


def test_tensor_parallel_and_fp8_kv_split_the_estimate() -> None:
    tp2 = _llama_need(0.2, tp=2)
    assert tp2.weights == LLAMA_WEIGHTS / 2 and tp2.kv_one_sequence == GIB / 2
    assert tp2.activations == 8192 * 45056 * 2 / 2 + 256 * 128256 * 4
    fp8 = _llama_need(0.2, kv_cache_dtype="fp8")
    assert fp8.kv_one_sequence == GIB / 2 and fp8.weights == LLAMA_WEIGHTS


def test_prune_only_above_the_margin() -> None:
    roomy = _llama_need(0.9)
    assert roomy.fits and prune_reason(roomy) is None
    # 0.22 x 80 GiB = 17.6 GiB < 18.27 GiB needed: vLLM would refuse, but it is within the 10 % margin
    close = _llama_need(0.22)
    assert not close.fits
    assert close.need < close.budget * (1 + PRUNE_MARGIN)
    assert prune_reason(close) is None


def test_tiny_model_estimate_matches_hand_arithmetic() -> None:
    shape = shape_from_config(TINY_MODEL_CONFIG, "tiny")
    assert not isinstance(shape, str)
    # per layer 128*4*32*2 + 128*2*32*2 + 3*128*256 = 147,456; x2 layers + 2048*128*2 = 819,200 params x 2 B
    assert shape.weight_bytes == 1_638_400
    dev = device_for_class("1xT4-15GB")  # no profile for a T4: vLLM's generic defaults (256 seqs, 2048 tokens)
    assert isinstance(dev, Device) and dev.default_max_num_seqs == 256 and dev.default_max_num_batched_tokens == 2048
    need = memory_need(resolve_config({"gpu_memory_utilization": 0.2}, {}, dev, shape), dev, shape)
    # KV: 2 x 2 layers x 2 heads x 32 x 2 B = 512 B per token; 2048 tokens (max_position_embeddings)
    assert need.kv_one_sequence == 2048 * 512
    assert need.activations == 2048 * (2 * 256 + 4 * 128) * 2 + 256 * 2048 * 4
    assert need.need == 1_638_400 + need.activations + 1.5 * GIB + 2048 * 512  # the 1.5 GiB reserve dominates
    assert need.fits and prune_reason(need) is None  # 0.2 x 15 GiB = 3 GiB
    small = memory_need(resolve_config({"gpu_memory_utilization": 0.05}, {}, dev, shape), dev, shape)
    reason = prune_reason(small)  # 0.05 x 15 GiB = 0.75 GiB: the reserve alone does not fit
    assert reason is not None and "needs 1.5 GiB" in reason and "15.0 GiB x 0.05 = 0.8 GiB on 1xT4-15GB" in reason


def test_the_simulator_starts_by_the_same_estimate() -> None:
    profile, shape = get_profile("H100-80G"), get_shape("llama-3-8b")
    for util, fits in ((0.2, False), (0.5, True)):
        args = {"max_model_len": 8192, "gpu_memory_utilization": util}
        need = memory_need(resolve_config(args, {}, profile, shape), profile, shape)
        assert need.fits is fits and (prune_reason(need) is None) is fits
        if fits:
            assert start(args, {}, profile, shape).num_blocks == int(need.kv_available // (shape.kv_bytes_per_token() * 16))
        else:
            with pytest.raises(SimStartError):
                start(args, {}, profile, shape)


SIM_SPEC = textwrap.dedent("""
    name: prune-sim
    model: {source: hub, id: meta-llama/Meta-Llama-3-8B}
    backend: {kind: sim, profile: H100-80G, model_shape: llama-3-8b, noise: false}
    engine:
      fixed: {max_model_len: 8192}
      grid:
        gpu_memory_utilization: [0.2, 0.5, 0.9]
        max_num_seqs: [64, 256]
    load_points:
      - {name: c8, max_concurrency: 8, num_requests: 16, input_len: 256, output_len: 32}
    """)


def test_planning_prunes_what_cannot_fit_and_keeps_the_rest(tmp_path: Path) -> None:
    spec = parse_spec(SIM_SPEC)
    plan = plan_experiment(spec)
    kept = {b.config.args.gpu_memory_utilization for b in plan.batches}
    assert kept == {0.5, 0.9} and len(plan.batches) == 4
    assert sorted(p.config.args.max_num_seqs or 0 for p in plan.pruned) == [64, 256]
    assert all(p.config.args.gpu_memory_utilization == 0.2 for p in plan.pruned)
    assert all("does not fit in device memory: needs 18." in p.reason and "on H100-80G" in p.reason for p in plan.pruned)
    assert not {p.config_id for p in plan.pruned} & {b.config_id for b in plan.batches}
    store = Store.open(tmp_path / "exp")
    try:
        store.record_plan(spec.spec_hash(), spec.model_dump(mode="json"), None, plan)
        recorded = store.pruned_configs(spec.spec_hash())
        ds = build_dataset(store)
        in_dataset = json.loads(str(ds.attrs["pruned_configs"]))
    finally:
        store.close()
    assert {r["config_id"] for r in recorded} == {p.config_id for p in plan.pruned}
    assert all(r["reason"].startswith("does not fit in device memory") for r in recorded)
    assert [(r["config_id"], r["reason"]) for r in in_dataset] == [(p.config_id, p.reason) for p in plan.pruned]
    assert {r["config_label"] for r in in_dataset} == {f"max_num_seqs={n} gpu_mem_util=0.2 max_model_len=8192"
                                                       for n in (64, 256)}
    warnings = [w for w in _design_warnings(ds) if w["code"] == "pruned"]  # the report names them
    assert [w["subject"] for w in warnings] == [f"config {p.config_id[:12]}" for p in plan.pruned]
    assert all("was pruned before any trial, so it has no results: does not fit in device memory" in w["message"]
               for w in warnings)


def test_dry_run_lists_the_pruned_configs_with_their_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(SIM_SPEC)
    assert main(["sweep", str(path), "--dry-run", "--results-root", str(tmp_path / "runs")]) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "4 engine config(s)" in out
    assert "pruned before any trial: 2 engine config(s)" in out
    assert out.count("gpu_mem_util=0.2: does not fit in device memory: needs 18.") == 2
    assert "> 74.5 GiB x 0.20 = 14.9 GiB on H100-80G" in out


def test_hardware_targets_prune_per_target_from_the_models_config_json(tmp_path: Path) -> None:
    model = tmp_path / "llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA3_8B))
    spec = parse_spec(textwrap.dedent(f"""
        name: prune-targets
        model: {{source: path, path: {model}}}
        engine:
          fixed: {{max_model_len: 8192}}
          grid: {{gpu_memory_utilization: [0.2, 0.9]}}
        load_points:
          - {{name: c8, max_concurrency: 8, num_requests: 16, input_len: 256, output_len: 32}}
        hardware:
          targets: [{{hardware_class: 1xH100-80GB}}, {{hardware_class: cpu-16c-AVX512}}]
        """))
    plan = plan_experiment(spec)
    assert [(p.config.args.gpu_memory_utilization, p.hardware_target) for p in plan.pruned] == [(0.2, "1xH100-80GB")]
    assert sorted((b.config.args.gpu_memory_utilization or 0, b.hardware_target or "") for b in plan.batches) == [
        (0.2, "cpu-16c-AVX512"), (0.9, "1xH100-80GB"), (0.9, "cpu-16c-AVX512")]
    assert plan.prune_notes == ("memory: nothing pruned on target cpu-16c-AVX512: hardware class cpu-16c-AVX512 is "
                                "a CPU build (its KV cache is a fixed VLLM_CPU_KVCACHE_SPACE)",)


@pytest.mark.parametrize(("backend", "why"), [
    ("backend: {kind: sim, profile: cpu-tiny}", "sim profile cpu-tiny is a CPU build"),
    ("backend: {kind: vllm}", "the spec names no hardware target"),
    ("hardware: {targets: [{hardware_class: cpu-16c-AVX512}]}", "hardware class cpu-16c-AVX512 is a CPU build"),
    ("hardware: {targets: [{name: big, min_gpu_memory_gib: 40}]}", "a filter bounds the device memory only from below"),
])
def test_unknown_device_memory_prunes_nothing_and_says_why(backend: str, why: str) -> None:
    # on a GPU target of known memory gpu_memory_utilization 0.01 would be pruned (0.01 x 80 GiB < the 1.5 GiB reserve)
    spec = parse_spec(textwrap.dedent(f"""
        name: prune-none
        model: {{source: tiny}}
        engine:
          grid: {{gpu_memory_utilization: [0.01, 0.9], max_num_seqs: [2, 4]}}
        load_points:
          - {{name: c2, max_concurrency: 2, num_requests: 4, input_len: 32, output_len: 8}}
        {backend}
        """))
    plan = plan_experiment(spec)
    assert plan.pruned == () and len({b.config_id for b in plan.batches}) == 4
    assert len(plan.prune_notes) == 1 and why in plan.prune_notes[0]


def test_a_hub_model_is_pruned_by_gpu_count_only_and_says_why() -> None:
    """Its config.json is not read where the sweep is planned, so memory prunes nothing (0.2 x 80 GiB
    would be pruned for Llama-3-8B above), but tensor_parallel_size still cannot exceed a target's GPUs."""
    text = SIM_SPEC.replace("backend: {kind: sim, profile: H100-80G, model_shape: llama-3-8b, noise: false}",
                            "hardware: {targets: [{hardware_class: 1xH100-80GB}, {hardware_class: 2xH100-80GB}]}")
    spec = parse_spec(text)
    pruner, notes = memory_pruner(spec)
    assert pruner is not None and notes == (
        "memory: no engine config pruned by memory: the model's config.json of hub model meta-llama/Meta-Llama-3-8B "
        "is not read where the sweep is planned; tensor_parallel_size is still checked against each target's GPU count",)
    assert plan_experiment(spec).pruned == (), "tensor_parallel_size 1 fits everywhere; memory is not judged"
    tp = parse_spec(text.replace("max_num_seqs: [64, 256]", "tensor_parallel_size: [1, 2, 4]"))
    plan = plan_experiment(tp)
    pruned = sorted((p.hardware_target, p.config.args.tensor_parallel_size, p.reason) for p in plan.pruned)
    assert pruned == [
        *[("1xH100-80GB", n, f"needs {n} devices (tensor_parallel_size) but 1xH100-80GB has 1") for n in (2, 2, 2, 4, 4, 4)],
        *[("2xH100-80GB", 4, "needs 4 devices (tensor_parallel_size) but 2xH100-80GB has 2")] * 3], pruned
    kept = {(b.hardware_target, b.config.args.tensor_parallel_size) for b in plan.batches}
    assert kept == {("1xH100-80GB", 1), ("2xH100-80GB", 1), ("2xH100-80GB", 2)}


def test_preview_names_the_pruned_configs(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVETUNE_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "spec.yaml"
    path.write_text(SIM_SPEC)
    assert main(["sweep", str(path), "--preview"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.count("pruned before any trial (not simulated, no start paid): ") == 2
    assert "SIMULATED cost on H100-80G: 4 server starts" in out
    assert "would not start" not in out  # the simulator is never asked to start what was pruned


def test_pruned_configs_are_named_by_the_decision_the_ranking_and_the_dashboard(tmp_path: Path) -> None:
    """A sweep on the simulator: the pruned configs have no results, and recommend, rank and the
    decision block the Decision page and the report render (dashboards.decision_view) each name them."""
    import subprocess

    import analysis
    from analysis.common import jsonable
    from analysis.decision import recommend
    from analysis.ranking import rank
    from dashboards.decision_view import decision_html
    from tests.conftest import cli_env, coordinator_cmd

    path, root = tmp_path / "spec.yaml", tmp_path / "runs"
    path.write_text(SIM_SPEC)
    proc = subprocess.run(coordinator_cmd("sweep", str(path), "--results-root", str(root)),
                          capture_output=True, text=True, timeout=300, env=cli_env(tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    ds = analysis.load("prune-sim", results_root=root)
    pruned = {p.config_id for p in plan_experiment(parse_spec(SIM_SPEC)).pruned}
    assert len(pruned) == 2 and not pruned & set(ds.config_id.values.tolist()), "pruned configs never ran"
    subjects = {f"config {c[:12]}" for c in pruned}
    decision = recommend(ds, n_boot=50)
    for result in (decision, rank(ds)):
        named = [w for w in result.warnings if w.code == "pruned"]
        assert {w.subject for w in named} == subjects
        assert all("was pruned before any trial, so it has no results: does not fit" in w.message for w in named)
    html = decision_html(jsonable(decision), {}, {})
    assert all(s in html for s in subjects) and html.count("was pruned before any trial") == 2
    # the full analysis (report, analyze) gathers every section's caveats: each pruned config once
    from analysis.report import analyze

    doc = analyze(ds, n_boot=20)
    assert sorted(w["subject"] for w in doc["warnings"] if w["code"] == "pruned") == sorted(subjects)
