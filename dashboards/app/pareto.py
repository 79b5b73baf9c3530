"""Pareto explorer: the front of two chosen metrics, filters, and a linked trial table.

Points are engine configs (the medians of their repeats, per scenario x hardware class) from
``analysis.pareto.front`` on the filtered trial table; front members are red and joined per group;
hovering a point shows its config and values. Selecting points (tap, box or lasso) lists their
trials in the table below; selecting a trial there opens it in the trial inspector. Filters:
status, scenario (load point), dataset, hardware class and every swept parameter (ranges for
numeric ones). Baseline re-runs are drift controls and are left out. Above ``DATASHADE_ABOVE``
points the cloud is rasterised with datashader (the front stays as points with hover) and a box
selection picks the configs inside it.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import holoviews as hv
import numpy as np
import pandas as pd
import panel as pn

from analysis.frame import PARAM_PREFIX, AnalysisInputError, filter_trials, known_metrics, metric_sense
from analysis.pareto import base_columns, config_groups, front
from dashboards.app import Context, esc, state, warnings_html
from dashboards.app.labels import axis_label, short_labels, slo_bounds
from dashboards.app.marks import drift_bar, drift_marks, mode

log = logging.getLogger(__name__)

DATASHADE_ABOVE = 20_000
BOOTSTRAP_UP_TO = 2_000  # configs; p_front needs a bootstrap, skipped above this to stay fast
TABLE_COLUMNS = ("config", "load_point", "hardware_class", "repeat", "status", "drift_suspect", "trial")
#: one colour per load point x hardware class group (cycled)
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
SUSPECT_COLOUR = "#d62728"


def metric_options(df: pd.DataFrame) -> list[str]:
    """Metrics with a known sense that have at least one finite value."""
    out = []
    for m in known_metrics():
        if m in df.columns:
            col = pd.to_numeric(df[m], errors="coerce")
            if np.isfinite(col.to_numpy(dtype=float)).any():
                out.append(m)
    return out


Filters = tuple[tuple[str, str, tuple[Any, ...]], ...]


def filter_kwargs(filters: Filters) -> dict[str, Any]:
    """``(name, "range", (lo, hi))`` / ``(name, "in", values)`` triples as
    :func:`analysis.frame.filter_trials` keywords (a tuple is a range there, a list a set of values)."""
    return {name: (tuple(v) if kind == "range" else list(v)) for name, kind, v in filters}


BY = ("load_point", "hardware_class")


@dataclass(frozen=True)
class FrontView:
    """The Pareto explorer's data for two metrics and a set of filters (cached per dataset version).

    ``points``: one row per config with usable trials (``x``, ``y`` medians, ``config`` label,
    ``config_id``, ``front`` ("on front"/"dominated"), ``p_front`` (-1 without a bootstrap),
    ``repeats``, ``group``), built from arrays; ``rows``: positions in ``table`` (the trial table
    it was computed from) of the trials left after the filters (baselines left out); ``warnings``
    and ``n_boot`` from :func:`analysis.pareto.front`.
    """

    points: pd.DataFrame
    warnings: list[Any]
    n_boot: int
    rows: np.ndarray
    table: pd.DataFrame
    #: positions in ``table`` of the drift-suspect trials that pass the filters (left out of the front)
    suspect_rows: np.ndarray = dataclasses.field(default_factory=lambda: np.arange(0))

    @property
    def n_trials(self) -> int:
        return len(self.rows)


def filter_columns(df: pd.DataFrame, x: str, y: str, filters: Filters) -> list[str]:
    """The trial-table columns the front and the filters read (a narrow copy is enough)."""
    cols = [*base_columns(BY), x, y]
    for name, _, _ in filters:
        cols.append(name if name in ("status", "load_point", "dataset", "hardware_class") else PARAM_PREFIX + name)
    return [c for c in dict.fromkeys(cols) if c in df.columns]


def front_points(folder: Any, x: str, y: str, filters: Filters = ()) -> FrontView:
    """Per-config points of the front of ``x`` and ``y`` over the trials matching ``filters``
    (baselines and drift-suspect trials left out: :mod:`dashboards.app.marks`); cached per dataset version.

    The cloud comes straight from :func:`analysis.pareto.config_groups`' arrays (per-config medians);
    :func:`analysis.pareto.front` materialises point objects only for the front (every point only
    when it also bootstraps ``p_front``, i.e. up to ``BOOTSTRAP_UP_TO`` configs), so a 100k-trial
    dataset costs no per-config Python work."""
    version = state.version(folder)

    def make() -> FrontView:
        ds, df = state.dataset(folder), state.table(folder)
        lean = df[filter_columns(df, x, y, filters)].reset_index(drop=True)
        passing = filter_trials(lean, include_baseline=False, **filter_kwargs(filters))
        suspect = drift_marks(folder).mask(df)[passing.index.to_numpy()]  # lean has no trial_id
        filtered = passing[~suspect] if suspect.any() else passing
        n_cfg = int(filtered["config_id"].nunique())
        n_boot = 100 if n_cfg <= BOOTSTRAP_UP_TO else 0
        res = front(ds, metrics=(x, y), by=BY, table=filtered, n_boot=n_boot, points="all" if n_boot else "front")
        groups = config_groups(filtered, (x, y), BY)  # the grouping front() just cached for this table
        parts: list[pd.DataFrame] = []
        for g, rg in zip(groups, res.groups):
            idx = np.flatnonzero(g.counts > 0)
            ids = pd.Series(g.config_ids[idx], dtype=object).astype(str)  # object strings (no-op for str ids)
            on = ids.isin({pt.config_id for pt in rg.points if pt.on_front}).to_numpy()  # hash look-ups
            p_front = np.full(len(idx), -1.0)
            if n_boot and len(rg.points) == len(idx):  # points="all": the same configs in the same order
                p_front = np.asarray([-1.0 if pt.p_front is None else pt.p_front for pt in rg.points], dtype=float)
            labels = np.asarray(g.labels, dtype=object)[idx]
            parts.append(pd.DataFrame({
                x: g.medians[idx, 0], y: g.medians[idx, 1], "config": labels, "config_id": ids.to_numpy(),
                "front": np.where(on, "on front", "dominated"), "p_front": p_front,
                "repeats": g.counts[idx].astype(np.int64),
                "group": " ".join(str(v) for v in g.key.values())}))
        cols = [x, y, "config", "config_id", "front", "p_front", "repeats", "group"]
        points = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)
        return FrontView(points[cols], list(res.warnings), res.n_boot, filtered.index.to_numpy(), df,
                         passing.index.to_numpy()[suspect])

    return state._cached(("front", str(folder), version, x, y, filters, "clean"), make)


@dataclass(frozen=True)
class PageOptions:
    """The widget choices of a dataset version: metrics, levels of the status/scenario/dataset/
    hardware-class filters, and per swept parameter a range (numeric) or its values."""

    metrics: list[str]
    levels: dict[str, list[str]]
    ranges: dict[str, tuple[float, float, float]]
    values: dict[str, list[Any]]


def page_options(folder: Any) -> PageOptions:
    """:class:`PageOptions` of the experiment, cached per dataset version (a 100k-trial table
    takes a noticeable time to scan for levels on every visit)."""
    version = state.version(folder)

    def make() -> PageOptions:
        df = state.table(folder)
        levels: dict[str, list[str]] = {}
        for col in ("status", "load_point", "dataset", "hardware_class"):
            if col in df:
                levels[col] = sorted({str(v) for v in pd.unique(df[col].to_numpy(dtype=object))})
        ranges: dict[str, tuple[float, float, float]] = {}
        values: dict[str, list[Any]] = {}
        for p in state.swept(folder):
            if p.kind == "numeric":
                lo, hi = float(min(p.levels)), float(max(p.levels))
                step = min(np.diff(sorted({float(v) for v in p.levels}))) if len(p.levels) > 1 else 1.0
                ranges[p.name] = (lo, hi, float(step))
            else:
                uniq = pd.unique(df[p.column].to_numpy(dtype=object)).tolist()
                values[p.name] = sorted({v for v in uniq if v is not None and v == v and v != ""}, key=str)
        return PageOptions(metric_options(df), levels, ranges, values)

    return state._cached(("pareto-options", str(folder), version), make)


def cloud_points(xs: np.ndarray, ys: np.ndarray, x: str, y: str) -> hv.Points:
    """The rasterised cloud's points: columns always named ``x`` and ``y`` (labelled with the
    metrics), so datashader's numba kernels, compiled per column layout, are compiled once per
    process (by the server's warm-up rehearsal, or the first large front drawn) rather than once
    per metric pair."""
    return hv.Points(pd.DataFrame({"x": np.asarray(xs, dtype=float), "y": np.asarray(ys, dtype=float)}),
                     [hv.Dimension("x", label=x), hv.Dimension("y", label=y)])


def default_front(folder: Any) -> None:
    """Precompute the page's first view (used by the warm-up of large datasets)."""
    metrics = page_options(folder).metrics
    if "output_throughput" in metrics and "ttft_ms_p99" in metrics:
        front_points(folder, "output_throughput", "ttft_ms_p99")


class ParetoPage(pn.viewable.Viewer):
    """Widgets, plot and table of the Pareto explorer for one experiment."""

    def __init__(self, ctx: Context, **params: Any) -> None:
        super().__init__(**params)
        assert ctx.folder is not None
        self.ctx, self.folder = ctx, ctx.folder
        self.version = state.version(self.folder)
        self.ds = state.dataset(self.folder)
        self.df = state.table(self.folder)
        opts = page_options(self.folder)
        metrics = opts.metrics
        x = ctx.arg("x", "output_throughput")
        y = ctx.arg("y", "ttft_ms_p99")
        self.x = pn.widgets.Select(name="x metric", options=metrics, value=x if x in metrics else metrics[0],
                                   css_classes=["st-x"])
        self.y = pn.widgets.Select(name="y metric", options=metrics,
                                   value=y if y in metrics else metrics[min(1, len(metrics) - 1)], css_classes=["st-y"])
        self.filters: dict[str, pn.widgets.MultiChoice] = {}
        for col, label in (("status", "status"), ("load_point", "scenario"), ("dataset", "dataset"),
                           ("hardware_class", "hardware class")):
            if col in opts.levels:
                levels = opts.levels[col]
                want = [v for v in ctx.arg(col).split(",") if v in levels] or levels
                self.filters[col] = pn.widgets.MultiChoice(name=label, options=levels, value=want,
                                                           css_classes=[f"st-filter-{col}"])
        self.param_filters: dict[str, pn.widgets.RangeSlider | pn.widgets.MultiChoice] = {}
        for p in state.swept(self.folder):
            if p.name in opts.ranges:
                lo, hi, step = opts.ranges[p.name]
                self.param_filters[p.name] = pn.widgets.RangeSlider(name=p.name, start=lo, end=hi, value=(lo, hi),
                                                                    step=step)
            elif p.name in opts.values:
                raw = opts.values[p.name]
                self.param_filters[p.name] = pn.widgets.MultiChoice(name=p.name, options={str(v): v for v in raw},
                                                                    value=list(raw))
        self.marks = drift_marks(self.folder)
        self.drift_mode = mode(ctx)
        self.drift = drift_bar(ctx, self.marks, {
            "exclude": "they are left out of the front, the points and the trial table.",
            "apart": "they are left out of the front and drawn apart as red crosses, one per trial."})
        self.slos = slo_bounds(self.ds)
        self.labels = state._cached(("short-labels", str(self.folder), self.version), lambda: short_labels(self.df))
        self.summary = pn.pane.HTML(sizing_mode="stretch_width")
        self.notes = pn.pane.HTML(sizing_mode="stretch_width")
        self.plot = pn.pane.HoloViews(sizing_mode="stretch_width", height=480)
        self.trials = pn.widgets.Tabulator(pd.DataFrame(columns=list(TABLE_COLUMNS)), pagination="remote",
                                           page_size=12, selectable=1, disabled=True, show_index=False,
                                           hidden_columns=["trial_id"], widths={"config": 360},
                                           configuration={"columnDefaults": {"tooltip": True}},
                                           sizing_mode="stretch_width", css_classes=["st-trials-table"])
        self.open_btn = pn.widgets.Button(name="Select a trial in the table to open it", disabled=True,
                                          button_type="primary", css_classes=["st-open-trial"])
        self.open_btn.on_click(self._open)
        self.trials.param.watch(self._on_trial, "selection")
        for w in [self.x, self.y, *self.filters.values(), *self.param_filters.values()]:
            w.param.watch(lambda e: self.update(), "value_throttled" if "value_throttled" in w.param else "value")
        self.points = pd.DataFrame()
        self.suspect_rows = np.arange(0)
        self.rows = np.arange(0)
        self.trial_table = self.df
        self.update()

    # ------------------------------------------------------------------ computing
    def _filters(self) -> Filters:
        """The filters that narrow anything (a widget with every level or the full range is left out)."""
        out: list[tuple[str, str, tuple[Any, ...]]] = []
        for col, w in self.filters.items():
            if set(w.value) != set(w.options):
                out.append((col, "in", tuple(w.value)))
        for name, pw in self.param_filters.items():
            if isinstance(pw, pn.widgets.RangeSlider):
                if tuple(pw.value) != (pw.start, pw.end):
                    out.append((name, "range", tuple(pw.value)))
            elif len(pw.value) != len(pw.options):
                out.append((name, "in", tuple(pw.value)))
        return tuple(out)

    def update(self) -> None:
        """Recompute the front for the widgets' state and redraw."""
        x, y = self.x.value, self.y.value
        filters = self._filters()
        if x == y:
            self.notes.object = "<div class='st-warn'>choose two different metrics</div>"
            return
        try:
            view = front_points(self.folder, x, y, filters)
        except AnalysisInputError as exc:
            self.notes.object = f"<div class='st-warn'>{esc(exc)}</div>"
            return
        self.points, self.rows, self.trial_table = view.points, view.rows, view.table
        self.suspect_rows = view.suspect_rows
        warnings, n_boot, n_trials = view.warnings, view.n_boot, view.n_trials
        n_front = int((self.points["front"] == "on front").sum()) if len(self.points) else 0
        boot = "" if n_boot else f" (P(on front) not computed above {BOOTSTRAP_UP_TO} configs)"
        self.summary.object = (
            f"<div class='st-pareto-summary' data-points='{len(self.points)}' data-front='{n_front}' "
            f"data-trials='{n_trials}' data-cloud='{'raster' if len(self.points) > DATASHADE_ABOVE else 'points'}'>"
            f"{len(self.points)} configs shown, {n_front} on the front, from "
            f"{n_trials} trials after filters (of {len(self.df)}); senses: {x} "
            f"{'higher' if metric_sense(x) > 0 else 'lower'} is better, {y} "
            f"{'higher' if metric_sense(y) > 0 else 'lower'} is better{boot}; one colour per load point"
            + (f"; {len(self.suspect_rows)} drift-suspect trials left out of the front" if len(self.suspect_rows) else "")
            + "</div>")
        self.notes.object = warnings_html(warnings)
        self.plot.object = self._plot(x, y)
        self._show_trials(None)

    def _colours(self) -> dict[str, str]:
        groups = sorted({str(g) for g in self.points["group"]}) if len(self.points) else []
        return {g: PALETTE[i % len(PALETTE)] for i, g in enumerate(groups)}

    def _extras(self, x: str, y: str, xd: Any, yd: Any) -> list[Any]:
        """SLO lines on either axis and, in ``apart`` mode, the drift-suspect trials as crosses."""
        out: list[Any] = []
        if x in self.slos:
            out.append(hv.VLine(self.slos[x]).opts(color="black", line_dash="dashed", line_width=1.5))
        if y in self.slos:
            out.append(hv.HLine(self.slos[y]).opts(color="black", line_dash="dashed", line_width=1.5))
        if self.drift_mode == "apart" and len(self.suspect_rows):
            t = self.trial_table.iloc[self.suspect_rows]
            sus = pd.DataFrame({xd.name: t[x].to_numpy(dtype=float), yd.name: t[y].to_numpy(dtype=float),
                                "trial": t["trial_id"].astype(str).str[:12].to_numpy(),
                                "config": t["config_id"].astype(str).map(self.labels).to_numpy()})
            out.append(hv.Points(sus, [xd, yd], ["trial", "config"], label="drift-suspect trial (not in the front)")
                       .opts(marker="x", color=SUSPECT_COLOUR, size=9, tools=["hover"]))
        return out

    def _slo_note(self, x: str, y: str) -> str:
        on = [f"{m} <= {self.slos[m]:g} ms" for m in (x, y) if m in self.slos]
        return f"; dashed line: SLO {', '.join(on)}" if on else ""

    def _plot(self, x: str, y: str) -> Any:
        pts = self.points
        if pts.empty:
            return hv.Text(0, 0, "no config has both metrics after these filters")
        pts = pts.assign(config=pts["config_id"].map(self.labels).fillna(pts["config"]))
        front_pts = pts[pts["front"] == "on front"].sort_values(x)
        colours = self._colours()
        vdims = ["config", "front", "p_front", "repeats", "group", "config_id"]
        title = f"{y} vs {x}{self._slo_note(x, y)}"
        if len(pts) > DATASHADE_ABOVE:
            from holoviews.operation.datashader import dynspread, rasterize

            # generic x/y dimension names (labelled with the metrics): see cloud_points
            xd, yd = hv.Dimension("x", label=axis_label(x)), hv.Dimension("y", label=axis_label(y))
            cloud = cloud_points(pts[x].to_numpy(), pts[y].to_numpy(), x, y)
            raster = dynspread(rasterize(cloud).opts(cmap="Blues", cnorm="eq_hist", tools=["box_select"],
                                                     active_tools=["box_select"]))
            stream = hv.streams.BoundsXY(source=raster)
            stream.add_subscriber(self._on_bounds)
            front_xy = front_pts.rename(columns={x: "x", y: "y"})
            lines = hv.Overlay([hv.Curve(sub, xd, yd, label=str(g)).opts(color=colours[str(g)], line_width=1.5)
                                for g, sub in front_xy.groupby("group")])
            marks = hv.Points(front_xy, [xd, yd], vdims).opts(color="group", cmap=colours, size=7, line_color="black",
                                                               tools=["hover"])
            # an image and a few hundred marks: the plain canvas backend (WebGL buys nothing here and
            # costs a slow blit where the browser has no GPU); padding keeps the front's extreme
            # configs (the cloud's edges) off the frame's border
            return hv.Overlay([raster, lines, marks, *self._extras(x, y, xd, yd)]).opts(hv.opts.Overlay(
                responsive=True, height=480, padding=0.05, title=title,
                backend_opts={"plot.output_backend": "canvas"}))
        xd, yd = hv.Dimension(x, label=axis_label(x)), hv.Dimension(y, label=axis_label(y))
        lines = hv.Overlay([hv.Curve(sub.sort_values(x), xd, yd).opts(color=colours[str(g)], line_width=2)
                            for g, sub in front_pts.groupby("group")])
        # one colour per load point; front members drawn larger with a black outline
        on = pts["front"] == "on front"
        pts = pts.assign(size=np.where(on, 11, 7), outline=np.where(on, "black", "white"))
        points = hv.Points(pts, [xd, yd], [*vdims, "size", "outline"]).opts(
            color="group", cmap=colours, size="size", alpha=0.85, line_color="outline",
            tools=["hover", "tap", "box_select", "lasso_select"], active_tools=["box_select"], legend_position="top_right",
            nonselection_alpha=0.2, padding=0.15, show_legend=True)
        sel = hv.streams.Selection1D(source=points)
        sel.add_subscriber(self._on_select)
        return hv.Overlay([points, lines, *self._extras(x, y, xd, yd)]).opts(
            hv.opts.Overlay(responsive=True, height=480, title=title, legend_position="top_right"))

    # ------------------------------------------------------------------ linked selection
    def _on_select(self, index: list[int]) -> None:
        if not index:
            self._show_trials(None)
            return
        chosen = self.points.iloc[list(index)]
        self._show_trials(list(zip(chosen["config_id"].astype(str), chosen["group"].astype(str))))

    def _on_bounds(self, bounds: tuple[float, float, float, float] | None) -> None:
        if not bounds:
            self._show_trials(None)
            return
        x0, y0, x1, y1 = bounds
        p = self.points
        inside = (p[self.x.value] >= x0) & (p[self.x.value] <= x1) & (p[self.y.value] >= y0) & (p[self.y.value] <= y1)
        sub = p.loc[inside]
        self._show_trials(list(zip(sub["config_id"].astype(str), sub["group"].astype(str))))

    def _group_keys(self, table: pd.DataFrame, rows: np.ndarray) -> pd.Series:
        """The group (load point x hardware class, as the points' ``group``) of each of ``rows``."""
        cols = [c for c in BY if c in table.columns]
        keys = table[cols[0]].iloc[rows].astype(str).reset_index(drop=True) if cols else pd.Series([""] * len(rows))
        for c in cols[1:]:
            keys = keys + " " + table[c].iloc[rows].astype(str).reset_index(drop=True)
        return keys

    def _show_trials(self, chosen: list[tuple[str, str]] | None) -> None:
        """List the trials of ``chosen`` (config id, group) pairs: a point stands for one config at
        one load point, so selecting it lists that load point's trials only."""
        table = self.trial_table
        x, y = self.x.value, self.y.value
        rows = self.rows
        if self.drift_mode == "apart" and len(self.suspect_rows):
            rows = np.concatenate([rows, self.suspect_rows])
        if chosen is not None:
            pairs = pd.Series(table["config_id"].astype(str).iloc[rows].to_numpy()) + "\t" + self._group_keys(table, rows)
            rows = rows[pairs.isin({f"{c}\t{g}" for c, g in chosen}).to_numpy()]
        sub = table.iloc[rows]
        suspect = self.marks.mask(sub)
        out = pd.DataFrame({"config": sub["config_id"].astype(str).map(self.labels).to_numpy()})
        for c in (x, y):
            if c in sub.columns:
                out[axis_label(c)] = sub[c].to_numpy()
        for c in ("load_point", "hardware_class", "repeat", "status"):
            if c in sub.columns:
                out[c] = sub[c].astype(str).to_numpy() if c != "repeat" else sub[c].to_numpy()
        out["drift_suspect"] = np.where(suspect, "yes", "")
        out["trial"] = sub["trial_id"].astype(str).str[:12].to_numpy()
        out["trial_id"] = sub["trial_id"].astype(str).to_numpy()
        df = out
        self.trials.value = df.reset_index(drop=True)
        self.trials.selection = []
        what = f"{len(df)} trials of the {len(chosen)} selected configs (each at its own load point)" if chosen is not None else \
            f"all {len(df)} filtered trials (select points to narrow)"
        self.trials_note.object = f"<div class='st-note st-table-note' data-rows='{len(df)}'>{what}</div>"

    def _on_trial(self, event: Any) -> None:
        if event.new:
            tid = str(self.trials.value["trial_id"].iloc[event.new[0]])
            self.open_btn.name = f"Open trial {tid[:12]} in the inspector"
            self.open_btn.disabled = False
            self._chosen = tid
        else:
            self.open_btn.disabled = True

    def _open(self, _: Any) -> None:
        tid = getattr(self, "_chosen", None)
        if tid:
            self.ctx.navigate("inspector", trial=tid)

    def refresh(self) -> None:
        """Pick up a new dataset version (new results)."""
        v = state.version(self.folder)
        if v != self.version:
            self.version, self.ds, self.df = v, state.dataset(self.folder), state.table(self.folder)
            self.update()

    @property
    def trials_note(self) -> pn.pane.HTML:
        if not hasattr(self, "_trials_note"):
            self._trials_note = pn.pane.HTML(sizing_mode="stretch_width")
        return self._trials_note

    def __panel__(self) -> Any:
        controls = pn.Column(pn.pane.HTML("<b>Metrics</b>"), self.x, self.y, pn.pane.HTML("<b>Filters</b>"),
                             *self.filters.values(), *self.param_filters.values(), width=300)
        return pn.Column(self.drift, pn.Row(controls, pn.Column(self.summary, self.plot, self.notes,
                                                                sizing_mode="stretch_width"),
                                sizing_mode="stretch_width"),
                         pn.pane.HTML("<h4>Trials</h4>"), self.trials_note, self.trials, self.open_btn,
                         sizing_mode="stretch_width")


def view(ctx: Context) -> ParetoPage:
    return ParetoPage(ctx)
