"""Search views: optuna-dashboard-style views of an experiment, one load point at a time.

A picker chooses the load point (and the hardware class where there are several: classes never share
a view) and the objective (the spec's ranking objective by default); the views never pool load
points. Baseline re-runs are drift controls and are left out; holes (never measured) too.

- **Parallel coordinates**: one line per engine config measured at the load point, through one axis
  per swept parameter (log2 spacing for power-of-two knobs, one slot per level for bool and string
  ones) and the objective (the median of the config's ok trials), coloured by the objective.
  Configs with no ok trial are grey dashed lines ending in the ``failed`` slot under the objective
  axis. Above ``MAX_LINES`` configs a fixed-seed random ``MAX_LINES`` of them are drawn (the best
  ``ALWAYS_BEST`` always among them) and the page says so.
- **Slice plots**: the objective of each ok trial against each parameter (log x for power-of-two
  knobs). Above :data:`~dashboards.app.raster.RASTER_ABOVE` ok trials every one of them is binned
  into a density image (:mod:`dashboards.app.raster`; nothing sampled) and only the ``BEST_POINTS``
  best are drawn as points to hover and select (the page says so). The first
  ``SLICES_SHOWN`` parameters are drawn until the user picks others (a picker above them, or
  ``?slices=name,name``; the page says how many of how many), every plot a view of one shared source.
- **Run-order history**: the objective of each trial in the order the trials ran (their start
  times; one trial per GPU set at a time, so it is also the order they finished on that hardware),
  the best-so-far line over the ok trials, failed trials as red crosses on the bottom edge. Above
  ``RASTER_ABOVE`` ok trials they are one density image, with the trials that improved the best so
  far and the ``BEST_POINTS`` best as points to hover; above ``RASTER_ABOVE`` failed trials those
  are a red density strip along the bottom edge (the page says so).
- **Trial table** (Panel Tabulator, sorted and filtered in the server): one row per trial, short
  config labels (:func:`dashboards.app.labels.short_labels`; the full config id in the tooltip),
  units in the headers, widths that fit a 1280 px screen.

Drift-suspect trials follow :mod:`dashboards.app.marks`: ``?drift=exclude`` (default) leaves them
out of every view; ``?drift=apart`` still leaves them out of the lines, medians and best-so-far, and
shows them beside (orange diamonds on the history and the slices, marked rows in the table).
The views are computed in the background and cached per dataset version and choice.
"""

from __future__ import annotations

import dataclasses
import html
import logging
import math
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import panel as pn
from bokeh.models import ColumnDataSource, HoverTool, LinearColorMapper
from bokeh.palettes import Blues256
from bokeh.plotting import figure

from analysis.frame import AnalysisInputError, Parameter, metric_sense
from analysis.report import default_metric
from dashboards.app import Context, esc, on_result, raster, state
from dashboards.app.labels import axis_label, short_labels, unit
from dashboards.app.marks import DriftMarks, drift_bar, drift_marks, mode
from dashboards.app.pareto import metric_options
from dashboards.app.settle import settle

log = logging.getLogger(__name__)

MAX_LINES = 2_000  # configs drawn on the parallel coordinates
ALWAYS_BEST = 100  # of which the best ones are always drawn
BEST_POINTS = 100  # ok trials drawn as points to hover on the slices and the history when they are density images
SLICE_BINS = (120, 80)  # a slice plot's density image, bins (x, y): about 2 screen pixels each
HISTORY_BINS = (400, 100)  # the history's density image, bins (run order, objective)
SLICES_SHOWN = 3  # slice plots drawn until the user picks others (each is a Bokeh figure: 0.1 s and more)
SEED = 0
FAILED_SLOT = -0.15  # where a config with no ok trial meets the objective axis (normalised units)
FAILED_COLOUR = "#7f7f7f"
FAILED_TRIAL_COLOUR = "#d62728"
SUSPECT_COLOUR = "#ff7f0e"
BEST_COLOUR = "#2ca02c"  # the best trials drawn over a density image (the best-so-far line's colour)
#: the trial table's metric columns (after the objective): column -> header with its unit
TABLE_METRICS = {"output_throughput": "output (tok/s)", "request_throughput": "requests (req/s)",
                 "ttft_ms_p99": "TTFT p99 (ms)", "tpot_ms_p99": "TPOT p99 (ms)", "e2el_ms_p99": "E2E p99 (ms)"}
#: units of well-known engine knobs, for their axes
PARAM_UNITS = {"max_num_seqs": "sequences", "max_num_batched_tokens": "tokens", "max_model_len": "tokens",
               "block_size": "tokens per block", "gpu_memory_utilization": "fraction of GPU memory",
               "tensor_parallel_size": "GPUs", "pipeline_parallel_size": "GPUs", "swap_space": "GiB",
               "cpu_offload_gb": "GiB", "max_num_partial_prefills": "requests", "num_scheduler_steps": "steps"}


def power_of_two(p: Parameter) -> bool:
    """Whether a numeric parameter's levels are positive powers of two (batch sizes, token budgets,
    block sizes) or span a ratio of 8 or more (``Parameter.log``): its axes are log2-spaced."""
    if p.kind != "numeric" or len(p.levels) < 2:
        return False
    vals = [float(v) for v in p.levels]
    if p.log:
        return True
    return all(v > 0 and float(v).is_integer() and (int(v) & (int(v) - 1)) == 0 for v in vals)


