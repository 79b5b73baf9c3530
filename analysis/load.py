"""Load experiments' consolidated datasets (written by the coordinator after each result)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import xarray as xr

from analysis.common import restart_per_repeat_of
from servetune.errors import ExperimentNotFoundError
from servetune.paths import resolve_experiment_dir
from servetune.schema import DATASET_FILE, SCHEMA_VERSION


class MissingExperimentError(ExperimentNotFoundError):
    """An experiment that is not there (yet), or not readable by this servetune: the user's input,
    not a bug, so IPython and Jupyter show only its message (``_render_traceback_``), no traceback."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


def load(experiment: str | os.PathLike[str], results_root: str | os.PathLike[str] | None = None,
         fidelity: str = "full") -> xr.Dataset:
    """The dataset of ``experiment`` (its name, folder, spec file, or a ``results.nc`` path), fully read into memory.

    Every experiment the dashboard lists loads: a folder with a sweep's store (``experiment.sqlite``)
    or with only a ``results.nc`` (copied out of its experiment, or synthetic).

    One row per trial on the ``trial`` dimension (its latest finished attempt or its hole);
    latencies over ``quantile``. String variables are object arrays of ``str``, as the coordinator
    built them, whichever layout the file has (:mod:`servetune.netcdf`: fixed-width char arrays,
    or the variable-length strings of older files, which xarray reads as fixed-width unicode).
    Raises :class:`MissingExperimentError` (an :class:`ExperimentNotFoundError`) when there is none.
    A dataset with SIMULATED trials (backend ``sim``) gets the attribute ``simulated``: the label
    naming their profiles and calibration (:func:`analysis.hardware.simulated_of`).

    ``fidelity``: ``"full"`` (default) leaves out the trials of a successive-halving rung below full
    fidelity (measured on fewer requests: screening, never pooled with full trials; the attribute
    ``screening_trials`` says how many were left out), ``"all"`` keeps them, each with its
    ``fidelity`` coordinate.
    """
    if fidelity not in ("full", "all"):
        raise ValueError(f"fidelity must be 'full' or 'all', got {fidelity!r}")
    direct = Path(experiment)
    if direct.suffix == ".nc" and direct.is_file():
        path = direct  # a results.nc copied out of its experiment folder
    else:
        try:
            folder = resolve_experiment_dir(experiment, results_root, dataset_only=True)
        except ExperimentNotFoundError as exc:
            raise MissingExperimentError(str(exc)) from None
        path = folder / DATASET_FILE
    if not path.exists():
        raise MissingExperimentError(f"experiment {path.parent} has no {DATASET_FILE} yet")
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        loaded = ds.load()
    unicode = {name: var.astype(object) for name, var in loaded.variables.items() if var.dtype.kind == "U"}
    if unicode:  # a file with variable-length strings (written before servetune.netcdf)
        loaded = loaded.assign_coords({k: v for k, v in unicode.items() if k in loaded.coords})
        loaded = loaded.assign({k: v for k, v in unicode.items() if k not in loaded.coords})
    version = int(loaded.attrs.get("schema_version", 0))
    if version != SCHEMA_VERSION:
        raise MissingExperimentError(f"{path} has schema version {version}; this servetune reads {SCHEMA_VERSION}")
    from analysis.hardware import simulated_of

    label = simulated_of(loaded)
    if label is not None:  # the mark every reader (reports, decisions, pages) finds on the dataset
        loaded.attrs["simulated"] = label
    if fidelity == "full" and "fidelity" in loaded.coords:
        full = loaded["fidelity"].values >= 1.0
        if not full.all():
            n_screening = int((~full).sum())
            loaded = loaded.isel(trial=np.flatnonzero(full))
            loaded.attrs["screening_trials"] = n_screening
    return loaded


def load_many(
    experiments: Sequence[str | os.PathLike[str]], results_root: str | os.PathLike[str] | None = None
) -> xr.Dataset:
    """Several experiments as one dataset: their trials concatenated along ``trial``.

    A parameter one experiment swept and another did not is NaN / "" (vLLM's default) in the
    other's rows. The attribute ``experiments`` lists them (JSON), and analyses word effects
    across experiments as associations (they differ in more than one parameter). One experiment
    returns exactly :func:`load`'s dataset.
    """
    if not experiments:
        raise ExperimentNotFoundError("no experiment given")
    parts = [load(e, results_root) for e in experiments]
    if len(parts) == 1:
        return parts[0]
    return combine(parts)


def combine(parts: Sequence[xr.Dataset]) -> xr.Dataset:
    """Concatenate experiment datasets along ``trial`` (see :func:`load_many`)."""
    coord_kinds: dict[str, np.dtype] = {}
    for ds in parts:
        for name, coord in ds.coords.items():
            if coord.dims == ("trial",) and name != "trial":
                coord_kinds.setdefault(str(name), coord.dtype)
    filled = []
    for ds in parts:
        missing = {}
        for name, dtype in coord_kinds.items():
            if name in ds.coords:
                continue
            n = ds.sizes["trial"]
            if dtype.kind in "OUS":
                missing[name] = ("trial", np.full(n, "", dtype=object))
            else:
                missing[name] = ("trial", np.full(n, np.nan))
        filled.append(ds.assign_coords(missing).drop_vars("trial"))
    out = xr.concat(filled, dim="trial", coords="different", compat="equals", join="outer",
                    combine_attrs="drop_conflicts")
    out = out.assign_coords(trial=np.arange(out.sizes["trial"], dtype="int64"))
    names = [str(ds.attrs.get("experiment", "")) for ds in parts]
    out.attrs["experiments"] = json.dumps(names)
    out.attrs["experiment"] = "+".join(names)
    designs = {str(ds.attrs.get("design", "")) for ds in parts}
    out.attrs["design"] = designs.pop() if len(designs) == 1 else "mixed"
    out.attrs["restart_per_repeat"] = min(restart_per_repeat_of(ds) for ds in parts)
    swept: set[str] = set()
    for ds in parts:
        swept.update(json.loads(ds.attrs.get("swept_parameters", "[]") or "[]"))
    out.attrs["swept_parameters"] = json.dumps(sorted(swept))
    hws = {h for ds in parts for h in str(ds.attrs.get("hardware_classes", "")).split(",") if h}
    out.attrs["hardware_classes"] = ",".join(sorted(hws))
    return out
