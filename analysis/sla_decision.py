"""What to deploy when the experiment ran SLA searches: the config with the highest max rate at SLO.

An SLA search (``load_points[*].sla_search``, :mod:`servetune.sla`) probes each engine config at
rates of its own choosing, so its probes (``chat@9.42rps``) are not load points every config ran:
the per-load-point decision of :mod:`analysis.decision` cannot compare them. This module decides
on what the search found, per hardware class and SLA search load point, from the sweep's record
``runs/<name>/sla_search.json`` (written with ``results.nc``; :func:`read_sla_searches` checks that
it belongs to the same spec and that every probe it names is a trial of the dataset).

The objective is the trial-backed **max rate at SLO**: the highest probed rate that met every SLO,
beyond each percentile's sampling error, below every rate that missed, in every run (repeat) of
that config's search (``met_in_every_run_rps``). A config without one (no rate met in some run) is
not a candidate. Across several SLA search load points the ``weighted`` or ``regret`` rule of
:mod:`analysis.decision` combines them, each normalised by the best config's rate there.

Uncertainty. Each config's typical-run boundary has a 95% t-interval over its runs
(:func:`servetune.sla.combine_runs`; ``benchmarks/search/sla.py`` measures its coverage on the
simulator). Winner and runner-up are called distinguishable only when, on every SLA search load
point with weight > 0, the winner's interval lies wholly above the runner-up's: two non-overlapping
95% intervals. That is conservative (it misses some real differences), and it needs >= 2 runs per
config: with one run there is no interval over runs, so nothing is called distinguishable. The
verdicts were made during the sweep against the spec's SLOs; other SLOs cannot re-judge them
(:func:`sla_slos_match` refuses them).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.frame import AnalysisInputError

#: The sweep's SLA search record in the experiment folder (coordinator.sla_search.write_sla_file).
SLA_FILE = "sla_search.json"
#: The objective's name in a decision.
SLA_OBJECTIVE = "max_rate_at_slo_rps"
SLA_RULE = ("among configs whose SLA search found a rate meeting every SLO in every run on every SLA search load "
            "point, the highest max rate at SLO (with several such load points, the rule's traffic-weighted mean of "
            "each one's rate normalised by the best config's there); winner and runner-up are distinguishable only "
            "when the winner's 95% interval over runs on the typical boundary lies wholly above the runner-up's on "
            "every weighted load point (conservative; one run per config gives no interval)")
SLA_SLO_RULE = ("a probed rate meets the SLOs when even the high end of each percentile's sampling error is within "
                "its bound; the max rate at SLO is the highest rate meeting them below every rate that missed, in "
                "every run (servetune.sla)")


@dataclass(frozen=True)
class SlaSearch:
    """One config's SLA search on one load point and hardware class, over its runs."""

    config_id: str
    label: str
    load_point: str
    hardware_class: str
    runs: int
    met_in_every_run_rps: float | None
    boundary_estimate_rps: float | None
    boundary_ci95_rps: tuple[float, float] | None
    brackets: tuple[tuple[float | None, float | None], ...]
    stopped: tuple[str, ...]
    trial_ids: frozenset[str]


def _num(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)) or value <= 0:
        raise AnalysisInputError(f"{SLA_FILE}: {where} must be a positive number or null, got {value!r}")
    return float(value)


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise AnalysisInputError(f"{SLA_FILE}: {where} must be a non-empty string, got {value!r}")
    return value


