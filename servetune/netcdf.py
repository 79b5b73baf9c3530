"""How results datasets store their strings on disk: one rule for every writer of a ``results.nc``.

The coordinator (``coordinator.dataset.write_dataset``) and anything else that writes an
experiment's dataset (benchmarks, tests with synthetic experiments) go through :func:`write_netcdf`,
so every file has the same layout.

String variables (trial ids, config ids and labels, statuses, string parameters, ...) are written as
netCDF fixed-width character arrays (``char`` with a ``string<N>`` dimension and the attribute
``_Encoding = "utf-8"``; the layout netCDF-C, netCDF4-python and xarray read back as strings
without help). Reading one is a single contiguous read; variable-length strings, which older files
hold, cost HDF5 a heap look-up per value (about half the time of loading a 100,000-trial dataset).

A variable stays variable-length where fixed width would not round-trip or would mostly store
padding: when a value is not a ``str``, when there are no rows (xarray would read a char array
back as numbers), or when its widest value is over :data:`ALWAYS_FIXED_CHARS` characters and
padding every row to it would take more than :data:`MAX_PADDING` times the text itself (a few
long error messages among 100,000 empty ones). A string holding a NUL character fits neither
layout (HDF5 refuses it in variable-length strings, char arrays drop trailing NULs): writing it
raises ``ValueError`` naming the variable.

This module imports neither numpy nor xarray (it only calls the methods of the dataset it is given):
the core package stays pydantic and the standard library.
"""

from __future__ import annotations

import logging
import operator
import os
from itertools import repeat
from typing import Any

log = logging.getLogger(__name__)

ALWAYS_FIXED_CHARS = 64
"""Strings up to this many characters are always stored fixed-width, however uneven their lengths."""

MAX_PADDING = 4
"""Wider strings are fixed-width only if rows x widest value is at most this many times their total length."""

FIXED = {"dtype": "S1"}
"""xarray's encoding for a netCDF char array (it adds the ``string<N>`` dimension and ``_Encoding``)."""

VARIABLE_LENGTH = {"dtype": str}
"""xarray's encoding for a netCDF variable-length string (``NC_STRING``)."""


def string_layout(values: Any, name: str = "") -> dict[str, Any]:
    """The xarray encoding for one object array of strings: :data:`FIXED` or :data:`VARIABLE_LENGTH`.

    Args:
        values: a numpy object array (any shape), as a string variable's ``.values``.
        name: the variable's name, for the error message.

    Returns:
        a new dict, ready to pass as that variable's entry of ``to_netcdf(encoding=...)``.

    Raises:
        ValueError: a value holds a NUL character, which no netCDF string layout keeps.
    """
    items = values.ravel().tolist()  # C-level passes below: ~10 ms per 100,000 strings
    if not items or set(map(type, items)) != {str}:
        return dict(VARIABLE_LENGTH)
    if any(map(operator.contains, items, repeat("\x00"))):
        first = next(i for i, v in enumerate(items) if "\x00" in v)
        raise ValueError(f"string variable {name!r} holds a NUL character (at flat index {first}: "
                         f"{items[first][:80]!r}); netCDF strings cannot store it")
    lengths = list(map(len, items))
    widest = max(lengths)
    if widest > ALWAYS_FIXED_CHARS and len(items) * widest > MAX_PADDING * sum(lengths):
        return dict(VARIABLE_LENGTH)
    return dict(FIXED)


def netcdf_encoding(ds: Any) -> dict[str, dict[str, Any]]:
    """``to_netcdf``'s ``encoding`` for ``ds``: a layout for each of its string (object) variables.

    Variables of other dtypes get no entry (xarray's defaults). Used by :func:`write_netcdf`;
    exposed for callers that need to pass more options to ``to_netcdf`` themselves. Raises
    ``ValueError`` as :func:`string_layout` does.
    """
    encoding: dict[str, dict[str, Any]] = {}
    for name, var in ds.variables.items():
        if var.dtype == object:
            encoding[str(name)] = string_layout(var.values, str(name))
    fixed = sorted(k for k, v in encoding.items() if v == FIXED)
    log.debug("netCDF strings: fixed-width %s, variable-length %s", fixed, sorted(set(encoding) - set(fixed)))
    return encoding


def write_netcdf(ds: Any, path: str | os.PathLike[str]) -> None:
    """Write ``ds`` to ``path`` as netCDF4 (h5netcdf) with strings laid out by :func:`netcdf_encoding`.

    Raises ``ValueError`` (before writing anything) when a string holds a NUL character.

    Not atomic: a writer that replaces a file readers may be opening writes a temporary file in the
    same folder and ``os.replace``s it (as ``coordinator.dataset.write_dataset`` does).
    """
    ds.to_netcdf(path, engine="h5netcdf", encoding=netcdf_encoding(ds))
