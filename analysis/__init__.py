"""Analysis of servetune experiments. ``analysis.load(EXPERIMENT)`` returns its xarray dataset.

The dataset's shape is documented in :mod:`servetune.schema`.
"""

from analysis.load import load
from analysis.samples import pooled_latencies, trial_samples

__all__ = ["load", "pooled_latencies", "trial_samples"]
