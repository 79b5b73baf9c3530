"""Load an experiment's consolidated dataset (written by the coordinator after each result)."""

from __future__ import annotations

import os

import xarray as xr

from servetune.errors import ExperimentNotFoundError
from servetune.paths import resolve_experiment_dir
from servetune.schema import DATASET_FILE, SCHEMA_VERSION


def load(experiment: str | os.PathLike[str], results_root: str | os.PathLike[str] | None = None) -> xr.Dataset:
    """The dataset of ``experiment`` (its name, folder, or spec file), fully read into memory.

    One row per trial on the ``trial`` dimension (its latest finished attempt or its hole);
    latencies over ``quantile``. Raises :class:`ExperimentNotFoundError` when there is none.
    """
    folder = resolve_experiment_dir(experiment, results_root)
    path = folder / DATASET_FILE
    if not path.exists():
        raise ExperimentNotFoundError(f"experiment {folder} has no {DATASET_FILE} yet")
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        loaded = ds.load()
    version = int(loaded.attrs.get("schema_version", 0))
    if version != SCHEMA_VERSION:
        raise ExperimentNotFoundError(f"{path} has schema version {version}; this servetune reads {SCHEMA_VERSION}")
    return loaded
