"""The planted 300-config replicates that tests/test_analysis_importance.py and
tests/test_analysis_effects.py both analyse (SYNTHETIC data, ``analysis.synthetic.planted``).

Computed once per test process and shared: for each seed the importance, the partial dependences and
the interactions are asked of one dataset back to back, so they reuse one fitted surrogate and its
bootstrap refits (``analysis.surrogate``'s content-keyed cache). The results are the ones each call
gives on its own: refit ``i`` depends only on the seed and ``i`` (``Surrogate.boot_fits``). Treat
them as read-only.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import xarray as xr

from analysis.effects import PDResult, partial_dependence
from analysis.importance import ImportanceResult, importance
from analysis.interactions import InteractionResult, interactions
from analysis.synthetic import INTERACTION, Truth, planted


@dataclass(frozen=True)
class Replicate:
    ds: xr.Dataset
    truth: Truth
    importance: ImportanceResult  # n_boot=30
    pd_seqs: PDResult  # partial dependence of max_num_seqs, n_boot=30
    interactions: InteractionResult  # n_boot=10
    pd_pair: PDResult  # two-parameter partial dependence of INTERACTION, n_boot=20


@cache
def replicate(seed: int) -> Replicate:
    """``planted(n_configs=300, n_params=6, seed=seed)`` and its analyses, each with ``seed=seed``."""
    ds, truth = planted(n_configs=300, n_params=6, seed=seed)
    return Replicate(
        ds, truth,
        importance(ds, n_boot=30, seed=seed),
        partial_dependence(ds, "max_num_seqs", n_boot=30, seed=seed),
        interactions(ds, n_boot=10, seed=seed),
        partial_dependence(ds, list(INTERACTION), n_boot=20, seed=seed),
    )
