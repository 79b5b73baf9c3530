"""What every analysis result carries: intervals, warnings, subsampling notes, causal wording.

Results are dataclasses; :func:`jsonable` turns any of them into plain JSON (NaN -> null) for
``coordinator analyze --json`` and the dashboard.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import xarray as xr

ClaimKind = Literal["effect", "association"]
CAUSAL_DESIGNS = ("grid", "random", "quasi-random")


@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided interval at ``level`` (e.g. 0.95)."""

    estimate: float
    low: float
    high: float
    level: float = 0.95

    def excludes(self, value: float) -> bool:
        return bool(self.low > value or self.high < value)

    def __str__(self) -> str:
        return f"{self.estimate:.4g} [{self.low:.4g}, {self.high:.4g}]"


@dataclass(frozen=True)
class Caveat:
    """A plain-words caveat about what the data can support. ``code`` is stable for programs."""

    code: str
    message: str
    subject: str = ""


@dataclass(frozen=True)
class Subsample:
    """A computation ran on ``used`` of ``of`` items to stay fast (the output says so)."""

    what: str
    used: int
    of: int

    @property
    def fraction(self) -> float:
        return self.used / self.of if self.of else 1.0


@dataclass(frozen=True)
class Claim:
    """Whether a result may be read as an effect of the parameter (``effect``) or only as an
    ``association``, and why (from the design the experiment recorded)."""

    kind: ClaimKind
    why: str


@dataclass(frozen=True)
class Context:
    """Where a result holds: hardware, model, vLLM version and workload of the trials analysed."""

    hardware: str
    model: str
    vllm_version: str
    workload: str

    def words(self) -> str:
        return (f"on {self.hardware or 'unrecorded hardware'}, model {self.model or 'unrecorded'}, "
                f"vLLM {self.vllm_version or 'unrecorded'} and workload {self.workload or 'unrecorded'}")


def design_of(ds: xr.Dataset) -> tuple[str, bool]:
    """The design the experiment recorded (grid / random / quasi-random / adaptive, or "") and
    whether its run order was randomised."""
    return str(ds.attrs.get("design", "") or ""), bool(int(ds.attrs.get("randomized", 0) or 0))


def restart_per_repeat_of(ds: xr.Dataset) -> int:
    """The dataset's ``restart_per_repeat`` attribute: 0 when it says a config's repeats shared a
    server start, else 1 (absent: every repeat had its own start; unreadable: taken as absent)."""
    try:
        return 0 if int(ds.attrs.get("restart_per_repeat", 1)) == 0 else 1
    except (TypeError, ValueError):
        return 1


def repeats_share_a_server(ds: xr.Dataset) -> bool:
    """Whether the experiment ran a config's repeats in one server start (``restart_per_repeat: false``)
    and some config has more than one repeat; datasets that do not say so gave every repeat its own start."""
    if restart_per_repeat_of(ds) or "repeat" not in ds.coords or ds.sizes.get("trial", 0) == 0:
        return False
    return bool(np.nanmax(np.asarray(ds["repeat"].values, dtype="float64")) >= 1)  # some config repeated


#: The caveat every interval over repeats carries when :func:`repeats_share_a_server` holds.
SHARED_SERVER_TEXT = ("the repeats of each config ran in one server start (restart_per_repeat: false): intervals "
                      "over repeats cover run-to-run noise within a start, not the variation between server "
                      "starts, so a fresh deployment can differ by more; set restart_per_repeat: true to include it")


def warn_if_repeats_share_a_server(ds: xr.Dataset, notes: Notes, subject: str = "") -> None:
    """Add the ``repeats_share_server`` caveat to ``notes`` when :func:`repeats_share_a_server` holds."""
    if repeats_share_a_server(ds):
        notes.warn("repeats_share_server", SHARED_SERVER_TEXT, subject)


#: Caveat codes about the experiment as a whole, whichever analysis repeats them: a report that
#: gathers every section's caveats states each of these once (:func:`analysis.report.dedupe_warnings`).
EXPERIMENT_CODES = frozenset({"pruned", "repeats_share_server"})


def pruned_configs(ds: xr.Dataset) -> list[tuple[str, str]]:
    """``(subject, message)`` for each engine config planning pruned before any trial (the dataset's
    ``pruned_configs``, :mod:`servetune.memfit`): it has no results, so no ranking or decision can
    name it, and every reader says so rather than letting it vanish."""
    out = []
    for p in json.loads(str(ds.attrs.get("pruned_configs", "") or "[]")):
        where = f" on {p['hardware_target']}" if p.get("hardware_target") else ""
        out.append((f"config {str(p['config_id'])[:12]}{where}",
                     f"{p['config_label']}{' (baseline)' if p.get('is_baseline') else ''} was pruned before any "
                     f"trial, so it has no results: {p['reason']}"))
    return out


def warn_of_pruned_configs(ds: xr.Dataset, notes: Notes) -> None:
    """Add a ``pruned`` caveat to ``notes`` per config :func:`pruned_configs` names."""
    for subject, message in pruned_configs(ds):
        notes.warn("pruned", message, subject)


