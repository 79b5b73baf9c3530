"""SYNTHETIC experiments with planted ground truth, for validating the analyses and for benchmarks.

Nothing here was measured: :func:`planted` draws engine configurations, computes their metrics
from a known formula with noise, and returns a dataset in exactly the shape the coordinator writes
(:mod:`servetune.schema`; ``backend`` is ``"synthetic"``, not ``"sim"``, which is the simulated vLLM
backend, and the attribute ``synthetic`` is 1 so it can never pass for a real run), together with the :class:`Truth` the analyses must recover:

- main effects: ``max_num_seqs`` (strong), ``max_num_batched_tokens`` (medium), ``block_size``
  (weak) on output throughput (log scale, multiplicative noise);
- an interaction: ``enable_chunked_prefill`` helps at small ``max_num_batched_tokens`` only;
- a failure region: ``gpu_memory_utilization >= 0.95`` with ``max_num_seqs >= 128`` fails
  (measurement failure, "OOM") with probability ``fail_rate_region``; elsewhere
  ``fail_rate_base``; rare ``transport`` failures anywhere (not a property of the config);
- no-effect parameters (``enable_prefix_caching``, ``enforce_eager``, ``dtype``, ``seed``,
  ``kv_cache_dtype``, ``max_model_len``, ``tensor_parallel_size``);
- optional baseline re-runs and a planted drift (a step change after a fraction of the run);
- optional load levels (``load_levels=``: load point -> ``("rate", req/s)`` or ``("concurrency", N)``),
  for metric-vs-load curves: output throughput saturates at a planted knee
  (:meth:`Truth.saturation`): open loop, throughput = min(rate x 128 tokens, the config's planted
  capacity ``exp(log_throughput)``); closed loop, capacity x min(N, max_num_seqs) / max_num_seqs; latencies
  grow as the load nears (and passes) saturation. Load points not named there keep the default model.

``effects=``, ``interaction=`` and ``interaction_size=`` plant another surface (e.g. a +3% effect of
``enable_prefix_caching``: ``effects={**EFFECTS, "enable_prefix_caching": math.log(1.03)}``); the
:class:`Truth` then describes that surface and :meth:`Truth.log_throughput` evaluates it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import xarray as xr

from servetune.schema import QUANTILE_VARIABLES, SCALAR_VARIABLES, SCHEMA_VERSION

Design = Literal["grid", "random", "quasi-random", "adaptive"]

#: parameter -> levels, effect parameters first (the first ``n_params`` are used)
LEVELS: dict[str, list[Any]] = {
    "max_num_seqs": [4, 8, 16, 32, 64, 128, 256],
    "max_num_batched_tokens": [512, 1024, 2048, 4096, 8192],
    "enable_chunked_prefill": [False, True],
    "gpu_memory_utilization": [0.8, 0.85, 0.9, 0.95],
    "enable_prefix_caching": [False, True],
    "block_size": [16, 32, 64],
    "enforce_eager": [False, True],
    "dtype": ["bfloat16", "float16", "float32"],
    "seed": [0, 1, 2, 3],
    "kv_cache_dtype": ["auto", "fp8", "fp8_e4m3"],
    "max_model_len": [1024, 2048, 4096],
    "tensor_parallel_size": [1, 2],
}
EFFECTS = {"max_num_seqs": 1.0, "max_num_batched_tokens": 0.4, "enable_chunked_prefill": 0.15, "block_size": 0.08}
INTERACTION = ("max_num_batched_tokens", "enable_chunked_prefill")
INTERACTION_SIZE = -0.45
NULL_PARAMS = ("enable_prefix_caching", "enforce_eager", "dtype", "seed", "kv_cache_dtype", "max_model_len",
               "tensor_parallel_size")
QUANTILES = (0.5, 0.9, 0.95, 0.99)
OUTPUT_LEN = 128.0  # tokens per request (input and output) of every synthetic load point
LOAD_KINDS = ("rate", "concurrency")


@dataclass
class Truth:
    """What was planted."""

    params: list[str]
    important: list[str]
    null: list[str]
    interaction: tuple[str, str] | None
    fail_rate_region: float
    fail_rate_base: float
    drift_at: float | None
    drift_size: float
    effects: dict[str, float] = field(default_factory=dict)
    interaction_size: float = INTERACTION_SIZE

    def log_throughput(self, cfg: dict[str, Any]) -> float:
        """The planted noise-free log output throughput of ``cfg`` on this truth's surface."""
        return log_throughput(cfg, self.effects, self.interaction, self.interaction_size)

    def saturation(self, cfg: dict[str, Any], kind: str) -> float:
        """Where the planted throughput of ``cfg`` stops growing with load (``load_levels=``): the
        request rate (req/s) that meets its capacity for ``kind`` "rate", its ``max_num_seqs`` for
        "concurrency"."""
        if kind == "rate":
            return math.exp(self.log_throughput(cfg)) / OUTPUT_LEN
        return float(cfg.get("max_num_seqs", 16))

    def in_failure_region(self, cfg: dict[str, Any]) -> bool:
        return bool(cfg.get("gpu_memory_utilization", 0.9) >= 0.95 and cfg.get("max_num_seqs", 16) >= 128)


