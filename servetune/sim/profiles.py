"""Hardware profiles and model shapes of the simulated vLLM backend (pure data, standard library only).

A :class:`HardwareProfile` is one accelerator (or the CPU build) as the roofline step-time model
(:mod:`servetune.sim.steptime`) sees it: peak dense BF16 FLOP/s, memory bandwidth, memory size,
the interconnect tensor parallelism all-reduces over, and vLLM's fixed costs per step. A
:class:`ModelShape` is the transformer the simulator pretends to serve: enough of its config.json
to count FLOPs, weight bytes and KV-cache bytes.

Every profile is **uncalibrated**: the GPU figures are published spec-sheet peaks (cited per
profile), the achievable fractions of them and the per-step overheads are assumptions, and the
CPU profile's overheads are rough figures taken from the tiny-model runs written down in
DESIGN.md (not fitted). :attr:`HardwareProfile.calibration` says so, and every simulated result
records it. Registries are keyed by name; :func:`get_profile` and :func:`get_shape` name the ones
that exist when asked for one that does not.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

from servetune.tiny import TINY_MODEL_CONFIG

GIB = 1024**3
UNCALIBRATED = "uncalibrated (from published specs)"
UNCALIBRATED_CPU = "uncalibrated (rough figures from DESIGN.md tiny-model runs, not fitted)"


@dataclass(frozen=True)
class HardwareProfile:
    """One device type. ``memory_bytes`` is per device; ``interconnect_bytes_s`` is the per-direction
    bandwidth one device has to its tensor-parallel peers. ``default_max_num_seqs`` and
    ``default_max_num_batched_tokens`` are vLLM's own defaults for this device class in the
    OpenAI API server (``vllm/engine/arg_utils.py``, ``_set_default_max_num_seqs_and_batched_tokens_args``).
    ``kv_cache_bytes`` (CPU only) is the fixed KV-cache space the CPU build takes
    (``VLLM_CPU_KVCACHE_SPACE``; the daemon sets 1 GiB), instead of a memory fraction."""

    name: str
    peak_flops: float
    mem_bandwidth_bytes_s: float
    memory_bytes: float
    interconnect_bytes_s: float
    source: str
    calibration: str = UNCALIBRATED
    #: achievable fractions of the peaks (assumptions until calibrated)
    flops_efficiency: float = 0.6
    bandwidth_efficiency: float = 0.8
    #: fixed cost of one engine step (scheduler, launch, sampling), and per sequence / per token in it
    step_overhead_s: float = 1.0e-3
    per_seq_overhead_s: float = 10e-6
    per_token_overhead_s: float = 0.0
    #: fixed latency every request sees outside the engine core's steps: the API server's HTTP
    #: parsing, tokenization, detokenization and the streamed chunk's way back to the client (on the
    #: CPU build the API server shares the cores with the engine core, so this is not negligible).
    #: It adds to TTFT and end-to-end latency, not to TPOT (it is paid once, before the first token
    #: reaches the client), and under a concurrency cap it delays the next send by as much. 0 on the
    #: GPU profiles (uncalibrated: small next to their step times, and nothing here measures it)
    request_overhead_s: float = 0.0
    #: extra cost per step without CUDA graphs (``enforce_eager``)
    eager_overhead_s: float = 3.0e-3
    #: one all-reduce's latency over the interconnect
    allreduce_latency_s: float = 10e-6
    #: memory vLLM cannot give to the KV cache besides weights and activations (CUDA context, graphs)
    reserved_bytes: float = 1.5 * GIB
    default_max_num_seqs: int = 256
    default_max_num_batched_tokens: int = 2048
    kv_cache_bytes: float | None = None
    max_devices: int = 8


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer (Llama layout: GQA attention, SwiGLU MLP), weights in ``dtype_bytes``."""

    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    dtype_bytes: int = 2
    tie_word_embeddings: bool = False

    @property
    def layer_params(self) -> int:
        """Parameters of one layer: q, k, v, o projections and the three MLP matrices (norms ignored)."""
        h, d = self.hidden_size, self.head_dim
        attn = h * self.num_attention_heads * d * 2 + h * self.num_kv_heads * d * 2
        return attn + 3 * h * self.intermediate_size

    @property
    def matmul_params(self) -> int:
        """Parameters every token multiplies through: all layers (the LM head counted apart)."""
        return self.num_layers * self.layer_params

    @property
    def weight_bytes(self) -> float:
        embed = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return float((self.matmul_params + embed) * self.dtype_bytes)

    def kv_bytes_per_token(self, tp: int = 1) -> float:
        """KV-cache bytes one token takes on one of ``tp`` devices (K and V, every layer)."""
        kv_heads = max(1, self.num_kv_heads // tp)
        return float(2 * self.num_layers * kv_heads * self.head_dim * self.dtype_bytes)


_TB = 1e12
_GB = 1e9

#: NVIDIA spec sheets; FLOP/s are dense BF16 Tensor Core figures (the sheets print twice these "with sparsity").
PROFILES: dict[str, HardwareProfile] = {
    p.name: p
    for p in (
        HardwareProfile(
            name="A100-80G", peak_flops=312 * _TB, mem_bandwidth_bytes_s=2039 * _GB, memory_bytes=80 * _GB,
            interconnect_bytes_s=300 * _GB,
            source="NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB: BF16 312 TFLOPS dense, HBM2e 2,039 GB/s, "
                   "NVLink 600 GB/s total = 300 GB/s per direction)",
            default_max_num_seqs=256, default_max_num_batched_tokens=2048,
        ),
        HardwareProfile(
            name="H100-80G", peak_flops=989 * _TB, mem_bandwidth_bytes_s=3350 * _GB, memory_bytes=80 * _GB,
            interconnect_bytes_s=450 * _GB,
            source="NVIDIA H100 Tensor Core GPU datasheet (SXM5: BF16 989 TFLOPS dense, HBM3 3.35 TB/s, NVLink "
                   "900 GB/s total = 450 GB/s per direction)",
            default_max_num_seqs=1024, default_max_num_batched_tokens=8192,
        ),
        HardwareProfile(
            name="H200", peak_flops=989 * _TB, mem_bandwidth_bytes_s=4800 * _GB, memory_bytes=141 * _GB,
            interconnect_bytes_s=450 * _GB,
            source="NVIDIA H200 Tensor Core GPU datasheet (SXM: BF16 989 TFLOPS dense, HBM3e 4.8 TB/s, 141 GB, "
                   "NVLink 900 GB/s total = 450 GB/s per direction)",
            default_max_num_seqs=1024, default_max_num_batched_tokens=8192,
        ),
        HardwareProfile(
            name="L40S", peak_flops=362 * _TB, mem_bandwidth_bytes_s=864 * _GB, memory_bytes=48 * _GB,
            interconnect_bytes_s=32 * _GB,
            source="NVIDIA L40S datasheet (BF16 362 TFLOPS dense, GDDR6 864 GB/s, 48 GB; no NVLink: PCIe Gen4 x16 "
                   "64 GB/s total = 32 GB/s per direction)",
            default_max_num_seqs=256, default_max_num_batched_tokens=2048,
        ),
        HardwareProfile(
            name="cpu-tiny", peak_flops=100e9, mem_bandwidth_bytes_s=20 * _GB, memory_bytes=16 * GIB,
            interconnect_bytes_s=10 * _GB,
            source="the CPU build of vLLM on a 2-core AVX2 node serving the tiny model: FLOP/s and bandwidth are "
                   "order-of-magnitude guesses (the tiny model is overhead-bound); overheads chosen so that "
                   "max_num_seqs 2 vs 32 at concurrency 32 lands near DESIGN.md's 265 vs 1,285 output tok/s",
            calibration=UNCALIBRATED_CPU,
            flops_efficiency=0.5, bandwidth_efficiency=0.7,
            step_overhead_s=6.0e-3, per_seq_overhead_s=0.3e-3, per_token_overhead_s=0.1e-3,
            eager_overhead_s=0.0, allreduce_latency_s=50e-6, reserved_bytes=0.0,
            default_max_num_seqs=128, default_max_num_batched_tokens=2048,
            kv_cache_bytes=1.0 * GIB, max_devices=1,
        ),
    )
}

_TINY = TINY_MODEL_CONFIG

#: Llama-3 shapes from Meta's published config.json files (Meta-Llama-3-8B, Meta-Llama-3-70B).
SHAPES: dict[str, ModelShape] = {
    s.name: s
    for s in (
        ModelShape(name="llama-3-8b", num_layers=32, hidden_size=4096, intermediate_size=14336,
                   num_attention_heads=32, num_kv_heads=8, head_dim=128, vocab_size=128256,
                   max_position_embeddings=8192),
        ModelShape(name="llama-3-70b", num_layers=80, hidden_size=8192, intermediate_size=28672,
                   num_attention_heads=64, num_kv_heads=8, head_dim=128, vocab_size=128256,
                   max_position_embeddings=8192),
        ModelShape(name="tiny", num_layers=int(_TINY["num_hidden_layers"]), hidden_size=int(_TINY["hidden_size"]),
                   intermediate_size=int(_TINY["intermediate_size"]),
                   num_attention_heads=int(_TINY["num_attention_heads"]),
                   num_kv_heads=int(_TINY["num_key_value_heads"]), head_dim=int(_TINY["head_dim"]),
                   vocab_size=int(_TINY["vocab_size"]),
                   max_position_embeddings=int(_TINY["max_position_embeddings"])),
    )
}

PROFILE_NAMES: tuple[str, ...] = tuple(PROFILES)
#: what ``backend: {kind: sim}`` simulates when it names nothing: the tiny test model on the CPU build
DEFAULT_SIM_PROFILE = "cpu-tiny"
DEFAULT_SIM_SHAPE = "tiny"
SHAPE_NAMES: tuple[str, ...] = tuple(SHAPES)


#: a calibration file (:mod:`benchmarks.sim_calibrate` writes it) whose fitted overheads replace a profile's
CALIBRATION_ENV = "SERVETUNE_SIM_CALIBRATION"


def _calibrated(profile: HardwareProfile) -> HardwareProfile:
    path = os.environ.get(CALIBRATION_ENV)
    if not path:
        return profile
    doc = json.loads(Path(path).read_text()).get(profile.name)
    if not doc:
        return profile
    fitted = doc["fitted"]
    return dataclasses.replace(profile, calibration=str(doc["calibration"]),
                               step_overhead_s=float(fitted["step_overhead_s"]),
                               per_seq_overhead_s=float(fitted["per_seq_overhead_s"]),
                               per_token_overhead_s=float(fitted["per_token_overhead_s"]),
                               request_overhead_s=float(fitted.get("request_overhead_s", profile.request_overhead_s)))


def get_profile(name: str, calibrated: bool = True) -> HardwareProfile:
    """Profile ``name``; with its fitted overheads from the file ``SERVETUNE_SIM_CALIBRATION`` names
    (when it has an entry for it) unless ``calibrated`` is false."""
    try:
        profile = PROFILES[name]
    except KeyError:
        raise KeyError(f"unknown sim profile {name!r}; profiles: {', '.join(PROFILE_NAMES)}") from None
    return _calibrated(profile) if calibrated else profile


def get_shape(name: str) -> ModelShape:
    try:
        return SHAPES[name]
    except KeyError:
        raise KeyError(f"unknown sim model shape {name!r}; shapes: {', '.join(SHAPE_NAMES)}") from None