def parse_sla_searches(doc: Any, trial_classes: Mapping[str, str], spec_hash: str) -> tuple[list[SlaSearch], list[dict[str, Any]]]:
    """The searches of a parsed :data:`SLA_FILE` and the SLOs they were judged against.

    ``trial_classes`` maps the dataset's trial ids to their hardware class; ``spec_hash`` is the
    dataset's. Raises AnalysisInputError naming the key when the record is malformed, belongs to
    another spec, or names a probe the dataset does not hold."""
    if not isinstance(doc, dict) or not isinstance(doc.get("searches"), list):
        raise AnalysisInputError(f"{SLA_FILE}: expected an object with a 'searches' list")
    if str(doc.get("spec_hash", "")) != spec_hash:
        raise AnalysisInputError(f"{SLA_FILE} is for spec {str(doc.get('spec_hash', ''))[:12]!r} but results.nc for "
                                 f"{spec_hash[:12]!r}: re-run the sweep (it rewrites both)")
    slos = doc.get("slos")
    if not isinstance(slos, list) or not all(isinstance(s, dict) for s in slos):
        raise AnalysisInputError(f"{SLA_FILE}: 'slos' must be a list of SLOs")
    out = []
    for i, s in enumerate(doc["searches"]):
        where = f"searches[{i}]"
        if not isinstance(s, dict) or not isinstance(s.get("per_run"), list) or not s["per_run"]:
            raise AnalysisInputError(f"{SLA_FILE}: {where} needs a non-empty 'per_run' list")
        ids: set[str] = set()
        brackets, stopped = [], []
        for j, run in enumerate(s["per_run"]):
            rw = f"{where}.per_run[{j}]"
            if not isinstance(run, dict) or not isinstance(run.get("probes"), list):
                raise AnalysisInputError(f"{SLA_FILE}: {rw} needs a 'probes' list")
            for k, p in enumerate(run["probes"]):
                ids.add(_str(p.get("trial_id") if isinstance(p, dict) else None, f"{rw}.probes[{k}].trial_id"))
            brackets.append((_num(run.get("bracket_low_rps"), f"{rw}.bracket_low_rps"),
                             _num(run.get("bracket_high_rps"), f"{rw}.bracket_high_rps")))
            stopped.append(str(run.get("stopped") or ""))
        missing = sorted(ids - set(trial_classes))
        if missing:
            raise AnalysisInputError(f"{SLA_FILE}: {where} names probe trial {missing[0][:16]!r}, which the dataset does "
                                     "not hold: the record and results.nc are from different sweeps")
        classes = {trial_classes[t] for t in ids}
        if len(classes) != 1:
            raise AnalysisInputError(f"{SLA_FILE}: {where}'s probes ran on several hardware classes: {sorted(classes)}")
        ci = s.get("boundary_ci95_rps")
        if ci is not None and (not isinstance(ci, list) or len(ci) != 2):
            raise AnalysisInputError(f"{SLA_FILE}: {where}.boundary_ci95_rps must be [low, high] or null, got {ci!r}")
        ci_pair = None if ci is None else (_num(ci[0], f"{where}.boundary_ci95_rps[0]"),
                                           _num(ci[1], f"{where}.boundary_ci95_rps[1]"))
        runs = s.get("runs")
        if isinstance(runs, bool) or not isinstance(runs, int) or runs != len(s["per_run"]):
            raise AnalysisInputError(f"{SLA_FILE}: {where}.runs must equal the number of per_run entries, got {runs!r}")
        out.append(SlaSearch(
            _str(s.get("config_id"), f"{where}.config_id"), str(s.get("config_label") or s.get("config_id")),
            _str(s.get("load_point"), f"{where}.load_point"), classes.pop(), runs,
            _num(s.get("met_in_every_run_rps"), f"{where}.met_in_every_run_rps"),
            _num(s.get("boundary_estimate_rps"), f"{where}.boundary_estimate_rps"),
            None if ci_pair is None or None in ci_pair else (float(ci_pair[0] or 0), float(ci_pair[1] or 0)),
            tuple(brackets), tuple(stopped), frozenset(ids)))
    return out, [dict(x) for x in slos]


def read_sla_searches(folder: Path, table: pd.DataFrame, spec_hash: str) -> tuple[list[SlaSearch], list[dict[str, Any]]] | None:
    """The SLA searches recorded in ``folder`` (None when the experiment ran none), checked against
    the dataset's trial ``table`` and ``spec_hash`` (:func:`parse_sla_searches`)."""
    path = Path(folder) / SLA_FILE
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AnalysisInputError(f"{path}: not readable JSON ({exc})") from None
    hw = table["hardware_class"].astype(str) if "hardware_class" in table else pd.Series("", index=table.index)
    classes = dict(zip(table["trial_id"].astype(str), hw, strict=True))
    if isinstance(doc, dict) and isinstance(doc.get("searches"), list):
        # a dataset cut to some trials (one hardware class) keeps the searches it holds probes of
        def held(s: Any) -> bool:
            runs = s.get("per_run") if isinstance(s, dict) else None
            return not isinstance(runs, list) or any(
                not isinstance(p, dict) or not isinstance(p.get("trial_id"), str) or p["trial_id"] in classes
                for r in runs if isinstance(r, dict) and isinstance(r.get("probes"), list) for p in r["probes"])
        doc = {**doc, "searches": [s for s in doc["searches"] if held(s)]}
    return parse_sla_searches(doc, classes, spec_hash)


