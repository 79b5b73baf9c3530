"""Parameters: importance with intervals, partial dependence, interactions and failure probability.

Each section shows its chart with the result's causal/associational label (``claim``) and its
minimum-data warnings next to it. The analyses (``analysis.importance``, ``analysis.effects``,
``analysis.interactions``, ``analysis.failure``; they share one fitted surrogate) run in the
background pool with a progress text in their place, and are cached per dataset version, metric and
scenario, so every session and every return to the page reuses them.

Hardware classes never share a fit: with trials of several classes a ``hardware class`` picker
chooses the one analysed (default the first; ``?hardware_class=`` in the URL), and the failure
section shows one group per class. ``leave out failover trials`` drops trials tagged
``failover-from:...`` (default: included, and the sections' caveats say how many there are).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import holoviews as hv
import pandas as pd
import panel as pn

from analysis.effects import PDResult, partial_dependence
from analysis.failure import FailureResult, failure_probability
from analysis.frame import AnalysisInputError
from analysis.hardware import classes_of
from analysis.importance import ImportanceResult, importance
from analysis.interactions import InteractionResult, interactions
from analysis.report import default_metric
from dashboards.app import Context, claim_html, esc, experiment_page, on_result, state, warnings_html
from dashboards.app.marks import drift_bar, drift_marks

log = logging.getLogger(__name__)

IMPORTANCE_BOOT = 50
PD_BOOT = 30
H2_BOOT = 10


def _iv(iv: Any) -> str:
    if not math.isfinite(iv.estimate):
        return "-"
    return f"{iv.estimate:.3g} [{iv.low:.3g}, {iv.high:.3g}]" if math.isfinite(iv.low) else f"{iv.estimate:.3g}"


def importance_view(r: ImportanceResult, pointer: str = "") -> Any:
    rows = [*r.parameters, r.probe]
    df = pd.DataFrame({"parameter": [p.name for p in rows], "importance": [p.permutation.estimate for p in rows],
                       "low": [p.permutation.low for p in rows], "high": [p.permutation.high for p in rows]})
    bars = hv.Bars(df, "parameter", "importance").opts(color="steelblue", invert_axes=True)
    errs = hv.ErrorBars([(p, e, e - lo, hi - e) for p, e, lo, hi in df.itertuples(index=False)
                         if math.isfinite(lo)], vdims=["importance", "neg", "pos"]).opts(invert_axes=True)
    plot = (bars * errs).opts(hv.opts.Overlay(width=max(560, 380 + 7 * max(len(str(n)) for n in df["parameter"])),
                                              height=60 + 28 * len(df),
                                              title=f"permutation importance of {r.metric}",
                                              ylabel="drop in held-out R² when shuffled"))
    table = "".join(f"<tr><td>{p.rank}</td><td>{esc(p.name)}</td><td>{_iv(p.permutation)}</td><td>{_iv(p.shap)}</td>"
                    f"<td class='st-verdict-{'yes' if p.verdict == 'important' else 'no'}'>{esc(p.verdict)}</td></tr>"
                    for p in r.parameters)
    info = (f"<div class='st-section-done' data-section='importance'>{claim_html(r.claim, r.warnings)}</div>{pointer}"
            f"<div class='st-note'>{r.n_trials} trials, {r.n_boot} bootstrap refits (resampling {r.resampled}); "
            f"out-of-bag R² {r.oob_r2:.2f}; {esc(r.method)}</div>{warnings_html(r.warnings)}"
            f"<table class='st-table'><tr><th>#</th><th>parameter</th><th>permutation</th><th>mean |SHAP|</th>"
            f"<th>verdict vs noise probe</th></tr>{table}</table>")
    return pn.Row(pn.pane.HoloViews(plot), pn.pane.HTML(info, sizing_mode="stretch_width"), sizing_mode="stretch_width")


#: the partial-dependence y axis spans at least this share of the curve's mean either side, so that
#: a wiggle of a few per cent (noise) is drawn as the small thing it is rather than filling the plot
MIN_Y_SPAN = 0.10
#: an interaction whose H² interval starts at or above this is "strong": the main effect of either
#: parameter depends on the other's level, and the main-effect sections say so
STRONG_H2 = 0.1


def is_power_of_two_knob(levels: list[Any]) -> bool:
    """Whether a numeric knob's levels are powers of two spanning at least 4x (``max_num_seqs``
    4..256): drawn on a log axis, where each doubling is one step."""
    vals = [v for v in levels if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(vals) < 3 or len(vals) != len(levels) or min(vals) <= 0:
        return False
    return all(float(v).is_integer() and (int(v) & (int(v) - 1)) == 0 for v in vals) and max(vals) >= 4 * min(vals)


def y_range(estimate: list[float], low: list[float], high: list[float]) -> tuple[float, float]:
    """The y axis of a partial dependence: the curve and its band, widened to at least
    :data:`MIN_Y_SPAN` of the mean either side of the mean."""
    vals = [v for v in [*estimate, *low, *high] if isinstance(v, (int, float)) and math.isfinite(v)]
    if not vals:
        return (0.0, 1.0)
    lo, hi = min(vals), max(vals)
    finite = [v for v in estimate if math.isfinite(v)]
    centre = sum(finite) / len(finite) if finite else (lo + hi) / 2
    half = max(abs(centre) * MIN_Y_SPAN, (hi - lo) / 2 * 1.1, 1e-9)
    mid = (lo + hi) / 2
    return (min(lo, mid - half), max(hi, mid + half))


def strong_partners(r: InteractionResult | None, param: str) -> list[Any]:
    """The pairs of ``r`` with ``param`` whose H² interval starts at or above :data:`STRONG_H2`."""
    if r is None:
        return []
    return [p for p in r.pairs if param in p.params and math.isfinite(p.h2.low) and p.h2.low >= STRONG_H2]


def interaction_pointer(r: InteractionResult | None, params: list[str]) -> str:
    """A note per parameter of ``params`` that interacts strongly (see :func:`strong_partners`):
    its main effect is an average over the partner's levels, shown in Interactions below."""
    out = []
    for name in params:
        for p in strong_partners(r, name):
            other = p.params[1] if p.params[0] == name else p.params[0]
            out.append(f"<div class='st-warn st-interaction-pointer' data-param='{esc(name)}' data-partner='{esc(other)}'>"
                       f"<b>{esc(name)}</b> interacts strongly with <b>{esc(other)}</b> (H² {_iv(p.h2)}): its main "
                       f"effect here is an average over {esc(other)}'s levels and can differ at each of them; "
                       "see Interactions below.</div>")
    return "".join(out)


