"""The benchmark's response surfaces: five simulated experiments (GPU profile, model shape, workload,
SLOs, a grid of >= 200 engine configs), each one load point, one repeat. SIMULATED."""

from __future__ import annotations

from typing import Any

from servetune.spec import ExperimentSpec

_MNS = [8, 16, 32, 64, 128, 256]


def _spec(name: str, profile: str, shape: str, grid: dict[str, list[Any]], load_point: dict[str, Any],
          slos: list[dict[str, Any]], objective: str) -> dict[str, Any]:
    return {
        "name": f"searchbench-{name}",
        "model": {"source": "tiny"},  # the sim backend serves the model shape; the model is not loaded
        "backend": {"kind": "sim", "profile": profile, "model_shape": shape},
        "engine": {"grid": grid},
        "load_points": [{"name": name, **load_point}],
        "slos": slos,
        "ranking": {"objective": objective, "require_slos": True},
        "repeats": 1,
        "planner": {"kind": "grid", "randomize": False},
    }


SURFACES: dict[str, dict[str, Any]] = {
    # 6 x 6 x 2 x 3 = 216: closed loop, long prompts, TTFT-bound
    "h100-8b-long-prompt": _spec(
        "h100-8b-long-prompt", "H100-80G", "llama-3-8b",
        {"max_model_len": [4096], "max_num_seqs": _MNS, "max_num_batched_tokens": [512, 1024, 2048, 4096, 8192, 16384],
         "enable_chunked_prefill": [True, False], "gpu_memory_utilization": [0.8, 0.9, 0.95]},
        {"max_concurrency": 128, "num_requests": 256, "input_len": 1024, "output_len": 128},
        [{"metric": "ttft_ms", "percentile": 99, "max_ms": 4000}], "output_throughput"),
    # 6 x 6 x 2 x 3 = 216: closed loop, chat-like, goodput under TTFT and TPOT SLOs
    "a100-8b-chat-goodput": _spec(
        "a100-8b-chat-goodput", "A100-80G", "llama-3-8b",
        {"max_model_len": [4096], "max_num_seqs": _MNS, "max_num_batched_tokens": [256, 512, 1024, 2048, 4096, 8192],
         "enable_chunked_prefill": [True, False], "gpu_memory_utilization": [0.7, 0.85, 0.95]},
        {"max_concurrency": 48, "num_requests": 256, "input_len": 512, "output_len": 192},
        [{"metric": "ttft_ms", "percentile": 99, "max_ms": 3000}, {"metric": "tpot_ms", "percentile": 99, "max_ms": 60}],
        "request_goodput"),
    # 3 x 6 x 4 x 2 x 2 = 288: a 70B model over tensor-parallel widths, decode-heavy
    "h200-70b-tp-decode": _spec(
        "h200-70b-tp-decode", "H200", "llama-3-70b",
        {"max_model_len": [4096], "tensor_parallel_size": [2, 4, 8], "max_num_seqs": _MNS,
         "max_num_batched_tokens": [1024, 2048, 4096, 8192], "enable_chunked_prefill": [True, False],
         "gpu_memory_utilization": [0.85, 0.95]},
        {"max_concurrency": 96, "num_requests": 192, "input_len": 256, "output_len": 256},
        [{"metric": "tpot_ms", "percentile": 99, "max_ms": 30}], "total_token_throughput"),
    # 5 x 5 x 2 x 2 x 2 = 200: shared prefixes on a 48 GB card, prefix caching on or off
    "l40s-8b-shared-prefix": _spec(
        "l40s-8b-shared-prefix", "L40S", "llama-3-8b",
        {"max_model_len": [4096], "max_num_seqs": [16, 32, 64, 128, 256],
         "max_num_batched_tokens": [1024, 2048, 4096, 8192, 16384], "enable_prefix_caching": [True, False],
         "enable_chunked_prefill": [True, False], "gpu_memory_utilization": [0.85, 0.95]},
        {"max_concurrency": 64, "num_requests": 256, "input_len": 1536, "output_len": 96,
         "dataset": {"kind": "shared_prefix", "num_prefixes": 4, "suffixes_per_prefix": 64, "prefix_len": 1024}},
        [{"metric": "ttft_ms", "percentile": 99, "max_ms": 6000}], "request_throughput"),
    # 6 x 5 x 2 x 2 x 2 = 240: 70B on A100s at a Poisson rate, CUDA graphs on or off
    "a100-70b-rate-eager": _spec(
        "a100-70b-rate-eager", "A100-80G", "llama-3-70b",
        {"max_model_len": [4096], "tensor_parallel_size": [4, 8], "max_num_seqs": _MNS,
         "max_num_batched_tokens": [512, 1024, 2048, 4096, 8192], "enable_chunked_prefill": [True, False],
         "enforce_eager": [True, False]},
        {"request_rate": 12, "num_requests": 192, "input_len": 768, "output_len": 256},
        [{"metric": "tpot_ms", "percentile": 99, "max_ms": 60}, {"metric": "e2el_ms", "percentile": 90, "max_ms": 20000}],
        "request_goodput"),
}


def surface_spec(name: str, **planner: Any) -> ExperimentSpec:
    """The validated spec of surface ``name`` with ``planner`` as its planner section."""
    d = dict(SURFACES[name])
    d["planner"] = {**d["planner"], **planner} if planner else d["planner"]
    return ExperimentSpec.model_validate(d)
