"""Decision: what to deploy for the traffic the user expects, under the SLOs that must hold.

The user sets the traffic mix (one weight per load point, default equal; the URL's ``weights``
argument, ``burst=3,steady=1``, presets it), the SLO bounds (the spec's, editable, plus more in the
CLI's ``METRIC<=VALUE`` syntax), the rule (``weighted`` or ``regret``) and whether drift-suspect
trials count (left out by default, with a banner saying how many). The page calls
:func:`analysis.decision.recommend` with exactly the CLI's defaults (``n_boot`` 1000, seed 0), so
for the same inputs it names the same config as ``python -m coordinator recommend`` (which is
shown, ready to copy, for the inputs on the page) and ``ds.sweep.recommend``. What it shows is
rendered by :mod:`dashboards.decision_view` (shared with the static report).

Hardware classes each get their own recommendation; the cross-hardware mode (per GPU, or per
GPU-hour at the user's prices) is one labelled decision across classes, only when asked for.

The dashboard reads the results root read-only: it never writes the decision record. The page
says where the record is (``runs/<name>/decision.json``), which configs it names and whether they
are the page's, and gives the command that writes it for the page's inputs.
"""

from __future__ import annotations

import json
import logging
import math
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import panel as pn

from analysis.common import jsonable
from analysis.crosshw import NORMALISATIONS, parse_prices
from analysis.decide_cli import RECORD_FILE, parse_slo, parse_weights
from analysis.decide_cli import build_parser as recommend_parser
from analysis.decision import RULES, Prepared, prepare, recommend
from analysis.frame import AnalysisInputError
from analysis.sla_decision import read_sla_searches
from dashboards.app import Context, esc, on_result, state
from dashboards.app.settle import into, settle
from dashboards.app.versioned import RestartOnNewVersion
from dashboards.decision_view import decision_html, labels_of, named_configs, recommend_command

log = logging.getLogger(__name__)

#: the CLI's defaults (``python -m coordinator recommend``), so the page and the CLI agree
N_BOOT = int(recommend_parser().get_default("n_boot"))
SEED = int(recommend_parser().get_default("seed"))


