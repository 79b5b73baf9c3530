"""What travels with the data on every page: drift-suspect trials and the SYNTHETIC mark.

Drift-suspect trials are the non-baseline trials measured after a baseline drift began on their
hardware class (:func:`analysis.drift.drift` on the spec's ranking objective, the metric the
decision core, :func:`analysis.decision.recommend`, checks; a dataset that already carries a
``drift_suspect`` coordinate, from :func:`analysis.drift.flag_suspect`, is taken at its word).
Every page that ranks, fronts, fits or compares trials shows a banner with their number and a
switch (``?drift=`` in the URL):

``exclude`` (default, as the decision core)
    the suspect trials are left out of every number on the page;
``apart``
    the numbers still leave them out, and the page shows them beside, marked (their own ranking,
    their own glyphs on the plots), never mixed into the clean ones.

When drift could not be checked (no baseline re-runs, too few of them, an unknown metric) the
banner says so and why: nothing is marked then, which is not the same as "no drift".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import panel as pn

from analysis.drift import drift
from analysis.frame import AnalysisInputError
from analysis.report import default_metric
from dashboards.app import Context, esc, state
from servetune.errors import ServetuneError
from servetune.schema import DATASET_FILE

#: switch label -> mode (``?drift=`` value)
MODES: dict[str, str] = {"leave them out": "exclude", "show them apart": "apart"}
DEFAULT_MODE = "exclude"


@dataclass(frozen=True)
class DriftMarks:
    """The drift-suspect trials of a dataset version: ``checked`` whether drift could be checked
    (``reason`` says why not), on ``metric``; ``suspect`` their trial ids; ``alarm_at`` the first
    alarm (µs since the epoch, None without one)."""

    checked: bool
    metric: str
    reason: str
    suspect: frozenset[str]
    alarm_at: int | None

    def mask(self, df: pd.DataFrame) -> np.ndarray:
        """Per row of the trial table ``df``: whether it is drift-suspect."""
        if not self.suspect or "trial_id" not in df:
            return np.zeros(len(df), dtype=bool)
        return np.asarray(df["trial_id"].astype(str).isin(self.suspect).to_numpy(), dtype=bool)


def unchecked_reason(warnings: Any) -> str:
    """Why a drift result with no chart checked nothing: its caveats' messages, joined."""
    msgs = [str(getattr(w, "message", w)) for w in warnings or ()]
    return "; ".join(msgs) or "no load point has enough baseline re-runs to chart"


def _read(folder: Path) -> DriftMarks:
    ds = state.dataset(folder)
    metric = default_metric(ds)
    if "drift_suspect" in ds.coords:
        flags = np.asarray(ds["drift_suspect"].values, dtype=bool)
        ids = frozenset(str(t) for t, f in zip(ds["trial_id"].values.tolist(), flags) if f)
        at = int(ds.attrs.get("drift_alarm_at", -1) or -1)
        return DriftMarks(True, str(ds.attrs.get("drift_metric", metric)), "", ids, at if at >= 0 else None)
    if "is_baseline" not in ds.coords or not bool(np.asarray(ds["is_baseline"].values, dtype=bool).any()):
        return DriftMarks(False, metric, "the experiment has no baseline re-runs to check drift against "
                                         "(schedule them with the spec's baseline settings)", frozenset(), None)
    try:
        res = drift(ds, metric=metric)
    except AnalysisInputError as exc:
        return DriftMarks(False, metric, str(exc), frozenset(), None)
    if not res.charts:
        return DriftMarks(False, metric, unchecked_reason(res.warnings), frozenset(), None)
    return DriftMarks(True, metric, "", frozenset(res.suspect), res.alarm_at)


def drift_marks(folder: Path) -> DriftMarks:
    """:class:`DriftMarks` of the experiment, cached per dataset version."""
    return state._cached(("drift-marks", str(folder), state.version(folder)), lambda: _read(folder))


def mode(ctx: Context) -> str:
    """The page's drift mode from the URL (``exclude`` unless ``?drift=apart``)."""
    want = ctx.arg("drift", DEFAULT_MODE)
    return want if want in MODES.values() else DEFAULT_MODE


