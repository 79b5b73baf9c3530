"""Words the pages put on numbers: metric units, axis labels, and short config labels.

A config's full label names every swept parameter in the spec's order, so two configs that differ
only in the last parameter look alike once a picker or a table cell truncates them.
:func:`short_labels` puts the parameters that differ between the configs shown first (most levels
first) and leaves out those every config shares.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from analysis.frame import PARAM_PREFIX

_UNITS = {"output_throughput": "tok/s", "total_token_throughput": "tok/s", "request_throughput": "req/s",
          "request_goodput": "req/s", "achieved_rate": "req/s", "offered_rate": "req/s", "scheduled_rate": "req/s",
          "output_tokens_per_user": "tok/s per user", "output_tokens_per_gpu": "tok/s per GPU",
          "output_tokens_per_dollar": "tok per USD", "duration_s": "s", "server_startup_s": "s",
          "slo_attainment": "fraction", "server_max_kv_cache_usage": "fraction",
          "server_prefix_cache_hit_rate": "fraction", "kv_cache_tokens": "tokens"}


def unit(metric: str) -> str:
    """The unit of a trial-table metric ("" when it has none or is unknown)."""
    if metric in _UNITS:
        return _UNITS[metric]
    base = metric.rsplit("_p", 1)[0] if "_p" in metric else metric
    if base.endswith("_ms") or metric.endswith("_ms"):
        return "ms"
    return ""


def axis_label(metric: str) -> str:
    """``ttft_ms_p99`` -> ``ttft_ms_p99 (ms)``: the metric with its unit, for an axis."""
    u = unit(metric)
    return f"{metric} ({u})" if u else metric


def _value(v: Any) -> str:
    if isinstance(v, float) and math.isfinite(v) and v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return str(v)


def short_labels(df: pd.DataFrame) -> dict[str, str]:
    """config id -> a short label of the configs in ``df``: only the swept parameters whose values
    differ between them, the ones with the most distinct values first (``name=value``, comma
    separated); a config with nothing differing is labelled by its full label."""
    cols = [c for c in df.columns if str(c).startswith(PARAM_PREFIX)]
    first = df.drop_duplicates("config_id")
    ids = first["config_id"].astype(str).to_numpy(dtype=object)
    # per column, each distinct value is formatted once (93,000 configs: 0.2 s, not 2 s row by row)
    words: dict[str, np.ndarray] = {}
    varying = []
    for c in cols:
        codes, uniq = pd.factorize(first[c], use_na_sentinel=False)
        texts = [_value(u) for u in uniq]
        n = len(set(texts))
        if n > 1:
            name = str(c).removeprefix(PARAM_PREFIX)
            words[c] = np.asarray([f"{name}={t}" for t in texts], dtype=object)[codes]
            varying.append((-n, cols.index(c), c))
    order = [c for _, _, c in sorted(varying)]
    if not order:
        full = first["config_label"].astype(str) if "config_label" in first else first["config_id"].astype(str)
        return dict(zip(ids.tolist(), full.tolist()))
    out = words[order[0]]
    for c in order[1:]:
        out = out + ", " + words[c]
    return dict(zip(ids.tolist(), out.tolist()))


def slo_bounds(ds: Any) -> dict[str, float]:
    """The spec's SLOs (``ds.attrs["slos"]``) as trial-table column -> bound in ms
    (``ttft_ms`` at percentile 99, max 200 -> ``{"ttft_ms_p99": 200.0}``); unreadable ones are skipped."""
    import json

    from analysis.frame import quantile_column

    raw = ds.attrs.get("slos", "")
    try:
        data = json.loads(raw) if isinstance(raw, str) and raw else (raw or [])
    except ValueError:
        return {}
    out: dict[str, float] = {}
    for s in data if isinstance(data, list) else []:
        try:
            out[quantile_column(str(s["metric"]), float(s.get("percentile", 99.0)) / 100.0)] = float(s["max_ms"])
        except (KeyError, TypeError, ValueError):
            continue
    return out
