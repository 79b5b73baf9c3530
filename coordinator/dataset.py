"""Write the consolidated results dataset (``results.nc``) from the store.

The coordinator is the single writer: after each result it rebuilds the dataset from SQLite and
replaces the file atomically (write to a temporary file, then ``os.replace``), so a reader never
sees half a file. The shape is documented in :mod:`servetune.schema`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from coordinator.store import AttemptRow, Store, now_us
from servetune.canonical import canonical_json
from servetune.manifest import EngineConfig
from servetune.metrics import DEFAULT_QUANTILES
from servetune.netcdf import write_netcdf
from servetune.schema import DATASET_FILE, QUANTILE_VARIABLES, SCALAR_VARIABLES, SCHEMA_VERSION
from servetune.spec import ENGINE_ARG_NAMES

log = logging.getLogger(__name__)


def _num(value: Any) -> float:
    if value is None:
        return math.nan
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    return float(value)


def build_dataset(store: Store) -> xr.Dataset:
    """One row per trial (its latest finished attempt, or its hole), in the current spec's run order first."""
    current = store.current_spec_hash()
    planned = store.planned_trial_ids(current) if current else []
    order = {tid: i for i, tid in enumerate(planned)}
    trials = store.trials()
    trials.sort(key=lambda t: (order.get(t[0], len(order)), 0))
    latest = store.latest_finished()
    quantiles = list(DEFAULT_QUANTILES)

    env_names = sorted({k for _, m, _ in trials for k in m.engine.env})
    arg_names = [n for n in ENGINE_ARG_NAMES if any(getattr(m.engine.args, n) is not None for _, m, _ in trials)]
    n = len(trials)
    coords: dict[str, list[Any]] = {k: [] for k in (
        "trial_id", "attempt", "config_id", "experiment", "load_point", "repeat", "status", "failure_kind",
        "error", "is_baseline", "baseline_run", "started_at", "hardware_class", "daemon_key_id", "backend", "spec_hash",
        "in_current_spec", "stopped_early", "retry_warning", "client_fell_behind", "request_rate", "max_concurrency",
        "input_len", "output_len", "config_label", "dataset", "dataset_sha256", "endpoint", "arrival", "burstiness",
    )}
    coords.update(hardware_target=[], tags=[])  # the spec's target, and marks such as failover-from:<class>
    coords["fidelity"] = []  # 1: a full trial; < 1: a successive-halving rung on a shortened load point
    params: dict[str, list[Any]] = {f"param_{a}": [] for a in arg_names}
    params.update({f"param_env.{e}": [] for e in env_names})
    scalars: dict[str, list[float]] = {v: [] for v in SCALAR_VARIABLES}
    qvars: dict[str, list[list[float]]] = {v: [] for v in QUANTILE_VARIABLES}
    hw_seen: set[str] = set()
    vllm_versions: set[str] = set()

    for trial_id, m, first_spec in trials:
        att: AttemptRow | None = latest.get(trial_id)
        metrics = (att.metrics or {}) if att else {}
        lp = m.load_point
        coords["trial_id"].append(trial_id)
        coords["attempt"].append(att.attempt if att else 0)
        coords["config_id"].append(m.config_id)
        coords["experiment"].append(m.experiment)
        coords["load_point"].append(lp.name)
        coords["repeat"].append(m.repeat)
        coords["status"].append(att.status if att else "hole")
        coords["failure_kind"].append((att.failure_kind or "") if att else "")
        coords["error"].append(((att.error or "") if att else "")[:500])
        coords["is_baseline"].append(m.baseline_run is not None)
        coords["baseline_run"].append(m.baseline_run if m.baseline_run is not None else -1)
        coords["started_at"].append(int(att.started_at_us) if att else 0)
        coords["hardware_class"].append((att.hardware_class or "") if att else "")
        coords["daemon_key_id"].append((att.daemon_key_id or "") if att else "")
        coords["backend"].append(m.backend)
        coords["spec_hash"].append(first_spec)
        coords["in_current_spec"].append(trial_id in order)
        coords["stopped_early"].append(metrics.get("stopped_early") or "")
        coords["retry_warning"].append(metrics.get("retry_warning") or "")
        coords["client_fell_behind"].append(bool(metrics.get("client_fell_behind", False)))
        coords["request_rate"].append(_num(lp.request_rate))
        coords["max_concurrency"].append(_num(lp.max_concurrency))
        means = lp.mean_lengths()
        coords["input_len"].append(means[0] if means else math.nan)  # mean tokens; NaN: from a file
        coords["output_len"].append(means[1] if means else math.nan)
        coords["dataset"].append(lp.dataset.kind)
        coords["dataset_sha256"].append(getattr(lp.dataset, "sha256", None) or "")
        coords["endpoint"].append(lp.endpoint)
        coords["arrival"].append(lp.arrival if lp.request_rate is not None else "closed-loop")
        coords["burstiness"].append(lp.burstiness)
        coords["config_label"].append(m.engine.label())
        coords["hardware_target"].append(m.hardware_target or "")
        coords["tags"].append(",".join(m.tags))
        coords["fidelity"].append(float(m.fidelity))
        for a in arg_names:
            value = getattr(m.engine.args, a)
            params[f"param_{a}"].append(value)
        for e in env_names:
            params[f"param_env.{e}"].append(m.engine.env.get(e, ""))
        for v in SCALAR_VARIABLES:
            scalars[v].append(_num(metrics.get(v)))
        mq = metrics.get("quantiles") or quantiles
        for v in QUANTILE_VARIABLES:
            values = metrics.get(v)
            if values and list(mq) == quantiles:
                qvars[v].append([_num(x) for x in values])
            else:
                qvars[v].append([math.nan] * len(quantiles))
        if att and att.hardware_class:
            hw_seen.add(att.hardware_class)
        if metrics.get("vllm_version"):
            vllm_versions.add(str(metrics["vllm_version"]))

    data_vars: dict[str, Any] = {v: ("trial", np.asarray(scalars[v], dtype="float64")) for v in SCALAR_VARIABLES}
    for v in QUANTILE_VARIABLES:
        arr = np.asarray(qvars[v], dtype="float64").reshape(n, len(quantiles))
        data_vars[v] = (("trial", "quantile"), arr)
    coord_arrays: dict[str, Any] = {"quantile": ("quantile", np.asarray(quantiles, dtype="float64"))}
    for k, values in coords.items():
        coord_arrays[k] = ("trial", _array(values))
    for k, values in params.items():
        coord_arrays[k] = ("trial", _array(values))
    ds = xr.Dataset(data_vars=data_vars, coords=coord_arrays)
    ds = ds.assign_coords(trial=np.arange(n, dtype="int64"))

    spec_json = store.spec(current) if current else {}
    meta = store.spec_meta(current) if current else {}
    swept = _swept(params)
    ds.attrs.update(
        {
            "schema_version": SCHEMA_VERSION,
            "experiment": str(spec_json.get("name", "")),
            "spec_hash": current or "",
            "design": str(meta.get("design") or ""),
            "randomized": int(meta.get("randomized") or 0),
            "planner_seed": int(meta.get("planner_seed") or 0),
            # 1: every repeat had its own server start; 0: some spec version of this experiment ran a
            # config's repeats in one (restart_per_repeat: false), so their spread may leave the
            # start-to-start variation out (judged over every version, as trials carry over)
            "restart_per_repeat": int(all(
                store.spec(h).get("restart_per_repeat", True) for h in {current, *(t[2] for t in trials)} if h)),
            "run_order": json.dumps(planned),
            "vllm_version": ",".join(sorted(vllm_versions)),
            "hardware_classes": ",".join(sorted(hw_seen)),
            "model": canonical_json(trials[0][1].model) if trials else "",
            "created_at_us": now_us(),
            "swept_parameters": json.dumps(swept),
            "slos": json.dumps(spec_json.get("slos", [])),
            "ranking": json.dumps(spec_json.get("ranking", {})),
            "gpu_hour_prices": json.dumps(spec_json.get("gpu_hour_prices") or {}, sort_keys=True),
            "pruned_configs": canonical_json([
                {"config_id": p["config_id"], "config_label": EngineConfig.model_validate(p["engine"]).label(),
                 "hardware_target": p["hardware_target"] or "", "is_baseline": p["is_baseline"], "reason": p["reason"]}
                for p in (store.pruned_configs(current) if current else [])]),
        }
    )
    return ds


