"""The experiment spec: one YAML file that says what to measure, how, and how to rank it.

``load_spec(path)`` parses YAML into :class:`ExperimentSpec` (pydantic, unknown keys refused) and
then checks the engine configurations it expands to against combinations vLLM is known to refuse.
Every problem is reported at once as a :class:`~servetune.errors.SpecIssue` with its YAML path.

Sections: ``name``, ``model``, ``engine`` (typed vLLM engine args, fixed and swept, plus server
environment variables), ``load_points``, ``slos``, ``ranking``, ``repeats``, ``baseline``,
``planner`` (design ``grid``, ``random``, ``quasi-random``, or the adaptive ``optuna`` and ``halving``, their options,
order randomised under a ``seed``), ``budgets``, ``backend``, and the optional ``gpu_hour_prices`` (hardware class, as
``daemon/fingerprint.py``'s ``hardware_class`` names it, -> US dollars per GPU-hour, each > 0; the
analysis uses them for per-cost figures and says so when none are given), and the optional ``hardware``
(the classes measured and declared failover: :mod:`servetune.hardware`). See
``configs/quickstart.yaml`` for a commented example, ``configs/random-design.yaml`` for a sampled design.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal, Union
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from servetune.errors import SpecError, SpecIssue
from servetune.hardware import HardwareClassName, HardwareSpec
from servetune.sim.profiles import DEFAULT_SIM_PROFILE, DEFAULT_SIM_SHAPE, PROFILE_NAMES, SHAPE_NAMES, get_shape
from servetune.yamlsafe import MAX_SPEC_BYTES, YamlRefused, iter_regular_file, load_yaml, read_regular_file

#: The most engine configs a spec may describe under ``planner.kind: grid``, and the most any
#: design may plan (``planner.n_configs``). A larger space is refused (its size is computed as a
#: product, never listed) with the advice to sample it: ``random`` and ``quasi-random`` draw from it
#: without listing it.
MAX_GRID_CONFIGS = 10_000

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,99}$"
#: Load point names with this character are made by rate sweeps (``name@sync``, ``name@max``, ``name@12.5rps``).
DERIVED_MARK = "@"
ENV_NAME_PATTERN = r"^[A-Z_][A-Z0-9_]*$"

Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]


def _env_value(value: Any) -> Any:
    """YAML writes ``1`` and ``true`` unquoted; an environment variable is always a string."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float)):
        return str(value)
    return value


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("an environment variable's value cannot hold a NUL character")
    return value


def _not_bool(value: Any) -> Any:
    """Python counts ``True`` as 1: a choice among numbers must refuse a YAML boolean itself."""
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got the boolean {value} ({_BOOL_HINT})")
    return value


_BOOL_HINT = "YAML reads unquoted yes/no/on/off/true/false as booleans"

EnvName = Annotated[str, StringConstraints(pattern=ENV_NAME_PATTERN)]
EnvValue = Annotated[str, BeforeValidator(_env_value), AfterValidator(_no_nul)]

#: Server environment variables a spec (and so a GRANT) may set: vLLM's own and those of the
#: libraries under it. Anything else can change how a process loads code (``LD_PRELOAD``,
#: ``PYTHONPATH``, ``PYTHONWARNINGS`` with ``BROWSER`` runs a command, ``PATH``, ``BASH_ENV`` ...):
#: such variables are the node operator's, set in the daemon's own environment, which vLLM inherits.
SERVER_ENV_PREFIXES: tuple[str, ...] = (
    "VLLM_", "CUDA_", "NCCL_", "NVIDIA_", "OMP_", "KMP_", "MKL_", "TORCH_", "PYTORCH_", "TORCHINDUCTOR_",
    "TRITON_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "HIP_", "ROCM_", "HSA_", "GLOO_", "UCX_", "NEURON_", "TPU_",
    "XLA_",
)


def refused_server_env(names: Iterable[str]) -> list[str]:
    """The names among ``names`` that a spec or a GRANT may not set in vLLM's environment
    (:data:`SERVER_ENV_PREFIXES`), sorted."""
    return sorted({n for n in names if not n.startswith(SERVER_ENV_PREFIXES)})


def refused_server_env_text(names: Iterable[str]) -> str:
    """Why :func:`refused_server_env` refused ``names`` (non-empty), for a person."""
    return (f"server environment variable(s) {', '.join(names)} may not come from a spec: only vLLM's and its "
            f"libraries' ({', '.join(p + '*' for p in SERVER_ENV_PREFIXES)}); variables that change how a process "
            "loads code belong to the node's operator: set them in the daemon's environment (vLLM inherits it)")