def claim_for(ds: xr.Dataset, tool_set: bool = True) -> Claim:
    """The causal status of effects estimated from ``ds``.

    Effects of parameters the tool set (``tool_set``) under a randomised design (grid, random or
    quasi-random values, run in randomised order) are effects; everything else is an association:
    adaptive designs choose values from earlier outcomes, an order as written lets drift over time
    masquerade as a parameter's effect, combined experiments differ in more than the parameter, and
    quantities the tool observed rather than set (hardware, server metrics) were never assigned.
    """
    design, randomized = design_of(ds)
    experiments = str(ds.attrs.get("experiments", "") or "")
    if not tool_set:
        return Claim("association", "the tool observed this quantity; it did not set it, so other causes are not ruled out")
    if experiments and len(json.loads(experiments)) > 1:
        return Claim("association", "trials come from several experiments, which differ in more than this parameter")
    if design == "adaptive":
        return Claim("association", "the adaptive planner chose parameter values from earlier outcomes, so values "
                                    "are confounded with what was measured before")
    if design not in CAUSAL_DESIGNS:
        return Claim("association", f"the experiment recorded no randomised design (design {design or 'unrecorded'!r})")
    if not randomized:
        return Claim("association", f"{design} design run in the order written: drift over time (thermal, "
                                    "neighbours) could masquerade as a parameter's effect")
    return Claim("effect", f"the tool set the parameters itself under a {design} design in randomised run order")


def context_of(ds: xr.Dataset, load_point: str | None = None) -> Context:
    hw = str(ds.attrs.get("hardware_classes", "") or "")
    if not hw and "hardware_class" in ds.coords:
        hw = ",".join(sorted({str(v) for v in ds["hardware_class"].values.tolist() if v}))
    model = str(ds.attrs.get("model", "") or "")
    try:
        ident = json.loads(model) if model else {}
        if isinstance(ident, dict):
            model = str(ident.get("path") or ident.get("name") or ident.get("served_name") or model)
    except ValueError:
        pass
    workload = load_point if load_point is not None else ",".join(
        sorted({str(v) for v in ds["load_point"].values.tolist()})) if "load_point" in ds.coords else ""
    return Context(hw, model, str(ds.attrs.get("vllm_version", "") or ""), workload)


def effect_sentence(claim: Claim, ctx: Context, param: str, a: Any, b: Any, metric: str, d: Interval,
                    relative: bool = True) -> str:
    """One sentence in the wording the design allows."""
    unit = "%" if relative else ""
    scale = 100.0 if relative else 1.0
    change = f"{d.estimate * scale:+.3g}{unit} " + (
        f"[{d.low * scale:+.3g}{unit}, {d.high * scale:+.3g}{unit}]" if math.isfinite(d.low) and math.isfinite(d.high)
        else "(no 95% interval: see caveat no_interval)")
    if claim.kind == "effect":
        return f"setting {param} from {a} to {b} changed {metric} by {change} {ctx.words()}"
    return (f"trials with {param}={b} had {metric} {change} relative to {param}={a} {ctx.words()} "
            f"(an association, not an effect: {claim.why})")


#: Why no interval is stated from the spread of the forest's bootstrap refits for a change, a 2-D
#: partial dependence or an interaction (the regressions give those where they can be fitted; with
#: fewer configs nothing calibrated is left): forests shrink effects towards zero, so the refits
#: miss the truth far more often than 5% of the time. Measured by ``benchmarks/analysis/coverage.py``.
NO_FOREST_INTERVAL = ("a forest pulls effects towards zero, so the spread of its refits sits around a shrunken "
                      "estimate and misses the true value far more often than the stated 5% (measured by "
                      "benchmarks/analysis/coverage.py; figures in benchmarks/RESULTS.md)")


def percentile_interval(samples: Sequence[float] | np.ndarray, estimate: float | None = None,
                        level: float = 0.95) -> Interval:
    """Percentile bootstrap interval of ``samples``; the estimate defaults to their median."""
    arr = np.asarray(samples, dtype=float)
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        return Interval(math.nan, math.nan, math.nan, level)
    lo, hi = np.quantile(arr, [(1 - level) / 2, 1 - (1 - level) / 2])
    est = float(np.median(arr)) if estimate is None else float(estimate)
    return Interval(est, float(lo), float(hi), level)


def interval_around(samples: Sequence[float] | np.ndarray, estimate: float, level: float = 0.95,
                    lower: float = -math.inf, upper: float = math.inf) -> Interval:
    """A bootstrap interval built around ``estimate``: estimate +- the ``level`` quantile of
    |sample - estimate| (symmetric, so it always holds the estimate, and wider when the replicates
    sit off it, e.g. when the estimator is biased), clipped to ``[lower, upper]`` (a share cannot
    fall below 0). NaN bounds without finite samples."""
    arr = np.asarray(samples, dtype=float)
    arr = arr[np.isfinite(arr)]
    if arr.size == 0 or not math.isfinite(estimate):
        return Interval(float(estimate), math.nan, math.nan, level)
    half = float(np.quantile(np.abs(arr - estimate), level))
    return Interval(float(estimate), max(lower, estimate - half), min(upper, estimate + half), level)


def jsonable(obj: Any) -> Any:
    """Plain JSON values from dataclasses, numpy scalars/arrays, tuples and dicts (NaN/inf -> None)."""
    t = type(obj)  # the plain types first: a full analysis converts hundreds of thousands of values
    if t is float:
        return obj if math.isfinite(obj) else None
    if t is str or t is int or t is bool or obj is None:
        return obj
    if t is list or t is tuple:
        return [jsonable(v) for v in obj]
    if t is dict:
        return {str(k): jsonable(v) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj) if not f.name.startswith("_")}
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [jsonable(v) for v in obj.tolist()]
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, (np.integer, int)):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        f = float(obj)
        return f if math.isfinite(f) else None
    if obj is None or isinstance(obj, str):
        return obj
    return str(obj)


@dataclass
class Notes:
    """Collects warnings and subsampling notes while an analysis runs."""

    warnings: list[Caveat] = field(default_factory=list)
    subsampled: list[Subsample] = field(default_factory=list)

    def warn(self, code: str, message: str, subject: str = "") -> None:
        self.warnings.append(Caveat(code, message, subject))

    def subsample(self, what: str, used: int, of: int) -> None:
        if used < of:
            self.subsampled.append(Subsample(what, used, of))