def pd_view(r: PDResult, log_x: bool = False, pointer: str = "") -> Any:
    grid = r.grid[0]
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in grid)
    xs = grid if numeric else [str(v) for v in grid]
    df = pd.DataFrame({r.params[0]: xs, "estimate": r.estimate, "low": r.low, "high": r.high})
    if numeric:
        plot = hv.Overlay([hv.Curve((xs, ice), r.params[0], "estimate").opts(color="lightgrey", line_width=0.5)
                           for ice in r.ice[:50]])
        plot = plot * hv.Area(df, r.params[0], ["low", "high"]).opts(alpha=0.3, color="steelblue")
        plot = plot * hv.Curve(df, r.params[0], "estimate").opts(color="steelblue", line_width=2)
    else:
        plot = hv.Scatter(df, r.params[0], "estimate").opts(size=9) * hv.ErrorBars(
            [(x, e, e - lo, hi - e) for x, e, lo, hi in zip(xs, r.estimate, r.low, r.high) if math.isfinite(lo)],
            vdims=["estimate", "neg", "pos"])
    log_x = log_x and numeric
    plot = plot.opts(hv.opts.Overlay(width=560, height=300, title=f"partial dependence of {r.metric}",
                                     show_legend=False, logx=log_x, ylim=y_range(r.estimate, r.low, r.high),
                                     xlabel=f"{r.params[0]}{' (log scale)' if log_x else ''}",
                                     ylabel=f"{r.metric} ({r.scale})"))
    info = (f"<div class='st-section-done st-pd-axes' data-section='pd' data-logx='{str(log_x).lower()}'>"
            f"{claim_html(r.claim, r.warnings)}</div>{pointer}"
            f"<p>{esc(r.sentence or '')}</p><div class='st-note'>{_pd_source(r)}; ICE curves in grey; "
            f"only the sampled range is shown; the y axis spans at least +-{MIN_Y_SPAN:.0%} of the curve's mean, "
            f"so noise is not stretched into a pattern{'; x on a log scale (powers of two)' if log_x else ''}</div>"
            f"{warnings_html(r.warnings)}")
    return pn.Row(pn.pane.HoloViews(plot), pn.pane.HTML(info, sizing_mode="stretch_width"), sizing_mode="stretch_width")


