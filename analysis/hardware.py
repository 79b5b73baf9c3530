"""Hardware classes and failover trials in the analyses: what never mixes, and how moved trials show.

Hardware classes (the ``hardware_class`` coordinate, :func:`daemon.fingerprint`'s class of the node
that measured the trial) are incomparable: a ranking, a Pareto front, a surrogate fit (importance,
partial dependence, interactions, verdicts), a failure model or a drift chart never pools trials of
two classes. :func:`require_separate` is the one rule every view applies: with several classes in
the analysed trials, a grouping must include ``hardware_class`` or a surrogate must be given one
class. Comparing classes is an explicit, labelled mode of its own (:mod:`analysis.crosshw`), on
normalised metrics only.

Failover trials: a trial the coordinator moved to another class or daemon (where the spec declared
hardware interchangeable) carries the tag ``failover-from:<class or daemon>``. The read side is the
``tags`` coordinate on ``trial`` (text: tags separated by commas, or a JSON list; "" or absent when a
trial has none). Every analysis takes ``include_failover`` (default ``True``: included, and
*marked*: ranking rows and front points count their failover trials in ``n_failover``, and a
``failover_trials`` caveat names how many and where from); ``include_failover=False`` leaves them out
and says so (``failover_excluded``). A dataset without a ``tags`` coordinate has no failover trials.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from analysis.common import Notes
from analysis.frame import AnalysisInputError
from servetune.simulated import is_simulated, mixed_message, simulated_label

TAGS = "tags"
FAILOVER_PREFIX = "failover-from:"


def parse_tags(value: Any) -> list[str]:
    """The tags of one trial from the ``tags`` coordinate's text (comma-separated or a JSON list)."""
    if value is None or (isinstance(value, float) and value != value):
        return []
    if isinstance(value, (list, tuple, np.ndarray)):
        return [str(v).strip() for v in value if str(v).strip()]
    text = str(value).strip()
    if not text:
        return []
    if text.startswith("["):
        try:
            items = json.loads(text)
        except ValueError:
            items = None
        if isinstance(items, list):
            return [str(v).strip() for v in items if str(v).strip()]
    return [t.strip() for t in text.split(",") if t.strip()]


def failover_sources(tags: Sequence[Any] | np.ndarray | pd.Series) -> np.ndarray:
    """Per trial, where it was moved from (``failover-from:<X>`` -> ``X``), or "" for an original."""
    values = np.asarray(tags.tolist() if hasattr(tags, "tolist") else list(tags), dtype=object)
    if values.size == 0:
        return np.full(0, "", dtype=object)
    codes, uniq = pd.factorize(pd.Series(values).astype(str))  # each distinct tag text parsed once
    found = []
    for value in np.asarray(uniq, dtype=object).tolist():
        src = ""
        for t in parse_tags(value):
            if t.startswith(FAILOVER_PREFIX):
                src = t.removeprefix(FAILOVER_PREFIX) or "?"
                break
        found.append(src)
    return np.asarray(found, dtype=object)[np.asarray(codes, dtype=np.intp)]


def _column(data: xr.Dataset | pd.DataFrame, name: str) -> np.ndarray | None:
    if isinstance(data, pd.DataFrame):
        return data[name].to_numpy(dtype=object) if name in data else None
    if name in data.coords or name in data.data_vars:
        return np.asarray(data[name].values, dtype=object)
    return None


def failover_of(data: xr.Dataset | pd.DataFrame) -> np.ndarray:
    """:func:`failover_sources` of a dataset's or trial table's rows ("" everywhere without tags)."""
    tags = _column(data, TAGS)
    n = len(data) if isinstance(data, pd.DataFrame) else int(data.sizes.get("trial", 0))
    return np.full(n, "", dtype=object) if tags is None else failover_sources(tags)


def classes_of(data: xr.Dataset | pd.DataFrame) -> list[str]:
    """The distinct hardware classes of the rows (sorted; "" of holes left out)."""
    hw = _column(data, "hardware_class")
    return [] if hw is None else sorted({str(v) for v in hw.tolist() if str(v)})


def simulated_mask(data: xr.Dataset | pd.DataFrame) -> np.ndarray:
    """Per row: whether the trial is SIMULATED (:func:`servetune.simulated.is_simulated`: backend ``sim``
    or a ``sim-`` hardware class); planted synthetic data (backend ``synthetic``) is not."""
    backend = _column(data, "backend")
    hw = _column(data, "hardware_class")
    n = len(backend) if backend is not None else (len(hw) if hw is not None else 0)
    b = backend.tolist() if backend is not None else [None] * n
    h = hw.tolist() if hw is not None else [None] * n
    return np.array([is_simulated(x, y) for x, y in zip(b, h)], dtype=bool)