def param_axis(p: Parameter) -> str:
    """A parameter's axis label: its name, unit and scale (``max_num_seqs (sequences, log2 scale)``)."""
    what = PARAM_UNITS.get(p.name, "")
    scale = "log2 scale" if power_of_two(p) else ("categories" if p.kind != "numeric" else "linear")
    return f"{p.name} ({what + ', ' if what else ''}{scale})"


def _level_key(v: Any) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def normalise(p: Parameter, values: pd.Series) -> np.ndarray:
    """Each value's height on the parameter's parallel axis, in [0, 1] (NaN where missing)."""
    if p.kind == "numeric":
        x = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float)
        lv = np.asarray([float(v) for v in p.levels], dtype=float)
        if power_of_two(p):
            x, lv = np.log2(np.where(x > 0, x, np.nan)), np.log2(lv)
        lo, hi = float(np.nanmin(lv)), float(np.nanmax(lv))
        return np.asarray((x - lo) / (hi - lo) if hi > lo else np.where(np.isnan(x), np.nan, 0.5))
    levels = [_level_key(v) for v in p.levels]
    if "" not in levels and values.isna().any():
        levels = ["", *levels]
    pos = {lv: (i / (len(levels) - 1) if len(levels) > 1 else 0.5) for i, lv in enumerate(levels)}
    return np.asarray([pos.get(_level_key(v), np.nan) for v in values.tolist()], dtype=float)


@dataclass(frozen=True)
class Views:
    """What the page draws for one load point x hardware class and objective.

    ``configs``: one row per config measured there (``config_id``, ``label``, ``objective`` median of
    its ok trials, NaN when none, ``n_ok``, ``n_failed``, the parameter columns); ``drawn``: the
    config ids on the parallel coordinates; ``trials``: the trials in run order (``order`` from 1,
    ``objective``, ``status``, ``best_so_far`` over the ok ones, ``suspect``, ``label``), drift-suspect ones
    included only in ``apart`` mode and then never in ``best_so_far``."""

    load_point: str
    hardware_class: str
    objective: str
    higher_is_better: bool
    params: list[Parameter]
    configs: pd.DataFrame
    drawn: list[str]
    trials: pd.DataFrame
    labels: dict[str, str]
    n_suspect: int

    @property
    def best(self) -> float:
        ok = self.trials.loc[(self.trials["status"] == "ok") & ~self.trials["suspect"], "objective"]
        ok = ok[np.isfinite(ok.to_numpy(dtype=float))]
        if ok.empty:
            return float("nan")
        return float(ok.max() if self.higher_is_better else ok.min())


def compute(folder: Any, load_point: str, hardware_class: str, objective: str, apart: bool) -> Views:
    """:class:`Views` of the experiment (see the module doc); raises ``AnalysisInputError`` naming a
    load point, class or objective the experiment does not have."""
    df, marks = state.table(folder), drift_marks(folder)
    if objective not in df.columns:
        raise AnalysisInputError(f"objective {objective!r} is not a metric of this experiment")
    higher = metric_sense(objective) > 0
    keep = (df["load_point"].astype(str) == load_point).to_numpy()
    if "hardware_class" in df and hardware_class:
        keep = keep & (df["hardware_class"].astype(str) == hardware_class).to_numpy()
    if "is_baseline" in df:
        keep = keep & ~df["is_baseline"].astype(bool).to_numpy()
    keep = keep & (df["status"].astype(str) != "hole").to_numpy()
    if not keep.any():
        raise AnalysisInputError(f"no measured trial at load point {load_point!r}"
                                 + (f" on hardware class {hardware_class!r}" if hardware_class else ""))
    params = [p for p in state.swept(folder) if p.column in df.columns]
    cols = [c for c in dict.fromkeys(["trial_id", "config_id", "config_label", "status", "repeat", "started_at",
                                      objective, *TABLE_METRICS, *(p.column for p in params)]) if c in df.columns]
    sub = df.loc[keep, cols].reset_index(drop=True)
    suspect = marks.mask(sub)
    n_suspect = int(suspect.sum())
    sub = sub.assign(objective=pd.to_numeric(sub[objective], errors="coerce").astype(float), suspect=suspect)
    if not apart:
        sub = sub[~suspect].reset_index(drop=True)
    clean = sub[~sub["suspect"]]

    def make_labels() -> dict[str, str]:
        out = short_labels(clean if len(clean) else sub)
        for cid in set(sub["config_id"].astype(str)) - set(out):
            out[cid] = str(cid)
        return out

    # per load point x class x drift mode, not per objective: 1-2 s on 93,000 configs
    labels = state._cached(("views-labels", str(folder), state.version(folder), load_point, hardware_class, apart),
                           make_labels)
    # integer codes per config (grouping by 64-character ids sorts strings: seconds on 100k trials)
    codes, ids = pd.factorize(clean["config_id"].astype(str).to_numpy(), sort=False)
    status = clean["status"].astype(str).to_numpy()
    obj = clean["objective"].to_numpy()
    good = (status == "ok") & np.isfinite(obj)
    configs = clean[[p.column for p in params]].groupby(codes, sort=True).first().reset_index(drop=True)
    configs.insert(0, "config_id", np.asarray(ids, dtype=object))
    med = pd.Series(obj[good]).groupby(codes[good], sort=True).median()
    configs["objective"] = med.reindex(np.arange(len(ids))).to_numpy()
    configs["n_ok"] = np.bincount(codes[good], minlength=len(ids))
    configs["n_failed"] = np.bincount(codes[status == "failed"], minlength=len(ids))
    configs["label"] = configs["config_id"].map(labels)
    drawn = _draw_lines(configs, higher)
    order = np.argsort(sub["started_at"].to_numpy(), kind="stable") if "started_at" in sub else np.arange(len(sub))
    trials = sub.iloc[order].reset_index(drop=True)
    trials.insert(0, "order", np.arange(1, len(trials) + 1))
    good = (trials["status"].astype(str) == "ok").to_numpy() & ~trials["suspect"].to_numpy() & \
        np.isfinite(trials["objective"].to_numpy())
    run = pd.Series(np.where(good, trials["objective"].to_numpy(), np.nan))
    trials["best_so_far"] = (run.cummax() if higher else run.cummin()).to_numpy()
    codes, uniq = pd.factorize(trials["config_id"].astype(str).to_numpy(), sort=False)
    trials["label"] = np.asarray([labels.get(u, u) for u in uniq], dtype=object)[codes]
    return Views(load_point, hardware_class, objective, higher, params, configs, drawn, trials, labels, n_suspect)


