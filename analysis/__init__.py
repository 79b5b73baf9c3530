"""Analysis of servetune experiments. ``analysis.load(EXPERIMENT)`` returns its xarray dataset.

The dataset's shape is documented in :mod:`servetune.schema`.
"""

from analysis.load import load

__all__ = ["load"]