def sla_of(ds: Any, table: pd.DataFrame) -> tuple[list[SlaSearch], list[dict[str, Any]]] | None:
    """:func:`read_sla_searches` of the folder ``ds`` was loaded from (``ds.encoding["source"]``, as
    :func:`analysis.load.load` leaves it); None for a dataset made in memory or without a record."""
    source = getattr(ds, "encoding", {}).get("source")
    if not source:
        return None
    return read_sla_searches(Path(str(source)).parent, table, str(ds.attrs.get("spec_hash", "")))


def _key(slo: Mapping[str, Any]) -> tuple[str, float, float]:
    return (str(slo.get("metric")), float(slo.get("percentile", 99.0)), float(slo.get("max_ms", math.nan)))


def sla_slos_match(asked: Sequence[Mapping[str, Any]], judged: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the SLOs a decision asks for are the ones the SLA searches were judged against."""
    return sorted(map(_key, asked)) == sorted(map(_key, judged))


@dataclass(frozen=True)
class SlaTable:
    """One hardware class's searches as arrays: ``rate[c, l]`` the max rate at SLO of config ``c`` on
    SLA load point ``l`` (NaN: none, or no search there), ``low``/``high`` its boundary interval
    (NaN: none)."""

    config_ids: list[str]
    labels: list[str]
    load_points: list[str]
    rate: np.ndarray
    low: np.ndarray
    high: np.ndarray
    searches: dict[tuple[str, str], SlaSearch]


def sla_table(searches: Sequence[SlaSearch], load_points: Sequence[str]) -> SlaTable:
    ids = sorted({s.config_id for s in searches})
    labels = {s.config_id: s.label for s in searches}
    at = {(s.config_id, s.load_point): s for s in searches}
    shape = (len(ids), len(load_points))
    rate, low, high = np.full(shape, np.nan), np.full(shape, np.nan), np.full(shape, np.nan)
    for c, cid in enumerate(ids):
        for j, lp in enumerate(load_points):
            s = at.get((cid, lp))
            if s is None:
                continue
            if s.met_in_every_run_rps is not None:
                rate[c, j] = s.met_in_every_run_rps
            if s.boundary_ci95_rps is not None:
                low[c, j], high[c, j] = s.boundary_ci95_rps
    return SlaTable(ids, [labels[i] for i in ids], list(load_points), rate, low, high, at)


def distinguishable(t: SlaTable, win: int, run: int, weights: np.ndarray) -> bool:
    """Whether the winner's interval lies wholly above the runner-up's on every weighted load point."""
    used = weights > 0
    lo_w, hi_r = t.low[win, used], t.high[run, used]
    return bool(used.any() and np.isfinite(lo_w).all() and np.isfinite(hi_r).all() and (lo_w > hi_r).all())


def rate_text(s: SlaSearch | None) -> str:
    """``9.12 req/s in every run of 3 (typical boundary 10.2 [9.02, 11.5])`` for one search."""
    if s is None:
        return "no SLA search"
    met = (f"{s.met_in_every_run_rps:.4g} req/s in every run" if s.met_in_every_run_rps is not None
           else "no rate meeting every SLO in every run")
    met += f" of {s.runs}" if s.runs > 1 else " of its one run"
    if s.boundary_estimate_rps is not None and s.boundary_ci95_rps is not None:
        met += (f" (typical boundary {s.boundary_estimate_rps:.4g} [{s.boundary_ci95_rps[0]:.4g}, "
                f"{s.boundary_ci95_rps[1]:.4g}] req/s, 95% over runs)")
    return met


__all__ = ["SLA_FILE", "SLA_OBJECTIVE", "SLA_RULE", "SLA_SLO_RULE", "SlaSearch", "SlaTable", "parse_sla_searches",
           "read_sla_searches", "sla_of", "sla_slos_match", "sla_table", "distinguishable", "rate_text"]