def _swept(params: dict[str, list[Any]]) -> list[str]:
    return [k.removeprefix("param_") for k, v in params.items() if len({repr(x) for x in v}) > 1]


def _array(values: list[Any]) -> np.ndarray:
    """A netCDF-friendly array: bool, int64, float64 (None -> NaN) or variable-length str."""
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in present):
        if len(present) == len(values):
            return np.asarray(values, dtype=bool)
        return np.asarray([_num(v) for v in values], dtype="float64")
    if present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        if len(present) == len(values):
            return np.asarray(values, dtype="int64")
        return np.asarray([_num(v) for v in values], dtype="float64")
    if present and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return np.asarray([_num(v) for v in values], dtype="float64")
    return np.asarray(["" if v is None else str(v) for v in values], dtype=object)


def _without_nul(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` with NUL characters in its strings replaced by U+FFFD (netCDF cannot store them; a
    server's log tail in an error message may hold one). The result records keep the raw text."""
    fixed: dict[str, Any] = {}
    for name, var in ds.variables.items():
        if var.dtype == object and any(isinstance(v, str) and "\x00" in v for v in var.values.ravel().tolist()):
            clean = [v.replace("\x00", "\ufffd") if isinstance(v, str) else v for v in var.values.ravel().tolist()]
            fixed[str(name)] = var.copy(data=np.asarray(clean, dtype=object).reshape(var.shape))
            log.warning("dataset variable %s: NUL characters replaced by U+FFFD", name)
    if not fixed:
        return ds
    return ds.assign_coords({k: v for k, v in fixed.items() if k in ds.coords}).assign(
        {k: v for k, v in fixed.items() if k not in ds.coords})


def write_dataset(store: Store) -> Path:
    """Rebuild ``results.nc`` and replace it atomically; returns its path."""
    ds = _without_nul(build_dataset(store))
    final = store.folder / DATASET_FILE
    fd, tmp = tempfile.mkstemp(prefix=".results-", suffix=".nc", dir=store.folder)
    os.close(fd)
    try:
        write_netcdf(ds, tmp)  # strings as fixed-width char arrays where that pays (servetune.netcdf)
        os.replace(tmp, final)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return final