def clean(df: pd.DataFrame, marks: DriftMarks) -> pd.DataFrame:
    """``df`` without its drift-suspect rows (``df`` itself when there are none)."""
    m = marks.mask(df)
    return df[~m] if m.any() else df


def banner_html(marks: DriftMarks, how: str, n_rows: int | None = None) -> str:
    """The banner: how many trials are drift-suspect and what this page does with them (``how``
    finishes the sentence for the current mode); or that drift could not be checked, and why."""
    if not marks.checked:
        return (f"<div class='st-warn st-drift-banner' data-suspect='unchecked'><b>drift could not be checked</b> "
                f"({esc(marks.reason)}): no trial is marked drift-suspect, which does not mean there was no drift."
                "</div>")
    n = len(marks.suspect) if n_rows is None else n_rows
    if not n:
        return (f"<div class='st-note st-drift-banner' data-suspect='0'>no drift-suspect trial (baseline re-runs "
                f"checked on {esc(marks.metric)})</div>")
    at = f" since the alarm at {pd.Timestamp(marks.alarm_at, unit='us'):%Y-%m-%d %H:%M:%S} UTC" if marks.alarm_at else ""
    return (f"<div class='st-warn st-drift-banner' data-suspect='{n}'><b>{n} drift-suspect trial(s)</b> (measured "
            f"after a baseline drift of {esc(marks.metric)} began on their hardware{at}): {how}</div>")


def drift_bar(ctx: Context, marks: DriftMarks, how: dict[str, str], n_rows: int | None = None) -> Any:
    """The banner and the exclude / show-apart switch; ``how`` maps each mode to what this page
    does with the suspect trials in it. Switching reopens the page with ``?drift=``."""
    current = mode(ctx)
    html = pn.pane.HTML(banner_html(marks, how[current], n_rows), sizing_mode="stretch_width")
    if not marks.checked or not marks.suspect:
        return html
    switch = pn.widgets.RadioButtonGroup(name="drift-suspect trials", options=MODES, value=current,
                                         button_type="light", css_classes=["st-drift-mode"])
    switch.param.watch(lambda e: ctx.navigate(ctx.page, drift=e.new), "value")
    return pn.Column(html, pn.Row(pn.pane.HTML("<span class='st-note'>drift-suspect trials:</span>"), switch),
                     sizing_mode="stretch_width")


def synthetic_html(folder: Path | None) -> str:
    """The SYNTHETIC banner of an experiment whose data was generated (``synthetic`` attribute of its
    dataset, the mark the report reads too), and the SIMULATED banner of one whose trials ran on the
    simulated vLLM (``simulated`` attribute, set by :func:`analysis.load`), else nothing."""
    if folder is None:
        return ""
    html = ""
    if state.is_synthetic(folder):
        html = ("<div class='st-synthetic'>SYNTHETIC DATA: this experiment was generated with planted effects; "
                "nothing in it was measured on a real server.</div>")
    try:  # the dataset the pages read anyway (cached per version); one that cannot load has no banner here
        attrs = state.dataset(folder).attrs if (folder / DATASET_FILE).exists() else {}
    except (ServetuneError, OSError, ValueError):
        attrs = {}
    simulated = attrs.get("simulated")
    if simulated:  # set by analysis.load: trials of the sim backend, their profiles and calibration
        html += (f"<div class='st-synthetic st-simulated'>{esc(str(simulated))}: these trials ran on the simulated "
                 "vLLM (servetune.sim); nothing in them was measured on a real server.</div>")
    screening = int(attrs.get("screening_trials", 0) or 0)
    if screening:  # set by analysis.load: a successive-halving sweep's shorter rungs, left out of every page
        html += (f"<div class='st-note st-screening'>{screening} screening trial(s) of successive halving, measured "
                 "on shortened load points, are left out of every page (only full-fidelity trials are results); "
                 "analysis.load(NAME, fidelity='all') has them.</div>")
    return html