def _pd_source(r: PDResult) -> str:
    """Where the curve's intervals come from, as ``r.bands`` says."""
    if r.bands == "regression":
        return "95% intervals from the main-effects regression (errors clustered by config)"
    return f"95% bands from {r.n_boot} bootstrap refits of the forest"


def _h2_source(r: InteractionResult) -> str:
    """Where the pairs' H² and strength intervals come from (each pair's ``source``)."""
    n_reg = sum(p.source == "regression" for p in r.pairs)
    if n_reg == len(r.pairs):
        return "H² and strength from a regression with each pair's product terms"
    if n_reg == 0:
        return f"H² from {r.n_boot} refits of the forest"
    return f"H²: {n_reg} pair(s) from a regression with product terms, the rest from {r.n_boot} forest refits"


def interactions_view(r: InteractionResult) -> Any:
    rows = "".join(f"<tr><td>{esc(' x '.join(p.params))}</td><td>{_iv(p.h2)}</td><td>{_iv(p.strength)}</td>"
                   f"<td>{p.shap_interaction:.3g}</td><td>{esc(', '.join(w.code for w in p.warnings))}</td></tr>"
                   for p in r.pairs[:15])
    parts: list[Any] = []
    if r.pairs:
        top = r.pairs[0]
        cells = pd.DataFrame([(c.a, c.b, c.median, c.count) for c in top.cells],
                             columns=[top.params[0], top.params[1], "median", "trials"])
        parts.append(pn.pane.HoloViews(hv.HeatMap(cells, [top.params[0], top.params[1]], ["median", "trials"]).opts(
            width=560, height=300, tools=["hover"], colorbar=True, cmap="viridis",
            title=f"observed median {r.metric}", clabel=r.metric)))
    info = (f"<div class='st-section-done' data-section='interactions'>{claim_html(r.claim, r.warnings)}</div>"
            f"<div class='st-note'>{r.n_pairs_computed} of {r.n_pairs_total} pairs; {_h2_source(r)}; "
            f"{esc(r.method)}</div>{warnings_html(r.warnings)}"
            f"<table class='st-table'><tr><th>pair</th><th>H²</th><th>strength</th><th>SHAP interaction</th>"
            f"<th>caveats</th></tr>{rows}</table>")
    return pn.Row(*parts, pn.pane.HTML(info, sizing_mode="stretch_width"), sizing_mode="stretch_width")