def _draw_lines(configs: pd.DataFrame, higher: bool) -> list[str]:
    """The configs drawn on the parallel coordinates: all of them up to ``MAX_LINES``, else the
    ``ALWAYS_BEST`` best and a fixed-seed random choice of the others."""
    ids = configs["config_id"].astype(str).to_numpy()
    if len(ids) <= MAX_LINES:
        return ids.tolist()
    score = configs["objective"].to_numpy(dtype=float) * (1 if higher else -1)
    ranked = np.argsort(np.where(np.isfinite(score), -score, np.inf), kind="stable")
    best = ranked[:ALWAYS_BEST]
    rest = np.random.default_rng(SEED).choice(ranked[ALWAYS_BEST:], MAX_LINES - ALWAYS_BEST, replace=False)
    return ids[np.sort(np.concatenate([best, rest]))].tolist()


def views(folder: Any, load_point: str, hardware_class: str, objective: str, apart: bool) -> Future[Views]:
    """:func:`compute` in the background, once per dataset version and choice."""
    key = ("views", str(folder), state.version(folder), load_point, hardware_class, objective, apart)
    return state.background(key, lambda: compute(folder, load_point, hardware_class, objective, apart))


# ------------------------------------------------------------------------------------------ plots
#
# Plain Bokeh, few models: one multi-line source for the parallel coordinates, one source shared by
# every slice plot (each plot is a view of its own column of it, so hovering or selecting trials in
# one shows them in all), one figure for the history. HoloViews took about 20 s to build and render
# these on 100,000 trials (12 figures of 5,000 points, 26,000 segments); see benchmarks/RESULTS.md.


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def parallel_plot(v: Views) -> Any:
    """Parallel coordinates: one polyline per drawn config in one multi-line source (``pc|ok``,
    columns ``xs``, ``ys``, ``objective``, ``pc_config``, ``config``), coloured by the objective;
    configs with no ok trial grey dashed in ``pc|failed`` (objective NaN), ending in the failed slot."""
    from bokeh.models import ColorBar, FixedTicker, LabelSet
    from bokeh.palettes import Viridis256

    cf = v.configs.set_index(v.configs["config_id"].astype(str)).loc[v.drawn]
    axes = [*(param_axis(p) for p in v.params), axis_label(v.objective)]
    heights = [normalise(p, cf[p.column]) for p in v.params]
    obj = cf["objective"].to_numpy(dtype=float)
    finite = obj[np.isfinite(obj)]
    lo, hi = (float(finite.min()), float(finite.max())) if len(finite) else (0.0, 1.0)
    heights.append(np.where(np.isfinite(obj), (obj - lo) / (hi - lo) if hi > lo else 0.5, FAILED_SLOT))
    y = np.vstack(heights).T  # configs x axes
    k = y.shape[1]
    failed = ~np.isfinite(obj)
    title = (f"{v.objective} across the parameters at {v.load_point}: {len(v.drawn)} configs"
             + (f" of {len(v.configs)} drawn (the {ALWAYS_BEST} best and a random choice)" if len(v.drawn) < len(v.configs)
                else ""))
    fig = figure(height=420, sizing_mode="stretch_width", title=title, x_range=(-0.2, k - 0.6),
                 y_range=(FAILED_SLOT - 0.08, 1.08), tools="pan,wheel_zoom,box_zoom,reset,save")
    clabel = axis_label(v.objective)
    xs = np.arange(k, dtype=float)
    ids, labels = cf.index.to_numpy(dtype=object), cf["label"].to_numpy(dtype=object)

    def lines(mask: np.ndarray, name: str) -> ColumnDataSource:
        # plain lists, not an array per line: Bokeh sends every array as its own binary buffer (two
        # websocket frames each), and 4,000 of them took the browser 1.5 s to receive; heights are
        # rounded to 1e-4 of the axis (a tenth of a pixel)
        rows = np.flatnonzero(mask)
        return ColumnDataSource({"xs": [xs.tolist()] * len(rows), "ys": np.round(y[rows], 4).tolist(),
                                 "objective": obj[rows], "pc_config": ids[rows], "config": labels[rows]}, name=name)

    mapper = LinearColorMapper(palette=Viridis256, low=lo, high=hi if hi > lo else lo + 1)
    ok_lines = fig.multi_line("xs", "ys", source=lines(~failed, "pc|ok"), line_width=1.2, alpha=0.7,
                              color={"field": "objective", "transform": mapper})
    renderers = [ok_lines]
    if failed.any():
        renderers.append(fig.multi_line("xs", "ys", source=lines(failed, "pc|failed"), color=FAILED_COLOUR,
                                        line_dash="dashed", line_width=1.2, alpha=0.8, legend_label="failed (no ok trial)"))
        fig.legend.location = "top_left"
    fig.segment(x0=xs, y0=FAILED_SLOT - 0.05, x1=xs, y1=1.02, color="black", line_width=1)
    fig.add_layout(LabelSet(x="x0", y="y0", text="text", x_offset=4, text_font_size="8pt", text_color="#333",
                            source=ColumnDataSource(_tick_labels(v, lo, hi, k, bool(failed.any())).to_dict("list"))))
    fig.add_layout(ColorBar(color_mapper=mapper, title=clabel), "right")
    fig.add_tools(HoverTool(renderers=renderers, tooltips=[("config", "@config"), (clabel, "@objective")]))
    fig.xaxis.ticker = FixedTicker(ticks=list(range(k)))
    fig.xaxis.major_label_overrides = {i: a for i, a in enumerate(axes)}
    fig.xaxis.major_label_text_font_size = "8pt"
    fig.yaxis.visible = False
    fig.axis.axis_label = ""  # the parallel axes are named in their ticks
    fig.grid.visible = False
    fig.title.text_font_size = "10pt"
    return fig


