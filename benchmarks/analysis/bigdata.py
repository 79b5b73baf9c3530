"""A large SYNTHETIC experiment, built with numpy in the dataset's shape (:mod:`servetune.schema`).

:func:`analysis.synthetic.planted` builds one Python dict per trial, which is right for ground-truth
tests but takes about a minute and several GB at a million trials. :func:`vectorised` draws the same
kind of data (the same levels, the same planted throughput formula, failure region and latency
model) column by column, so a million trials take a few seconds. It is only for timing analyses at
scale; the ground-truth checks use :func:`~analysis.synthetic.planted`.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import xarray as xr

from analysis.synthetic import EFFECTS, INTERACTION, INTERACTION_SIZE, LEVELS, QUANTILES
from servetune.schema import QUANTILE_VARIABLES, SCALAR_VARIABLES, SCHEMA_VERSION


def _z(name: str, idx: np.ndarray) -> np.ndarray:
    """Position of each drawn level in the parameter's range, 0..1 (log2 for numeric levels), as
    :func:`analysis.synthetic._z` computes it for one value."""
    levels = LEVELS[name]
    if isinstance(levels[0], (bool, str)):
        return idx / max(1, len(levels) - 1)
    logs = np.log2(np.asarray(levels, dtype=float))
    span = logs[-1] - logs[0]
    return (logs[idx] - logs[0]) / span if span > 0 else np.zeros(len(idx))


def vectorised(n_configs: int = 250_000, repeats: int = 4, n_params: int = 12, noise: float = 0.05,
               fail_rate_region: float = 0.7, fail_rate_base: float = 0.03, seed: int = 0) -> xr.Dataset:
    """``n_configs`` random configs x ``repeats`` trials (one load point, one hardware class, random
    design in randomised order), in :mod:`servetune.schema`'s shape with ``backend`` ``"sim"``.

    Args:
        n_configs: distinct engine configs (drawn uniformly from the levels; duplicates possible).
        repeats: trials per config.
        n_params: how many of :data:`analysis.synthetic.LEVELS` are swept (the first ones).
        noise: sd of the multiplicative (log-scale) noise on throughput and latencies.
        fail_rate_region / fail_rate_base: failure probability in / out of the planted region.
        seed: random seed.

    Returns:
        The dataset (``n_configs * repeats`` trials).
    """
    rng = np.random.default_rng(seed)
    names = list(LEVELS)[:n_params]
    n = n_configs * repeats
    cfg_idx = {name: rng.integers(0, len(LEVELS[name]), n_configs) for name in names}
    cfg_of_trial = np.repeat(np.arange(n_configs), repeats)
    order = rng.permutation(n)  # randomised run order
    cfg_of_trial = cfg_of_trial[order]
    repeat = np.tile(np.arange(repeats), n_configs)[order]
    idx = {name: cfg_idx[name][cfg_of_trial] for name in names}

    def z(name: str, default_level: int) -> np.ndarray:
        if name in idx:
            return _z(name, idx[name])
        return np.full(n, float(_z(name, np.asarray([default_level]))[0]))

    y = np.full(n, math.log(400.0))
    for name, size in EFFECTS.items():
        if name in idx:
            y += size * _z(name, idx[name])
    a, b = INTERACTION
    if a in idx and b in idx:
        y += INTERACTION_SIZE * _z(a, idx[a]) * (idx[b] == 1)
    y += rng.normal(0, noise, n)
    gmu = np.asarray(LEVELS["gpu_memory_utilization"], dtype=float)[idx["gpu_memory_utilization"]] \
        if "gpu_memory_utilization" in idx else np.full(n, 0.9)
    mns = np.asarray(LEVELS["max_num_seqs"], dtype=float)[idx["max_num_seqs"]] if "max_num_seqs" in idx \
        else np.full(n, 16.0)
    region = (gmu >= 0.95) & (mns >= 128)
    failed = rng.random(n) < np.where(region, fail_rate_region, fail_rate_base)
    ok = ~failed

    out_tp = np.where(ok, np.exp(y), np.nan)
    z_mns = z("max_num_seqs", 2)
    z_mnbt = z("max_num_batched_tokens", 2)
    ttft50 = 40.0 * np.exp(0.6 * z_mns - 0.4 * z_mnbt + rng.normal(0, noise, n))
    tpot50 = 8.0 * np.exp(0.5 * z_mns + rng.normal(0, noise, n))
    q = {"ttft_ms": ttft50[:, None] * np.array([1.0, 1.6, 1.9, 2.6]),
         "tpot_ms": tpot50[:, None] * np.array([1.0, 1.2, 1.3, 1.5]),
         "itl_ms": tpot50[:, None] * np.array([1.0, 1.4, 1.6, 2.2])}
    q["e2el_ms"] = q["ttft_ms"] + 128 * q["tpot_ms"]
    for k in q:
        q[k][failed] = np.nan
    req_tp = out_tp / 128.0
    with np.errstate(over="ignore"):
        slo_att = np.where(ok, 1.0 / (1.0 + np.exp((q["ttft_ms"][:, 3] - 200.0) / 30.0)), np.nan)
    scalars: dict[str, np.ndarray] = {v: np.full(n, np.nan) for v in SCALAR_VARIABLES}
    okf = np.where(ok, 1.0, np.nan)
    scalars.update(
        request_throughput=req_tp, output_throughput=out_tp, total_token_throughput=out_tp * 2.0,
        request_goodput=req_tp * slo_att, n_requests=200.0 * okf, n_completed=200.0 * okf, n_errors=0.0 * okf,
        n_cancelled=0.0 * okf, duration_s=200.0 / req_tp, total_input_tokens=200.0 * 128 * okf,
        total_output_tokens=200.0 * 128 * okf, slo_attainment=slo_att,
        slos_met=np.where(ok, (q["ttft_ms"][:, 3] <= 200.0).astype(float), np.nan), achieved_rate=req_tp,
        sched_lag_p99_ms=0.5 * okf, mean_ttft_ms=ttft50 * 1.2 * okf, mean_tpot_ms=tpot50 * 1.05 * okf,
        mean_itl_ms=tpot50 * 1.1 * okf, mean_e2el_ms=q["e2el_ms"][:, 0] * 1.1,
        server_max_running=np.minimum(mns, 32.0) * okf, server_max_kv_cache_usage=np.minimum(1.0, mns / 256) * okf,
    )

    def const(value: Any, dtype: Any) -> tuple[str, np.ndarray]:
        return ("trial", np.full(n, value, dtype=dtype))

    trial_ids = np.asarray([f"sim{i:08d}" for i in range(n)], dtype=object)
    cfg_names = np.asarray([f"cfg-{i:07d}" for i in range(n_configs)], dtype=object)
    coords: dict[str, Any] = {
        "quantile": ("quantile", np.asarray(QUANTILES)),
        "trial_id": ("trial", trial_ids),
        "attempt": const(1, "int64"),
        "config_id": ("trial", cfg_names[cfg_of_trial]),
        "experiment": const("planted-vectorised", object),
        "load_point": const("lp", object),
        "repeat": ("trial", repeat.astype("int64")),
        "status": ("trial", np.where(ok, "ok", "failed").astype(object)),
        "failure_kind": ("trial", np.where(ok, "", "measurement").astype(object)),
        "error": ("trial", np.where(ok, "", "CUDA out of memory (synthetic)").astype(object)),
        "is_baseline": const(False, bool),
        "baseline_run": const(-1, "int64"),
        "started_at": ("trial", 1_700_000_000_000_000 + np.arange(n, dtype="int64") * 60_000_000),
        "hardware_class": const("sim-gpu-a", object),
        "backend": const("sim", object),
        "spec_hash": const("synthetic", object),
        "in_current_spec": const(True, bool),
        "stopped_early": const("", object),
        "client_fell_behind": const(False, bool),
        "request_rate": const(np.nan, "float64"),
        "max_concurrency": const(32.0, "float64"),
        "input_len": const(128.0, "float64"),
        "output_len": const(128.0, "float64"),
        "dataset": const("random", object),
        "dataset_sha256": const("", object),
        "endpoint": const("completions", object),
        "arrival": const("closed-loop", object),
        "burstiness": const(1.0, "float64"),
    }
    for name in names:
        levels = LEVELS[name]
        if isinstance(levels[0], bool):
            values: np.ndarray = idx[name].astype(bool)
        elif isinstance(levels[0], str):
            values = np.asarray(levels, dtype=object)[idx[name]]
        elif isinstance(levels[0], int):
            values = np.asarray(levels, dtype="int64")[idx[name]]
        else:
            values = np.asarray(levels, dtype="float64")[idx[name]]
        coords[f"param_{name}"] = ("trial", values)
    data_vars: dict[str, Any] = {v: ("trial", np.asarray(scalars[v], dtype="float64")) for v in SCALAR_VARIABLES}
    for v in QUANTILE_VARIABLES:
        data_vars[v] = (("trial", "quantile"), q[v])
    ds = xr.Dataset(data_vars=data_vars, coords=coords).assign_coords(trial=np.arange(n, dtype="int64"))
    ds.attrs.update({
        "schema_version": SCHEMA_VERSION, "experiment": "planted-vectorised", "spec_hash": "synthetic",
        "design": "random", "randomized": 1, "planner_seed": seed, "run_order": "[]", "vllm_version": "synthetic",
        "hardware_classes": "sim-gpu-a", "model": json.dumps({"path": "synthetic"}), "created_at_us": 0,
        "swept_parameters": json.dumps(names),
        "slos": json.dumps([{"metric": "ttft_ms", "percentile": 99.0, "max_ms": 200.0}]),
        "ranking": json.dumps({"objective": "output_throughput", "require_slos": True}), "synthetic": 1,
        "gpu_hour_prices": "{}",
    })
    return ds