def failure_view(r: FailureResult) -> Any:
    parts: list[Any] = [pn.pane.HTML(
        f"<div class='st-section-done' data-section='failure'>{claim_html(r.claim)}</div>"
        f"<div class='st-note'>{r.n_trials} trials ran ({r.n_holes} holes and {r.n_baseline} baseline runs left out); "
        f"failure kinds modelled: {esc(', '.join(r.kinds))}; by kind: "
        f"{esc('; '.join(f'{k.kind} {k.failures}/{k.of}' for k in r.by_kind))}</div>{warnings_html(r.warnings)}",
        sizing_mode="stretch_width")]
    for g in r.groups:
        # the 20 highest observed rates, highest on top (the inverted axis draws the first category lowest)
        regions = sorted(g.regions, key=lambda x: -x.rate.estimate if math.isfinite(x.rate.estimate) else 0)[:20][::-1]
        if regions:
            df = pd.DataFrame({"region": [x.label for x in regions], "rate": [x.rate.estimate for x in regions],
                               "low": [x.rate.low for x in regions], "high": [x.rate.high for x in regions]})
            plot = (hv.Scatter(df, "region", "rate").opts(size=8, color="crimson", invert_axes=True)
                    * hv.ErrorBars([(a, e, e - lo, hi - e) for a, e, lo, hi in df.itertuples(index=False)],
                                   vdims=["rate", "neg", "pos"]).opts(invert_axes=True)).opts(
                # wide enough for the region labels and a whole title (the class is in the note below)
                hv.opts.Overlay(width=max(560, 330 + 7 * max(len(str(x.label)) for x in regions)),
                                height=80 + 24 * len(df), title="failure rate by region (Wilson 95%)",
                                ylabel="failure rate"))
            parts.append(pn.pane.HoloViews(plot))
        parts.append(pn.pane.HTML(f"<div class='st-note'>{esc(g.hardware_class)} / {esc(g.load_point)}: "
                                  f"{g.failures} of {g.n} failed ({_iv(g.rate)}); model: {esc(g.model)}</div>"))
    return pn.Column(*parts, sizing_mode="stretch_width")


