"""Compare two engine configs: their per-repeat values, the ratio of medians with its interval,
and the verdict (``ds.sweep.compare``: bootstrap CI, rank test where the repeats allow, a minimum
practical effect), worded as an effect or an association as the design allows.

Configs come from the pickers or the URL (``?page=compare&a=<id>&b=<id>``); the scenario and
hardware class are those both configs ran on.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import holoviews as hv
import pandas as pd
import panel as pn

from analysis.frame import AnalysisInputError
from dashboards.app import Context, claim_html, esc, state, warnings_html
from dashboards.app.labels import axis_label, short_labels
from dashboards.app.marks import clean, drift_bar, drift_marks, mode
from dashboards.app.pareto import SUSPECT_COLOUR, metric_options

log = logging.getLogger(__name__)

MAX_PICKER_OPTIONS = 500
"""Configs listed in each picker at most (those with the most ok repeats); others by URL."""


class ComparePage(pn.viewable.Viewer):
    """Two config pickers, metric, scenario, minimum effect; the comparison below."""

    def __init__(self, ctx: Context, **params: Any) -> None:
        super().__init__(**params)
        assert ctx.folder is not None
        self.ctx, self.folder = ctx, ctx.folder
        self.ds, self.all = state.dataset(self.folder), state.table(self.folder)
        self.marks = drift_marks(self.folder)
        self.drift_mode = mode(ctx)
        self.drift = drift_bar(ctx, self.marks, {
            "exclude": "they are left out of the comparison and its plots.",
            "apart": "they are left out of the comparison; their values are drawn beside as red crosses."})
        self.df = clean(self.all, self.marks)  # what the comparison reads
        runs = self.df[~self.df["is_baseline"].astype(bool)] if "is_baseline" in self.df else self.df
        # the differing parameters first: a picker's width cuts the end of a label, never what tells configs apart
        label_of = state._cached(("short-labels", str(self.folder), state.version(self.folder)),
                                 lambda: short_labels(self.all))
        label_of = {c: label_of.get(c, c) for c in runs["config_id"].astype(str).unique()}
        ids = sorted(label_of, key=label_of.__getitem__)

        # default pair: the two configs with the most ok repeats (then the best median throughput)
        ok = runs[runs["status"] == "ok"]
        if len(ok) and "output_throughput" in ok:
            stats = ok.groupby("config_id")["output_throughput"].agg(["count", "median"])
            ranked = [str(i) for i in stats.sort_values(["count", "median"], ascending=False).index]
        else:
            ranked = list(ids)
        seen = set(ranked)
        ranked += [i for i in ids if i not in seen]

        self.ids = ids

        def pick(arg: str, default: int) -> str | None:
            want = ctx.arg(arg)
            hit = [i for i in ids if want and i == want] or [i for i in ids if want and i.startswith(want)]
            return hit[0] if hit else (ranked[min(default, len(ranked) - 1)] if ranked else None)

        chosen = [c for c in (pick("a", 0), pick("b", 1)) if c]
        listed = ranked[:MAX_PICKER_OPTIONS]  # a browser cannot take a picker of 90,000 configs
        listed += [c for c in chosen if c not in set(listed)]
        seen_labels = pd.Series([label_of[i] for i in listed]).value_counts()
        # the label alone where it names one config; the id's start is added only to tell duplicates apart
        options = {(label_of[i] if seen_labels[label_of[i]] == 1 else f"{label_of[i]} ({i[:8]})"): i
                   for i in sorted(listed, key=label_of.__getitem__)}
        self.picker_note = pn.pane.HTML(
            f"<div class='st-note st-picker-note' data-listed='{len(options)}' data-configs='{len(ids)}'>The pickers "
            f"list the {len(options)} configs with the most ok repeats (then the highest median output throughput) "
            f"of {len(ids)}; compare any other by its id in the URL (<code>?page=compare&amp;a=ID&amp;b=ID</code>, "
            "a prefix is enough).</div>" if len(options) < len(ids) else "", sizing_mode="stretch_width")
        # full width: a picker cut to a fixed width hides the end of the label
        self.a = pn.widgets.Select(name="config a", options=options, value=pick("a", 0), css_classes=["st-a"],
                                   sizing_mode="stretch_width")
        self.b = pn.widgets.Select(name="config b", options=options, value=pick("b", 1), css_classes=["st-b"],
                                   sizing_mode="stretch_width")
        metrics = metric_options(self.df)
        self.metric = pn.widgets.Select(name="metric", options=metrics,
                                        value="output_throughput" if "output_throughput" in metrics else metrics[0])
        lps = sorted({str(v) for v in runs["load_point"]})
        want_lp = ctx.arg("load_point")
        self.lp = pn.widgets.Select(name="scenario", options=lps,
                                    value=want_lp if want_lp in lps else (lps[0] if lps else None))
        self.min_effect = pn.widgets.FloatSlider(name="minimum effect that matters", start=0.0, end=0.5, step=0.01,
                                                 value=0.05)
        self.body = pn.Column(sizing_mode="stretch_width")
        for w in (self.a, self.b, self.metric, self.lp, self.min_effect):
            w.param.watch(lambda e: self.update(), "value")
        self.update()

    def short_id(self, config_id: str) -> str:
        """The first 16 characters of ``config_id`` where they name it alone, else all of it."""
        head = config_id[:16]
        return head if sum(i.startswith(head) for i in self.ids) == 1 else config_id

    def update(self) -> None:
        a, b, metric, lp = self.a.value, self.b.value, self.metric.value, self.lp.value
        if not (a and b):
            self.body.objects = [pn.pane.HTML("<div class='st-note'>needs two configs</div>")]
            return
        if pn.state.location is not None:
            pn.state.location.update_query(a=self.short_id(a), b=self.short_id(b))
        try:
            c = self.ds.sweep.compare(a, b, metric=metric, load_point=lp, min_effect=self.min_effect.value,
                                      table=self.df)
        except AnalysisInputError as exc:
            self.body.objects = [pn.pane.HTML(f"<div class='st-warn st-verdict' data-verdict='none'>{esc(exc)}</div>")]
            return
        sub = self.df[(self.df["load_point"].astype(str) == c.load_point) & (self.df["status"] == "ok")
                      & self.df["config_id"].isin([c.config_a, c.config_b])]
        if c.hardware_class and "hardware_class" in sub:
            sub = sub[sub["hardware_class"].astype(str) == c.hardware_class]
        pts = pd.DataFrame({"config": sub["config_id"].map({c.config_a: "a", c.config_b: "b"}),
                            metric: sub[metric].astype(float)}).dropna()
        yd = hv.Dimension(metric, label=axis_label(metric))
        layers = [hv.BoxWhisker(pts, "config", yd), hv.Scatter(pts, "config", yd).opts(size=9, color="black", jitter=0.2)]
        if self.drift_mode == "apart":
            sus = self.all[self.marks.mask(self.all) & (self.all["load_point"].astype(str) == c.load_point)
                           & self.all["config_id"].isin([c.config_a, c.config_b])]
            if len(sus):
                layers.append(hv.Scatter(pd.DataFrame({"config": sus["config_id"].map({c.config_a: "a", c.config_b: "b"}),
                                                       metric: sus[metric].astype(float)}).dropna(), "config", yd,
                                         label="drift-suspect repeat (left out)").opts(
                    marker="x", size=10, color=SUSPECT_COLOUR, jitter=0.2))
        dist = hv.Overlay(layers).opts(hv.opts.Overlay(width=420, height=320, title=f"{metric}: per-repeat values"))
        ratio = c.ratio
        ratio_plot = (hv.ErrorBars([(0, ratio.estimate, ratio.estimate - ratio.low, ratio.high - ratio.estimate)],
                                   vdims=["ratio", "neg", "pos"]) if math.isfinite(ratio.low) else hv.ErrorBars([]))
        ratio_plot = (ratio_plot * hv.Scatter([(0, ratio.estimate)], vdims="ratio").opts(size=10)
                      * hv.HLine(1.0).opts(color="grey", line_dash="dashed")
                      * hv.HSpan(1 - c.min_effect, 1 + c.min_effect).opts(color="lightgrey", alpha=0.3)).opts(
            hv.opts.Overlay(width=280, height=320, title="ratio b / a (95% CI)", xaxis=None,
                            ylabel="ratio of medians b / a"))
        ci = f"[{ratio.low:.3g}, {ratio.high:.3g}]" if math.isfinite(ratio.low) else "(no interval)"
        text = (f"<div class='st-verdict' data-verdict='{esc(c.verdict)}' data-a='{esc(c.config_a)}' "
                f"data-b='{esc(c.config_b)}' data-n-a='{c.n_a}' data-n-b='{c.n_b}' data-lp='{esc(c.load_point)}'><b>verdict: {esc(c.verdict)}</b></div>"
                f"<div>a = {esc(c.label_a)} (median {c.median_a:.4g}, {c.n_a} repeats); b = {esc(c.label_b)} "
                f"(median {c.median_b:.4g}, {c.n_b} repeats)</div>"
                f"<div>ratio of medians b / a: <b>{ratio.estimate:.4g}</b> {ci}; {esc(c.rank_test)}</div>"
                f"<div>{claim_html(c.claim)}</div><p>{esc(c.sentence)}</p>{warnings_html(c.warnings)}")
        self.body.objects = [pn.pane.HTML(text, sizing_mode="stretch_width"),
                             pn.Row(pn.pane.HoloViews(dist), pn.pane.HoloViews(ratio_plot))]

    def __panel__(self) -> Any:
        return pn.Column(self.drift, self.a, self.b, self.picker_note, pn.Row(self.metric, self.lp, self.min_effect), self.body,
                         sizing_mode="stretch_width")


def view(ctx: Context) -> ComparePage:
    return ComparePage(ctx)