def _z(name: str, value: Any) -> float:
    """Position of ``value`` in the parameter's range, 0..1 (log2 for numeric levels)."""
    levels = LEVELS[name]
    if isinstance(value, bool) or isinstance(levels[0], str):
        return float(levels.index(value)) / max(1, len(levels) - 1)
    lo, hi = math.log2(levels[0]), math.log2(levels[-1])
    return (math.log2(value) - lo) / (hi - lo) if hi > lo else 0.0


def log_throughput(cfg: dict[str, Any], effects: dict[str, float] | None = None,
                   interaction: tuple[str, str] | None = INTERACTION,
                   interaction_size: float = INTERACTION_SIZE) -> float:
    """The planted noise-free log output throughput of a config (tokens/s): ``effects`` (default
    :data:`EFFECTS`: parameter -> change on the log scale from its lowest to its highest level)
    plus ``interaction_size`` x z(first) x [second is on/at its highest level]."""
    y = math.log(400.0)
    for name, size in (EFFECTS if effects is None else effects).items():
        if name in cfg:
            y += size * _z(name, cfg[name])
    if interaction is not None:
        a, b = interaction
        if a in cfg and b in cfg:
            y += interaction_size * _z(a, cfg[a]) * _z(b, cfg[b])
    return y


def _configs(design: Design, names: list[str], n_configs: int, rng: np.random.Generator, seed: int) -> list[dict[str, Any]]:
    if design == "grid":
        import itertools

        combos = list(itertools.product(*[LEVELS[n] for n in names]))
        return [dict(zip(names, c)) for c in combos]
    if design == "quasi-random":
        from scipy.stats import qmc

        u = qmc.Sobol(d=len(names), scramble=True, seed=seed).random(n_configs)
    elif design == "random":
        u = rng.random((n_configs, len(names)))
    else:  # adaptive: a random start, then mostly near the best so far (values follow outcomes)
        u = rng.random((n_configs, len(names)))
        n0 = max(4, n_configs // 5)

        def score(row: np.ndarray) -> float:
            return log_throughput({n: LEVELS[n][min(len(LEVELS[n]) - 1, int(x * len(LEVELS[n])))]
                                   for n, x in zip(names, row)})

        best, best_y = 0, score(u[0])
        for i in range(1, n_configs):
            if i >= n0 and rng.random() < 0.8:
                u[i] = np.clip(u[best] + rng.normal(0, 0.12, len(names)), 0, 0.999)
            y = score(u[i])
            if y > best_y:
                best, best_y = i, y
    return [{n: LEVELS[n][min(len(LEVELS[n]) - 1, int(x * len(LEVELS[n])))] for n, x in zip(names, row)} for row in u]


def planted(
    n_configs: int = 60,
    n_params: int = 6,
    repeats: int = 1,
    design: Design = "random",
    randomized: bool = True,
    noise: float = 0.05,
    fail_rate_region: float = 0.7,
    fail_rate_base: float = 0.03,
    transport_rate: float = 0.0,
    load_points: Sequence[str] = ("lp",),
    baseline_every: int = 0,
    drift_at: float | None = None,
    drift_size: float = -0.15,
    hardware_classes: Sequence[str] = ("sim-gpu-a",),
    gpu_hour_prices: dict[str, float] | None = None,
    params: Sequence[str] | None = None,
    seed: int = 0,
    effects: dict[str, float] | None = None,
    interaction: tuple[str, str] | None = INTERACTION,
    interaction_size: float = INTERACTION_SIZE,
    load_levels: dict[str, tuple[str, float]] | None = None,
) -> tuple[xr.Dataset, Truth]:
    """A synthetic experiment (one row per trial, :mod:`servetune.schema`'s shape) and its truth.

    ``n_configs`` configs (a full grid ignores it) x ``load_points`` x
    ``repeats`` trials per hardware class; with ``baseline_every`` a baseline config is re-run after
    every that many configs; ``drift_at`` (0..1 of the run) plants a step of ``drift_size`` (log
    scale) on everything measured after it. ``effects`` / ``interaction`` / ``interaction_size``
    choose the planted surface (defaults: :data:`EFFECTS`, :data:`INTERACTION`,
    :data:`INTERACTION_SIZE`). ``load_levels`` gives load points a request rate or a concurrency
    and the saturating load model of the module docstring (its names are added to ``load_points``;
    the default ``("lp",)`` gives way to them).
    """
    if not 1 <= n_params <= len(LEVELS):
        raise ValueError(f"n_params must be 1..{len(LEVELS)}, got {n_params}")
    rng = np.random.default_rng(seed)
    effects = dict(EFFECTS if effects is None else effects)
    unknown = sorted(set(effects) - set(LEVELS))
    if unknown:
        raise ValueError(f"unknown effect parameters {unknown}; known: {', '.join(LEVELS)}")
    levels = dict(load_levels or {})
    for lp_name, (kind, value) in levels.items():
        if kind not in LOAD_KINDS or not (isinstance(value, (int, float)) and value > 0):
            raise ValueError(f"load_levels[{lp_name!r}] = {(kind, value)!r}: want (one of {LOAD_KINDS}, a number > 0)")
    if levels:  # the default single load point gives way to the levels; named ones are kept beside them
        load_points = list(levels) if tuple(load_points) == ("lp",) else list(dict.fromkeys([*load_points, *levels]))
    names = list(params) if params is not None else list(LEVELS)[:n_params]
    configs = _configs(design, names, n_configs, rng, seed)
    baseline_cfg = {n: LEVELS[n][len(LEVELS[n]) // 2] for n in names}
    rows: list[dict[str, Any]] = []
    order: list[tuple[dict[str, Any], str, int, int, str]] = []  # cfg, lp, repeat, baseline_run, hw
    for hw in hardware_classes:
        for cfg in configs:
            for lp in load_points:
                for r in range(repeats):
                    order.append((cfg, lp, r, -1, hw))
    if randomized:
        perm = rng.permutation(len(order))
        order = [order[i] for i in perm]
    if baseline_every:
        with_bl: list[tuple[dict[str, Any], str, int, int, str]] = []
        run = 0
        for i, item in enumerate(order):
            if i % baseline_every == 0:
                for lp in load_points:
                    with_bl.append((baseline_cfg, lp, 0, run, item[4]))
                run += 1
            with_bl.append(item)
        order = with_bl
    t0 = 1_700_000_000_000_000
    n_total = len(order)
    for i, (cfg, lp, rep, bl_run, hw) in enumerate(order):
        lp_index = list(load_points).index(lp)
        shift = 0.0 if lp in levels else 0.3 * lp_index
        y = log_throughput(cfg, effects, interaction, interaction_size) - shift + rng.normal(0, noise)
        drifted = drift_at is not None and i >= drift_at * n_total
        if drifted:
            y += drift_size
        p_fail = fail_rate_region if _in_region(cfg) else fail_rate_base
        u = rng.random()
        status, kind, error = "ok", "", ""
        if u < transport_rate:
            status, kind, error = "failed", "transport", "daemon lost (synthetic)"
        elif rng.random() < p_fail and bl_run < 0:
            status, kind, error = "failed", "measurement", "CUDA out of memory (synthetic)"
        rows.append(_row(i, cfg, lp, rep, bl_run, hw, y, status, kind, error, t0 + i * 60_000_000, rng, noise,
                         levels.get(lp)))
    planted_pair = interaction if interaction is not None and all(n in names for n in interaction) else None
    acting = {n for n, v in effects.items() if v != 0} | (set(planted_pair) if planted_pair else set())
    truth = Truth(
        params=names,
        important=[n for n in names if n in acting],
        null=[n for n in names if n not in acting and n != "gpu_memory_utilization"],
        interaction=planted_pair,
        fail_rate_region=fail_rate_region,
        fail_rate_base=fail_rate_base,
        drift_at=drift_at,
        drift_size=drift_size,
        effects={n: effects[n] for n in names if n in effects},
        interaction_size=interaction_size,
    )
    return _dataset(rows, names, design, randomized, list(hardware_classes), gpu_hour_prices, seed), truth


def _in_region(cfg: dict[str, Any]) -> bool:
    return bool(cfg.get("gpu_memory_utilization", 0.9) >= 0.95 and cfg.get("max_num_seqs", 16) >= 128)


def _row(i: int, cfg: dict[str, Any], lp: str, rep: int, bl_run: int, hw: str, y: float, status: str, kind: str,
         error: str, started_at: int, rng: np.random.Generator, noise: float,
         level: tuple[str, float] | None = None) -> dict[str, Any]:
    ok = status == "ok"
    out_tp = math.exp(y) if ok else math.nan
    mns = float(cfg.get("max_num_seqs", 16))
    conc, rate, arrival = 32.0, math.nan, "closed-loop"
    ttft50 = 40.0 * math.exp(0.6 * _z("max_num_seqs", cfg.get("max_num_seqs", 16))
                             - 0.4 * _z("max_num_batched_tokens", cfg.get("max_num_batched_tokens", 2048))
                             + rng.normal(0, noise))
    tpot50 = 8.0 * math.exp(0.5 * _z("max_num_seqs", cfg.get("max_num_seqs", 16)) + rng.normal(0, noise))
    if level is not None:  # the saturating load model (module docstring): y is the capacity, noise included
        kind, load = level
        if kind == "rate":
            rate, conc, arrival = float(load), math.nan, "poisson"
            rho = load * OUTPUT_LEN / math.exp(y)  # below capacity it serves the offered rate, measured with noise
            out_tp = (load * OUTPUT_LEN * math.exp(rng.normal(0, noise / 2)) if rho < 1.0 else math.exp(y)) if ok else math.nan
            queue = 1.0 + rho / max(0.05, 1.0 - rho) if rho < 1.0 else 1.0 + 20.0 * rho
        else:
            conc = float(load)
            rho = load / mns
            out_tp = min(1.0, rho) * math.exp(y) if ok else math.nan
            queue = max(1.0, rho)
        ttft50 *= queue
        tpot50 *= 1.0 + 0.3 * min(1.0, rho)
    spread = np.array([1.0, 1.6, 1.9, 2.6])
    q = {"ttft_ms": ttft50 * spread, "tpot_ms": tpot50 * np.array([1.0, 1.2, 1.3, 1.5]),
         "itl_ms": tpot50 * np.array([1.0, 1.4, 1.6, 2.2])}
    q["e2el_ms"] = q["ttft_ms"] + OUTPUT_LEN * q["tpot_ms"]
    req_tp = out_tp / OUTPUT_LEN
    slo_att = 1.0 / (1.0 + math.exp(min(700.0, (q["ttft_ms"][3] - 200.0) / 30.0))) if ok else math.nan
    scalars = {v: math.nan for v in SCALAR_VARIABLES}
    if ok:
        scalars.update(
            request_throughput=req_tp, output_throughput=out_tp, total_token_throughput=out_tp * 2.0,
            request_goodput=req_tp * slo_att, n_requests=200.0, n_completed=200.0, n_errors=0.0, n_cancelled=0.0,
            duration_s=200.0 / req_tp, total_input_tokens=200.0 * 128, total_output_tokens=200.0 * 128,
            slo_attainment=slo_att, slos_met=1.0 if q["ttft_ms"][3] <= 200.0 else 0.0, achieved_rate=req_tp,
            offered_rate=rate, sched_lag_p99_ms=0.5, mean_ttft_ms=ttft50 * 1.2, mean_tpot_ms=tpot50 * 1.05,
            mean_itl_ms=tpot50 * 1.1, mean_e2el_ms=float(q["e2el_ms"][0]) * 1.1,
            server_max_running=min(mns, conc), server_max_kv_cache_usage=min(1.0, mns / 256),
        )
    return {
        "trial_id": f"sim{i:08d}", "attempt": 1, "config_id": "cfg-" + json.dumps(cfg, sort_keys=True),
        "experiment": "planted", "load_point": lp, "repeat": rep, "status": status, "failure_kind": kind,
        "error": error, "is_baseline": bl_run >= 0, "baseline_run": bl_run, "started_at": started_at,
        "hardware_class": hw, "backend": "synthetic", "spec_hash": "synthetic", "in_current_spec": True,
        "stopped_early": "", "client_fell_behind": False, "request_rate": rate, "max_concurrency": conc,
        "input_len": 128.0, "output_len": 128.0, "config_label": " ".join(f"{k}={v}" for k, v in cfg.items()),
        "dataset": "random", "dataset_sha256": "", "endpoint": "completions", "arrival": arrival,
        "burstiness": 1.0, "params": cfg, "scalars": scalars,
        "quantiles": {v: (q[v].tolist() if ok else [math.nan] * 4) for v in QUANTILE_VARIABLES},
    }


def _dataset(rows: list[dict[str, Any]], names: list[str], design: str, randomized: bool, hw: list[str],
             prices: dict[str, float] | None, seed: int) -> xr.Dataset:
    n = len(rows)
    coord_names = [k for k in rows[0] if k not in ("params", "scalars", "quantiles")] if rows else []
    coords: dict[str, Any] = {"quantile": ("quantile", np.asarray(QUANTILES))}
    for k in coord_names:
        values = [r[k] for r in rows]
        if isinstance(values[0], str):
            coords[k] = ("trial", np.asarray(values, dtype=object))
        elif isinstance(values[0], bool):
            coords[k] = ("trial", np.asarray(values, dtype=bool))
        elif isinstance(values[0], int):
            coords[k] = ("trial", np.asarray(values, dtype="int64"))
        else:
            coords[k] = ("trial", np.asarray(values, dtype="float64"))
    for name in names:
        values = [r["params"][name] for r in rows]
        if isinstance(LEVELS[name][0], str):
            coords[f"param_{name}"] = ("trial", np.asarray(values, dtype=object))
        elif isinstance(LEVELS[name][0], bool):
            coords[f"param_{name}"] = ("trial", np.asarray(values, dtype=bool))
        elif isinstance(LEVELS[name][0], int):
            coords[f"param_{name}"] = ("trial", np.asarray(values, dtype="int64"))
        else:
            coords[f"param_{name}"] = ("trial", np.asarray(values, dtype="float64"))
    data_vars: dict[str, Any] = {
        v: ("trial", np.asarray([r["scalars"][v] for r in rows], dtype="float64")) for v in SCALAR_VARIABLES}
    for v in QUANTILE_VARIABLES:
        data_vars[v] = (("trial", "quantile"), np.asarray([r["quantiles"][v] for r in rows], dtype="float64").reshape(n, 4))
    ds = xr.Dataset(data_vars=data_vars, coords=coords).assign_coords(trial=np.arange(n, dtype="int64"))
    ds.attrs.update({
        "schema_version": SCHEMA_VERSION, "experiment": "planted", "spec_hash": "synthetic", "design": design,
        "randomized": int(randomized), "planner_seed": seed, "run_order": json.dumps([r["trial_id"] for r in rows]),
        "vllm_version": "synthetic", "hardware_classes": ",".join(hw), "model": json.dumps({"path": "synthetic"}),
        "created_at_us": 0, "swept_parameters": json.dumps(names),
        "slos": json.dumps([{"metric": "ttft_ms", "percentile": 99.0, "max_ms": 200.0}]),
        "ranking": json.dumps({"objective": "output_throughput", "require_slos": True}), "synthetic": 1,
        "gpu_hour_prices": json.dumps(prices or {}),
    })
    return ds