class ParametersPage(pn.viewable.Viewer):
    """Metric and scenario pickers; four sections computed in the background."""

    def __init__(self, ctx: Context, **params: Any) -> None:
        super().__init__(**params)
        self.folder, self.ds, self.df, self.metric = experiment_page(ctx, default_metric)
        self.marks = drift_marks(self.folder)
        suspect = self.marks.mask(self.df)
        if suspect.any():  # every fit below reads the dataset: give it the clean trials only
            self.ds = self.ds.isel(trial=~suspect)
        fits = "they are left out of every fit below"
        self.drift = drift_bar(ctx, self.marks, {
            "exclude": f"{fits}.",
            "apart": f"{fits} (a fitted surface cannot show them apart; the Pareto and Compare pages draw them)."})
        lps = sorted({str(v) for v in self.df["load_point"]})
        ok = self.df[(self.df["status"] == "ok")]
        main_lp = str(ok["load_point"].astype(str).value_counts().idxmax()) if len(ok) else (lps[0] if lps else "")
        self.lp = pn.widgets.Select(name="scenario", options=lps, value=ctx.arg("load_point", main_lp)
                                    if ctx.arg("load_point", main_lp) in lps else main_lp)
        names = [p.name for p in state.swept(self.folder)]
        self.log_params = {p.name for p in state.swept(self.folder)
                           if p.kind == "numeric" and is_power_of_two_knob(list(p.levels))}
        #: the finished results of the current question, by section (the main-effect sections point
        #: to a strong interaction once the interactions are in)
        self.results: dict[str, Any] = {}
        want_pd = ctx.arg("pd")
        self.pd_param = pn.widgets.Select(name="partial dependence of", options=names,
                                          value=want_pd if want_pd in names else (names[0] if names else None))
        classes = classes_of(self.df)
        wanted = ctx.arg("hardware_class", classes[0] if classes else "")
        self.hw = pn.widgets.Select(name="hardware class", options=classes,
                                    value=wanted if wanted in classes else (classes[0] if classes else None),
                                    visible=len(classes) > 1)
        self.no_failover = pn.widgets.Checkbox(name="leave out failover trials", value=False)
        self.sections = {k: pn.Column(sizing_mode="stretch_width") for k in ("importance", "pd", "interactions",
                                                                             "failure")}
        self.metric.param.watch(lambda e: self.start(), "value")
        self.lp.param.watch(lambda e: self.start(), "value")
        self.hw.param.watch(lambda e: self.start(), "value")
        self.no_failover.param.watch(lambda e: self.start(), "value")
        self.pd_param.param.watch(lambda e: self._start_one("pd"), "value")
        self.start()

    def _jobs(self) -> dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]]:
        ds, m, lp, p = self.ds, self.metric.value, self.lp.value, self.pd_param.value
        kw = self.selection()
        fo = {"include_failover": kw["include_failover"]}
        return {
            "importance": (lambda: importance(ds, metric=m, load_point=lp, n_boot=IMPORTANCE_BOOT, **kw),
                           importance_view),
            "pd": (lambda: partial_dependence(ds, p, metric=m, load_point=lp, n_boot=PD_BOOT, **kw), pd_view),
            "interactions": (lambda: interactions(ds, metric=m, load_point=lp, n_boot=H2_BOOT, **kw),
                             interactions_view),
            "failure": (lambda: failure_probability(ds, **fo), failure_view),
        }

    def selection(self) -> dict[str, Any]:
        """The hardware class (only when the trials ran on several) and failover choice of the fits."""
        several = len(self.hw.options) > 1
        return {"hardware_class": self.hw.value if several else None, "include_failover": not self.no_failover.value}

    def start(self) -> None:
        self.results = {}
        for name in ("failure", "pd", "interactions", "importance"):  # quickest first
            self._start_one(name)

    def _view(self, name: str, res: Any, render: Callable[[Any], Any]) -> Any:
        inter = self.results.get("interactions")
        if name == "importance":
            important = [p.name for p in res.parameters if p.verdict == "important"]
            return importance_view(res, interaction_pointer(inter, important))
        if name == "pd":
            return pd_view(res, log_x=res.params[0] in self.log_params,
                           pointer=interaction_pointer(inter, [res.params[0]]))
        return render(res)

    def _start_one(self, name: str) -> None:
        self.results.pop(name, None)
        fn, render = self._jobs()[name]
        key = ("params-clean", str(self.folder), state.version(self.folder), name, self.metric.value, self.lp.value,
               self.pd_param.value if name == "pd" else None, tuple(self.selection().values()))
        since = time.strftime("%H:%M:%S")
        self.sections[name].objects = [pn.Row(pn.indicators.LoadingSpinner(value=True, size=24), pn.pane.HTML(
            f"<div class='st-progress-text' data-section='{name}'>computing {name} in the background "
            f"(started {since}; cached per dataset version once done)...</div>"))]
        fut = state.background(key, fn)
        on_result(fut, lambda f: self._done(name, key, f, render))

    def _done(self, name: str, key: tuple[Any, ...], fut: Future[Any], render: Callable[[Any], Any]) -> None:
        if key[4:6] != (self.metric.value, self.lp.value) or key[-1] != tuple(self.selection().values()):
            return  # the user changed the question meanwhile
        try:
            res = fut.result()
            self.results[name] = res
            self.sections[name].objects = [self._view(name, res, render)]
            if name == "interactions":  # point the finished main-effect sections to a strong interaction
                for other in ("importance", "pd"):
                    if other in self.results:
                        self.sections[other].objects = [self._view(other, self.results[other], render)]
        except AnalysisInputError as exc:
            self.sections[name].objects = [pn.pane.HTML(
                f"<div class='st-warn st-section-done' data-section='{name}'>not computed: {esc(exc)}</div>")]
        except Exception as exc:
            log.exception("section %s failed", name)
            self.sections[name].objects = [pn.pane.HTML(
                f"<div class='st-error st-section-done' data-section='{name}'>{name} failed: {esc(exc)}</div>")]

    def __panel__(self) -> Any:
        return pn.Column(
            self.drift, pn.Row(self.metric, self.lp, self.hw, self.no_failover),
            pn.pane.HTML("<h3>Importance</h3>"), self.sections["importance"],
            pn.pane.HTML("<h3>Partial dependence</h3>"), self.pd_param, self.sections["pd"],
            pn.pane.HTML("<h3>Interactions</h3>"), self.sections["interactions"],
            pn.pane.HTML("<h3>Failure probability</h3>"), self.sections["failure"],
            sizing_mode="stretch_width")


def view(ctx: Context) -> ParametersPage:
    return ParametersPage(ctx)