class StrictModel(BaseModel):
    """Base of every spec section: unknown keys are refused, values are immutable, and no number
    may be infinite or NaN. A spec read from a file is also validated in pydantic's strict mode
    (:func:`parse_spec`): ``yes`` is not 1 and ``"8"`` is not 8."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ModelSpec(StrictModel):
    """Which model to serve: the generated ``tiny`` model, a local ``path``, or a ``hub`` id."""

    source: Literal["tiny", "path", "hub"] = "tiny"
    path: str | None = Field(None, description="folder with config.json (source: path)")
    id: str | None = Field(None, description="Hugging Face hub id, resolved on the node (source: hub)")
    revision: str | None = None
    load_format: Literal["auto", "dummy", "safetensors", "pt"] | None = Field(
        None, description="vLLM --load-format; the tiny model always uses dummy (random) weights"
    )
    served_name: Annotated[str, StringConstraints(min_length=1, max_length=200)] = "servetune-model"

    @model_validator(mode="after")
    def _source_fields(self) -> ModelSpec:
        if self.source == "path" and not self.path:
            raise ValueError("model.path is required when model.source is 'path'")
        if self.source == "hub" and not self.id:
            raise ValueError("model.id is required when model.source is 'hub'")
        if self.source != "path" and self.path:
            raise ValueError(f"model.path is only allowed with source 'path' (source is {self.source!r})")
        if self.source != "hub" and (self.id or self.revision):
            raise ValueError(f"model.id and model.revision are only allowed with source 'hub' (source is {self.source!r})")
        return self


class EngineArgs(StrictModel):
    """Typed vLLM engine arguments. ``None`` means "vLLM's default": the flag is not passed."""

    max_num_seqs: int | None = Field(None, ge=1, description="--max-num-seqs")
    max_num_batched_tokens: int | None = Field(None, ge=1, description="--max-num-batched-tokens")
    enable_chunked_prefill: bool | None = Field(None, description="--[no-]enable-chunked-prefill")
    enable_prefix_caching: bool | None = Field(None, description="--[no-]enable-prefix-caching")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, description="--gpu-memory-utilization")
    block_size: Annotated[Literal[1, 8, 16, 32, 64, 128, 256], BeforeValidator(_not_bool)] | None = Field(
        None, description="--block-size")
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] | None = None
    max_model_len: int | None = Field(None, ge=16, description="--max-model-len")
    tensor_parallel_size: int | None = Field(None, ge=1, le=64, description="--tensor-parallel-size")
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] | None = None
    enforce_eager: bool | None = Field(None, description="--[no-]enforce-eager")
    seed: int | None = Field(None, ge=0)

    def cli_args(self) -> list[str]:
        """The argv fragment for ``vllm serve`` / the OpenAI API server, in field order."""
        argv: list[str] = []
        for name in type(self).model_fields:
            value = getattr(self, name)
            if value is None:
                continue
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                argv.append(flag if value else "--no-" + flag[2:])
            else:
                argv += [flag, str(value)]
        return argv


ENGINE_ARG_NAMES: tuple[str, ...] = tuple(EngineArgs.model_fields)


class EngineConfigSpec(EngineArgs):
    """One explicit engine configuration: engine args plus server environment variables."""

    env: dict[EnvName, EnvValue] = Field(default_factory=dict)


def _grid_model() -> type[BaseModel]:
    """A model with one optional non-empty list per engine arg, so grid values are type-checked."""
    fields: dict[str, Any] = {}
    for name, info in EngineArgs.model_fields.items():
        inner = _strip_optional(info.annotation)
        item = Annotated[(inner, *info.metadata)] if info.metadata else inner  # type: ignore[valid-type]
        fields[name] = (list[item] | None, Field(None, min_length=1))  # type: ignore[valid-type]
    from pydantic import create_model

    return create_model("EngineGrid", __base__=StrictModel, **fields)


def _strip_optional(annotation: Any) -> Any:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType) and len(args) == 1:
        return args[0]
    return annotation


EngineGrid = _grid_model()


class EngineSpace(StrictModel):
    """The engine search space: ``fixed`` args for every config, a ``grid`` (full factorial),
    explicit ``configs`` (each merged over ``fixed``), and server ``env`` fixed or swept (``env_grid``)."""

    fixed: EngineArgs = Field(default_factory=EngineArgs)
    grid: EngineGrid = Field(default_factory=EngineGrid)  # type: ignore[valid-type]
    configs: list[EngineConfigSpec] = Field(default_factory=list)
    env: dict[EnvName, EnvValue] = Field(default_factory=dict)
    env_grid: dict[EnvName, Annotated[list[EnvValue], Field(min_length=1)]] = Field(default_factory=dict)

    def axes(self) -> list[tuple[str, list[Any]]]:
        """The grid's axes in a stable order: swept engine args by name (field order), then swept
        environment variables as ``env.NAME`` (sorted), each with its values as written."""
        grid = typing.cast(BaseModel, self.grid).model_dump()
        out: list[tuple[str, list[Any]]] = [(k, list(v)) for k, v in grid.items() if v is not None]
        out += [(f"env.{k}", list(v)) for k, v in sorted(self.env_grid.items())]
        return out

    def config_at(
        self, levels: typing.Sequence[int], axes: list[tuple[str, list[Any]]] | None = None
    ) -> tuple[EngineArgs, dict[str, str]]:
        """The grid config at one level index per axis of :meth:`axes` (or of ``axes``, e.g.
        :meth:`unique_axes`), merged over ``fixed``/``env``."""
        axes = self.axes() if axes is None else axes
        if len(levels) != len(axes):
            raise ValueError(f"{len(levels)} level(s) given for {len(axes)} axes")
        args: dict[str, Any] = self.fixed.model_dump(exclude_none=True)
        env: dict[str, str] = dict(self.env)
        for (name, values), level in zip(axes, levels):
            if name.startswith("env."):
                env[name.removeprefix("env.")] = values[level]
            else:
                args[name] = values[level]
        return EngineArgs(**args), env

    def unique_axes(self) -> list[tuple[str, list[Any]]]:
        """:meth:`axes` with each value kept once (first occurrence): their product lists the
        grid's distinct configs in :meth:`expand`'s order."""
        return [(name, list({(type(v).__name__, v): v for v in values}.values())) for name, values in self.axes()]

    def _grid_included(self) -> bool:
        return any(not name.startswith("env.") for name, _ in self.axes()) or not self.configs

    def size(self) -> int:
        """How many engine configs this space describes, computed without listing them: the grid's
        product over :meth:`unique_axes` plus every explicit config times the ``env_grid``
        combinations. Exact unless an explicit config repeats another config (then an upper bound)."""
        axes = self.unique_axes()
        env_combos = math.prod(len(v) for name, v in axes if name.startswith("env."))
        return (math.prod(len(v) for _, v in axes) if self._grid_included() else 0) + len(self.configs) * env_combos

    def count(self) -> int:
        """``len(self.expand())`` where the space is within :data:`MAX_GRID_CONFIGS` (exact), else
        :meth:`size` (never listed)."""
        size = self.size()
        return len(self.expand()) if size <= MAX_GRID_CONFIGS else size

    def config_by_index(self, index: int) -> tuple[EngineArgs, dict[str, str]]:
        """Config ``index`` (0 <= index < :meth:`size`) of the space in :meth:`expand`'s order, before
        duplicates are removed: built alone, without listing the space (for sampling a large one)."""
        axes = self.unique_axes()
        grid_size = math.prod(len(v) for _, v in axes) if self._grid_included() else 0
        if index < grid_size:
            return self.config_at(_unrank(index, [len(v) for _, v in axes]), axes)
        env_axes = [(name, v) for name, v in axes if name.startswith("env.")]
        explicit, combo = divmod(index - grid_size, math.prod(len(v) for _, v in env_axes))
        levels = _unrank(combo, [len(v) for _, v in env_axes])
        env = {**self.env, **{n.removeprefix("env."): v[i] for (n, v), i in zip(env_axes, levels)},
               **self.configs[explicit].env}
        extra = self.configs[explicit].model_dump(exclude_none=True, exclude={"env"})
        return EngineArgs(**{**self.fixed.model_dump(exclude_none=True), **extra}), env

    def env_names(self) -> set[str]:
        """Every environment variable some config of this space sets (without listing the space)."""
        return set(self.env) | set(self.env_grid) | {k for c in self.configs for k in c.env}

    def expand(self) -> list[tuple[EngineArgs, dict[str, str]]]:
        """Every engine configuration this space describes, in a stable order, duplicates removed."""
        axes = self.axes()
        n_grid = sum(1 for name, _ in axes if not name.startswith("env."))
        out: list[tuple[EngineArgs, dict[str, str]]] = []
        seen: set[str] = set()

        def add(args: EngineArgs, env: dict[str, str]) -> None:
            key = config_key(args, env)
            if key not in seen:
                seen.add(key)
                out.append((args, env))

        if n_grid or not self.configs:
            for levels in itertools.product(*[range(len(values)) for _, values in axes]):
                add(*self.config_at(levels))
        for args, env in _explicit_configs(self):
            add(args, env)
        return out


def _unrank(index: int, radices: list[int]) -> tuple[int, ...]:
    """The level indices at position ``index`` of ``itertools.product`` over ranges of ``radices``."""
    levels = []
    for radix in reversed(radices):
        index, level = divmod(index, radix)
        levels.append(level)
    return tuple(reversed(levels))


def config_key(args: EngineArgs, env: dict[str, str]) -> str:
    """A canonical string naming one engine config (set args and environment), for deduplication."""
    return json.dumps([args.model_dump(exclude_none=True), env], sort_keys=True)


class LengthDist(StrictModel):
    """A token-length distribution: ``fixed`` (``value``), ``uniform`` integers in [``min``, ``max``],
    or ``normal`` (``mean``, ``std``) rounded and clipped to [``min``, ``max``] (min defaults to 1)."""

    dist: Literal["fixed", "uniform", "normal"]
    value: int | None = Field(None, ge=1, le=1_000_000)
    min: int | None = Field(None, ge=1, le=1_000_000)
    max: int | None = Field(None, ge=1, le=1_000_000)
    mean: float | None = Field(None, gt=0, le=1_000_000)
    std: float | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _fields(self) -> LengthDist:
        need = {"fixed": ("value",), "uniform": ("min", "max"), "normal": ("mean", "std")}[self.dist]
        missing = [f for f in need if getattr(self, f) is None]
        if missing:
            raise ValueError(f"dist {self.dist!r} needs {', '.join(missing)}")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) > max ({self.max})")
        return self

    def upper(self) -> int:
        """The largest length this distribution can produce (for max_model_len checks)."""
        if self.dist == "fixed":
            assert self.value is not None
            return self.value
        if self.max is not None:
            return self.max
        assert self.mean is not None and self.std is not None
        return max(self.min or 1, int(round(self.mean + 6 * self.std)))

    def expected(self) -> float:
        if self.dist == "fixed":
            assert self.value is not None
            return float(self.value)
        if self.dist == "uniform":
            assert self.min is not None and self.max is not None
            return (self.min + self.max) / 2
        assert self.mean is not None
        return self.mean


def _length_kind(value: Any) -> str:
    return "<distribution>" if isinstance(value, (dict, LengthDist)) else "<tokens>"


#: A token length: a number of tokens or a distribution. Tagged, so an error names the one the
#: value is meant as (a mapping: the distribution); tags in angle brackets are left out of YAML paths.
Length = Annotated[
    Union[Annotated[int, Field(ge=1, le=1_000_000), Tag("<tokens>")], Annotated[LengthDist, Tag("<distribution>")]],
    Discriminator(_length_kind),
]


class RandomDataset(StrictModel):
    """Random token ids (completions) or random vocabulary text (chat) of the load point's lengths."""

    kind: Literal["random"] = "random"