def spec_slos(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    """The spec's SLOs as the dataset records them (attribute ``slos``, JSON); [] when none."""
    raw = attrs.get("slos", "") or ""
    try:
        data = json.loads(raw) if isinstance(raw, str) and raw else list(raw or [])
    except ValueError:
        return []
    return [dict(s) for s in data if isinstance(s, dict) and "metric" in s and "max_ms" in s]


def serve_commands(folder: Path, doc: dict[str, Any]) -> dict[str, str]:
    """config id -> ``vllm serve`` command of each class's winner (a cross-hardware entry
    ``<id>@<class>`` gets its config's command)."""
    ds, df = state.dataset(folder), state.table(folder)
    out: dict[str, str] = {}
    for c in [*(doc.get("classes") or []), *(doc.get("sla") or [])]:
        win = c.get("winner")
        if not win or str(win["config_id"]) in out:
            continue
        cid = str(win["config_id"])
        plain = cid.rsplit("@", 1)[0] if str(doc.get("mode", "")).startswith("cross-hardware") else cid
        try:
            out[cid] = state.serve_command(folder, ds, df, plain)
        except Exception as exc:  # a config the store and the dataset cannot rebuild: say so in place
            out[cid] = f"# cannot render the command: {exc}"
    return out


def prepared(folder: Path, version: int) -> Prepared:
    """The input-independent part of the decision (trial table, drift check, fingerprint) of this
    dataset version, made once across sessions: every later decision on it (another weight, SLO
    bound or rule) skips it."""
    return state._cached(("decision-prepared", str(folder), version),
                         lambda: prepare(state.dataset(folder), table=state.table(folder)))


def record_html(folder: Path, doc: dict[str, Any], command: str) -> str:
    """Where the decision record is, what it names, and whether that is what the page shows."""
    path = folder / RECORD_FILE
    page_winners = {str(c.get("hardware_class")): (c.get("winner") or {}).get("config_id") for c in doc.get("classes") or []}
    write = (f"<div class='st-note'>write the record for these inputs (the dashboard never writes into the results "
             f"root):</div><pre class='st-cmd st-decision-cli'>{esc(command)}</pre>")
    if not path.is_file():
        return (f"<div class='st-decision-record' data-state='absent'>No decision record yet: it would be "
                f"<code>{esc(path)}</code>.</div>{write}")
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
        rec_winners = {str(c.get("hardware_class")): (c.get("winner") or {}).get("config_id") for c in rec["classes"]}
        inputs = rec.get("inputs") or {}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return (f"<div class='st-warn st-decision-record' data-state='unreadable'>The decision record "
                f"<code>{esc(path)}</code> cannot be read: {esc(exc)}</div>{write}")
    same = rec_winners == page_winners
    names = ", ".join(f"{k or 'all'}: {v or 'none'}" for k, v in rec_winners.items())
    return (f"<div class='st-decision-record' data-state='{'same' if same else 'differs'}'>Decision record "
            f"<code>{esc(path)}</code> names {esc(names)} "
            + ("(the same configs as this page)" if same else
               f"(NOT what this page shows: it was made with other inputs or data: weights "
               f"{esc(inputs.get('weights') or 'equal')}, SLOs {esc(inputs.get('slos') or 'the spec')}, rule "
               f"{esc(inputs.get('rule'))})") + f"</div>{write}")


class DecisionPage(RestartOnNewVersion, pn.viewable.Viewer):
    """Inputs (weights, SLO bounds, rule, drift switch, cross-hardware mode) and the decision."""

    def __init__(self, ctx: Context, **params: Any) -> None:
        super().__init__(**params)
        assert ctx.folder is not None
        self.ctx, self.folder = ctx, ctx.folder
        ds, df = state.dataset(self.folder), state.table(self.folder)
        self.sla_error = ""
        try:  # an SLA search's probes are decided under their search's load point, not one by one
            self.sla = read_sla_searches(self.folder, df, str(ds.attrs.get("spec_hash", "")))
        except AnalysisInputError as exc:
            self.sla, self.sla_error = None, str(exc)
        probes = set().union(*(s.trial_ids for s in self.sla[0])) if self.sla else set()
        lps = df.loc[~df["trial_id"].astype(str).isin(probes), "load_point"] if "load_point" in df else []
        self.load_points = sorted((set(map(str, lps)) | {s.load_point for s in (self.sla or ([], []))[0]}) - {""})
        try:
            preset = parse_weights(ctx.arg("weights") or None) or {}
        except AnalysisInputError:
            preset = {}
        self.weights = [pn.widgets.FloatInput(name=f"weight of {lp}", value=float(preset.get(lp, 0.0 if preset else 1.0)),
                                              start=0.0, step=0.5, width=150, css_classes=["st-weight", f"st-weight-{i}"])
                        for i, lp in enumerate(self.load_points)]
        self.slos = spec_slos(dict(ds.attrs))
        self.bounds = [pn.widgets.FloatInput(name=f"{s['metric']} p{float(s.get('percentile', 99)):g} max (ms)",
                                             value=float(s["max_ms"]), start=0.0, width=190,
                                             css_classes=["st-slo", f"st-slo-{i}"]) for i, s in enumerate(self.slos)]
        self.more = pn.widgets.TextInput(name="more SLOs (METRIC<=VALUE, comma-separated)",
                                         placeholder="tpot_ms_p99<=50, e2el_ms_p90<=2000", width=320,
                                         css_classes=["st-slo-more"])
        want = ctx.arg("rule", "weighted")
        self.rule = pn.widgets.Select(name="rule", options=list(RULES), value=want if want in RULES else "weighted",
                                      width=150, css_classes=["st-rule"])
        self.include_drift = pn.widgets.Checkbox(name="include drift-suspect trials", value=False,
                                                 css_classes=["st-include-drift"])
        self.cross = pn.widgets.Select(name="cross-hardware mode", options=["off", *NORMALISATIONS], value="off",
                                       width=170, css_classes=["st-cross"])
        self.prices = pn.widgets.TextInput(name="USD per GPU-hour by class (per_gpu_hour)", placeholder="a100=2.5, h100=4",
                                           width=260)
        self.body = pn.Column(sizing_mode="stretch_width")
        for w in [*self.weights, *self.bounds, self.more, self.rule, self.include_drift, self.cross, self.prices]:
            w.param.watch(lambda e: self.start(), "value")
        self.version = state.version(self.folder)
        self.start()

    def inputs(self) -> dict[str, Any]:
        """What the page asks :func:`recommend` (raises AnalysisInputError naming a bad input)."""
        weights = {lp: float(w.value if w.value is not None else math.nan) for lp, w in zip(self.load_points, self.weights)}
        slos = [{**s, "max_ms": float(b.value if b.value is not None else math.nan)} for s, b in zip(self.slos, self.bounds)]
        for bad in [s for s in slos if not s["max_ms"] >= 0]:
            raise AnalysisInputError(f"the bound of SLO {bad['metric']} p{float(bad.get('percentile', 99)):g} must be "
                                     f"a number of ms >= 0, got {bad['max_ms']}")
        slos += [parse_slo(t.strip()) for t in (self.more.value or "").split(",") if t.strip()]
        cross = None if self.cross.value == "off" else str(self.cross.value)
        text = [t.strip() for t in (self.prices.value or "").replace(";", ",").split(",") if t.strip()]
        prices = parse_prices(text) if cross == "per_gpu_hour" else None
        return {"weights": weights, "slos": slos, "rule": str(self.rule.value),
                "include_drift": bool(self.include_drift.value), "cross_hardware": cross, "prices": prices}

    def start(self) -> None:
        """Decide (or fetch the cached decision for these inputs) in the background."""
        try:
            if self.sla_error:
                raise AnalysisInputError(self.sla_error)
            inputs = self.inputs()
        except AnalysisInputError as exc:
            self.body.objects = [pn.pane.HTML(f"<div class='st-warn st-decision-refused'>{esc(exc)}</div>")]
            return
        if pn.state.location is not None:
            pn.state.location.update_query(weights=",".join(f"{lp}={w:g}" for lp, w in inputs["weights"].items()))
        self.body.objects = [pn.pane.HTML("<div class='st-progress-text'>deciding...</div>"),
                             pn.indicators.LoadingSpinner(value=True, size=30)]
        folder, v, sla = self.folder, state.version(self.folder), self.sla
        key = ("decision", str(folder), v, json.dumps(inputs, sort_keys=True))

        def compute() -> dict[str, Any]:
            d = recommend(state.dataset(folder), n_boot=N_BOOT, seed=SEED, prepared=prepared(folder, v), sla=sla,
                          **inputs)
            return jsonable(d)  # type: ignore[no-any-return]

        fut = state.background(key, compute)
        on_result(fut, lambda f: self._done(f, inputs))

    def _done(self, fut: Future[dict[str, Any]], inputs: dict[str, Any]) -> None:
        try:
            if inputs != self.inputs():
                return  # the user changed an input meanwhile: that decision is on its way
        except AnalysisInputError:
            return
        settle(fut, lambda doc: self._show(doc, inputs), into(self.body), "decision", "st-decision-refused")

    def _show(self, doc: dict[str, Any], inputs: dict[str, Any]) -> None:
        self.doc = doc
        command = recommend_command(self.cli_target(), inputs["weights"], inputs["slos"],
                                    inputs["rule"], inputs["include_drift"], inputs["cross_hardware"], inputs["prices"])
        labels = labels_of(state.table(self.folder), named_configs(doc))
        self.body.objects = [pn.pane.HTML(
            f"<div class='st-decision' data-mode='{esc(doc.get('mode'))}'>"
            f"{decision_html(doc, serve_commands(self.folder, doc), labels)}"
            f"<h4 style='font-size: 1.05em'>Decision record</h4>{record_html(self.folder, doc, command)}</div>", sizing_mode="stretch_width")]

    def cli_target(self) -> str:
        """What to name the experiment on the CLI: its name (``recommend`` resolves a name under the
        results root to a folder with ``experiment.sqlite`` or only a ``results.nc``, as listed here)."""
        return self.ctx.experiment or self.folder.name

    def __panel__(self) -> Any:
        return pn.Column(
            pn.pane.HTML("<div class='st-note'>Which single engine config to deploy for the traffic you expect: set "
                         "the share of traffic each load point stands for and the SLOs that must hold.</div>"),
            pn.Row(*self.weights), pn.Row(*self.bounds, self.more),
            pn.Row(self.rule, self.include_drift, self.cross, self.prices), self.body, sizing_mode="stretch_width")


def view(ctx: Context) -> DecisionPage:
    return DecisionPage(ctx)
