"""Analysis of servetune experiments: answers with honest uncertainty.

``analysis.load(EXPERIMENT)`` returns an experiment's xarray dataset (shape in
:mod:`servetune.schema`); importing this package registers the ``ds.sweep`` accessor
(:mod:`analysis.accessor`) with Pareto fronts, switchable rankings, comparisons, parameter
importance, partial dependence, interactions, failure probability and baseline drift, each with
its uncertainty, its minimum-data warnings and its causal or associational wording.
``python -m analysis analyze EXPERIMENT --json`` (also ``python -m coordinator analyze``) prints
everything as JSON described by ``analysis/analyze.schema.json``.
"""

from analysis import accessor as _accessor  # noqa: F401  (registers ds.sweep)
from analysis.load import combine, load, load_many
from analysis.samples import pooled_latencies, trial_samples

__all__ = ["combine", "load", "load_many", "pooled_latencies", "trial_samples"]