class SharedPrefixDataset(StrictModel):
    """``num_prefixes`` random prefixes of ``prefix_len`` tokens, each followed by
    ``suffixes_per_prefix`` different random suffixes (the load point's ``input_len``): the
    workload prefix caching is for. Requests cycle through the prefixes."""

    kind: Literal["shared_prefix"]
    num_prefixes: int = Field(ge=1, le=100_000)
    suffixes_per_prefix: int = Field(ge=1, le=100_000)
    prefix_len: int = Field(ge=1, le=1_000_000)


class FileDataset(StrictModel):
    """Prompts from a file: ``sharegpt`` (a JSON list of ``{"conversations": [{"from", "value"}...]}``,
    first human turn as prompt, the next turn's length as output length) or ``jsonl`` (one
    ``{"prompt": str, "output_len": int}`` per line). The file's sha256 is part of every trial id."""

    kind: Literal["sharegpt", "jsonl"]
    path: str
    sha256: str | None = Field(None, description="filled in by the coordinator; a mismatch on the node is refused")
    max_input_len: int | None = Field(None, ge=1, description="skip prompts longer than this (tokens)")
    output_len_from: Literal["dataset", "load_point"] = "dataset"


Dataset = Annotated[Union[RandomDataset, SharedPrefixDataset, FileDataset], Field(discriminator="kind")]
_DATASET_KINDS = {kind for m in (RandomDataset, SharedPrefixDataset, FileDataset)
                  for kind in typing.get_args(m.model_fields["kind"].annotation)}


class StopConditions(StrictModel):
    """Ending a load point early. A load point stopped early is still a result (status ok, with
    ``stopped_early`` saying why, and metrics over what ran)."""

    max_errors: int | None = Field(None, ge=1, description="stop after this many failed requests")
    max_error_rate: float | None = Field(None, gt=0, le=1, description="stop when errors / finished exceeds this")
    min_requests_for_rate: int = Field(20, ge=1, description="finished requests before max_error_rate applies")
    over_saturation: bool = Field(False, description="stop when the queue keeps growing and TTFT keeps rising")
    saturation_window_s: float = Field(5.0, gt=0, le=3600)


class RateSweep(StrictModel):
    """Find the rates worth measuring: first a synchronous load point (one request at a time,
    ``<name>@sync``) and a maximum-throughput one (every request at once, ``<name>@max``), then
    ``num_rates`` evenly spaced request rates strictly between their request throughputs
    (``<name>@<rate>rps``), each a new trial whose manifest is made when the two are known."""

    num_rates: int = Field(ge=1, le=50)
    max_concurrency: int = Field(256, ge=1, le=100_000, description="the @max load point's cap on requests in flight")


def requests_to_confirm(percentile: float) -> int:
    """The fewest requests whose latencies can bound the ``percentile`` (in (0, 100]) from above
    below their maximum: ``q^n <= 2.5%`` (:func:`servetune.sla.quantile_ci_ranks`)."""
    q = percentile / 100.0
    if q >= 1.0:
        return 10**9  # p100 is never bounded by a sample
    return max(1, math.ceil(math.log(0.025) / math.log(q)))


class SlaSearch(StrictModel):
    """Find the highest request rate meeting the spec's SLOs for each engine config (``servetune.sla``):
    a first round of ``rates_per_round`` rates from ``min_rps`` to ``max_rps`` (evenly in log), then
    rounds that bracket (doubling above, halving below) and bisect the boundary, until the interval
    on it is within ``rel_tol`` or the request count cannot narrow it. Each rate is a trial
    (``<name>@<rate>rps``, open loop); each round is one more server start, its rates in one batch."""

    min_rps: float = Field(gt=0, le=1_000_000, description="the first round's lowest rate")
    max_rps: float = Field(gt=0, le=1_000_000, description="the first round's highest rate")
    rates_per_round: int = Field(3, ge=1, le=16, description="rates per server start (the first round: at least 2)")
    rel_tol: float = Field(0.05, gt=0, le=1, description="stop when (hi - lo) / lo is at most this")
    max_rounds: int = Field(6, ge=1, le=30, description="rounds (server starts) per engine config, the first included")

    @model_validator(mode="after")
    def _ordered(self) -> SlaSearch:
        if self.max_rps < self.min_rps:
            raise ValueError(f"max_rps ({self.max_rps:g}) is below min_rps ({self.min_rps:g})")
        return self


class LoadPoint(StrictModel):
    """What varies against one running server: arrival, request count or duration, lengths, dataset."""

    name: Name
    request_rate: float | None = Field(None, gt=0, description="requests/s; omit for as fast as max_concurrency allows")
    max_concurrency: int | None = Field(None, ge=1, description="cap on requests in flight (closed loop when alone)")
    arrival: Literal["poisson", "constant", "gamma"] = "poisson"
    burstiness: float = Field(1.0, gt=0, le=1000, description="gamma shape (1 = Poisson; < 1 burstier, > 1 steadier)")
    num_requests: int | None = Field(None, ge=1, le=1_000_000)
    duration_s: float | None = Field(None, gt=0, le=86_400)
    input_len: Length = 128
    output_len: Length = 64
    dataset: Dataset = Field(default_factory=RandomDataset)
    endpoint: Literal["completions", "chat"] = "completions"
    warmup_requests: int = Field(0, ge=0, le=100_000)
    stop: StopConditions = Field(default_factory=StopConditions)
    rate_sweep: RateSweep | None = None
    sla_search: SlaSearch | None = None
    seed: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _complete(self) -> LoadPoint:
        if self.rate_sweep is not None and self.sla_search is not None:
            raise ValueError("give a rate_sweep or an sla_search, not both")
        if self.rate_sweep is not None:
            if self.request_rate is not None or self.max_concurrency is not None:
                raise ValueError("a rate_sweep sets request_rate and max_concurrency itself: leave them out")
        elif self.sla_search is not None:
            if self.request_rate is not None or self.max_concurrency is not None:
                raise ValueError("an sla_search sets request_rate itself (open loop): leave request_rate and "
                                 "max_concurrency out")
        elif self.request_rate is None and self.max_concurrency is None:
            raise ValueError("set request_rate, max_concurrency, or both (or a rate_sweep or sla_search)")
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("set num_requests, duration_s, or both (the first reached stops the load point)")
        if self.stop.over_saturation and self.request_rate is None and self.rate_sweep is None and self.sla_search is None:
            raise ValueError("stop.over_saturation needs a request_rate (a closed loop's concurrency bounds its queue)")
        if self.arrival == "gamma" and self.request_rate is None and self.rate_sweep is None and self.sla_search is None:
            raise ValueError("arrival 'gamma' needs a request_rate")
        if self.burstiness != 1.0 and self.arrival != "gamma":
            raise ValueError(f"burstiness applies to arrival 'gamma' only (arrival is {self.arrival!r})")
        if isinstance(self.dataset, SharedPrefixDataset) and self.dataset.prefix_len >= self.max_input_len():
            raise ValueError(
                f"dataset.prefix_len ({self.dataset.prefix_len}) must be below input_len ({self.max_input_len()}):"
                " the suffix is what differs between requests"
            )
        return self

    def max_input_len(self) -> int:
        return self.input_len if isinstance(self.input_len, int) else self.input_len.upper()

    def max_output_len(self) -> int:
        return self.output_len if isinstance(self.output_len, int) else self.output_len.upper()

    def length_bounds(self) -> tuple[int, int] | None:
        """Largest (input, output) tokens a request can have, where the spec alone says it (None
        for a file dataset without ``max_input_len``, or whose output lengths come from the file)."""
        if isinstance(self.dataset, FileDataset):
            if self.dataset.max_input_len is None or self.dataset.output_len_from == "dataset":
                return None
            return self.dataset.max_input_len, self.max_output_len()
        return self.max_input_len(), self.max_output_len()

    def mean_lengths(self) -> tuple[float, float] | None:
        """Mean (input, output) tokens, for the dataset's coordinates (None for file datasets)."""
        if isinstance(self.dataset, FileDataset):
            return None
        mean_in = float(self.input_len) if isinstance(self.input_len, int) else self.input_len.expected()
        return mean_in, self.mean_output_len()

    def mean_output_len(self) -> float:
        return float(self.output_len) if isinstance(self.output_len, int) else self.output_len.expected()

    def expected_seconds(self) -> float:
        """A rough length of the measurement, for plans and ETAs (seconds)."""
        if self.duration_s is not None and self.num_requests is None:
            return self.duration_s
        n = self.num_requests or 0
        if self.request_rate:
            est = n / self.request_rate
        else:
            est = n * self.mean_output_len() * 0.004 / max(1, self.max_concurrency or 1) + 2.0
        if self.duration_s is not None:
            est = min(est, self.duration_s)
        return est + self.warmup_requests * 0.5


