"""``ds.sweep``: the analyses as methods of an experiment's xarray dataset.

Importing :mod:`analysis` registers the accessor::

    import analysis
    ds = analysis.load("quickstart")
    ok = ds.sweep.filter(status="ok", load_point="c32")
    ok.sweep.front(("output_throughput", "ttft_ms_p99"))
    ds.sweep.rank("goodput")          # switch the policy: nothing re-runs
    ds.sweep.importance()

Every method is a thin call into the module that documents it (:mod:`analysis.pareto`,
:mod:`analysis.ranking`, :mod:`analysis.compare`, :mod:`analysis.importance`,
:mod:`analysis.effects`, :mod:`analysis.interactions`, :mod:`analysis.failure`,
:mod:`analysis.drift`, :mod:`analysis.decision`, :mod:`analysis.report`); none modifies the dataset.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from analysis.frame import Parameter, filter_trials, parameters, trial_table
from analysis.hardware import failover_of


@xr.register_dataset_accessor("sweep")
class SweepAccessor:
    """Analysis methods on a servetune results dataset (see :mod:`servetune.schema`)."""

    def __init__(self, ds: xr.Dataset) -> None:
        self._ds = ds

    # ------------------------------------------------------------------ views
    def table(self) -> pd.DataFrame:
        """One row per trial with quantile columns and derived metrics (:func:`analysis.frame.trial_table`)."""
        return trial_table(self._ds)

    def parameters(self) -> list[Parameter]:
        """The swept parameters (:func:`analysis.frame.parameters`)."""
        return parameters(self._ds)

    def filter(
        self,
        status: str | Sequence[str] | None = None,
        load_point: str | Sequence[str] | None = None,
        dataset: str | Sequence[str] | None = None,
        hardware_class: str | Sequence[str] | None = None,
        include_baseline: bool = True,
        scenario: str | Sequence[str] | None = None,
        include_failover: bool = True,
        **param_values: Any,
    ) -> xr.Dataset:
        """The trials matching every filter, as a new dataset (attributes kept).

        ``scenario`` is an alias of ``load_point``. Parameter filters are keyed by parameter name
        (``max_num_seqs=[8, 16]``, ``max_num_batched_tokens=(1024, 4096)`` for a range).
        ``include_failover=False`` leaves out failover trials (tag ``failover-from:...``,
        :mod:`analysis.hardware`)."""
        if scenario is not None and load_point is not None:
            raise ValueError("give load_point or its alias scenario, not both")
        df = trial_table(self._ds)
        kept = filter_trials(df, status=status, load_point=scenario if scenario is not None else load_point,
                             dataset=dataset, hardware_class=hardware_class, include_baseline=include_baseline,
                             **param_values)
        keep = df.index.isin(kept.index)
        if not include_failover:
            keep &= failover_of(self._ds) == ""
        positions = np.flatnonzero(keep)
        return self._ds.isel(trial=positions)

    # ------------------------------------------------------------------ analyses
    def front(self, metrics: Sequence[str] = ("output_throughput", "ttft_ms_p99"), **kw: Any) -> Any:
        from analysis.pareto import front

        return front(self._ds, metrics=tuple(metrics), **kw)

    def rank(self, policy: str = "slo_throughput", **kw: Any) -> Any:
        from analysis.ranking import rank

        return rank(self._ds, policy=policy, **kw)

    def compare(self, config_a: str, config_b: str, **kw: Any) -> Any:
        from analysis.compare import compare

        return compare(self._ds, config_a, config_b, **kw)

    def importance(self, **kw: Any) -> Any:
        from analysis.importance import importance

        return importance(self._ds, **kw)

    def partial_dependence(self, params: str | Sequence[str], **kw: Any) -> Any:
        from analysis.effects import partial_dependence

        return partial_dependence(self._ds, params, **kw)

    def interactions(self, **kw: Any) -> Any:
        from analysis.interactions import interactions

        return interactions(self._ds, **kw)

    def failure(self, **kw: Any) -> Any:
        from analysis.failure import failure_probability

        return failure_probability(self._ds, **kw)

    def drift(self, **kw: Any) -> Any:
        from analysis.drift import drift

        return drift(self._ds, **kw)

    def recommend(self, weights: dict[str, float] | None = None, **kw: Any) -> Any:
        """One config to deploy per hardware class (:func:`analysis.decision.recommend`)."""
        from analysis.decision import recommend

        return recommend(self._ds, weights=weights, **kw)

    def analyze(self, **kw: Any) -> dict[str, Any]:
        """Everything, as the JSON document ``coordinator analyze --json`` prints."""
        from analysis.report import analyze

        return analyze(self._ds, **kw)