def _tick_labels(v: Views, lo: float, hi: float, k: int, failed: bool) -> pd.DataFrame:
    xs: list[float] = []
    ys: list[float] = []
    texts: list[str] = []
    for i, p in enumerate(v.params):
        levels = list(p.levels)
        if p.kind == "numeric" and len(levels) > 8:
            levels = [levels[j] for j in np.unique(np.linspace(0, len(levels) - 1, 6).round().astype(int))]
        heights = normalise(p, pd.Series(levels, dtype=object))
        for lv, h in zip(levels, heights):
            if np.isfinite(h):
                xs.append(float(i))
                ys.append(float(h))
                texts.append(_level_key(lv) or "(default)")
    for t in np.linspace(lo, hi, 5) if hi > lo else [lo]:
        xs.append(float(k - 1))
        ys.append(float((t - lo) / (hi - lo)) if hi > lo else 0.5)
        texts.append(_fmt(float(t)))
    if failed:
        xs.append(float(k - 1))
        ys.append(FAILED_SLOT)
        texts.append("failed")
    return pd.DataFrame({"x0": xs, "y0": ys, "text": texts})


def _best_rows(rows: pd.DataFrame, higher: bool) -> np.ndarray:
    """Positions in ``rows`` of its ``BEST_POINTS`` best by ``objective`` (ties by row), in row order."""
    score = rows["objective"].to_numpy(dtype=float) * (-1.0 if higher else 1.0)
    return np.sort(np.argsort(score, kind="stable")[:BEST_POINTS])


def clean_ok(t: pd.DataFrame) -> np.ndarray:
    """The trials the slice plots and the history draw as ok: ok, not drift-suspect, objective finite."""
    return (t["status"].astype(str) == "ok").to_numpy() & ~t["suspect"].to_numpy() & np.isfinite(t["objective"].to_numpy())


def rasterised(v: Views) -> bool:
    """Whether the slice plots and the history draw the ok trials as density images (more than
    :data:`~dashboards.app.raster.RASTER_ABOVE` of :func:`clean_ok`) rather than one point each."""
    return int(clean_ok(v.trials).sum()) > raster.RASTER_ABOVE


def _slice_columns(v: Views, rows: pd.DataFrame, names: list[str] | None) -> dict[str, Any]:
    """The slice plots' shared source: ``x<i>`` (parameter i's value; a level's position, jittered,
    for bool and string parameters, ``xt<i>`` its text), ``y`` (the objective), ``order``, ``config``."""
    data: dict[str, Any] = {"y": rows["objective"].to_numpy(dtype=float), "order": rows["order"].to_numpy(),
                            "config": rows["label"].to_numpy(dtype=object)}
    jitter = np.random.default_rng(SEED).uniform(-0.3, 0.3, len(rows))
    for i, p in enumerate(v.params):
        if names is not None and p.name not in names:
            continue
        xs = rows[p.column]
        if p.kind == "numeric":
            data[f"x{i}"] = pd.to_numeric(xs, errors="coerce").to_numpy(dtype=float)
            continue
        levels = _levels(p, xs)
        text = np.asarray([_level_key(a) or "(default)" for a in xs.tolist()], dtype=object)
        data[f"x{i}"] = np.asarray([levels.index(t) if t in levels else np.nan for t in text], dtype=float) + jitter
        data[f"xt{i}"] = text
    return data


