"""Load curves: output throughput, TTFT, TPOT and E2E latency against the load offered, per config.

GuideLLM's view of a benchmark: one line per config through its load levels, a median over its
repeats at each (error bars: the distribution-free interval of :func:`analysis.curves.median_interval`,
at the exact confidence the repeats allow; a single repeat has none, and the page says so rather
than drawing a band). Open-loop load points (a request rate) and closed-loop ones (a concurrency)
never share an x axis: each kind x workload x hardware class is its own row of four panels
(:func:`analysis.curves.curves`). Latency panels show the percentile picked (p50 or p99, ``?pct=``)
and the spec's SLO as a dashed line where the SLO is on that percentile. Each throughput curve's knee
is marked under the rule stated on the page (:data:`analysis.curves.KNEE_RULE`).

Configs: the :data:`SHOWN` with the highest peak throughput (each series' peak over its best, the
largest over the series) by default; the picker lists the :data:`PICKABLE` highest. Labels are short
(:func:`dashboards.app.labels.short_labels`: the parameters that differ first), the id on hover.
Drift-suspect trials follow :mod:`dashboards.app.marks` (``?drift=exclude|apart``: left out of the
curves, or drawn apart as grey crosses). The series are computed in the background per dataset
version and drift mode (:func:`dashboards.app.state.background`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np
import pandas as pd
import panel as pn
from bokeh.models import ColumnDataSource, HoverTool, Label, Span
from bokeh.palettes import Category10_10
from bokeh.plotting import figure

from analysis.curves import KINDS, KNEE_RULE, Series, curves
from analysis.frame import quantile_column
from dashboards.app import Context, esc, on_result, state
from dashboards.app.labels import axis_label, short_labels, slo_bounds
from dashboards.app.marks import clean, drift_bar, drift_marks, mode
from dashboards.app.settle import into, settle

log = logging.getLogger(__name__)

THROUGHPUT = "output_throughput"
LATENCIES = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "e2el_ms": "E2E latency"}
PERCENTILES = {"p50": 0.5, "p99": 0.99}
SHOWN = 8
PICKABLE = 200
INTERVAL_NOTE = ("error bars: a distribution-free interval of the median over the config's repeats at that load "
                 "(order statistics); 95% from 6 repeats, with fewer it is [min, max] at its exact lower confidence "
                 "(2 repeats 50%, 3 75%, 4 87.5%, 5 93.75%), shown on hover")


def columns(ds: Any) -> list[str]:
    """The trial-table columns the page reads: throughput and each latency at each offered percentile."""
    qs = [float(q) for q in ds["quantile"].values.tolist()] if "quantile" in ds.coords else []
    lat = [quantile_column(v, q) for v in LATENCIES for q in PERCENTILES.values() if q in qs]
    return [THROUGHPUT, *lat]


def _compute(folder: Any, drift_mode: str) -> tuple[list[Series], pd.DataFrame]:
    """The series of the clean trials, and the drift-suspect trials (empty unless shown apart)."""
    ds, df = state.dataset(folder), state.table(folder)
    marks = drift_marks(folder)
    cols = [c for c in columns(ds) if c in df]
    suspect = df[marks.mask(df)] if drift_mode == "apart" else df.iloc[:0]
    return curves(clean(df, marks), cols), suspect


def default_configs(series: list[Series], n: int = SHOWN) -> list[str]:
    """The configs with the highest peak throughput relative to each series' best, ``n`` of them
    (a config's score is its best over the series)."""
    score: dict[str, float] = {}
    for s in series:
        peak = s.peak()
        best = float(peak.max()) if len(peak) and np.isfinite(peak).any() else math.nan
        if not best > 0:
            continue
        for cid, p in zip(s.config_ids, peak.tolist()):
            score[cid] = max(score.get(cid, -math.inf), p / best)
    return [c for c, _ in sorted(score.items(), key=lambda kv: (-kv[1], kv[0]))][:n]


class CurvesPage(pn.viewable.Viewer):
    """Percentile and config pickers, the knee rule, and per series a row of panels with its knees."""

    def __init__(self, ctx: Context, **params: Any) -> None:
        super().__init__(**params)
        assert ctx.folder is not None
        self.ctx, self.folder = ctx, ctx.folder
        ds = state.dataset(self.folder)
        qs = [float(q) for q in ds["quantile"].values.tolist()] if "quantile" in ds.coords else []
        options = [k for k, q in PERCENTILES.items() if q in qs] or list(PERCENTILES)
        want = ctx.arg("pct", "p99")
        self.pct = pn.widgets.RadioButtonGroup(name="latency percentile", options=options,
                                               value=want if want in options else options[-1],
                                               button_type="light", css_classes=["st-pct"])
        self.hw = pn.widgets.Select(name="hardware class", options=[], visible=False, css_classes=["st-hw"])
        self.configs = pn.widgets.MultiChoice(name="configs (highest peak throughput first)", options={},
                                              sizing_mode="stretch_width", css_classes=["st-configs"])
        self.marks = drift_marks(self.folder)
        self.drift_mode = mode(ctx)
        self.drift = drift_bar(ctx, self.marks, {
            "exclude": "they are left out of every curve below.",
            "apart": "they are left out of the curves and drawn apart as grey crosses, never in a median."})
        self.rule = pn.pane.HTML(f"<div class='st-note st-knee-rule'>{esc(KNEE_RULE)}.</div>"
                                 f"<div class='st-note'>{esc(INTERVAL_NOTE)}.</div>", sizing_mode="stretch_width")
        self.body = pn.Column(sizing_mode="stretch_width")
        self.series: list[Series] = []
        self.suspect = pd.DataFrame()
        self.slos = slo_bounds(ds)
        self.version = state.version(self.folder)
        self.labels: dict[str, str] = {}
        self._quiet, self._pending = False, True
        self.hw.param.watch(lambda e: self._pick_class(), "value")
        for w in (self.pct, self.configs):
            w.param.watch(lambda e: self.render(), "value")
        self.start()

    def _pick_class(self) -> None:
        if not self._quiet:
            self._quiet = True
            try:
                self._pickable()
            finally:
                self._quiet = False
            self.render()

    def start(self) -> None:
        self._pending = True
        self.body.objects = [pn.pane.HTML("<div class='st-progress-text'>load curves...</div>"),
                             pn.indicators.LoadingSpinner(value=True, size=30)]
        folder, v, dmode = self.folder, state.version(self.folder), self.drift_mode
        fut = state.background(("curves", str(folder), v, dmode), lambda: _compute(folder, dmode))
        on_result(fut, self._done)

    def _done(self, fut: Future[tuple[list[Series], pd.DataFrame]]) -> None:
        settle(fut, self._show, into(self.body), "load curves", "st-curves-refused")

    def _show(self, result: tuple[list[Series], pd.DataFrame]) -> None:
        self.series, self.suspect = result
        self._pending = False
        classes = sorted({s.hardware_class for s in self.series})
        want = self.ctx.arg("hw")
        self._quiet = True  # the pickers are filled in: one render at the end, not one per widget
        try:
            self.hw.options = classes
            self.hw.visible = len(classes) > 1
            self.hw.value = want if want in classes else (classes[0] if classes else None)
            self._pickable()
        finally:
            self._quiet = False
        self.render()

    def _pickable(self) -> None:
        mine = [s for s in self.series if s.hardware_class == self.hw.value]
        ranked = default_configs(mine, PICKABLE)
        df = state.table(self.folder)
        self.labels = short_labels(df[df["config_id"].astype(str).isin(set(ranked))]) if ranked else {}
        self.configs.options = {f"{self.labels.get(c, c)} ({c[:8]})": c for c in ranked}
        self.configs.value = ranked[:SHOWN]

    def render(self) -> None:
        if self._quiet or self._pending:
            return
        if not self.series:
            self.body.objects = [pn.pane.HTML(
                "<div class='st-warn st-curves-empty'>no load point of this experiment sets a request rate or a "
                "concurrency, so there is no load to draw curves against</div>")]
            return
        if pn.state.location is not None:
            pn.state.location.update_query(pct=self.pct.value, **({"hw": self.hw.value} if self.hw.visible else {}))
        chosen = list(self.configs.value or [])
        mine = [s for s in self.series if s.hardware_class == self.hw.value]
        parts: list[Any] = []
        for si, s in enumerate(mine):
            parts.extend(self._series_view(si, s, chosen))
        self.body.objects = parts

    def _series_view(self, si: int, s: Series, chosen: list[str]) -> list[Any]:
        return series_view(si, s, chosen, self.pct.value, self.labels, self.slos, self._suspects)

    def _suspects(self, fig: Any, s: Series, col: str) -> None:
        if self.suspect.empty or col not in self.suspect:
            return
        at = dict(zip(s.load_points, s.loads.tolist()))
        sub = self.suspect[self.suspect["load_point"].astype(str).isin(set(at))
                           & (self.suspect["hardware_class"].astype(str) == s.hardware_class)
                           & self.suspect["config_id"].astype(str).isin(set(self.configs.value or []))]
        sub = sub[np.isfinite(sub[col].to_numpy(dtype=float))]
        if sub.empty:
            return
        src = ColumnDataSource({"x": [at[str(v)] for v in sub["load_point"]], "y": sub[col].to_numpy(dtype=float),
                                "config": sub["config_id"].astype(str).tolist()}, name=f"suspect|{col}")
        fig.scatter("x", "y", source=src, marker="x", size=9, color="#777777",
                    legend_label="drift-suspect trial (not in the curves)")

    def refresh(self) -> None:
        v = state.version(self.folder)
        if v != self.version:
            self.version = v
            self.slos = slo_bounds(state.dataset(self.folder))
            self.start()

    def __panel__(self) -> Any:
        return pn.Column(self.drift, pn.Row(self.pct, self.hw), self.configs, self.rule, self.body,
                         sizing_mode="stretch_width")


def series_view(si: int, s: Series, chosen: list[str], pct: str, labels: dict[str, str], slos: dict[str, float],
                suspects: Callable[[Any, Series, str], None] | None = None) -> list[Any]:
    """One series' row of the page (also the static report's): its notes (HTML), the grid of its
    panels (throughput with knees, each latency at ``pct``) and its knee table (HTML), for the
    configs ``chosen`` labelled by ``labels``; ``suspects(fig, s, column)`` may add drift-suspect marks."""
    index = {c: i for i, c in enumerate(s.config_ids)}
    rows = [(cid, index[cid]) for cid in chosen if cid in index]
    q = PERCENTILES[pct]
    counts = s.counts[[i for _, i in rows]] if rows else s.counts[:0]
    measured = counts[counts > 0]
    single = bool(len(measured)) and bool((measured <= 1).all())
    notes = [f"<h3 class='st-series' data-series='{si}' data-kind='{s.kind}' data-levels='{len(s.loads)}'>"
             f"{esc(s.title)}</h3>",
             f"<div class='st-note'>{len(s.loads)} load level(s): "
             f"{esc(', '.join(f'{x:g}' for x in s.loads))} ({esc(KINDS[s.kind])}); {len(rows)} of "
             f"{len(s.config_ids)} configs shown</div>"]
    if single:
        notes.append("<div class='st-warn st-single-repeat'>single repeat: no interval (each point is one trial; "
                     "repeat the trials to see how much a point can move)</div>")
    elif len(measured) and (measured <= 1).any():
        notes.append("<div class='st-note st-some-single'>points with a single repeat have no interval</div>")
    if len(s.loads) < 3:
        notes.append(f"<div class='st-warn st-no-knee'>no knee: {len(s.loads)} load level(s) here, the rule "
                     "needs at least 3</div>")
    figs = [_figure(si, s, THROUGHPUT, "output throughput", rows, labels, slos, suspects, knees=True)]
    for var, word in LATENCIES.items():
        col = quantile_column(var, q)
        if col in s.metrics:
            figs.append(_figure(si, s, col, f"{word} p{q * 100:g}", rows, labels, slos, suspects))
    for var in LATENCIES:
        for c in [c for c in slos if c.startswith(var + "_p") and c != quantile_column(var, q)]:
            notes.append(f"<div class='st-note st-slo-elsewhere'>SLO {esc(c)} &le; {slos[c]:g} ms is on "
                         f"another percentile: pick {esc(c.rsplit('_', 1)[1])} to see its line</div>")
    knees = "".join(_knee_row(si, s, cid, i, labels) for cid, i in rows)
    table = (f"<table class='st-table st-knees' data-series='{si}'><tr><th>config</th><th>knee "
             f"({esc(KINDS[s.kind])})</th><th>why</th></tr>{knees}</table>")
    from bokeh.layouts import gridplot

    grid = pn.pane.Bokeh(gridplot([figs[k:k + 2] for k in range(0, len(figs), 2)], sizing_mode="stretch_width",
                                  merge_tools=False), sizing_mode="stretch_width")
    return [pn.pane.HTML("".join(notes), sizing_mode="stretch_width"), grid,
            pn.pane.HTML(table, sizing_mode="stretch_width")]

def _knee_row(si: int, s: Series, cid: str, i: int, labels: dict[str, str]) -> str:
    k = s.knee(i)
    load = "" if k.load is None else f"{k.load:g}"
    return (f"<tr class='st-knee' data-series='{si}' data-config='{esc(cid)}' data-load='{load}'>"
            f"<td title='{esc(cid)}'>{esc(labels.get(cid, cid))}</td><td>{load or '-'}</td>"
            f"<td class='st-note'>{esc(k.why)}</td></tr>")

def _figure(si: int, s: Series, col: str, word: str, rows: list[tuple[str, int]], labels: dict[str, str],
            slos: dict[str, float], suspects: Callable[[Any, Series, str], None] | None, knees: bool = False) -> Any:
    """One panel: every config's line in one multi-line source (``lines|series|column``: ``xs``,
    ``ys``, ``config``, ``label``), its points with their intervals (``points|series|column``), the
    knee marks on the throughput panel (``knees|series``: ``x``, ``y``, ``config``) and the SLO line
    (a Span): few Bokeh models, so a page of eight panels stays quick to build and send."""
    pos = s.loads[s.loads > 0]
    log_x = len(pos) == len(s.loads) and len(pos) > 1 and pos.max() / pos.min() >= 8
    fig = figure(height=300, sizing_mode="stretch_width", x_axis_type="log" if log_x else "linear",
                 y_axis_type="linear" if col == THROUGHPUT else "log",  # latencies span decades near saturation
                 title=f"{word} vs {KINDS[s.kind].split(' (')[0]}", x_axis_label=KINDS[s.kind],
                 y_axis_label=axis_label(col), tools="pan,wheel_zoom,box_zoom,reset,save")
    lines: dict[str, list[Any]] = {"xs": [], "ys": [], "config": [], "label": [], "color": []}
    pts: dict[str, list[Any]] = {k: [] for k in ("x", "y", "low", "high", "n", "interval", "config", "label",
                                                 "color")}
    kn: dict[str, list[Any]] = {"x": [], "y": [], "config": [], "label": [], "why": [], "color": []}
    for n, (cid, i) in enumerate(rows):
        colour, label = Category10_10[n % 10], labels.get(cid, cid)
        y = s.medians[col][i]
        has = np.flatnonzero(np.isfinite(y))
        lines["xs"].append(s.loads[has].tolist())
        lines["ys"].append(y[has].tolist())
        lines["config"].append(cid)
        lines["label"].append(label[:60])
        lines["color"].append(colour)
        for j in has.tolist():
            b = s.band(i, j, col)
            for k, v in (("x", float(s.loads[j])), ("y", float(y[j])), ("low", b.low), ("high", b.high),
                         ("n", b.n), ("config", cid), ("label", label), ("color", colour),
                         ("interval", "no interval (single repeat)" if b.n < 2 else
                          f"[{b.low:.4g}, {b.high:.4g}] at {b.level:.1%}")):
                pts[k].append(v)
        k_ = s.knee(i) if knees else None
        if k_ is not None and k_.load is not None:
            for k, v in (("x", k_.load), ("y", float(y[int(np.flatnonzero(s.loads == k_.load)[0])])),
                         ("config", cid), ("label", label), ("why", k_.why), ("color", colour)):
                kn[k].append(v)
    fig.multi_line("xs", "ys", source=ColumnDataSource(lines, name=f"lines|{si}|{col}"), color="color",
                   line_width=2, legend_field="label")
    points = fig.scatter("x", "y", source=ColumnDataSource(pts, name=f"points|{si}|{col}"), color="color", size=7)
    bars = {k: [v for v, lo in zip(vs, pts["low"]) if math.isfinite(lo)] for k, vs in pts.items()}
    if bars["x"]:
        fig.segment("x", "low", "x", "high", source=ColumnDataSource(bars, name=f"intervals|{si}|{col}"),
                    color="color", line_width=2, alpha=0.6)
    if kn["x"]:
        fig.scatter("x", "y", source=ColumnDataSource(kn, name=f"knees|{si}"), marker="star", size=18,
                    color="color", line_color="black", legend_label="knee")
    bound = slos.get(col)
    if bound is not None:
        fig.add_layout(Span(location=bound, dimension="width", line_color="#b00020", line_dash="dashed",
                            line_width=2, name=f"slo|{si}|{col}"))
        fig.add_layout(Label(x=5, y=bound, x_units="screen", text=f"SLO {col} <= {bound:g} ms",
                             text_color="#b00020", text_font_size="10pt"))
    if suspects is not None:
        suspects(fig, s, col)
    fig.add_tools(HoverTool(renderers=[points], tooltips=[
        ("config", "@label"), ("id", "@config"), ("load", "@x"), ("median", "@y{0.[000]}"),
        ("repeats", "@n"), ("interval", "@interval")]))
    fig.legend.click_policy = "hide"
    fig.legend.label_text_font_size = "8pt"
    fig.legend.location = "top_left"
    return fig


def view(ctx: Context) -> CurvesPage:
    return CurvesPage(ctx)
