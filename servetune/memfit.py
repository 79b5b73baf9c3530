"""Will an engine config fit in device memory? One home for the estimate (standard library only).

vLLM at start-up gives the KV cache what is left of ``gpu_memory_utilization x device memory``
once the weights, the peak activations of one forward pass and its fixed reserve (CUDA context,
graphs) are in, and refuses to start when that cannot hold one sequence of ``max_model_len``
tokens. :func:`memory_need` is that arithmetic, per device of a tensor-parallel group:

- weights: the model's parameters (q, k, v, o, the three MLP matrices, the embeddings and the LM
  head; norms ignored) x the weight dtype's bytes / ``tensor_parallel_size``;
- activations: ``max_num_batched_tokens x (2 x intermediate + 4 x hidden) x dtype / tp`` plus
  float32 logits for ``max_num_seqs`` sequences;
- reserve: the device's fixed reserve (1.5 GiB on a GPU);
- KV cache: one ``max_model_len`` sequence (rounded up to whole blocks) is what vLLM needs to
  start; ``max_model_len x max_num_seqs`` (every seat full) is reported beside it, never pruned
  on: a config that cannot hold every seat at full length still starts, preempts under load,
  and is often the fastest one (vLLM's own defaults are such configs).

The simulator (:func:`servetune.sim.engine.kv_capacity`) starts or refuses a server by this
estimate, and planning (:func:`prune_reason`, :func:`memory_pruner`) prunes a config only when
its need exceeds the budget by more than :data:`PRUNE_MARGIN`: the activation and reserve terms
are rough (vLLM profiles the real peak), and a wrong prune loses a valid config, whereas a config
planned in the margin that does not fit costs one failed start, recorded with vLLM's reason.

Where the device memory or the model's shape is not known (a CPU build, whose KV cache is a fixed
``VLLM_CPU_KVCACHE_SPACE``; a filter target, which bounds the memory only from below; a hardware
class naming no memory; a hub model, whose config.json the coordinator does not have) nothing is
pruned and :func:`memory_pruner` says why, once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from servetune.sim.profiles import GIB, PROFILES, ModelShape, get_profile, get_shape

#: vLLM's default --gpu-memory-utilization (vllm/config/cache.py)
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
DEFAULT_BLOCK_SIZE = 16
#: a config is pruned only when its need exceeds the budget by more than this fraction of the budget
PRUNE_MARGIN = 0.10
#: what vLLM keeps besides weights, activations and KV cache on a GPU (CUDA context, graphs): the
#: GPU profiles' ``reserved_bytes``
GPU_RESERVED_BYTES = 1.5 * GIB
#: vLLM's defaults for a GPU it does not single out (the smaller ones: fewer activations, fewer prunes)
GENERIC_MAX_NUM_SEQS = 256
GENERIC_MAX_NUM_BATCHED_TOKENS = 2048


class MemoryDevice(Protocol):
    """What the estimate reads of a device (a sim :class:`~servetune.sim.profiles.HardwareProfile`,
    or a :class:`Device` from a hardware class)."""

    @property
    def name(self) -> str: ...
    @property
    def memory_bytes(self) -> float: ...
    @property
    def reserved_bytes(self) -> float: ...
    @property
    def default_max_num_seqs(self) -> int: ...
    @property
    def default_max_num_batched_tokens(self) -> int: ...
    @property
    def kv_cache_bytes(self) -> float | None: ...
    @property
    def max_devices(self) -> int: ...


@dataclass(frozen=True)
class Device:
    """A GPU of a hardware class, as far as the estimate needs it (``memory_bytes`` per GPU,
    ``max_devices`` GPUs of it on the node)."""

    name: str
    memory_bytes: float
    max_devices: int
    default_max_num_seqs: int = GENERIC_MAX_NUM_SEQS
    default_max_num_batched_tokens: int = GENERIC_MAX_NUM_BATCHED_TOKENS
    reserved_bytes: float = GPU_RESERVED_BYTES
    kv_cache_bytes: float | None = None


@dataclass(frozen=True)
class SimEngineConfig:
    """vLLM engine args as the server resolves them (vLLM's defaults filled in)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool
    prefix_caching: bool
    block_size: int
    max_model_len: int
    tensor_parallel_size: int
    gpu_memory_utilization: float
    enforce_eager: bool
    cpu_kvcache_space_gib: float | None = None


def resolve_config(args: Mapping[str, object], env: Mapping[str, str], profile: MemoryDevice,
                   shape: ModelShape) -> SimEngineConfig:
    """Fill vLLM's defaults into ``args`` (an :class:`~servetune.spec.EngineArgs` dump without Nones)."""

    def get(name: str, default: object) -> object:
        value = args.get(name)
        return default if value is None else value

    chunked = bool(get("enable_chunked_prefill", True))
    max_model_len = int(get("max_model_len", shape.max_position_embeddings))  # type: ignore[call-overload]
    default_mnbt = profile.default_max_num_batched_tokens
    if not chunked:
        default_mnbt = max(default_mnbt, max_model_len)
    cpu_space = env.get("VLLM_CPU_KVCACHE_SPACE")
    return SimEngineConfig(
        max_num_seqs=int(get("max_num_seqs", profile.default_max_num_seqs)),  # type: ignore[call-overload]
        max_num_batched_tokens=int(get("max_num_batched_tokens", default_mnbt)),  # type: ignore[call-overload]
        chunked_prefill=chunked,
        prefix_caching=bool(get("enable_prefix_caching", True)),
        block_size=int(get("block_size", DEFAULT_BLOCK_SIZE)),  # type: ignore[call-overload]
        max_model_len=max_model_len,
        tensor_parallel_size=int(get("tensor_parallel_size", 1)),  # type: ignore[call-overload]
        gpu_memory_utilization=float(get("gpu_memory_utilization", DEFAULT_GPU_MEMORY_UTILIZATION)),  # type: ignore[arg-type]
        enforce_eager=bool(get("enforce_eager", False)),
        cpu_kvcache_space_gib=float(cpu_space) if cpu_space else None,
    )


@dataclass(frozen=True)
class MemoryNeed:
    """The estimate of one config on one device (bytes, per device of its tensor-parallel group)."""

    device: str
    memory_bytes: float
    gpu_memory_utilization: float
    weights: float
    activations: float
    reserved: float
    kv_one_sequence: float  # one max_model_len sequence, whole blocks: what vLLM needs to start
    kv_every_seat: float  # max_model_len x max_num_seqs: every seat full (reported, not pruned on)
    max_model_len: int
    max_num_seqs: int

    @property
    def budget(self) -> float:
        """``gpu_memory_utilization x memory``: what vLLM may take of the device."""
        return self.gpu_memory_utilization * self.memory_bytes

    @property
    def kv_available(self) -> float:
        """What is left for the KV cache once weights, activations and the reserve are in."""
        return self.budget - self.weights - self.activations - self.reserved

    @property
    def need(self) -> float:
        """Weights + activations + reserve + one ``max_model_len`` sequence of KV cache."""
        return self.weights + self.activations + self.reserved + self.kv_one_sequence

    @property
    def fits(self) -> bool:
        """Whether the server starts by this estimate (no margin)."""
        return self.kv_available > 0 and self.kv_one_sequence <= self.kv_available

    def describe(self) -> str:
        """The numbers, e.g. ``needs 18.3 GiB (weights 15.0 + activations 0.8 + reserve 1.5 + KV for
        one 8192-token sequence 1.0) > 74.5 GiB x 0.20 = 14.9 GiB on H100-80G (...)``."""
        g = GIB
        op = "<=" if self.fits else ">"
        return (f"needs {self.need / g:.1f} GiB (weights {self.weights / g:.1f} + activations "
                f"{self.activations / g:.1f} + reserve {self.reserved / g:.1f} + KV for one {self.max_model_len}-token "
                f"sequence {self.kv_one_sequence / g:.1f}) {op} {self.memory_bytes / g:.1f} GiB x "
                f"{self.gpu_memory_utilization:.2f} = {self.budget / g:.1f} GiB on {self.device} (all {self.max_num_seqs} "
                f"seats full would hold {self.kv_every_seat / g:.1f} GiB of KV; vLLM starts without that)")


def memory_need(cfg: SimEngineConfig, device: MemoryDevice, shape: ModelShape,
                kv_dtype_bytes: int | None = None) -> MemoryNeed:
    """The estimate (see the module docstring) for a GPU ``device``; ``kv_dtype_bytes``: the KV
    cache's element size when it differs from the weights' (``kv_cache_dtype: fp8``)."""
    tp = cfg.tensor_parallel_size
    kv_token = shape.kv_bytes_per_token(tp) * (kv_dtype_bytes / shape.dtype_bytes if kv_dtype_bytes else 1)
    activations = (cfg.max_num_batched_tokens * (2 * shape.intermediate_size + 4 * shape.hidden_size)
                   * shape.dtype_bytes / tp + cfg.max_num_seqs * shape.vocab_size * 4)
    bs = cfg.block_size
    return MemoryNeed(
        device=device.name, memory_bytes=device.memory_bytes, gpu_memory_utilization=cfg.gpu_memory_utilization,
        weights=shape.weight_bytes / tp, activations=activations, reserved=device.reserved_bytes,
        kv_one_sequence=math.ceil(cfg.max_model_len / bs) * bs * kv_token,
        kv_every_seat=cfg.max_num_seqs * cfg.max_model_len * kv_token,
        max_model_len=cfg.max_model_len, max_num_seqs=cfg.max_num_seqs)


def prune_reason(need: MemoryNeed, margin: float = PRUNE_MARGIN) -> str | None:
    """Why planning prunes this config (its need exceeds the budget by more than ``margin``), or None."""
    if need.need <= need.budget * (1 + margin):
        return None
    return f"does not fit in device memory: {need.describe()} (pruned above {1 + margin:.2f} x the budget)"


# --------------------------------------------------------------------------- from a spec

_DTYPE_BYTES = {"half": 2, "float16": 2, "bfloat16": 2, "float": 4, "float32": 4}
_CLASS = re.compile(r"(\d+)x([A-Za-z0-9_.]+?)-(\d+)GB")


def shape_from_config(arch: Mapping[str, Any], name: str, dtype: str | None = None) -> ModelShape | str:
    """The :class:`ModelShape` of a Hugging Face config.json (engine ``dtype`` None or ``auto``:
    the config's ``torch_dtype``, float32 served as 16-bit as vLLM does), or why it cannot be read."""
    try:
        heads = int(arch["num_attention_heads"])
        hidden = int(arch["hidden_size"])
        shape = ModelShape(
            name=name, num_layers=int(arch["num_hidden_layers"]), hidden_size=hidden,
            intermediate_size=int(arch["intermediate_size"]), num_attention_heads=heads,
            num_kv_heads=int(arch.get("num_key_value_heads") or heads),
            head_dim=int(arch.get("head_dim") or hidden // heads), vocab_size=int(arch["vocab_size"]),
            max_position_embeddings=int(arch.get("max_position_embeddings") or 2048),
            dtype_bytes=_DTYPE_BYTES.get(dtype or "auto", 2),
            tie_word_embeddings=bool(arch.get("tie_word_embeddings", False)))
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        return f"the model's config.json has no usable {exc} (a Llama-like layout is needed)"
    return shape


def device_for_class(hardware_class: str) -> Device | str:
    """The GPU of hardware class ``1xH100-80GB`` (memory: the fingerprint's ``round(MiB / 1024)`` GiB,
    so at most half a GiB above the real size), or why the class gives no device memory."""
    m = _CLASS.fullmatch(hardware_class)
    if m is None:
        what = "a CPU build (its KV cache is a fixed VLLM_CPU_KVCACHE_SPACE)" if hardware_class.startswith("cpu-") \
            else "not one kind of GPU with its memory (COUNTxMODEL-NNGB)"
        return f"hardware class {hardware_class} is {what}"
    count, chip, mem = int(m.group(1)), m.group(2), int(m.group(3))
    known = next((p for p in PROFILES.values() if p.kv_cache_bytes is None and p.name.split("-")[0].upper() == chip.upper()), None)
    seqs = known.default_max_num_seqs if known else GENERIC_MAX_NUM_SEQS
    mnbt = known.default_max_num_batched_tokens if known else GENERIC_MAX_NUM_BATCHED_TOKENS
    return Device(name=hardware_class, memory_bytes=mem * GIB, max_devices=count, default_max_num_seqs=seqs,
                  default_max_num_batched_tokens=mnbt)


#: (engine args without Nones, env, hardware target label or None) -> why it is pruned, or None
Pruner = Callable[[Mapping[str, object], Mapping[str, str], "str | None"], "str | None"]


def _kv_dtype_bytes(args: Mapping[str, object]) -> int | None:
    return 1 if str(args.get("kv_cache_dtype") or "auto").startswith("fp8") else None


def memory_pruner(spec: Any) -> tuple[Pruner | None, tuple[str, ...]]:
    """The memory check planning applies to ``spec`` (an :class:`~servetune.spec.ExperimentSpec`)
    per engine config and hardware target, and notes saying where nothing is pruned and why.

    ``sim`` backend: the simulated profile and model shape, as the simulator resolves them (it
    ignores ``dtype`` and ``kv_cache_dtype``). ``vllm``: each hardware target that is a GPU class,
    and the model's config.json (tiny, or a local path). ``openai``: nothing (no engine args)."""
    from servetune.spec import model_architecture

    backend = spec.backend
    if backend.kind == "openai":
        return None, ()
    if backend.kind == "sim":
        from servetune.sim.profiles import DEFAULT_SIM_PROFILE, DEFAULT_SIM_SHAPE

        profile = get_profile(backend.profile or DEFAULT_SIM_PROFILE)
        sim_shape = get_shape(backend.model_shape or DEFAULT_SIM_SHAPE)
        if profile.kv_cache_bytes is not None:
            return None, (f"memory: no engine config pruned: sim profile {profile.name} is a CPU build "
                          "(its KV cache is a fixed VLLM_CPU_KVCACHE_SPACE)",)

        def prune_sim(args: Mapping[str, object], env: Mapping[str, str], target: str | None) -> str | None:
            return _verdict(args, env, profile, sim_shape, None)

        return prune_sim, ()
    arch = model_architecture(spec.model)
    name = str(spec.model.id or spec.model.path or spec.model.source)
    unknown_model: str | None = None  # why the model's memory cannot be estimated, if it cannot
    if arch is None:
        what = f"of hub model {spec.model.id} is not read" if spec.model.source == "hub" else "is not readable"
        unknown_model = f"the model's config.json {what} where the sweep is planned"
    elif arch.get("quantization_config") is not None:
        unknown_model = "the model is quantized (quantization_config), so its weight bytes are not estimated"
    elif isinstance(unreadable := shape_from_config(arch, name), str):
        unknown_model = unreadable
    targets = spec.hardware.targets if spec.hardware is not None else []
    if not targets:
        return None, (f"memory: no engine config pruned: {unknown_model}" if unknown_model else
                      "memory: no engine config pruned: the spec names no hardware target (hardware.targets), "
                      "so the device memory is unknown",)
    notes: list[str] = []
    devices: dict[str | None, Device] = {}
    for t in targets:
        dev = (device_for_class(t.hardware_class) if t.hardware_class is not None
               else "a filter bounds the device memory only from below")
        if isinstance(dev, str):
            notes.append(f"memory: nothing pruned on target {t.label}: {dev}")
        else:
            devices[t.label] = dev
    if not devices:
        return None, tuple(notes)
    if unknown_model:  # the device count still bounds tensor_parallel_size on every GPU class target
        notes.append(f"memory: no engine config pruned by memory: {unknown_model}; tensor_parallel_size is still "
                     "checked against each target's GPU count")

    def prune(args: Mapping[str, object], env: Mapping[str, str], target: str | None) -> str | None:
        device = devices.get(target)
        if device is None:
            return None
        if arch is None or unknown_model:
            return _too_many_devices(args, device)
        dtype = args.get("dtype")
        shape = shape_from_config(arch, name, str(dtype) if dtype is not None else None)
        if isinstance(shape, str):
            return _too_many_devices(args, device)
        return _verdict(args, env, device, shape, _kv_dtype_bytes(args))

    return prune, tuple(notes)


def _too_many_devices(args: Mapping[str, object], device: MemoryDevice) -> str | None:
    """Why a config needs more GPUs than ``device`` has (``tensor_parallel_size``), or None."""
    tp = args.get("tensor_parallel_size")
    tp = 1 if tp is None or isinstance(tp, bool) else int(tp)  # type: ignore[call-overload]
    if tp > device.max_devices:
        return f"needs {tp} devices (tensor_parallel_size) but {device.name} has {device.max_devices}"
    return None


def _verdict(args: Mapping[str, object], env: Mapping[str, str], device: MemoryDevice, shape: ModelShape,
             kv_dtype_bytes: int | None) -> str | None:
    cfg = resolve_config(args, env, device, shape)
    too_many = _too_many_devices({"tensor_parallel_size": cfg.tensor_parallel_size}, device)
    if too_many:
        return too_many
    return prune_reason(memory_need(cfg, device, shape, kv_dtype_bytes))
