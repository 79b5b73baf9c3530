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

log = logging.getLogger(__name__)

DATASHADE_ABOVE = 20_000
BOOTSTRAP_UP_TO = 2_000  # configs; p_front needs a bootstrap, skipped above this to stay fast
TABLE_COLUMNS = ("trial_id", "config_label", "load_point", "hardware_class", "repeat", "status")


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
    (baselines left out); cached per dataset version.

    The cloud comes straight from :func:`analysis.pareto.config_groups`' arrays (per-config medians);
    :func:`analysis.pareto.front` materialises point objects only for the front (every point only
    when it also bootstraps ``p_front``, i.e. up to ``BOOTSTRAP_UP_TO`` configs), so a 100k-trial
    dataset costs no per-config Python work."""
    version = state.version(folder)

    def make() -> FrontView:
        ds, df = state.dataset(folder), state.table(folder)
        lean = df[filter_columns(df, x, y, filters)].reset_index(drop=True)
        filtered = filter_trials(lean, include_baseline=False, **filter_kwargs(filters))
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
        return FrontView(points[cols], list(res.warnings), res.n_boot, filtered.index.to_numpy(), df)

    return state._cached(("front", str(folder), version, x, y, filters), make)


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
        self.summary = pn.pane.HTML(sizing_mode="stretch_width")
        self.notes = pn.pane.HTML(sizing_mode="stretch_width")
        self.plot = pn.pane.HoloViews(sizing_mode="stretch_width", height=480)
        self.trials = pn.widgets.Tabulator(pd.DataFrame(columns=list(TABLE_COLUMNS)), pagination="remote",
                                           page_size=12, selectable=1, disabled=True, show_index=False,
                                           sizing_mode="stretch_width", css_classes=["st-trials-table"])
        self.open_btn = pn.widgets.Button(name="Select a trial in the table to open it", disabled=True,
                                          button_type="primary", css_classes=["st-open-trial"])
        self.open_btn.on_click(self._open)
        self.trials.param.watch(self._on_trial, "selection")
        for w in [self.x, self.y, *self.filters.values(), *self.param_filters.values()]:
            w.param.watch(lambda e: self.update(), "value_throttled" if "value_throttled" in w.param else "value")
        self.points = pd.DataFrame()
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
        warnings, n_boot, n_trials = view.warnings, view.n_boot, view.n_trials
        n_front = int((self.points["front"] == "on front").sum()) if len(self.points) else 0
        boot = "" if n_boot else f" (P(on front) not computed above {BOOTSTRAP_UP_TO} configs)"
        self.summary.object = (
            f"<div class='st-pareto-summary' data-points='{len(self.points)}' data-front='{n_front}' "
            f"data-trials='{n_trials}' data-cloud='{'raster' if len(self.points) > DATASHADE_ABOVE else 'points'}'>"
            f"{len(self.points)} configs shown, {n_front} on the front, from "
            f"{n_trials} trials after filters (of {len(self.df)}); senses: {x} "
            f"{'higher' if metric_sense(x) > 0 else 'lower'} is better, {y} "
            f"{'higher' if metric_sense(y) > 0 else 'lower'} is better{boot}</div>")
        self.notes.object = warnings_html(warnings)
        self.plot.object = self._plot(x, y)
        self._show_trials(None)

    def _plot(self, x: str, y: str) -> Any:
        pts = self.points
        if pts.empty:
            return hv.Text(0, 0, "no config has both metrics after these filters")
        front_pts = pts[pts["front"] == "on front"].sort_values(x)
        vdims = ["config", "front", "p_front", "repeats", "group", "config_id"]
        if len(pts) > DATASHADE_ABOVE:
            from holoviews.operation.datashader import dynspread, rasterize

            # generic x/y dimension names (labelled with the metrics): see cloud_points
            xd, yd = hv.Dimension("x", label=x), hv.Dimension("y", label=y)
            cloud = cloud_points(pts[x].to_numpy(), pts[y].to_numpy(), x, y)
            raster = dynspread(rasterize(cloud).opts(cmap="Blues", cnorm="eq_hist", tools=["box_select"],
                                                     active_tools=["box_select"]))
            stream = hv.streams.BoundsXY(source=raster)
            stream.add_subscriber(self._on_bounds)
            front_xy = front_pts.rename(columns={x: "x", y: "y"})
            lines = hv.Overlay([hv.Curve(sub, xd, yd).opts(color="crimson", line_width=1.5)
                                for _, sub in front_xy.groupby("group")])
            marks = hv.Points(front_xy, [xd, yd], vdims).opts(color="crimson", size=6, tools=["hover"])
            # an image and a few hundred marks: the plain canvas backend (WebGL buys nothing here and
            # costs a slow blit where the browser has no GPU); padding keeps the front's extreme
            # configs (the cloud's edges) off the frame's border
            return (raster * lines * marks).opts(hv.opts.Overlay(
                responsive=True, height=480, padding=0.05, title=f"{y} vs {x}",
                backend_opts={"plot.output_backend": "canvas"}))
        lines = hv.Overlay([hv.Curve(sub.sort_values(x), x, y).opts(color="crimson", line_width=1.5)
                            for _, sub in front_pts.groupby("group")])
        points = hv.Points(pts, [x, y], vdims).opts(
            color="front", cmap={"on front": "crimson", "dominated": "steelblue"}, size=8, alpha=0.8,
            tools=["hover", "tap", "box_select", "lasso_select"], active_tools=["box_select"], legend_position="top_right",
            nonselection_alpha=0.2, padding=0.15)
        sel = hv.streams.Selection1D(source=points)
        sel.add_subscriber(self._on_select)
        return (points * lines).opts(hv.opts.Overlay(responsive=True, height=480, title=f"{y} vs {x}"))

    # ------------------------------------------------------------------ linked selection
    def _on_select(self, index: list[int]) -> None:
        self._show_trials(self.points["config_id"].iloc[list(index)].tolist() if index else None)

    def _on_bounds(self, bounds: tuple[float, float, float, float] | None) -> None:
        if not bounds:
            self._show_trials(None)
            return
        x0, y0, x1, y1 = bounds
        p = self.points
        inside = (p[self.x.value] >= x0) & (p[self.x.value] <= x1) & (p[self.y.value] >= y0) & (p[self.y.value] <= y1)
        self._show_trials(p.loc[inside, "config_id"].tolist())

    def _show_trials(self, config_ids: list[str] | None) -> None:
        table = self.trial_table
        cols = [c for c in dict.fromkeys((*TABLE_COLUMNS, self.x.value, self.y.value)) if c in table.columns]
        rows = self.rows
        if config_ids is not None:
            rows = rows[pd.Series(table["config_id"].to_numpy()[rows]).isin(config_ids).to_numpy()]
        df = table[cols].iloc[rows]
        self.trials.value = df.reset_index(drop=True)
        self.trials.selection = []
        what = f"{len(df)} trials of the {len(config_ids)} selected configs" if config_ids is not None else \
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
        return pn.Column(pn.Row(controls, pn.Column(self.summary, self.plot, self.notes, sizing_mode="stretch_width"),
                                sizing_mode="stretch_width"),
                         pn.pane.HTML("<h4>Trials</h4>"), self.trials_note, self.trials, self.open_btn,
                         sizing_mode="stretch_width")


def view(ctx: Context) -> ParetoPage:
    return ParetoPage(ctx)
