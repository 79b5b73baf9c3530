"""The full analysis of an experiment as one JSON document (``analyze --json``).

:func:`analyze` runs every analysis on a dataset and returns plain JSON whose shape is described
by ``analysis/analyze.schema.json`` (checked in tests). A section that the data cannot support
(no swept parameter, no failures, no baseline) is present with ``{"skipped": "<why>"}`` rather than
absent or invented. Everything a section subsampled to stay fast is also collected at the top
level under ``subsampled``.

Hardware classes never share a section (:mod:`analysis.hardware`). With one class the document is
that class's analysis (``hardware_class`` names it). With several and none chosen, every section
of the top-level document is skipped with the reason, and ``per_hardware_class`` holds one complete
document per class (the report shows one section per class); ``hardware_class=`` analyses one.
``cross_hardware`` (asked for with ``cross_hardware="per_gpu"`` or ``"per_gpu_hour"`` and the
user's ``prices``) adds the labelled comparison of :func:`analysis.crosshw.compare_hardware`.
Failover trials (tag ``failover-from:...``) are included and marked unless
``include_failover=False`` leaves them out (a ``failover_excluded`` warning says how many).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from analysis.common import EXPERIMENT_CODES, Notes, claim_for, context_of, design_of, jsonable, pruned_configs
from analysis.frame import AnalysisInputError, parameters, trial_table
from analysis.hardware import classes_of, per_class, select_failover, simulated_of

log = logging.getLogger(__name__)

REPORT_VERSION = 1
SCHEMA_PATH = Path(__file__).with_name("analyze.schema.json")

Progress = Callable[[int, int, str], None]


def stderr_progress(label: str) -> Progress:
    """A :data:`Progress` that writes ``<label> [i/n] <section>`` lines to stderr (the CLIs' progress)."""

    def show(i: int, n: int, name: str) -> None:
        sys.stderr.write(f"{label} [{i}/{n}] {name}\n")
        sys.stderr.flush()

    return show


def default_metric(ds: xr.Dataset) -> str:
    """The spec's ranking objective (``output_throughput`` unless the spec chose another)."""
    try:
        return str(json.loads(ds.attrs.get("ranking", "") or "{}").get("objective") or "output_throughput")
    except ValueError:
        return "output_throughput"


def analyze(
    ds: xr.Dataset,
    metric: str | None = None,
    load_point: str | None = None,
    policy: str = "slo_throughput",
    n_boot: int = 100,
    seed: int = 0,
    progress: Progress | None = None,
    hardware_class: str | None = None,
    include_failover: bool = True,
    cross_hardware: str | None = None,
    prices: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Run every analysis on ``ds``; returns the JSON document (see the module docstring).

    ``metric`` is the response of the parameter analyses (default: the spec's ranking objective);
    ``load_point`` restricts those to one scenario (default: the scenario with the most ok trials,
    since parameter effects differ between workloads). ``n_boot`` bootstrap replicates for the
    importance fits (the other sections use their own documented defaults, scaled to it).
    ``hardware_class`` analyses one class (default: each class on its own, see the module
    docstring); ``include_failover`` keeps failover trials (marked) or leaves them out;
    ``cross_hardware`` (``per_gpu`` / ``per_gpu_hour``, the latter with ``prices``: class -> USD
    per GPU-hour, else the spec's) adds the labelled cross-hardware comparison (refused, with the
    unpriced classes named, when a price is missing).
    """
    from analysis.crosshw import NORMALISATIONS, compare_hardware

    if cross_hardware is not None and cross_hardware not in NORMALISATIONS:
        raise AnalysisInputError(f"unknown cross-hardware normalisation {cross_hardware!r}; known: "
                                 f"{', '.join(NORMALISATIONS)}")
    classes = classes_of(ds)
    cross = None
    if cross_hardware is not None:  # asked for explicitly: a missing price refuses the whole run
        cross = jsonable(compare_hardware(ds, cross_hardware, prices, n_boot=max(0, n_boot), seed=seed,
                                          include_failover=include_failover))
    if hardware_class is not None:
        if hardware_class not in classes:
            raise AnalysisInputError(f"unknown hardware class {hardware_class!r}; the dataset has: "
                                     f"{', '.join(classes) or 'none'}")
        ds = dict(per_class(ds))[hardware_class]
    elif len(classes) > 1:
        return _per_class_document(ds, classes, cross, metric=metric, load_point=load_point, policy=policy,
                                   n_boot=n_boot, seed=seed, progress=progress, include_failover=include_failover)
    doc = _analyze_one(ds, metric, load_point, policy, n_boot, seed, progress, include_failover)
    doc["hardware_class"] = classes_of(ds)[0] if classes_of(ds) else None
    if cross is not None:
        doc["cross_hardware"] = cross
    return doc


_SECTIONS = ("pareto", "ranking", "importance", "partial_dependence", "interactions", "failure", "drift")


def _per_class_document(ds: xr.Dataset, classes: list[str], cross: Any, **kw: Any) -> dict[str, Any]:
    """The document of a dataset of several classes: sections skipped at the top, one whole
    document per class under ``per_hardware_class``."""
    parts = [analyze(part, hardware_class=c, **kw) for c, part in per_class(ds)]
    df = trial_table(ds)
    why = (f"the trials ran on {len(classes)} hardware classes ({', '.join(classes)}), which never share an "
           "analysis: see per_hardware_class (one document per class)")
    doc: dict[str, Any] = {
        **_head(ds, df, parts[0]["metric"], kw.get("load_point"), [p.name for p in parameters(ds)]),
        "timings_s": {k: round(sum(float(p["timings_s"].get(k, 0.0)) for p in parts), 3) for k in _SECTIONS},
        **{k: {"skipped": why} for k in _SECTIONS},
        "hardware_class": None,
        "hardware_classes": classes,
        "per_hardware_class": parts,
        "subsampled": [{**s, "hardware_class": p["hardware_class"]} for p in parts for s in p["subsampled"]],
        "warnings": dedupe_warnings([{**w, "hardware_class": p["hardware_class"]}
                                     for p in parts for w in p["warnings"]]),
    }
    if cross is not None:
        doc["cross_hardware"] = cross
    return doc


def _head(ds: xr.Dataset, df: pd.DataFrame, metric: str, lp: str | None, params: list[str]) -> dict[str, Any]:
    """The fields every document starts with: what was analysed, its design, context and counts."""
    design, randomized = design_of(ds)
    return {
        "report_version": REPORT_VERSION,
        "experiment": str(ds.attrs.get("experiment", "")),
        "experiments": json.loads(ds.attrs["experiments"]) if ds.attrs.get("experiments") else
        [str(ds.attrs.get("experiment", ""))],
        "synthetic": bool(int(ds.attrs.get("synthetic", 0) or 0)),
        "simulated": simulated_of(ds),
        "design": {"design": design, "randomized": randomized, "claim": jsonable(claim_for(ds))},
        "context": jsonable(context_of(ds, lp)),
        "metric": metric,
        "load_point": lp,
        "parameters": params,
        "counts": _counts(df),
    }


def _analyze_one(ds: xr.Dataset, metric: str | None, load_point: str | None, policy: str, n_boot: int, seed: int,
                 progress: Progress | None, include_failover: bool) -> dict[str, Any]:
    """The document of one hardware class (or a dataset that records none)."""
    dropped: list[dict[str, Any]] = []
    if not include_failover:
        notes = Notes()
        ds, _, _ = select_failover(ds, None, False, notes)
        dropped = [{**jsonable(w), "section": "design"} for w in notes.warnings]
    metric = metric or default_metric(ds)
    df = trial_table(ds)
    if metric not in df.columns:
        raise AnalysisInputError(f"unknown metric {metric!r}")
    lp = load_point or _main_load_point(df)
    if lp is not None and lp not in set(df["load_point"].astype(str)):
        raise AnalysisInputError(f"unknown load point {lp!r}; the dataset has: "
                                 f"{', '.join(sorted(set(df['load_point'].astype(str))))}")
    from analysis.ranking import POLICIES

    if policy not in POLICIES:
        raise AnalysisInputError(f"unknown ranking policy {policy!r}; known: {', '.join(sorted(POLICIES))}")
    params = [p.name for p in parameters(ds)]
    doc: dict[str, Any] = {**_head(ds, df, metric, lp, params), "timings_s": {}}
    sections: list[tuple[str, Callable[[], Any]]] = [
        ("pareto", lambda: _pareto(ds, df)),
        ("ranking", lambda: _ranking(ds, policy, seed, df)),
        ("importance", lambda: _importance(ds, metric, lp, n_boot, seed)),
        ("partial_dependence", lambda: _pd(ds, params, metric, lp, seed, df)),
        ("interactions", lambda: _interactions(ds, params, metric, lp, seed)),
        ("failure", lambda: _failure(ds, lp, seed)),
        ("drift", lambda: _drift(ds, metric)),
    ]
    for i, (name, fn) in enumerate(sections):
        if progress is not None:
            progress(i, len(sections), name)
        t0 = time.perf_counter()
        try:
            doc[name] = fn()
        except AnalysisInputError as exc:
            doc[name] = {"skipped": str(exc)}
        doc["timings_s"][name] = round(time.perf_counter() - t0, 3)
        log.info("analysis section %s took %.2f s", name, doc["timings_s"][name])
    if progress is not None:
        progress(len(sections), len(sections), "done")
    doc["subsampled"] = _collect(doc, "subsampled")
    doc["warnings"] = dedupe_warnings(dropped + _design_warnings(ds) + _collect(doc, "warnings"))
    return doc


def _design_warnings(ds: xr.Dataset) -> list[dict[str, Any]]:
    """What the design itself hides: aliased settings (:func:`analysis.frame.aliases`) and
    parameters that vary only between one set value and vLLM's default, which the parameter
    analyses leave out (:func:`analysis.frame.parameters`), and the engine configs planning pruned
    before any trial (the dataset's ``pruned_configs``). Named, never dropped silently."""
    from analysis.frame import aliases

    out = [{"code": "aliased", "message": a.sentence, "subject": f"{a.a}, {a.b}", "section": "design"}
           for a in aliases(ds)]
    analysed = {p.name for p in parameters(ds)}
    for p in parameters(ds, include_constant=True):
        if p.name in analysed or len(p.levels) != 1:
            continue
        values = ds[p.column].values.tolist()
        n_set = sum(1 for v in values if not (v is None or (isinstance(v, float) and v != v) or v == ""))
        if 0 < n_set < len(values):
            out.append({"code": "default_only", "subject": p.name, "section": "design", "message":
                        f"{p.name} is set ({p.levels[0]}) in some trials and left at vLLM's default in the others "
                        f"({n_set} of {len(values)} trials set it): the parameter analyses leave it out, since the "
                        "default's value is not recorded; read any difference it makes from the configs "
                        "themselves (and see 'aliased' if it moves with another parameter)"})
    if "retry_warning" in ds.coords:  # results that came after attempts lost to transport (retries.jsonl)
        for tid, lp, text in zip(ds["trial_id"].values, ds["load_point"].values, ds["retry_warning"].values):
            if str(text):
                out.append({"code": "retried", "subject": f"trial {str(tid)[:12]} @ {lp}", "section": "design",
                            "message": f"{text} (the result stands; runs/<name>/retries.jsonl has each lost attempt)"})
    for subject, message in pruned_configs(ds):  # servetune.memfit, before any trial
        out.append({"code": "pruned", "subject": subject, "section": "design", "message": message})
    screening = int(ds.attrs.get("screening_trials", 0) or 0)
    if screening:  # analysis.load left a successive-halving sweep's shorter rungs out
        out.append({"code": "screening", "subject": f"{screening} trial(s)", "section": "design", "message":
                    f"{screening} screening trial(s) of successive halving, measured on shortened load points, are "
                    "left out of every analysis here: only full-fidelity trials are results, and the configs that "
                    "reached them were chosen by the screening (analysis.load(NAME, fidelity='all') has them)"})
    return out


def dedupe_warnings(warnings: list[Any]) -> list[Any]:
    """Warnings with identical section, code, subject and message kept once, in their first order
    (one caveat per load point or group often reads the same); a caveat about the whole experiment
    (:data:`~analysis.common.EXPERIMENT_CODES`) once whatever section repeats it."""
    seen: set[tuple[str, ...]] = set()
    out = []
    for w in warnings:
        fields = ("code", "subject", "message") if isinstance(w, dict) and w.get("code") in EXPERIMENT_CODES \
            else ("section", "code", "subject", "message")
        key = tuple(str(w.get(k, "")) for k in fields) if isinstance(w, dict) else (str(w),)
        if key not in seen:
            seen.add(key)
            out.append(w)
    return out


def _main_load_point(df: Any) -> str | None:
    ok = df[(df["status"] == "ok") & ~df["is_baseline"].astype(bool)]
    if ok.empty:
        return None
    return str(ok["load_point"].astype(str).value_counts().idxmax())


def _counts(df: Any) -> dict[str, int]:
    status = df["status"].astype(str)
    baseline = df["is_baseline"].astype(bool)
    out = {"trials": int(len(df)), "ok": int((status == "ok").sum()), "failed": int((status == "failed").sum()),
           "hole": int((status == "hole").sum()), "baseline": int(baseline.sum()),
           "configs": int(df["config_id"].nunique())}
    return out


def _collect(doc: dict[str, Any], key: str) -> list[Any]:
    found: list[Any] = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k == key and isinstance(v, list):
                    found.extend({**item, "section": where} if isinstance(item, dict) else item for item in v)
                else:
                    walk(v, where)
        elif isinstance(node, list):
            for v in node:
                walk(v, where)

    for section in _SECTIONS:
        walk(doc.get(section), section)
    return found


def _pareto(ds: xr.Dataset, df: pd.DataFrame) -> Any:
    from analysis.pareto import front

    return jsonable(front(ds, metrics=("output_throughput", "ttft_ms_p99"), table=df))


def _ranking(ds: xr.Dataset, policy: str, seed: int, df: pd.DataFrame) -> Any:
    from analysis.ranking import rank

    return jsonable(rank(ds, policy=policy, seed=seed, table=df))


def _importance(ds: xr.Dataset, metric: str, lp: str | None, n_boot: int, seed: int) -> Any:
    from analysis.importance import importance

    if not parameters(ds):
        raise AnalysisInputError("no parameter was swept: there is nothing to attribute")
    return jsonable(importance(ds, metric=metric, load_point=lp, n_boot=n_boot, seed=seed))


def _pd(ds: xr.Dataset, params: list[str], metric: str, lp: str | None, seed: int, df: pd.DataFrame) -> Any:
    from analysis.effects import partial_dependence

    if not params:
        raise AnalysisInputError("no parameter was swept: there is no partial dependence to show")
    out = []
    for p in params:
        doc = jsonable(partial_dependence(ds, p, metric=metric, load_point=lp, seed=seed))
        out.append(_with_measured(doc, df))
    return out


def _with_measured(doc: dict[str, Any], df: pd.DataFrame) -> dict[str, Any]:
    """Beside a one-parameter partial dependence's sentence (a modelled change: the surrogate's
    prediction averaged over every other parameter), the measured one: the medians of the ok trials
    at its first and last grid value (same load point and hardware class), as ``measured``
    (``{"from", "to", "median_from", "median_to", "n_from", "n_to", "change", "relative"}``), and the
    sentence says which number is which. Skipped where a grid end is not an observed level."""
    params, grid, sentence = doc.get("params") or [], doc.get("grid") or [], doc.get("sentence")
    if len(params) != 1 or not grid or len(grid[0]) < 2 or not sentence:
        return doc
    col = f"param_{params[0]}"
    metric = str(doc.get("metric"))
    if col not in df or metric not in df:
        return doc
    sel = (df["status"].astype(str) == "ok") & ~df["is_baseline"].astype(bool)
    for key in ("load_point", "hardware_class"):
        if doc.get(key) is not None and key in df:
            sel &= df[key].astype(str) == str(doc[key])
    sub = df[sel]
    a, b = grid[0][0], grid[0][-1]

    def median_at(level: Any) -> tuple[float, int]:
        vals = sub[col].to_numpy(dtype=object)
        if isinstance(level, (int, float)) and not isinstance(level, bool):
            num = pd.to_numeric(pd.Series(vals), errors="coerce").to_numpy(dtype=float)
            hit = np.isclose(num, float(level), rtol=1e-9, atol=0.0)
        else:
            hit = np.array([str(v) == str(level) for v in vals.tolist()], dtype=bool)
        y = sub[metric].to_numpy(dtype=float)[hit]
        y = y[np.isfinite(y)]
        return (float(np.median(y)) if len(y) else float("nan")), int(len(y))

    (ma, na), (mb, nb) = median_at(a), median_at(b)
    if not (na and nb and np.isfinite(ma) and np.isfinite(mb)):
        return doc
    relative = bool(doc.get("relative", True)) and ma > 0
    change = mb / ma - 1.0 if relative else mb - ma
    shown = f"{100 * change:+.3g}%" if relative else f"{change:+.4g}"
    doc["measured"] = {"from": a, "to": b, "median_from": ma, "median_to": mb, "n_from": na, "n_to": nb,
                       "change": change, "relative": relative}
    if doc.get("measured_change") is not None:  # the sentence states it already (analysis.effects)
        return doc
    doc["sentence"] = (f"{sentence} (modelled: the surrogate's partial dependence, averaged over the other "
                       f"parameters); measured: the median {metric} of the trials with {params[0]}={a} was "
                       f"{ma:.4g} ({na} trials) and with {params[0]}={b} {mb:.4g} ({nb} trials), {shown}")
    return doc


def _interactions(ds: xr.Dataset, params: list[str], metric: str, lp: str | None, seed: int) -> Any:
    from analysis.interactions import interactions

    if len(params) < 2:
        raise AnalysisInputError("fewer than two parameters were swept: there is no pair to interact")
    return jsonable(interactions(ds, metric=metric, load_point=lp, seed=seed))


def _failure(ds: xr.Dataset, lp: str | None, seed: int) -> Any:
    from analysis.failure import failure_probability

    status = np.asarray(ds["status"].values).astype(str)
    if not (status != "hole").any():
        raise AnalysisInputError("no trial has finished: there is no failure rate to estimate")
    return jsonable(failure_probability(ds, seed=seed))


def _drift(ds: xr.Dataset, metric: str) -> Any:
    from analysis.drift import drift

    return jsonable(drift(ds, metric=metric))


def _import_jsonschema() -> Any:
    """``jsonschema``, imported without its optional RFC 3987 format checker when it is not loaded
    yet: the installed ``rfc3987_syntax`` (a JupyterLab dependency) compiles its grammar at import,
    3-4 s of every ``python -m analysis analyze`` here, for a format check :func:`validate_report`
    never asks for (``jsonschema.validate`` checks no formats unless given a format checker)."""
    import sys

    if "jsonschema" in sys.modules:
        return sys.modules["jsonschema"]
    blocked = "rfc3987_syntax" not in sys.modules
    if blocked:
        sys.modules["rfc3987_syntax"] = None  # type: ignore[assignment]  # import raises ImportError: skipped
    try:
        import jsonschema
    finally:
        if blocked:
            del sys.modules["rfc3987_syntax"]  # later importers get the real package
    return jsonschema


def validate_report(doc: dict[str, Any]) -> None:
    """Check ``doc`` against ``analysis/analyze.schema.json`` (raises jsonschema.ValidationError)."""
    jsonschema = _import_jsonschema()

    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    jsonschema.validate(doc, schema)
