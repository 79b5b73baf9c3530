"""SYNTHETIC experiments with a designed table of per-config medians, for the decision core.

Nothing here was measured. :func:`designed` draws a :func:`analysis.synthetic.planted` experiment
(its shape, attributes and ``synthetic`` = 1 flag) and overwrites its configs' output throughput and
``ttft_ms`` 99th percentile with the designed medians times log-normal noise, so every winner,
margin and threshold of :func:`analysis.decision.recommend` is known in advance. Configs are named
by the design's keys (``config_id`` = ``config_label`` = the key); their ``param_*`` values stay
the planted ones, so a winner still has a real ``vllm serve`` command.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import xarray as xr

from analysis.synthetic import planted

#: config -> load point -> (output_throughput median, ttft_ms_p99 median)
Design = Mapping[str, Mapping[str, tuple[float, float]]]
TTFT_P99 = 3  # index of the 0.99 quantile in the planted dataset


def designed(design: Design, hardware_class: str = "sim-gpu-a", repeats: int = 4, seed: int = 0,
             noise: float = 0.01) -> xr.Dataset:
    """A SYNTHETIC dataset: ``repeats`` trials of every config of ``design`` on every load point
    (the design's load points, same for every config), each value = designed median x exp(N(0, noise))."""
    names = sorted(design)
    load_points = list(next(iter(design.values())))
    for attempt in range(100):  # planted's random design may draw a config twice: redraw, deterministically
        ds, _ = planted(n_configs=len(names), n_params=6, repeats=repeats, load_points=tuple(load_points),
                        fail_rate_region=0.0, fail_rate_base=0.0, hardware_classes=(hardware_class,),
                        seed=seed + 100_003 * attempt)
        ids = np.asarray(ds["config_id"].values, dtype=object)
        uniq = sorted(set(ids.tolist()))
        if len(uniq) == len(names):
            break
    else:
        raise ValueError(f"could not draw {len(names)} distinct planted configs")
    name_of = dict(zip(uniq, names))
    rng = np.random.default_rng([seed, 1])
    lps = np.asarray(ds["load_point"].values, dtype=object).tolist()
    tp = ds["output_throughput"].values.copy()
    ttft = ds["ttft_ms"].values.copy()
    for i, (cid, lp) in enumerate(zip(ids.tolist(), lps)):
        thr, lat = design[name_of[cid]][lp]
        tp[i] = thr * float(np.exp(rng.normal(0, noise)))
        ttft[i, TTFT_P99] = lat * float(np.exp(rng.normal(0, noise)))
    new_ids = np.asarray([name_of[c] for c in ids.tolist()], dtype=object)
    out = ds.assign(output_throughput=("trial", tp), ttft_ms=(("trial", "quantile"), ttft))
    out = out.assign_coords(config_id=("trial", new_ids), config_label=("trial", new_ids.copy()))
    out.attrs = dict(ds.attrs)
    return out