def simulated_of(data: xr.Dataset | pd.DataFrame) -> str | None:
    """The SIMULATED label of the rows (:func:`servetune.simulated.simulated_label`, naming the profiles
    and their calibration) when any trial is simulated, else None."""
    mask = simulated_mask(data)
    if not mask.any():
        return None
    hw = _column(data, "hardware_class")
    return simulated_label(hw[mask].tolist() if hw is not None else [])


def require_not_mixed(data: xr.Dataset | pd.DataFrame, what: str) -> None:
    """Refuse ``what`` (a ranking, a front, a decision) over simulated and measured trials together."""
    mask = simulated_mask(data)
    if mask.any() and not mask.all():
        raise AnalysisInputError(mixed_message(what))


def several_classes_message(classes: Sequence[str], what: str) -> str:
    return (f"the trials ran on {len(classes)} hardware classes ({', '.join(classes)}), which never share {what}: "
            "analyse one class at a time (hardware_class=...), or compare classes explicitly on normalised "
            "metrics (analysis.crosshw)")


def require_separate(data: xr.Dataset | pd.DataFrame, by: Sequence[str], what: str) -> None:
    """Refuse a grouping ``by`` that would put trials of several hardware classes into one ``what``."""
    if "hardware_class" in by:
        return
    classes = classes_of(data)
    if len(classes) > 1:
        raise AnalysisInputError(several_classes_message(classes, what))


def one_class(data: xr.Dataset | pd.DataFrame, hardware_class: str | None, what: str) -> None:
    """Refuse a surrogate-style analysis (one fit) over several classes when none was chosen."""
    if hardware_class is not None:
        return
    classes = classes_of(data)
    if len(classes) > 1:
        raise AnalysisInputError(several_classes_message(classes, what))


def per_class(ds: xr.Dataset) -> list[tuple[str, xr.Dataset]]:
    """``ds`` split by hardware class (holes, which ran nowhere, go with every class they could be
    re-run on: each class's part keeps them). One class (or none recorded): ``[(class, ds)]``, the
    dataset itself."""
    classes = classes_of(ds)
    if len(classes) <= 1:
        return [(classes[0] if classes else "", ds)]
    hw = np.asarray(ds["hardware_class"].values, dtype=object).astype(str)
    out = []
    for c in classes:
        keep = np.flatnonzero((hw == c) | (hw == ""))
        part = ds.isel(trial=keep)
        part.attrs = {**ds.attrs, "hardware_classes": c}
        out.append((c, part))
    return out


@dataclass
class Failover:
    """The failover trials of what an analysis read: ``sources`` per trial ("" for originals),
    whether they were kept, and how many were left out."""

    sources: np.ndarray
    included: bool
    n_excluded: int = 0
    by_cell: dict[tuple[str, ...], int] = field(default_factory=dict)

    def n_failover(self, key: dict[str, str], config_id: str) -> int:
        """How many of the config's trials in the group ``key`` are failover trials."""
        return self.by_cell.get((*key.values(), str(config_id)), 0)


def select_failover(ds: xr.Dataset, table: pd.DataFrame | None, include_failover: bool, notes: Notes,
                    by: Sequence[str] = ()) -> tuple[xr.Dataset, pd.DataFrame | None, Failover]:
    """Keep or drop the failover trials of ``ds`` (and of its ``table``, row for row), with the caveat
    that says which; ``by_cell`` counts the kept ones per ``by`` group x config for marking rows."""
    src = failover_of(ds)
    moved = src != ""
    if not moved.any():
        return ds, table, Failover(src, include_failover)
    named = ", ".join(sorted(set(src[moved].tolist())))
    if not include_failover:
        keep = np.flatnonzero(~moved)
        notes.warn("failover_excluded", f"{int(moved.sum())} failover trial(s) (moved from {named}) are left out "
                                        "(include_failover=False)")
        if table is not None:
            table = table[~failover_of(table).astype(bool)] if TAGS in table else table.iloc[keep]
        return ds.isel(trial=keep), table, Failover(src[keep], False, int(moved.sum()))
    notes.warn("failover_trials", f"{int(moved.sum())} trial(s) are failover trials, moved from {named} to other "
                                  "hardware or daemons (tag failover-from:...): included and marked (n_failover); "
                                  "pass include_failover=False to leave them out")
    cells: dict[tuple[str, ...], int] = {}
    keys = [k for k in by if k in ds.coords or k in ds.data_vars]
    cols = [np.asarray(ds[k].values, dtype=object).astype(str) for k in [*keys, "config_id"]]
    for i in np.flatnonzero(moved).tolist():
        cell = tuple(c[i] for c in cols)
        cells[cell] = cells.get(cell, 0) + 1
    return ds, table, Failover(src, True, 0, cells)