class SLO(StrictModel):
    """A latency objective: ``metric`` at ``percentile`` must be at most ``max_ms``.

    The same thresholds, applied to each request, define goodput (as ``vllm bench serve`` does).
    """

    metric: Literal["ttft_ms", "tpot_ms", "e2el_ms"]
    percentile: float = Field(99.0, gt=0, le=100)
    max_ms: float = Field(gt=0)


RankMetric = Literal["output_throughput", "request_throughput", "total_token_throughput", "request_goodput"]


class RankingPolicy(StrictModel):
    """Default ranking: the highest ``objective``, configurations meeting every SLO first."""

    objective: RankMetric = "output_throughput"
    require_slos: bool = True


class BaselineSpec(StrictModel):
    """A reference engine config re-run at the start, every ``every_batches`` batches, and at the end."""

    engine: EngineConfigSpec
    every_batches: int = Field(4, ge=1)
    load_points: list[Name] | None = Field(None, description="subset of load point names; default all")


#: The planner kinds (the vocabulary) with the planner keys each takes besides ``kind``,
#: ``randomize`` and ``seed``, and which of them it requires. ``coordinator.planning`` registers one
#: planner per kind (its registry and this table are held together by ``tests/test_planners.py``).
PLANNER_OPTIONS: dict[str, dict[str, bool]] = {
    "grid": {},
    "random": {"n_configs": True},
    "quasi-random": {"n_configs": True},
    "optuna": {"n_trials": True, "sampler": False, "batch": False},
    "halving": {"n_configs": True, "eta": False, "min_fidelity": False},
}
#: Designs that sample ``n_configs`` engine configs from the engine space instead of taking them all.
SAMPLED_DESIGNS: tuple[str, ...] = tuple(k for k, opts in PLANNER_OPTIONS.items() if "n_configs" in opts)
#: Designs that choose configs on the grid's axes (explicit ``engine.configs`` are not on them).
AXIS_DESIGNS: tuple[str, ...] = ("quasi-random", "optuna")
OptunaSampler = Literal["tpe", "gp", "nsga2"]
_OPTION_PURPOSE = {
    "n_configs": "how many engine configs to sample",
    "n_trials": "how many engine configs to measure",
    "sampler": "the Optuna sampler",
    "batch": "how many engine configs to ask for at once",
    "eta": "the reduction factor between rungs",
    "min_fidelity": "the first rung's fraction of each load point's requests",
}
#: Successive halving's defaults: keep the best 1/eta at each rung, the first at 1/eta^2 of the load.
DEFAULT_ETA = 3


class PlannerSpec(StrictModel):
    """Which engine configs to run and in what order (the design, recorded with the results).

    ``grid``: every config the engine space describes. ``random``: ``n_configs`` of them drawn
    uniformly at random without replacement under ``seed``. ``quasi-random``: ``n_configs``
    distinct configs from a scrambled Sobol sequence (seeded) over the grid's axes (``engine.grid``
    and ``engine.env_grid``, each value list mapped to equal slices of [0, 1)). Asking for more
    configs than the space holds plans all of them (with a note). ``optuna``: an adaptive design,
    ``n_trials`` distinct configs on the grid's axes chosen by an Optuna ``sampler`` (``tpe``
    (default), ``gp`` or ``nsga2``) from the results so far, ``batch`` (default 1) at a time, under
    ``seed`` (``coordinator.planning.adaptive``). ``halving``: successive halving, a multi-fidelity
    design: ``n_configs`` configs drawn as ``random`` draws them, measured first at ``min_fidelity``
    (default 1/eta^2) of each load point's requests (or duration), the best 1/``eta`` (default 3)
    of them again at ``eta`` times that fidelity, and so on up to the full load points; every trial
    records its fidelity (``coordinator.planning.halving``). ``randomize`` shuffles the batch order
    and the load points inside each batch under ``seed``.
    """

    kind: Annotated[str, StringConstraints(min_length=1, max_length=40)] = "grid"
    n_configs: int | None = Field(
        None, ge=1, le=MAX_GRID_CONFIGS, validate_default=True, description="random / quasi-random: how many engine configs to sample"
    )
    n_trials: int | None = Field(None, ge=1, le=MAX_GRID_CONFIGS, validate_default=True,
                                 description="optuna: how many distinct engine configs to measure")
    sampler: OptunaSampler | None = Field(None, validate_default=True, description="optuna: tpe (default), gp or nsga2")
    batch: int | None = Field(None, ge=1, le=256, validate_default=True,
                              description="optuna: engine configs asked for at once (one per daemon); default 1")
    eta: int | None = Field(None, ge=2, le=10, validate_default=True,
                            description="halving: keep the best 1/eta of each rung for the next (default 3)")
    min_fidelity: float | None = Field(None, gt=0, lt=1, validate_default=True,
                                       description="halving: the first rung's fraction of each load point's "
                                                   "requests or duration (default 1/eta^2)")
    randomize: bool = True
    seed: int = Field(0, ge=0)

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, value: str) -> str:
        if value not in PLANNER_OPTIONS:
            raise ValueError(f"unknown planner kind {value!r}; known kinds: {', '.join(sorted(PLANNER_OPTIONS))}")
        return value

    @field_validator("n_configs", "n_trials", "sampler", "batch", "eta", "min_fidelity")
    @classmethod
    def _option_for_kind(cls, value: Any, info: ValidationInfo) -> Any:
        kind = info.data.get("kind")
        if kind is None:
            return value  # kind itself was refused: that is the error to report
        name = str(info.field_name)
        takes = PLANNER_OPTIONS[kind]
        if name in takes and takes[name] and value is None:
            raise ValueError(f"planner.{name} is required when planner.kind is {kind!r} ({_OPTION_PURPOSE[name]})")
        if name not in takes and value is not None:
            users = " or ".join(repr(k) for k, opts in PLANNER_OPTIONS.items() if name in opts)
            why = "; the grid design runs every config" if kind == "grid" else ""
            raise ValueError(f"planner.{name} only applies to planner.kind {users}{why} (leave {name} out)")
        return value


