"""Cross-hardware mode: hardware classes compared explicitly, on normalised metrics only.

By default no analysis puts two hardware classes together (:mod:`analysis.hardware`). This mode is
the one asked-for exception, and every output of it says so (``mode`` ``"cross-hardware"``, a
``label`` naming the normalisation, and the group key's ``hardware_class`` reads
``cross-hardware (...)``). Each (config, hardware class) pair is its own entry, ``<config_id>@<class>``
labelled ``<label> on <class>``, so one config measured on two classes is two rows, never one pooled
row. Normalisations (:data:`NORMALISATIONS`):

``per_gpu``
    the objective per GPU the config used (``output_tokens_per_gpu``: output throughput /
    ``tensor_parallel_size``, a CPU node counting as one device).
``per_gpu_hour``
    the objective per US dollar of GPU time at the user's prices (``output_tokens_per_dollar``:
    output throughput x 3600 / (GPUs x USD per GPU-hour)). Prices come from ``prices`` (hardware
    class -> USD per GPU-hour, as the ``hardware_class`` coordinate names it), else from the spec's
    ``gpu_hour_prices``; without a price for every compared class the view is refused
    (:class:`AnalysisInputError` naming the unpriced classes): prices are never guessed.

Latencies (the front's other axis, the SLO gate) are compared as measured: they are what a user
of each class would see, and the label says so.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from analysis.common import Caveat
from analysis.frame import AnalysisInputError, trial_table
from analysis.hardware import classes_of, require_not_mixed
from analysis.pareto import ParetoResult, front
from analysis.ranking import RankingResult, rank

MODE = "cross-hardware"

#: normalisation -> (ranking policy, normalised output-throughput column, words)
NORMALISATIONS: dict[str, tuple[str, str, str]] = {
    "per_gpu": ("per_gpu", "output_tokens_per_gpu",
                "per GPU (output throughput / GPUs the config used)"),
    "per_gpu_hour": ("per_cost", "output_tokens_per_dollar",
                     "per GPU-hour at the user's prices (output tokens per US dollar: output throughput x 3600 / "
                     "(GPUs x USD per GPU-hour))"),
}


@dataclass(frozen=True)
class CrossHardware:
    """A labelled comparison of hardware classes on a normalised metric.

    ``ranking`` ranks every (config, class) entry per load point under the normalised policy (of
    the objective); ``front`` is their Pareto front of ``metric`` (normalised output throughput)
    against ``latency`` (as measured). ``measured_on``
    maps each entry's id (``<config_id>@<class>``) to its class; ``prices`` are the USD per GPU-hour
    used (``prices_from``: ``argument`` or ``spec``; empty for ``per_gpu``)."""

    mode: str
    normalisation: str
    label: str
    metric: str
    latency: str
    classes: list[str]
    prices: dict[str, float]
    prices_from: str
    ranking: RankingResult
    front: ParetoResult
    measured_on: dict[str, str]
    warnings: list[Caveat] = field(default_factory=list)


def _spec_prices(ds: xr.Dataset) -> dict[str, float]:
    raw = ds.attrs.get("gpu_hour_prices", "") or ""
    try:
        data = json.loads(raw) if isinstance(raw, str) and raw else dict(raw or {})
    except ValueError:
        return {}
    return {str(k): float(v) for k, v in data.items()}


def resolve_prices(ds: xr.Dataset, classes: list[str], prices: Mapping[str, Any] | None) -> tuple[dict[str, float], str]:
    """The USD per GPU-hour of every class in ``classes`` and where they came from; refuses
    (:class:`AnalysisInputError`) a missing, non-numeric or non-positive price, naming the class."""
    given = dict(prices) if prices is not None else None
    source = "argument" if given else "spec"
    chosen = given if given else _spec_prices(ds)
    out: dict[str, float] = {}
    for cls, value in chosen.items():
        try:
            price = float(value)
        except (TypeError, ValueError):
            raise AnalysisInputError(f"price of hardware class {cls!r} must be a number of US dollars per GPU-hour, "
                                     f"got {value!r}") from None
        if not math.isfinite(price) or price <= 0:
            raise AnalysisInputError(f"price of hardware class {cls!r} must be > 0 US dollars per GPU-hour, "
                                     f"got {value!r}")
        out[str(cls)] = price
    missing = [c for c in classes if c not in out]
    if missing:
        raise AnalysisInputError(
            f"the per-GPU-hour comparison needs a price (US dollars per GPU-hour) for every hardware class; none is "
            f"given for {', '.join(missing)}{' (no prices given at all)' if not out else ''}: pass prices "
            "{class: USD per GPU-hour} (--gpu-hour-price CLASS=USD) or set gpu_hour_prices in the spec; "
            "prices are never guessed")
    return {c: out[c] for c in classes}, source


def relabel(ds: xr.Dataset, group_label: str) -> tuple[xr.Dataset, pd.DataFrame, dict[str, str]]:
    """``ds`` and its trial table with every (config, class) pair as its own config and one group."""
    table = trial_table(ds)  # derived metrics (per GPU, per dollar) computed with the real classes
    hw = table["hardware_class"].astype(str).to_numpy(dtype=object)
    cfg = table["config_id"].astype(str).to_numpy(dtype=object)
    label = (table["config_label"].astype(str).to_numpy(dtype=object) if "config_label" in table
             else cfg.copy())
    entry = np.array([f"{c}@{h}" for c, h in zip(cfg.tolist(), hw.tolist())], dtype=object)
    entry_label = np.array([f"{lb} on {h}" for lb, h in zip(label.tolist(), hw.tolist())], dtype=object)
    group = np.full(len(table), group_label, dtype=object)
    table = table.assign(config_id=entry, config_label=entry_label, hardware_class=group, measured_on=hw)
    out = ds.assign_coords(config_id=("trial", entry), config_label=("trial", entry_label),
                           hardware_class=("trial", group), measured_on=("trial", hw))
    measured = {str(e): str(h) for e, h in zip(entry.tolist(), hw.tolist()) if h}
    return out, table, measured


_relabel = relabel  #: its name when it was private (kept for callers written against it)


def compare_hardware(ds: xr.Dataset, normalise: str = "per_gpu", prices: Mapping[str, Any] | None = None,
                     latency: str = "ttft_ms_p99", objective: str | None = None,
                     slos: list[dict[str, Any]] | None = None, n_boot: int = 200, seed: int = 0,
                     include_failover: bool = True) -> CrossHardware:
    """Compare the hardware classes of ``ds`` on a normalised metric (see the module docstring).

    Args:
        ds: an experiment's dataset, usually with trials of several hardware classes.
        normalise: ``per_gpu`` or ``per_gpu_hour`` (:data:`NORMALISATIONS`).
        prices: hardware class -> US dollars per GPU-hour (``per_gpu_hour``; default the spec's).
        latency: the front's latency axis, compared as measured.
        objective, slos, n_boot, seed, include_failover: as for :func:`analysis.ranking.rank`.

    Raises:
        AnalysisInputError: an unknown normalisation, or ``per_gpu_hour`` without a price for
            every class (named).
    """
    if normalise not in NORMALISATIONS:
        raise AnalysisInputError(f"unknown normalisation {normalise!r}; known: {', '.join(NORMALISATIONS)}")
    policy, column, words = NORMALISATIONS[normalise]
    classes = classes_of(ds)
    if not classes:
        raise AnalysisInputError("no trial records a hardware class: there is nothing to compare across hardware")
    require_not_mixed(ds, "a cross-hardware comparison")
    used: dict[str, float] = {}
    source = ""
    warnings: list[Caveat] = []
    if normalise == "per_gpu_hour":
        used, source = resolve_prices(ds, classes, prices)
        extra = sorted(set(prices or {}) - set(classes))
        if extra:
            warnings.append(Caveat("unused_prices", f"prices given for {', '.join(extra)}, which ran no trial here"))
        ds = ds.copy()
        ds.attrs = {**ds.attrs, "gpu_hour_prices": json.dumps(used, sort_keys=True)}
    label = (f"CROSS-HARDWARE comparison of {', '.join(classes)}, normalised {words}; latencies as measured. "
             "Not a per-class result: each class's own ranking and front are the default views")
    group_label = f"{MODE} ({', '.join(classes)}; normalised {normalise})"
    if len(classes) == 1:
        warnings.append(Caveat("one_class", f"only one hardware class ({classes[0]}) ran trials: nothing to compare "
                                             "across; this is its normalised view"))
    cross, table, measured = relabel(ds, group_label)
    ranking = rank(cross, policy=policy, objective=objective, slos=slos, n_boot=n_boot, seed=seed, table=table,
                   include_failover=include_failover)
    pareto = front(cross, metrics=(column, latency), n_boot=n_boot, seed=seed, table=table,
                   include_failover=include_failover)
    return CrossHardware(MODE, normalise, label, column, latency, classes, used, source, ranking, pareto, measured,
                         warnings + list(ranking.warnings))


def parse_prices(items: list[str]) -> dict[str, float] | None:
    """``["a100=2.5", ...]`` -> ``{"a100": 2.5}`` (None when none given); AnalysisInputError names a bad item."""
    out: dict[str, float] = {}
    for item in items:
        cls, sep, value = item.rpartition("=")
        try:
            price = float(value)
        except ValueError:
            price = float("nan")
        if not sep or not cls or not price > 0 or price == float("inf"):
            raise AnalysisInputError(f"--gpu-hour-price {item!r}: expected CLASS=USD with USD > 0")
        out[cls] = price
    return out or None