def _levels(p: Parameter, values: pd.Series) -> list[str]:
    out = [_level_key(a) or "(default)" for a in p.levels]
    if values.isna().any() and "(default)" not in out:
        out.insert(0, "(default)")
    return out


def _x_range(p: Parameter, levels: list[str]) -> tuple[float, float]:
    """A slice plot's x range: its parameter's levels, padded (log10-padded on a log axis); the
    level positions (0..n-1, jittered by up to 0.3) for bool and string parameters."""
    if p.kind != "numeric":
        return -0.5, len(levels) - 0.5
    lv = [float(a) for a in p.levels]
    return raster.padded(min(lv), max(lv), log=power_of_two(p))


def slice_plots(v: Views, names: list[str] | None = None) -> Any:
    """One scatter of the objective against each parameter (ok trials), log x for power-of-two knobs,
    every plot a view of one shared source (``slices|clean``; ``slices|suspect`` for drift-suspect
    trials shown apart): a figure per parameter (those in ``names``, every one by default), named
    ``slice|<parameter>``. Above ``RASTER_ABOVE`` ok trials (:func:`rasterised`) each plot draws every
    one of them as a density image instead (``slices|density|<parameter>``) and the shared source,
    ``slices|best``, holds the ``BEST_POINTS`` best of them only, drawn as points to hover and select."""
    from bokeh.layouts import gridplot
    from bokeh.models import Div, FixedTicker, Range1d

    if not v.params or names == []:
        return Div(text="no swept parameter" if not v.params else "no parameter picked")
    t = v.trials
    ok = t[(t["status"].astype(str) == "ok") & np.isfinite(t["objective"].to_numpy())]
    clean, sus = ok[~ok["suspect"]], ok[ok["suspect"]]
    dense = rasterised(v)
    everything = _slice_columns(v, clean, names) if dense else {}
    shown = clean.iloc[_best_rows(clean, v.higher_is_better)] if dense else clean
    src = ColumnDataSource(_slice_columns(v, shown, names), name="slices|best" if dense else "slices|clean")
    sus_src = ColumnDataSource(_slice_columns(v, sus, names), name="slices|suspect") if len(sus) else None
    mapper = LinearColorMapper(palette=Blues256[::-1][64:], low=1, high=max(len(t), 2))
    ylab = axis_label(v.objective)
    y_all = clean["objective"].to_numpy(dtype=float)
    y_span = raster.padded(float(y_all.min()), float(y_all.max())) if dense else (0.0, 1.0)
    y_range = Range1d(*y_span)
    figs = []
    for i, p in enumerate(v.params):
        if names is not None and p.name not in names:
            continue
        log_x = power_of_two(p)
        levels = _levels(p, t[p.column])
        extra: dict[str, Any] = {"x_range": Range1d(*_x_range(p, levels)), "y_range": y_range} if dense else {}
        fig = figure(width=340, height=250, title=p.name, name=f"slice|{p.name}", x_axis_type="log" if log_x else "linear",
                     x_axis_label=param_axis(p), y_axis_label=ylab, tools="pan,wheel_zoom,box_zoom,box_select,reset,save",
                     **extra)
        xv = f"@xt{i}" if p.kind != "numeric" else f"@x{i}"
        if dense:
            img = raster.density(everything[f"x{i}"], everything["y"], SLICE_BINS[0], SLICE_BINS[1],
                                 _x_range(p, levels), y_span, log_x=log_x)
            raster.add_density(fig, img, f"slices|density|{p.name}", legend_label=f"all {len(clean)} ok trials")
            dots = fig.scatter(f"x{i}", "y", source=src, size=5, color=BEST_COLOUR, line_color="black", line_width=0.5,
                               legend_label=f"the {len(shown)} best (hover)")
        else:
            dots = fig.scatter(f"x{i}", "y", source=src, size=4, alpha=0.6, color={"field": "order", "transform": mapper})
        if sus_src is not None:
            fig.scatter(f"x{i}", "y", source=sus_src, marker="diamond", size=6, color=SUSPECT_COLOUR,
                        legend_label="drift-suspect")
        fig.add_tools(HoverTool(renderers=[dots], tooltips=[("config", "@config"), (p.name, xv), (ylab, "@y"),
                                                            ("run order", "@order")]))
        if log_x:
            fig.xaxis.ticker = FixedTicker(ticks=[float(a) for a in p.levels])
            fig.xaxis.major_label_overrides = {float(a): _level_key(a) for a in p.levels}
        elif p.kind != "numeric":
            fig.xaxis.ticker = FixedTicker(ticks=list(range(len(levels))))
            fig.xaxis.major_label_overrides = dict(enumerate(levels))
        if fig.legend:
            fig.legend.label_text_font_size = "7pt"
            fig.legend.location = "bottom_right"
            fig.legend.background_fill_alpha = 0.6
        fig.title.text_font_size = "10pt"
        fig.axis.axis_label_text_font_size = "8pt"
        figs.append(fig)
    return gridplot(figs, ncols=3, merge_tools=True, toolbar_location="right")