class Budgets(StrictModel):
    """Time budgets in seconds. A trial past its budget is a measurement failure; a sweep past its
    budget stops granting work and leaves the rest as holes."""

    server_start_timeout_s: float = Field(300, gt=0, le=7200)
    trial_timeout_s: float = Field(900, gt=0, le=86_400)
    sweep_timeout_s: float | None = Field(None, gt=0)
    drain_timeout_s: float = Field(60, gt=0, le=3600)


#: Keys that left the spec, with where they went. A spec that still sets one is refused with this
#: text; a stored spec holding its old default (null) still loads (resume), and the spec hash
#: counts it as null (:data:`REMOVED_SPEC_FIELDS`), so every recorded hash stays valid.
MOVED_BACKEND_KEYS: dict[str, str] = {
    "python": "the daemon's own flag `daemon start --vllm-python PATH` (or $SERVETUNE_VLLM_PYTHON) on each node",
    "launch": "the daemon's own flag `daemon start --vllm-launch 'COMMAND ...'` (or $SERVETUNE_VLLM_LAUNCH) on "
              "each node",
}


class BackendSpec(StrictModel):
    """What is measured.

    ``vllm``: the daemon starts vLLM for each engine config, with the interpreter or launch command
    its own operator configured (``daemon start --vllm-python`` / ``--vllm-launch``): a spec, and
    so a GRANT, carries no command. ``openai``: an OpenAI-compatible endpoint the user already runs
    (vLLM, SGLang, TGI, llama.cpp, a gateway) at ``base_url``, sending ``model.served_name`` as the
    model and the API key found in the node's environment variable ``api_key_env`` (the value
    never leaves the node); servetune starts nothing, so the engine search space must be empty.
    ``sim``: SIMULATED, no server runs: the daemon plays each load point against a model of vLLM's
    scheduler (:mod:`servetune.sim`) on hardware ``profile`` serving a model of shape
    ``model_shape``, with seeded noise unless ``noise`` is false (``model`` then only names the trial).
    """

    kind: Literal["vllm", "openai", "sim"] = "vllm"
    base_url: Annotated[str, StringConstraints(pattern=r"^https?://[^\s/]+(/[^\s]*)?$")] | None = Field(
        None, description="openai: the endpoint's base URL, e.g. http://10.0.0.7:8000 (without /v1)"
    )
    api_key_env: EnvName | None = Field(None, description="openai: environment variable holding the API key")
    scrape_metrics: bool = Field(False, description="openai: also read <base_url>/metrics (a vLLM server)")
    profile: str | None = Field(None, description=f"sim: the simulated hardware, one of {', '.join(PROFILE_NAMES)} "
                                                  f"(default {DEFAULT_SIM_PROFILE})")
    model_shape: str | None = Field(None, description=f"sim: the simulated model, one of {', '.join(SHAPE_NAMES)} "
                                                      f"(default {DEFAULT_SIM_SHAPE})")
    noise: bool | None = Field(None, description="sim: seeded noise on step times (default true); false: the noiseless truth")

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for key, where in MOVED_BACKEND_KEYS.items():
            if key in data:
                if data[key] is not None:
                    raise ValueError(f"backend.{key} is no longer a spec key: a coordinator never tells a daemon what "
                                     f"to run; it moved to {where}. Remove backend.{key} from the spec")
                data = {k: v for k, v in data.items() if k != key}  # a stored spec's old default
        return data

    def sim_target(self) -> str | None:
        """``sim``: what is simulated, as every trial records it (``target``): ``sim:PROFILE/SHAPE``
        plus ``/noiseless`` without noise; None for other kinds."""
        if self.kind != "sim":
            return None
        target = f"sim:{self.profile or DEFAULT_SIM_PROFILE}/{self.model_shape or DEFAULT_SIM_SHAPE}"
        return target + ("/noiseless" if self.noise is False else "")

    @model_validator(mode="after")
    def _kind_fields(self) -> BackendSpec:
        if self.kind == "openai":
            if not self.base_url:
                raise ValueError("backend.base_url is required when backend.kind is 'openai'")
            try:
                port = urlsplit(self.base_url).port
            except ValueError:
                raise ValueError(f"backend.base_url {self.base_url!r}: the port must be a number from 1 to 65535") from None
            if port == 0:
                raise ValueError(f"backend.base_url {self.base_url!r}: the port must be a number from 1 to 65535")
        elif self.base_url or self.api_key_env or self.scrape_metrics:
            raise ValueError("backend.base_url, api_key_env and scrape_metrics only apply to backend.kind 'openai'")
        if self.kind != "sim" and (self.profile is not None or self.model_shape is not None or self.noise is not None):
            raise ValueError("backend.profile, model_shape and noise only apply to backend.kind 'sim'")
        if self.profile is not None and self.profile not in PROFILE_NAMES:
            raise ValueError(f"backend.profile {self.profile!r} is not a sim profile; profiles: {', '.join(PROFILE_NAMES)}")
        if self.model_shape is not None and self.model_shape not in SHAPE_NAMES:
            raise ValueError(f"backend.model_shape {self.model_shape!r} is not a sim model shape; shapes: "
                             f"{', '.join(SHAPE_NAMES)}")
        return self


def _price(value: Any) -> Any:
    """A price is a YAML number: a string or a boolean is refused rather than converted."""
    if isinstance(value, (bool, str)) or not isinstance(value, (int, float)):
        raise ValueError(f"must be a number of US dollars per GPU-hour, got {value!r}")
    return value


#: US dollars per GPU-hour: a finite number above zero.
GpuHourPrice = Annotated[float, BeforeValidator(_price), Field(gt=0, allow_inf_nan=False)]


class ExperimentSpec(StrictModel):
    """A whole experiment. Build it with :func:`load_spec` to get every check, not just types."""

    name: Name
    description: str = ""
    model: ModelSpec = Field(default_factory=ModelSpec)
    engine: EngineSpace = Field(default_factory=EngineSpace)
    load_points: list[LoadPoint] = Field(min_length=1)
    slos: list[SLO] = Field(default_factory=list)
    ranking: RankingPolicy = Field(default_factory=RankingPolicy)
    repeats: int = Field(1, ge=1, le=100)
    restart_per_repeat: bool = Field(
        True, description="true: every repeat of a config gets its own server start (repeats then include "
                          "start-to-start variation); false: a config's repeats share one server start "
                          "(cheaper; the analysis says its intervals leave that variation out)")
    baseline: BaselineSpec | None = None
    planner: PlannerSpec = Field(default_factory=PlannerSpec)
    budgets: Budgets = Field(default_factory=Budgets)
    backend: BackendSpec = Field(default_factory=BackendSpec)
    gpu_hour_prices: dict[HardwareClassName, GpuHourPrice] = Field(
        default_factory=dict,
        description="hardware class (as the daemon's fingerprint names it) -> US dollars per GPU-hour",
    )
    hardware: HardwareSpec | None = Field(
        None, description="the hardware classes measured (targets) and declared failover (servetune.hardware)")

    def spec_hash(self) -> str:
        """sha256 of the canonical JSON of the validated spec (defaults filled in).

        Fields added later (:data:`ADDED_SPEC_FIELDS`) are left out while they hold their default, so
        a spec written before they existed keeps its hash.
        """
        from servetune.canonical import drop_added_defaults, restore_removed_fields, sha256_json

        data = restore_removed_fields(self.model_dump(mode="json"), REMOVED_SPEC_FIELDS)
        return sha256_json(drop_added_defaults(data, ADDED_SPEC_FIELDS))


