"""Trial inspector: one trial's manifest, metrics, per-request distributions, server-metric time
series and logs.

The trial comes from the URL (``?page=inspector&trial=<id or prefix>``), the trial picker, or the
Pareto explorer's table. Per-request samples come from :func:`analysis.trial_samples`; the
server-metric series (``outcome.server_series``), the manifest and the logs from the trial's
latest finished attempt in the store (:func:`dashboards.app.state.trial_files`): the server and
client logs from the experiment's artifact store when a daemon uploaded them, else the vLLM server
log under the experiment's ``daemon/logs/`` and the client side (the daemon's log lines: load
generator, server lifecycle) of the attempt's time window from the experiment's ``logs/``.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

import holoviews as hv
import pandas as pd
import panel as pn

import analysis
from dashboards.app import Context, esc, state
from servetune.metrics import per_request_latencies

log = logging.getLogger(__name__)

MAX_PICKER_OPTIONS = 500
"""Trials listed in the picker at most (ok ones with the highest throughput first); others by URL."""

_SHOWN_METRICS = ("status", "failure_kind", "error", "load_point", "hardware_class", "repeat", "attempt",
                  "output_throughput", "request_throughput", "request_goodput", "slo_attainment", "ttft_ms_p50",
                  "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99", "e2el_ms_p99", "n_requests", "n_completed", "n_errors",
                  "n_cancelled", "duration_s", "server_startup_s", "kv_cache_tokens", "server_max_running",
                  "server_max_kv_cache_usage", "stopped_early", "retry_warning")


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "-" if math.isnan(v) else f"{v:.4g}"
    return str(v)


class InspectorPage(pn.viewable.Viewer):
    """Everything recorded about one trial."""

    def __init__(self, ctx: Context, **params: Any) -> None:
        super().__init__(**params)
        assert ctx.folder is not None
        self.ctx, self.folder = ctx, ctx.folder
        self.df = state.table(self.folder)
        listed = self.df
        if len(self.df) > MAX_PICKER_OPTIONS:  # a browser cannot take a picker of 100,000 trials
            order = self.df.assign(_ok=(self.df["status"] == "ok"),
                                   _tput=self.df.get("output_throughput", pd.Series(0.0, index=self.df.index)))
            listed = order.sort_values(["_ok", "_tput"], ascending=False).head(MAX_PICKER_OPTIONS)
        options = {f"{r.config_label} @ {r.load_point} [{r.status}] {str(r.trial_id)[:10]}": str(r.trial_id)
                   for r in listed.itertuples()}
        wanted = ctx.arg("trial")
        match = [t for t in self.df["trial_id"].astype(str) if wanted and t.startswith(wanted)]
        if match and match[0] not in options.values():
            options[match[0]] = match[0]
        self.picker_note = pn.pane.HTML(
            f"<div class='st-note st-picker-note' data-listed='{len(options)}' data-trials='{len(self.df)}'>The "
            f"picker lists {len(options)} of the {len(self.df)} trials (ok ones first, highest output throughput first); open "
            "any other from the Pareto explorer's trial table or by its id in the URL "
            "(<code>?page=inspector&amp;trial=ID</code>, a prefix is enough).</div>"
            if len(options) < len(self.df) else "", sizing_mode="stretch_width")
        self.picker = pn.widgets.Select(name="Trial", options=options, css_classes=["st-trial-picker"],
                                        value=match[0] if match else (next(iter(options.values())) if options else None),
                                        sizing_mode="stretch_width")
        self.body = pn.Column(sizing_mode="stretch_width")
        self.picker.param.watch(lambda e: self._show(), "value")
        self._show()

    def _show(self) -> None:
        tid = self.picker.value
        if not tid:
            self.body.objects = [pn.pane.HTML("<div class='st-note'>no trial to show</div>")]
            return
        if pn.state.location is not None:
            pn.state.location.update_query(trial=tid)
        row = self.df[self.df["trial_id"].astype(str) == tid].iloc[0]
        files = state.trial_files(self.folder, tid)
        metrics = "".join(f"<tr><td>{k}</td><td>{esc(_fmt(row[k]))}</td></tr>" for k in _SHOWN_METRICS if k in row)
        params = "".join(f"<tr><td>{esc(str(k).removeprefix('param_'))}</td><td>{esc(_fmt(row[k]))}</td></tr>"
                         for k in row.index if str(k).startswith("param_"))
        head = pn.pane.HTML(
            f"<div class='st-trial' data-trial='{esc(tid)}'><b>trial</b> <code>{esc(tid)}</code><br>"
            f"<b>config</b> {esc(row.get('config_label', row['config_id']))}</div>"
            f"<table class='st-table st-metrics'>{metrics}</table><h4>Engine parameters</h4>"
            f"<table class='st-table'>{params}</table>", sizing_mode="stretch_width")
        manifest = pn.pane.JSON(files.manifest or {"note": "no manifest (no store)"}, depth=2, name="Manifest",
                                sizing_mode="stretch_width")
        logs = pn.Column(
            pn.pane.HTML(f"<h4>Server log</h4><div class='st-note'>{esc(files.server_log_path)}</div>"
                         f"<pre class='st-log st-server-log'>{esc(files.server_log)}</pre>", sizing_mode="stretch_width"),
            pn.pane.HTML(f"<h4>Client log (daemon: load generator, server lifecycle)</h4>"
                         f"<div class='st-note'>{esc(files.client_log_path)}</div>"
                         f"<pre class='st-log st-client-log'>{esc(files.client_log)}</pre>", sizing_mode="stretch_width"),
            sizing_mode="stretch_width")
        self.body.objects = [
            pn.Row(head, manifest, sizing_mode="stretch_width"),
            self._distributions(tid, files),
            self._series(files),
            logs,
        ]

    def _distributions(self, tid: str, files: state.TrialFiles) -> Any:
        if files.record is None:
            return pn.pane.HTML("<div class='st-note'>no per-request samples: " + esc(files.server_log) + "</div>")
        try:
            samples = analysis.trial_samples(self.folder, tid)
        except Exception as exc:
            return pn.pane.HTML(f"<div class='st-note'>no per-request samples: {esc(exc)}</div>")
        rows = [per_request_latencies(s) for s in samples if s.error is None]
        data = pd.DataFrame(rows)
        plots = []
        for col in ("ttft_ms", "tpot_ms", "e2el_ms"):
            if col in data and data[col].notna().any():
                plots.append(hv.Histogram(_hist(data[col].dropna()), kdims=[col], vdims=["requests"]).opts(
                    width=320, height=220, title=f"{col} ({data[col].notna().sum()} requests)"))
        n_err = sum(1 for s in samples if s.error is not None)
        note = f"<div class='st-note'>{len(samples)} measured requests, {n_err} with an error</div>"
        if not plots:
            return pn.pane.HTML(note + "<div class='st-note'>no successful request to plot</div>")
        return pn.Column(pn.pane.HTML("<h4>Per-request distributions</h4>" + note), pn.Row(*[pn.pane.HoloViews(p) for p in plots]))

    def _series(self, files: state.TrialFiles) -> Any:
        series = ((files.record or {}).get("outcome") or {}).get("server_series") or []
        if not series:
            return pn.pane.HTML("<div class='st-note'>no server-metric time series recorded for this attempt</div>")
        df = pd.DataFrame(series)
        if "t_ns" in df:  # monotonic ns on the daemon's clock
            df["t_s"] = (df["t_ns"] - df["t_ns"].min()) / 1e9
            df = df.drop(columns=["t_ns"])
        else:
            df["t_s"] = range(len(df))
        tcol = "t_s"
        plots = [hv.Curve(df, tcol, c).opts(width=320, height=200, title=c) for c in df.columns
                 if c != tcol and pd.api.types.is_numeric_dtype(df[c])]
        return pn.Column(pn.pane.HTML(f"<h4>Server metrics over the load point ({len(df)} samples)</h4>"),
                         pn.GridBox(*[pn.pane.HoloViews(p) for p in plots], ncols=3))

    def __panel__(self) -> Any:
        return pn.Column(self.picker, self.picker_note, self.body, sizing_mode="stretch_width")


def _hist(values: pd.Series, bins: int = 30) -> tuple[Any, Any]:
    import numpy as np

    counts, edges = np.histogram(values.to_numpy(dtype=float), bins=min(bins, max(1, len(values))))
    return edges, counts


def view(ctx: Context) -> InspectorPage:
    return InspectorPage(ctx)


def manifest_text(manifest: dict[str, Any] | None) -> str:
    return json.dumps(manifest or {}, indent=2, sort_keys=True)