def history_plot(v: Views) -> Any:
    """The objective by run order (``history|ok``), the best-so-far line (``history|best``: columns
    ``order``, ``best_so_far``), failed trials as red crosses on the bottom edge (``history|failed``),
    suspects apart. Above ``RASTER_ABOVE`` ok trials (:func:`rasterised`) the ok trials are one density
    image (``history|density``) and ``history|ok`` holds, to hover, only the trials that improved the
    best so far and the ``BEST_POINTS`` best; above ``RASTER_ABOVE`` failed trials they are a red
    density strip along the bottom edge (``history|failed-density``) with no hover."""
    from bokeh.models import Range1d

    t = v.trials
    xlab, ylab = "run order (trial number, by start time)", axis_label(v.objective)
    status = t["status"].astype(str).to_numpy()
    finite = np.isfinite(t["objective"].to_numpy())
    suspect = t["suspect"].to_numpy()
    okm = clean_ok(t)
    best = t["best_so_far"].to_numpy()
    # where the best improved (best_so_far is NaN on the trials that are not ok: compare with the last finite one)
    steps = np.flatnonzero(okm & (pd.Series(best).ffill().shift().to_numpy() != best))
    ok = t[okm]
    dense = rasterised(v)
    failed = t[status == "failed"]
    dense_failed = len(failed) > raster.RASTER_ABOVE
    sense = "higher" if v.higher_is_better else "lower"
    floor = float(np.nanmin(ok["objective"])) if len(ok) else 0.0
    extra: dict[str, Any] = {}
    strip: tuple[float, float] | None = None  # the failed trials' strip, under the ok trials' range
    y_lo = y_hi = floor
    if dense:
        y_lo, y_hi = raster.padded(floor, float(np.nanmax(ok["objective"])))
        strip = (y_lo - 0.04 * (y_hi - y_lo), y_lo) if dense_failed else None
        extra = {"x_range": Range1d(*raster.padded(1.0, float(len(t)), 0.01)),
                 "y_range": Range1d(strip[0] if strip else y_lo, y_hi)}
    fig = figure(height=340, sizing_mode="stretch_width", x_axis_label=xlab, y_axis_label=ylab,
                 title=f"{v.objective} by run order at {v.load_point} ({sense} is better)",
                 tools="pan,wheel_zoom,box_zoom,reset,save", **extra)

    def points(rows: pd.DataFrame, name: str, y: Any = None) -> ColumnDataSource:
        return ColumnDataSource({"order": rows["order"].to_numpy(),
                                 "objective": rows["objective"].to_numpy(dtype=float) if y is None else y,
                                 "config": rows["label"].to_numpy(dtype=object)}, name=name)

    if dense:
        xr, yr = (fig.x_range.start, fig.x_range.end), (y_lo, y_hi)
        img = raster.density(ok["order"].to_numpy(), ok["objective"].to_numpy(), HISTORY_BINS[0], HISTORY_BINS[1], xr, yr)
        raster.add_density(fig, img, "history|density", legend_label=f"ok trials (all {len(ok)}; darker: more)")
        keep = np.union1d(np.searchsorted(np.flatnonzero(okm), steps), _best_rows(ok, v.higher_is_better))
        hover = [fig.scatter("order", "objective", source=points(ok.iloc[keep], "history|ok"), color=BEST_COLOUR, size=5,
                             line_color="black", line_width=0.5, legend_label="improved the best, or among the best (hover)")]
    else:
        hover = [fig.scatter("order", "objective", source=points(ok, "history|ok"), color="#1f77b4", size=4, alpha=0.6,
                             legend_label="ok trial")]
    if len(steps):
        line = {"order": np.r_[t["order"].to_numpy()[steps], t["order"].iloc[-1]],
                "best_so_far": np.r_[best[steps], best[steps][-1]]}
        fig.step("order", "best_so_far", source=ColumnDataSource(line, name="history|best"), mode="after",
                 color="#2ca02c", line_width=2.5, legend_label="best so far")
    if dense_failed and strip is not None:
        img = raster.density(failed["order"].to_numpy(), np.zeros(len(failed)), HISTORY_BINS[0], 1,
                             (fig.x_range.start, fig.x_range.end), (-0.5, 0.5), palette=raster.REDS)
        raster.add_density(fig, dataclasses.replace(img, y0=strip[0], y1=strip[1]), "history|failed-density",
                           legend_label=f"failed trials ({len(failed)}, a strip at the bottom; darker: more)")
    elif len(failed):
        hover.append(fig.scatter("order", "objective", source=points(failed, "history|failed", np.full(len(failed), floor)),
                                 marker="x", size=8, color=FAILED_TRIAL_COLOUR,
                                 legend_label=f"failed trial ({len(failed)}, drawn at the bottom)"))
    sus = t[suspect & finite]
    if len(sus):
        hover.append(fig.scatter("order", "objective", source=points(sus, "history|suspect"), marker="diamond", size=6,
                                 color=SUSPECT_COLOUR, legend_label="drift-suspect (not in the best so far)"))
    fig.add_tools(HoverTool(renderers=hover, tooltips=[("config", "@config"), ("run order", "@order"),
                                                       (ylab, "@objective")]))
    fig.legend.location = "bottom_right"
    fig.title.text_font_size = "10pt"
    return fig