#: Spec fields added after the first experiments were recorded, with their defaults (dotted paths
#: into the JSON dump): left out of the spec hash while they hold them. Add every new field here.
ADDED_SPEC_FIELDS: dict[str, object] = {"gpu_hour_prices": {}, "planner.n_configs": None, "backend.profile": None,
                                         "planner.n_trials": None, "planner.sampler": None, "planner.batch": None,
                                         "backend.model_shape": None, "backend.noise": None,
                                         "hardware": None, "hardware.co_tenancy": False, "hardware.groups": [],
                                         "restart_per_repeat": True, "load_points.*.sla_search": None,
                                         "planner.eta": None, "planner.min_fidelity": None}
#: Spec fields removed since, with the value every spec that can still load held (their old
#: default): put back before hashing, so a spec's hash is the one recorded before they went.
REMOVED_SPEC_FIELDS: dict[str, object] = {"backend.python": None, "backend.launch": None}


# --------------------------------------------------------------------------- loading & checks


def load_spec(path: str | os.PathLike[str]) -> ExperimentSpec:
    """Read, parse and fully check an experiment YAML. Raises :class:`SpecError` listing every issue.

    The file must be a regular file of at most :data:`~servetune.yamlsafe.MAX_SPEC_BYTES` (a FIFO
    or a device is refused without blocking or reading it)."""
    return load_spec_text(path)[0]


