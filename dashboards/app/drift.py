"""Drift: the XmR chart and the CUSUM of the baseline re-runs (``ds.sweep.drift``), the alarm, and
the trials measured after the drift began (suspect; raw values are never changed)."""

from __future__ import annotations

import logging
from typing import Any

import holoviews as hv
import pandas as pd
import panel as pn

from analysis.drift import DriftChart
from analysis.frame import AnalysisInputError
from dashboards.app import Context, esc, experiment_page, warnings_html
from dashboards.app.marks import unchecked_reason

log = logging.getLogger(__name__)


def chart_plots(c: DriftChart) -> Any:
    """XmR (values, centre, limits; out-of-limit runs marked) and CUSUM (upper, lower, decision interval)."""
    df = pd.DataFrame({"run": range(len(c.values)), "value": c.values, "out": c.out_of_limits,
                       "upper": c.cusum_upper, "lower": c.cusum_lower, "trial": [t[:12] for t in c.trial_ids]})
    xmr = (hv.Curve(df, "run", "value").opts(color="steelblue")
           * hv.Scatter(df, "run", ["value", "trial", "out"]).opts(
               color="out", cmap={True: "crimson", False: "steelblue"}, size=7, tools=["hover"])
           * hv.HLine(c.centre).opts(color="black") * hv.HLine(c.ucl).opts(color="crimson", line_dash="dashed")
           * hv.HLine(c.lcl).opts(color="crimson", line_dash="dashed"))
    if c.onset_index is not None:
        xmr = xmr * hv.VLine(c.onset_index).opts(color="orange", line_dash="dotted")
    xmr = xmr.opts(hv.opts.Overlay(width=520, height=280, title=f"XmR: {c.load_point} / {c.hardware_class}",
                                   show_legend=False))
    cusum = (hv.Curve(df, "run", "upper", label="S+") * hv.Curve(df, "run", "lower", label="S-")
             * hv.HLine(c.h).opts(color="crimson", line_dash="dashed")).opts(
        hv.opts.Overlay(width=520, height=280, title=f"CUSUM (k={c.k}, h={c.h} sigma)"))
    return pn.Row(pn.pane.HoloViews(xmr), pn.pane.HoloViews(cusum))


class DriftPage(pn.viewable.Viewer):
    """Metric picker; per load point x hardware class, the two charts and the alarm."""

    def __init__(self, ctx: Context, **params: Any) -> None:
        super().__init__(**params)
        self.folder, self.ds, self.df, self.metric = experiment_page(ctx, lambda ds: "output_throughput")
        self.body = pn.Column(sizing_mode="stretch_width")
        self.metric.param.watch(lambda e: self.update(), "value")
        self.update()

    def update(self) -> None:
        try:
            res = self.ds.sweep.drift(metric=self.metric.value)
        except AnalysisInputError as exc:
            self.body.objects = [pn.pane.HTML(f"<div class='st-warn'>{esc(exc)}</div>")]
            return
        if res.alarm:
            ids = ", ".join(t[:12] for t in res.suspect[:20]) + (" ..." if len(res.suspect) > 20 else "")
            head = (f"<div class='st-alarm' data-alarm='true'><b>drift alarm</b> at "
                    f"{pd.Timestamp(res.alarm_at, unit='us')} UTC; {len(res.suspect)} trial(s) suspect "
                    f"(measured after the drift began on their hardware): {esc(ids)}</div>")
        elif not res.charts:
            head = (f"<div class='st-alarm st-warn' data-alarm='unchecked'><b>drift could not be checked</b> on "
                    f"{esc(res.metric)}: {esc(unchecked_reason(res.warnings))}. No alarm here does not mean no drift."
                    "</div>")
        else:
            head = f"<div class='st-alarm' data-alarm='false'>no drift alarm on {esc(res.metric)} ({len(res.charts)} chart(s))</div>"
        parts: list[Any] = [pn.pane.HTML(head + warnings_html(res.warnings), sizing_mode="stretch_width")]
        for c in res.charts:
            rule = f"first alarm: run {c.alarm_index} ({c.alarm_rule})" if c.alarm_index is not None else "in control"
            parts.append(pn.pane.HTML(
                f"<h4>{esc(c.load_point)} / {esc(c.hardware_class)}</h4><div class='st-note'>{len(c.values)} baseline "
                f"runs, reference = first {c.n_reference}; centre {c.centre:.4g}, limits [{c.lcl:.4g}, {c.ucl:.4g}]; "
                f"{rule}; chance of a false alarm on a stable process with this chart: "
                f"{c.false_alarm_probability:.1%}</div>", sizing_mode="stretch_width"))
            parts.append(chart_plots(c))
        self.body.objects = parts

    def __panel__(self) -> Any:
        return pn.Column(self.metric, self.body, sizing_mode="stretch_width")


def view(ctx: Context) -> DriftPage:
    return DriftPage(ctx)