def trial_table(v: Views) -> pd.DataFrame:
    """The trial table's rows: run order, short config label (``config_tip``: the full id, escaped,
    for the tooltip), status, repeat, the objective and :data:`TABLE_METRICS` with units."""
    t = v.trials
    out = pd.DataFrame({"#": t["order"].to_numpy(),
                        "config": t["label"].to_numpy(),
                        "status": t["status"].astype(str).to_numpy()})
    if "repeat" in t:
        out["repeat"] = t["repeat"].to_numpy()
    if t["suspect"].any():
        out["drift"] = np.where(t["suspect"].to_numpy(), "suspect", "")
    if v.objective not in TABLE_METRICS:
        out[axis_label(v.objective)] = t["objective"].round(4).to_numpy()
    for col, head in TABLE_METRICS.items():
        if col in t:
            out[head] = pd.to_numeric(t[col], errors="coerce").round(4).to_numpy()
    out["config_tip"] = t["config_id"].astype(str).map(lambda s: html.escape(s, quote=True)).to_numpy()
    return out


# ------------------------------------------------------------------------------------------ the page


class SearchViewsPage(pn.viewable.Viewer):
    """Pickers (load point, hardware class, objective), the drift bar and the four views."""

    def __init__(self, ctx: Context, **params: Any) -> None:
        super().__init__(**params)
        assert ctx.folder is not None
        self.ctx, self.folder = ctx, ctx.folder
        self.version = state.version(self.folder)
        ds, df = state.dataset(self.folder), state.table(self.folder)
        measured = df[~df["is_baseline"].astype(bool)] if "is_baseline" in df else df
        lps = sorted({str(x) for x in pd.unique(measured["load_point"].to_numpy(dtype=object))})
        hws = sorted({str(x) for x in pd.unique(measured["hardware_class"].to_numpy(dtype=object))}) \
            if "hardware_class" in measured else [""]
        metrics = metric_options(df)
        want_lp, want_hw, want_obj = ctx.arg("load_point"), ctx.arg("hardware_class"), ctx.arg("objective")
        preferred = want_obj if want_obj in metrics else default_metric(ds)
        self.load_point = pn.widgets.Select(name="load point", options=lps, value=want_lp if want_lp in lps else lps[0],
                                            css_classes=["st-views-load-point"])
        self.hardware = pn.widgets.Select(name="hardware class", options=hws, value=want_hw if want_hw in hws else hws[0],
                                          visible=len(hws) > 1, css_classes=["st-views-hardware"])
        self.objective = pn.widgets.Select(name="objective", options=metrics,
                                           value=preferred if preferred in metrics else metrics[0],
                                           css_classes=["st-views-objective"])
        self.marks: DriftMarks = drift_marks(self.folder)
        self.drift_mode = mode(ctx)
        self.drift = drift_bar(ctx, self.marks, {
            "exclude": "they are left out of every view below.",
            "apart": "they are left out of the lines, medians and best-so-far below and drawn apart "
                     "(orange diamonds; 'suspect' in the table)."})
        self.summary = pn.pane.HTML(sizing_mode="stretch_width")
        self.parallel = pn.pane.Bokeh(sizing_mode="stretch_width", height=440, css_classes=["st-views-parallel"])
        self.slices = pn.pane.Bokeh(sizing_mode="stretch_width", css_classes=["st-views-slices"])
        self.slice_params = pn.widgets.MultiChoice(name="slice plots of (pick the parameters to draw)", options=[],
                                                   sizing_mode="stretch_width", css_classes=["st-views-slice-params"])
        self.slice_note = pn.pane.HTML(sizing_mode="stretch_width")
        self.drawn: Views | None = None
        self.slice_params.param.watch(lambda e: self._draw_slices(), "value")
        self.history = pn.pane.Bokeh(sizing_mode="stretch_width", height=360, css_classes=["st-views-history"])
        self.table = pn.widgets.Tabulator(
            pd.DataFrame(columns=["#", "config", "status"]), pagination="remote", page_size=15, disabled=True,
            show_index=False, header_filters=True, layout="fit_columns", sizing_mode="stretch_width",
            hidden_columns=["config_tip"], css_classes=["st-views-table"])
        for w in (self.load_point, self.hardware, self.objective):
            w.param.watch(lambda e: self.start(), "value")
        self.start()

    def start(self) -> None:
        """Compute (or fetch) the views of the pickers' choice in the background, then draw them."""
        choice = (self.load_point.value, self.hardware.value if self.hardware.visible else "", self.objective.value)
        if pn.state.location is not None:
            pn.state.location.update_query(load_point=choice[0], objective=choice[2])
        self.summary.object = (f"<div class='st-progress-text'>computing the views of {esc(choice[0])}...</div>")
        fut = views(self.folder, choice[0], choice[1], choice[2], self.drift_mode == "apart")
        on_result(fut, lambda f: self._done(f, choice))

    def _done(self, fut: Future[Views], choice: tuple[str, str, str]) -> None:
        if choice != (self.load_point.value, self.hardware.value if self.hardware.visible else "", self.objective.value):
            return
        settle(fut, self._draw, lambda text: setattr(self.summary, "object", text), "the search views",
               "st-views-refused")

    def _draw(self, v: Views) -> None:
        self.parallel.object = parallel_plot(v)
        self.drawn = None  # no slice redraw while the picker is filled in
        names = [p.name for p in v.params]
        kept = [n for n in (self.slice_params.value or []) if n in names] or \
            [n for n in self.ctx.arg("slices").split(",") if n in names]
        self.slice_params.options = names
        self.slice_params.value = kept or names[:SLICES_SHOWN]
        self.drawn = v
        self._draw_slices()
        self.history.object = history_plot(v)
        self._fill_table(v)
        n_failed = int((v.configs["n_ok"] == 0).sum())
        drawn = len(v.drawn) < len(v.configs)
        n_trials = int((~v.trials["suspect"]).sum())
        dense = rasterised(v)
        n_ok = int(clean_ok(v.trials).sum())
        n_failed_trials = int((v.trials["status"].astype(str) == "failed").sum())
        self.summary.object = (
            f"<div class='st-views-summary st-views-done' data-load-point='{esc(v.load_point)}' "
            f"data-configs='{len(v.configs)}' data-lines='{len(v.drawn)}' data-failed-configs='{n_failed}' "
            f"data-trials='{n_trials}' data-best='{v.best!r}' data-objective='{esc(v.objective)}'>"
            f"load point <b>{esc(v.load_point)}</b>{' on ' + esc(v.hardware_class) if self.hardware.visible else ''}: "
            f"{len(v.configs)} configs, {n_trials} trials (baseline re-runs and holes aside; other load points "
            f"are never pooled in); objective {esc(v.objective)} ({'higher' if v.higher_is_better else 'lower'} is "
            f"better), best ok trial {_fmt(v.best)} {esc(unit(v.objective))}; {n_failed} configs with no ok trial "
            "(grey dashed lines)."
            + (f" The parallel coordinates draw {len(v.drawn)} of the {len(v.configs)} configs: the {ALWAYS_BEST} best "
               f"and a random choice (seed {SEED}) of the others." if drawn else "")
            + (f" <span class='st-views-density' data-ok-trials='{n_ok}' data-best-points='{min(BEST_POINTS, n_ok)}'>The slice "
               f"plots and the history draw all {n_ok} ok trials as density images (darker: more trials in a bin; "
               f"zooming magnifies the bins), with the {min(BEST_POINTS, n_ok)} best of them as points to hover (on the "
               "history also each trial that improved the best so far)"
               + (f"; the history draws the {n_failed_trials} failed trials as a red strip along its bottom edge"
                  if n_failed_trials > raster.RASTER_ABOVE else "") + ".</span>" if dense else "")
            + "</div>")

    def _draw_slices(self) -> None:
        v = self.drawn
        if v is None:
            return
        names = list(self.slice_params.value or [])
        self.slices.object = slice_plots(v, names)
        self.slice_note.object = (
            f"<div class='st-note st-views-slice-note' data-shown='{len(names)}' data-params='{len(v.params)}'>"
            f"{len(names)} of the {len(v.params)} parameters drawn"
            + (": pick others above (each slice plot is a view of the same trials; select trials in one to see "
               "them in all)" if len(names) < len(v.params) else "") + "</div>")

    def _fill_table(self, v: Views) -> None:
        from bokeh.models.widgets.tables import HTMLTemplateFormatter

        frame = state._cached(("views-table", str(self.folder), self.version, v.load_point, v.hardware_class,
                               v.objective, self.drift_mode), lambda: trial_table(v))
        metric_cols = [c for c in frame.columns if c not in ("#", "config", "status", "repeat", "drift", "config_tip")]
        # 875 px (940 with the drift column): the whole table fits the main area of a 1280 px screen
        self.table.widths = {"#": 50, "config": 200, "status": 65, "repeat": 60, "drift": 65,
                             **{c: 100 for c in metric_cols}}
        self.table.formatters = {"config": HTMLTemplateFormatter(
            template="<span class='st-config' title='<%= config_tip %>'><%= value %></span>")}
        self.table.header_tooltips = {**{head: col for col, head in TABLE_METRICS.items()},
                                      "config": "short label: the parameters that differ between the configs shown; "
                                                "hover a cell for the full config id"}
        self.table.value = frame

    def refresh(self) -> None:
        v = state.version(self.folder)
        if v != self.version:
            self.version = v
            self.start()

    def __panel__(self) -> Any:
        return pn.Column(
            self.drift, pn.Row(self.load_point, self.hardware, self.objective), self.summary,
            pn.pane.HTML("<h4>Parallel coordinates</h4>"), self.parallel,
            pn.pane.HTML("<h4>Slice plots: the objective against each parameter</h4>"), self.slice_params,
            self.slice_note, self.slices,
            pn.pane.HTML("<h4>Run-order history</h4>"), self.history,
            pn.pane.HTML("<h4>Trials</h4><div class='st-note'>sort by a header, filter under it; "
                         "hover a config for its full id</div>"), self.table,
            sizing_mode="stretch_width")


def view(ctx: Context) -> SearchViewsPage:
    return SearchViewsPage(ctx)