def load_spec_text(path: str | os.PathLike[str]) -> tuple[ExperimentSpec, str]:
    """:func:`load_spec`, also returning the text the spec was parsed from (read once)."""
    source = str(path)
    try:
        text = read_regular_file(path, MAX_SPEC_BYTES, what="spec file").decode("utf-8")
    except FileNotFoundError:
        raise SpecError(source, [SpecIssue("", f"file not found: {source}")]) from None
    except YamlRefused as exc:
        raise SpecError(source, [SpecIssue("", exc.message)]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(source, [SpecIssue("", f"cannot read {source}: {exc}")]) from None
    return parse_spec(text, source=source, base_dir=Path(path).resolve().parent), text


def parse_spec(text: str, *, source: str = "<string>", base_dir: Path | None = None) -> ExperimentSpec:
    """Parse YAML text into a checked :class:`ExperimentSpec` (see :func:`load_spec`).

    The YAML is read by :func:`servetune.yamlsafe.load_yaml` (size, depth and alias expansion
    bounded; duplicate keys and NUL characters refused) and validated in pydantic's strict mode."""
    try:
        data = load_yaml(text)
    except YamlRefused as exc:
        raise SpecError(source, [SpecIssue(exc.path, exc.message)]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "unknown position"
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(source, [SpecIssue("", f"malformed YAML at {where}: {problem}")]) from None
    except ValueError as exc:  # a scalar YAML cannot build, e.g. an integer of 5,000 digits
        raise SpecError(source, [SpecIssue("", f"malformed YAML: {exc}")]) from None
    if not isinstance(data, dict):
        raise SpecError(source, [SpecIssue("", f"expected a mapping at the top level, got {type(data).__name__}")])
    if base_dir is not None:
        model = data.get("model")
        if isinstance(model, dict) and isinstance(model.get("path"), str):
            model_path = Path(os.path.expanduser(model["path"]))
            if not model_path.is_absolute():
                data = {**data, "model": {**model, "path": str((base_dir / model_path).resolve())}}
    file_issues: list[SpecIssue] = []
    if base_dir is not None:
        data, file_issues = _resolve_dataset_files(data, base_dir)
    try:
        spec = ExperimentSpec.model_validate(data, strict=True)
    except ValidationError as exc:
        raise SpecError(source, file_issues + _issues_from_validation(exc)) from None
    if file_issues:
        raise SpecError(source, file_issues)
    issues = check_spec(spec)
    if issues:
        raise SpecError(source, issues)
    return spec


#: The largest model ``config.json`` read (16 MiB; real ones are a few KB).
MAX_MODEL_CONFIG_BYTES = 16 << 20
#: The largest dataset file a spec may name, in bytes (4 GiB; ShareGPT's V3 file is about 0.7 GB).
MAX_DATASET_BYTES = 4 << 30


def _resolve_dataset_files(data: dict[str, Any], base_dir: Path) -> tuple[dict[str, Any], list[SpecIssue]]:
    """Make file datasets' paths absolute and record each file's sha256 (checked if the spec gives one).

    Only a regular file of at most :data:`MAX_DATASET_BYTES` is read (``/dev/zero``, a FIFO or a
    folder is refused before a byte is read), hashed in chunks."""
    import hashlib

    issues: list[SpecIssue] = []
    points = data.get("load_points")
    if not isinstance(points, list):
        return data, issues
    new_points = []
    for i, lp in enumerate(points):
        ds = lp.get("dataset") if isinstance(lp, dict) else None
        if isinstance(ds, dict) and ds.get("kind") in ("sharegpt", "jsonl") and isinstance(ds.get("path"), str):
            path = Path(os.path.expanduser(ds["path"]))
            path = path if path.is_absolute() else (base_dir / path).resolve()
            where = f"load_points[{i}].dataset.path"
            digest: str | None = None
            try:
                hasher = hashlib.sha256()
                for chunk in iter_regular_file(path, MAX_DATASET_BYTES, what="dataset file"):
                    hasher.update(chunk)
                digest = hasher.hexdigest()
            except YamlRefused as exc:
                issues.append(SpecIssue(where, exc.message))
            except OSError as exc:
                issues.append(SpecIssue(where, f"cannot read dataset file {path}: {exc.strerror or exc}"))
            if digest and ds.get("sha256") not in (None, digest):
                issues.append(SpecIssue(f"load_points[{i}].dataset.sha256",
                                        f"{path} has sha256 {digest}, not {ds['sha256']}"))
            lp = {**lp, "dataset": {**ds, "path": str(path), **({"sha256": digest} if digest else {})}}
        new_points.append(lp)
    return {**data, "load_points": new_points}, issues


def _loc_to_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for i, part in enumerate(loc):
        if part == "[key]" or (isinstance(part, str) and part.startswith("<")):
            continue  # "[key]": the key itself is bad (the path already ends with it); "<...>": a union's tag
        if i and loc[i - 1] == "dataset" and part in _DATASET_KINDS:
            continue  # the dataset union's tag (its kind), not a key
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _issues_from_validation(exc: ValidationError) -> list[SpecIssue]:
    issues = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            allowed = _allowed_keys(loc[:-1])
            msg = f"unknown key {loc[-1]!r}" + (f"; allowed keys: {', '.join(allowed)}" if allowed else "")
        elif err["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
        elif err["type"] in ("int_type", "float_type") and isinstance(err.get("input"), bool):
            msg = f"expected a number, got the boolean {err['input']} ({_BOOL_HINT})"
        else:
            msg = f"{msg} (got {err.get('input')!r})" if "input" in err and not isinstance(err["input"], dict) else msg
        issues.append(SpecIssue(_loc_to_path(loc), msg))
    return issues


def _allowed_keys(loc: tuple[int | str, ...]) -> list[str]:
    """Walk the model annotations along ``loc`` to list the keys allowed where an unknown one was found."""
    model: Any = ExperimentSpec
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return []
        info = model.model_fields.get(str(part))
        if info is None:
            return []
        model = _first_model(info.annotation)
        if model is None:
            return []
    if isinstance(model, type) and issubclass(model, BaseModel):
        return list(model.model_fields)
    return []


def _first_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _first_model(arg)
        if found is not None:
            return found
    return None


def model_architecture(spec: ModelSpec) -> dict[str, Any] | None:
    """The model's config.json as far as it can be known where the spec is checked (None: unknown)."""
    from servetune.tiny import TINY_MODEL_CONFIG

    if spec.source == "tiny":
        return dict(TINY_MODEL_CONFIG)
    if spec.source == "path" and spec.path:
        cfg = Path(spec.path) / "config.json"
        try:  # a FIFO or a device named config.json is refused, never read
            loaded = json.loads(read_regular_file(cfg, MAX_MODEL_CONFIG_BYTES, what="model config.json"))
        except (OSError, ValueError):
            return None
        return loaded if isinstance(loaded, dict) else None
    return None


def engine_architecture(spec: ExperimentSpec) -> dict[str, Any] | None:
    """The architecture the engine args are checked against: the simulated model shape for the
    ``sim`` backend (it serves that shape, whatever ``model`` says), else the model's config.json
    (:func:`model_architecture`)."""
    if spec.backend.kind == "sim":
        shape = get_shape(spec.backend.model_shape or DEFAULT_SIM_SHAPE)
        return {"max_position_embeddings": shape.max_position_embeddings,
                "num_attention_heads": shape.num_attention_heads}
    return model_architecture(spec.model)


def engine_combination_problems(args: EngineArgs, arch: dict[str, Any] | None) -> list[str]:
    """Reasons vLLM is known to refuse this combination of engine args (empty: none known)."""
    problems: list[str] = []
    max_pos = arch.get("max_position_embeddings") if arch else None
    max_len = args.max_model_len or (max_pos if isinstance(max_pos, int) else None)
    mnbt = args.max_num_batched_tokens
    if mnbt is not None and args.max_num_seqs is not None and mnbt < args.max_num_seqs:
        problems.append(
            f"max_num_batched_tokens ({mnbt}) < max_num_seqs ({args.max_num_seqs}): vLLM refuses to start"
        )
    if args.enable_chunked_prefill is False and mnbt is not None and max_len is not None and mnbt < max_len:
        problems.append(
            f"max_num_batched_tokens ({mnbt}) < max_model_len ({max_len}) with chunked prefill off: "
            "vLLM refuses to start (a whole prompt must fit in one batch); raise max_num_batched_tokens, "
            "lower max_model_len, or enable chunked prefill"
        )
    if args.max_model_len is not None and isinstance(max_pos, int) and args.max_model_len > max_pos:
        problems.append(
            f"max_model_len ({args.max_model_len}) exceeds the model's max_position_embeddings ({max_pos})"
        )
    heads = arch.get("num_attention_heads") if arch else None
    tp = args.tensor_parallel_size
    if tp is not None and isinstance(heads, int) and heads % tp != 0:
        problems.append(f"num_attention_heads ({heads}) is not divisible by tensor_parallel_size ({tp})")
    return problems


def check_spec(spec: ExperimentSpec) -> list[SpecIssue]:
    """Checks beyond types: model presence, unique names, the design's engine space, refused engine
    combinations, lengths."""
    issues: list[SpecIssue] = []
    if spec.model.source == "path" and spec.model.path:
        p = Path(spec.model.path)
        if not p.is_dir():
            issues.append(SpecIssue("model.path", f"model folder does not exist: {p}"))
        elif not (p / "config.json").is_file():
            issues.append(SpecIssue("model.path", f"no config.json in model folder {p}"))
    if spec.backend.kind == "openai":
        engine = spec.engine
        grid = typing.cast(BaseModel, engine.grid).model_dump(exclude_none=True)
        if engine.fixed.model_dump(exclude_none=True) or grid or engine.configs or engine.env or engine.env_grid:
            issues.append(SpecIssue("engine", "backend 'openai' measures a server servetune did not start: "
                                              "engine args and env cannot be applied; leave `engine` out"))
        if spec.baseline is not None:
            issues.append(SpecIssue("baseline", "a baseline engine config needs backend 'vllm'"))
    if spec.planner.kind in AXIS_DESIGNS and spec.engine.configs:
        verb = "samples" if spec.planner.kind == "quasi-random" else "searches"
        issues.append(SpecIssue("engine.configs", f"planner.kind {spec.planner.kind!r} {verb} the grid's axes "
                                "(engine.grid, engine.env_grid); explicit configs are not on them: move them "
                                "into engine.grid or use planner.kind 'random'"))
    if spec.planner.kind == "optuna":
        issues += _adaptive_issues(spec)
    if spec.planner.kind == "halving":
        issues += _halving_issues(spec)
    for i, lp in enumerate(spec.load_points):
        if lp.sla_search is not None and not spec.slos:
            issues.append(SpecIssue(f"load_points[{i}].sla_search", "an SLA search looks for the highest rate meeting "
                                    "the spec's SLOs: give `slos`"))
        if lp.sla_search is not None and lp.num_requests is None and lp.duration_s is not None:
            for slo in spec.slos:
                need = requests_to_confirm(slo.percentile)
                top = lp.sla_search.max_rps * lp.duration_s
                if top < need:
                    issues.append(SpecIssue(f"load_points[{i}].duration_s", (
                        f"duration_s {lp.duration_s:g} at max_rps {lp.sla_search.max_rps:g} sends about {top:.0f} "
                        f"requests, too few to show {slo.metric} p{slo.percentile:g} within its bound beyond its "
                        f"sampling error (that takes at least {need}): lengthen duration_s or set num_requests")))
        if lp.sla_search is not None and lp.num_requests is not None:
            for slo in spec.slos:
                need = requests_to_confirm(slo.percentile)
                if lp.num_requests < need:
                    issues.append(SpecIssue(f"load_points[{i}].num_requests", (
                        f"{lp.num_requests} requests per rate cannot show {slo.metric} p{slo.percentile:g} within "
                        f"its bound beyond its sampling error (that takes at least {need}): an SLA search would never "
                        f"find a rate that meets it; raise num_requests to {need} or more")))
        if lp.sla_search is not None and not spec.restart_per_repeat:
            issues.append(SpecIssue(f"load_points[{i}].sla_search", "restart_per_repeat: false runs a config's "
                                    "repeats in one server start, and an SLA search's rounds are planned per server "
                                    "start: use restart_per_repeat: true with an sla_search"))
    if not spec.restart_per_repeat:
        for i, lp in enumerate(spec.load_points):
            if lp.rate_sweep is not None:
                issues.append(SpecIssue(f"load_points[{i}].rate_sweep", "restart_per_repeat: false runs a config's "
                                        "repeats in one server start, and a rate sweep's follow-up rates are "
                                        "planned per server start: use restart_per_repeat: true with a rate_sweep"))
    size = spec.engine.size()
    if size > MAX_GRID_CONFIGS and spec.planner.kind == "grid":
        axes = " x ".join(f"{len(v)} {name}" for name, v in spec.engine.unique_axes())
        issues.append(SpecIssue("engine", (
            f"the engine space describes {size:,} configs ({axes}{' + explicit configs' if spec.engine.configs else ''}"
            f"), more than the {MAX_GRID_CONFIGS:,} a grid design may run: sample it with planner: "
            "{kind: random, n_configs: N} or {kind: quasi-random, n_configs: N}, or shrink the grid")))
    env_names = spec.engine.env_names()
    env_names |= set(spec.baseline.engine.env) if spec.baseline is not None else set()
    refused = refused_server_env(env_names)
    if refused:
        issues.append(SpecIssue("engine.env", refused_server_env_text(refused)))
    names = [lp.name for lp in spec.load_points]
    if DERIVED_MARK in spec.name:
        issues.append(SpecIssue("name", f"{DERIVED_MARK!r} is not allowed in an experiment name"))
    for i, name in enumerate(names):
        if DERIVED_MARK in name:
            issues.append(SpecIssue(f"load_points[{i}].name", f"{DERIVED_MARK!r} is reserved for rate-sweep load points"))
        if names.index(name) != i:
            issues.append(SpecIssue(f"load_points[{i}].name", f"duplicate load point name {name!r}"))
    arch = engine_architecture(spec)
    configs = spec.engine.expand() if size <= MAX_GRID_CONFIGS else _representatives(spec.engine)
    if spec.baseline is not None:
        base = spec.engine.fixed.model_dump(exclude_none=True)
        extra = spec.baseline.engine.model_dump(exclude_none=True, exclude={"env"})
        configs_with_paths: list[tuple[str, EngineArgs]] = [("baseline.engine", EngineArgs(**{**base, **extra}))]
        for bl_name in spec.baseline.load_points or []:
            if bl_name not in names:
                issues.append(
                    SpecIssue("baseline.load_points", f"unknown load point {bl_name!r}; defined: {', '.join(names)}")
                )
    else:
        configs_with_paths = []
    # A grid corner vLLM refuses is pruned when the sweep is planned (recorded with the reason,
    # never run); the baseline and explicit configs (and any config with the same args) are
    # refused, and so is a grid with no config left.
    explicit = {_args_key(a) for a, _ in _explicit_configs(spec.engine)}
    in_grid = [(a, e) for a, e in configs if _args_key(a) not in explicit]
    corners_pruned = any(not engine_combination_problems(a, arch) for a, _ in in_grid)
    prunable = {_args_key(a) for a, _ in in_grid} if corners_pruned else set()
    first_engine = len(configs_with_paths)
    configs_with_paths += [(f"engine (config {_describe(a, e)})", a) for a, e in configs]
    max_pos = arch.get("max_position_embeddings") if arch else None
    for n, (where, args) in enumerate(configs_with_paths):
        if n < first_engine or _args_key(args) not in prunable:
            for problem in engine_combination_problems(args, arch):
                issues.append(SpecIssue(where, problem))
        max_len = args.max_model_len or (max_pos if isinstance(max_pos, int) else None)
        if max_len is None:
            continue
        for i, lp in enumerate(spec.load_points):
            bounds = lp.length_bounds()
            if bounds is None:
                continue  # lengths come from a file: the node skips prompts over dataset.max_input_len
            if bounds[0] + bounds[1] > max_len:
                issues.append(
                    SpecIssue(
                        f"load_points[{i}]",
                        f"input_len + output_len ({bounds[0]} + {bounds[1]}) exceeds max_model_len "
                        f"({max_len}) of {where}: every request would be refused",
                    )
                )
    # A smaller EngineArgs set that fails for one config should not be reported 50 times.
    unique: list[SpecIssue] = []
    for issue in issues:
        if issue not in unique:
            unique.append(issue)
    return unique


#: The engine args :func:`engine_combination_problems` reads; for the first three its rules only
#: compare against bounds, so a space's smallest and largest values find every refused combination.
_RULE_ARGS = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "enable_chunked_prefill",
              "tensor_parallel_size")


def _adaptive_issues(spec: ExperimentSpec) -> list[SpecIssue]:
    """What the adaptive design (``planner.kind: optuna``) does not take yet: it searches the grid's
    axes, and scores a config once all its trials are in (no baseline, rate sweep or hardware targets)."""
    issues: list[SpecIssue] = []
    if not spec.engine.axes():
        issues.append(SpecIssue("engine.grid", "planner.kind 'optuna' searches the grid's axes: give engine.grid "
                                               "or engine.env_grid at least one swept value list"))
    return issues + _fixed_points_only(spec, "optuna", "scores fixed load points only")


def _halving_issues(spec: ExperimentSpec) -> list[SpecIssue]:
    """What successive halving (``planner.kind: halving``) does not take: it ranks configs on fixed
    load points (a rate sweep or SLA search plans its own load points), and promotes from one rung to
    the next on every config's trials together (no baseline runs or hardware targets yet)."""
    issues = _fixed_points_only(spec, "halving", "shortens fixed load points only")
    p = spec.planner
    eta = p.eta or DEFAULT_ETA
    if p.n_configs is not None and p.n_configs < eta:
        issues.append(SpecIssue("planner.n_configs", f"successive halving keeps the best 1/{eta} of each rung: "
                                f"{p.n_configs} config(s) leave nothing to halve; give at least {eta} or use "
                                "planner.kind 'random'"))
    return issues


def _fixed_points_only(spec: ExperimentSpec, kind: str, why: str) -> list[SpecIssue]:
    """An adaptive design's refusals of a baseline, rate sweeps, SLA searches and hardware targets."""
    issues: list[SpecIssue] = []
    if spec.baseline is not None:
        issues.append(SpecIssue("baseline", f"planner.kind {kind!r} does not interleave baseline runs yet: "
                                            "leave baseline out or use a grid, random or quasi-random design"))
    for i, lp in enumerate(spec.load_points):
        for key in ("rate_sweep", "sla_search"):
            if getattr(lp, key) is not None:
                issues.append(SpecIssue(f"load_points[{i}].{key}", f"planner.kind {kind!r} {why}: give "
                                                                  "request_rate or max_concurrency"))
    if spec.hardware is not None:
        issues.append(SpecIssue("hardware", f"planner.kind {kind!r} does not plan per hardware target yet: "
                                            "leave hardware out or use a grid, random or quasi-random design"))
    return issues


def _args_key(args: EngineArgs) -> str:
    return json.dumps(args.model_dump(exclude_none=True), sort_keys=True)


def _explicit_configs(space: EngineSpace) -> list[tuple[EngineArgs, dict[str, str]]]:
    """The explicit ``engine.configs``, each merged over ``fixed`` and ``env`` (one per ``env_grid``
    combination), as :meth:`EngineSpace.expand` lists them after the grid."""
    base = space.fixed.model_dump(exclude_none=True)
    env_items = sorted(space.env_grid.items())
    combos = list(itertools.product(*[v for _, v in env_items])) if env_items else [()]
    out = []
    for c in space.configs:
        extra = c.model_dump(exclude_none=True, exclude={"env"})
        for combo in combos:
            out.append((EngineArgs(**{**base, **extra}),
                        {**space.env, **dict(zip([k for k, _ in env_items], combo)), **c.env}))
    return out


def _representatives(space: EngineSpace) -> list[tuple[EngineArgs, dict[str, str]]]:
    """Configs of a space too large to list that include every combination the spec checks refuse:
    each explicit config, and the grid's configs over the extremes of ``max_num_seqs``,
    ``max_num_batched_tokens`` and ``max_model_len`` and every value of the other rule args
    (at most 2 x 2 x 2 x 3 x 64 configs); the other args at their first value."""
    configs: list[tuple[EngineArgs, dict[str, str]]] = []
    if space._grid_included():
        fixed = space.fixed.model_dump()
        swept = dict(space.unique_axes())
        choices: list[list[Any]] = []
        for name in EngineArgs.model_fields:
            values = swept.get(name, [fixed[name]])
            if name not in _RULE_ARGS:
                values = values[:1]
            elif name in _RULE_ARGS[:3] and len(values) > 2:
                values = [min(values), max(values)]
            choices.append(values)
        for combo in itertools.product(*choices):
            args = {k: v for k, v in zip(EngineArgs.model_fields, combo) if v is not None}
            configs.append((EngineArgs(**args), dict(space.env)))
    base = space.fixed.model_dump(exclude_none=True)
    for explicit in space.configs:
        configs.append((EngineArgs(**{**base, **explicit.model_dump(exclude_none=True, exclude={"env"})}), explicit.env))
    return configs


def _describe(args: EngineArgs, env: dict[str, str]) -> str:
    parts = [f"{k}={v}" for k, v in args.model_dump(exclude_none=True).items()]
    parts += [f"{k}={v}" for k, v in env.items()]
    return ", ".join(parts) if parts else "vLLM defaults"
