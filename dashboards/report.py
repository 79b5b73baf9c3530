"""The static report: one self-contained HTML file that opens offline.

``python -m coordinator report EXPERIMENT --out report.html`` runs ``python -m dashboards report``
(this module's :func:`main`). Its first section is the decision: what ``python -m coordinator
recommend EXPERIMENT`` decides with its defaults (:func:`analysis.decision.recommend`: one config per
hardware class, the rule, the runner-up and margin, what would change the answer, the evidence;
rendered by :mod:`dashboards.decision_view`, as on the dashboard's Decision page). It then holds
the Pareto front (a Bokeh plot through HoloViews), the
ranking under the spec's policy (winner, runner-up, whether they are distinguishable, and the
winner's ``vllm serve`` command from :mod:`servetune.export`), parameter importance with intervals
and verdicts, partial dependence (curves with their bands), interactions (H² and strength with
intervals), drift of the baseline re-runs (alarm, suspect trials, XmR charts; the ranking says how
many drift-suspect trials it includes and marks their configs' rows), the failure map
(regions with Wilson intervals), the load curves (:func:`curves_items`: the Load curves page's
series, knees and SLO lines for its default configs, drift-suspect trials left out), every warning and the
causal/associational wording of the claims, and the provenance (experiment, spec hash, vLLM,
hardware, model, design, creation time, and whether the data is SYNTHETIC). It is computed by
:func:`analysis.report.analyze`, exactly what ``analyze --json`` prints. With trials of several
hardware classes every section is shown once per class (classes never share a ranking, a front or
a fit); ``--cross-hardware per_gpu|per_gpu_hour`` (the latter with ``--gpu-hour-price CLASS=USD``)
adds the labelled cross-hardware comparison on a normalised metric, and ``--exclude-failover``
leaves out failover trials (default: included, marked in the tables and the warnings).

Panel's ``save(resources=INLINE)`` inlines the JavaScript but its documents still point at CSS on
``cdn.holoviz.org`` (``ImportedStyleSheet`` models in the embedded Bokeh document) and at favicons.
:func:`make_offline` turns every such style sheet into an ``InlineStyleSheet`` carrying the file's
text from the installed ``panel`` package (with the images it references inlined as ``data:``
URIs), drops the favicon links, and refuses to return a page that still references a network URL
it knows how to find (:func:`external_references`). The browser test opens the result with the
network blocked and counts requests.

The file is written atomically (a temporary file in the same folder, then a rename); a bad
experiment exits 2 naming it and writes nothing.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import logging
import math
import mimetypes
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from analysis.__main__ import add_hardware_arguments, hardware_options
from analysis.common import jsonable
from analysis.frame import AnalysisInputError, trial_table
from analysis.hardware import per_class
from analysis.load import load_many
from analysis.pareto import param_values
from analysis.report import Progress, stderr_progress
from servetune.errors import ServetuneError
from servetune.export import engine_config_from_params, model_argument, serve_command
from servetune.simulated import export_provenance

log = logging.getLogger(__name__)

#: Non-front configs drawn per Pareto plot at most (a deterministic sample; the front is always drawn).
MAX_PLOT_POINTS = 5000
#: Rows of each ranking table.
TOP_ROWS = 10
_PANEL_CDN = re.compile(r"https?://cdn\.holoviz\.org/panel/[^/]+/dist/([^?#\"']+)(?:\?[^#\"']*)?")
_JSON_SCRIPT = re.compile(r'(<script type="application/json" id="[^"]+">)(.*?)(</script>)', re.S)
_ICON_LINK = re.compile(r'<link rel="[^"]*icon[^"]*"[^>]*>')
_CSS_URL = re.compile(r"url\(\s*(['\"]?)([^'\")]+)\1\s*\)")
_CSS_IMPORT = re.compile(r"@import\s+url\(\s*(['\"]?)([^'\")]+)\1\s*\)\s*;?")
_NETWORK_URL = re.compile(r"^(https?:)?//", re.I)


class OfflineError(ServetuneError):
    """The saved page still references a network resource that could not be inlined."""


# --- making a saved Panel page offline -----------------------------------------------------------------


def panel_dist() -> Path:
    """The ``dist`` folder of the installed ``panel`` package (what its CDN serves)."""
    import panel

    return Path(panel.__file__).parent / "dist"


def _data_uri(path: Path) -> str:
    mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def inline_css(path: Path, seen: frozenset[Path] = frozenset()) -> str:
    """The CSS file at ``path`` with its ``@import``s expanded and relative ``url()``s as data URIs.

    Raises :class:`OfflineError` for a network URL inside it or a missing referenced file."""
    text = path.read_text(encoding="utf-8")
    here = path.parent

    def _import(m: re.Match[str]) -> str:
        target = (here / m.group(2)).resolve()
        if _NETWORK_URL.match(m.group(2)) or not target.is_file():
            raise OfflineError(f"{path} imports {m.group(2)!r}, which is not a local file")
        return "" if target in seen else inline_css(target, seen | {path.resolve()})

    def _url(m: re.Match[str]) -> str:
        ref = m.group(2).strip()
        if ref.startswith(("data:", "#")):
            return m.group(0)
        if _NETWORK_URL.match(ref):
            raise OfflineError(f"{path} references the network URL {ref!r}")
        target = (here / ref.split("?")[0].split("#")[0]).resolve()
        if not target.is_file():
            raise OfflineError(f"{path} references {ref!r}, which is not in the installed package")
        return f"url('{_data_uri(target)}')"

    return _CSS_URL.sub(_url, _CSS_IMPORT.sub(_import, text))


def _local_file(url: str, dist: Path) -> Path | None:
    m = _PANEL_CDN.fullmatch(url)
    if not m:
        return None
    path = (dist / m.group(1)).resolve()
    return path if path.is_file() and dist.resolve() in path.parents else None


def _inline_document(node: Any, dist: Path, cache: dict[Path, str]) -> int:
    """Turn every ImportedStyleSheet of a Bokeh document (JSON) into an InlineStyleSheet, in place."""
    count = 0
    if isinstance(node, dict):
        if node.get("name") == "ImportedStyleSheet" and node.get("type") == "object":
            url = str((node.get("attributes") or {}).get("url", ""))
            local = _local_file(url, dist)
            if local is None:
                raise OfflineError(f"the page imports the style sheet {url!r}, which is not in the installed panel")
            if local not in cache:
                cache[local] = inline_css(local)
            node["name"] = "InlineStyleSheet"
            node["attributes"] = {"css": cache[local]}
            count += 1
        for value in node.values():
            count += _inline_document(value, dist, cache)
    elif isinstance(node, list):
        for value in node:
            count += _inline_document(value, dist, cache)
    return count


def make_offline(page: str) -> str:
    """A page saved by Panel with inline resources, made to load with no network request.

    Raises :class:`OfflineError` when a referenced resource cannot be found locally."""
    dist = panel_dist()
    cache: dict[Path, str] = {}
    n_sheets = 0

    def _doc(m: re.Match[str]) -> str:
        nonlocal n_sheets
        doc = json.loads(m.group(2))
        n_sheets += _inline_document(doc, dist, cache)
        text = json.dumps(doc, separators=(",", ":")).replace("</", "<\\/")
        return m.group(1) + text + m.group(3)

    page = _JSON_SCRIPT.sub(_doc, page)
    page = _ICON_LINK.sub("", page)
    left = external_references(page)
    if left:
        raise OfflineError(f"the page still references {len(left)} network resource(s): {', '.join(left[:5])}")
    log.info("inlined %d style sheet reference(s) (%d files)", n_sheets, len(cache))
    return page


def external_references(page: str) -> list[str]:
    """Network URLs the page loads by itself: ``src``/``href`` of script, link and img tags, and
    string values in the embedded Bokeh documents that are URLs (style sheets, images)."""
    found: list[str] = []
    for m in re.finditer(r"<(?:script|link|img)\b[^>]*?\b(?:src|href)=\"([^\"]+)\"", page):
        if _NETWORK_URL.match(m.group(1)):
            found.append(m.group(1))

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
        elif isinstance(node, str) and _NETWORK_URL.match(node):
            found.append(node)

    for m in _JSON_SCRIPT.finditer(page):
        try:
            walk(json.loads(m.group(2)))
        except ValueError:
            continue
    return found


# --- the report's content ------------------------------------------------------------------------------


def _e(value: Any) -> str:
    return html.escape(str(value))


def _num(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1e3 else f"{value:,.0f}"
    return str(value)


def _interval(iv: dict[str, Any] | None, digits: int = 3, pct: bool = False) -> str:
    if not iv:
        return "–"
    fmt = (lambda v: "–" if v is None else f"{100 * v:.0f}%") if pct else (lambda v: _num(v, digits))
    est = fmt(iv.get("estimate"))
    if iv.get("low") is None or iv.get("high") is None:
        return est
    return f"{est} [{fmt(iv['low'])}, {fmt(iv['high'])}]"


def _group_name(group: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in group.items()) or "all trials"


def _skipped(section: Any) -> str | None:
    return str(section["skipped"]) if isinstance(section, dict) and "skipped" in section else None


def spec_ranking(ds: xr.Dataset) -> dict[str, Any]:
    """The spec's ranking policy (``objective``, ``require_slos``) recorded in the dataset."""
    try:
        out = json.loads(ds.attrs.get("ranking", "") or "{}")
    except ValueError:
        out = {}
    return out if isinstance(out, dict) else {}


def compute(ds: xr.Dataset, policy: str | None = None, n_boot: int = 100, seed: int = 0,
            progress: Progress | None = None, **hardware: Any) -> dict[str, Any]:
    """The analysis document the report shows (see :func:`analysis.report.analyze`).

    ``policy`` None means the spec's: ``slo_throughput`` of its objective, gated by its SLOs unless
    the spec says ``require_slos: false`` (then ranked without the gate). ``hardware``:
    ``hardware_class``, ``include_failover``, ``cross_hardware`` and ``prices`` of ``analyze``; with
    several classes the report has one section per class (``per_hardware_class``)."""
    from analysis.ranking import rank
    from analysis.report import analyze

    doc = analyze(ds, policy=policy or "slo_throughput", n_boot=n_boot, seed=seed, progress=progress, **hardware)
    parts = doc.get("per_hardware_class") or [doc]
    subsets = dict(per_class(ds))
    for part in parts:
        part["policy_source"] = "command line" if policy else "spec"
        if policy is None and spec_ranking(ds).get("require_slos") is False and "groups" in part.get("ranking", {}):
            sub = subsets.get(part.get("hardware_class") or "", ds)
            ranking = jsonable(rank(sub, policy="slo_throughput", slos=[], seed=seed,
                                    include_failover=hardware.get("include_failover", True)))
            part["ranking"] = ranking
            part["warnings"] = [w for w in part["warnings"] if w.get("section") != "ranking"]
            part["warnings"] += [{**w, "section": "ranking"} for w in ranking.get("warnings", [])]
    doc["policy_source"] = "command line" if policy else "spec"
    mark_drift_suspect(ds, parts)
    doc["decision"] = decision(ds, seed=seed, hardware_class=hardware.get("hardware_class"))
    if hardware.get("cross_hardware"):
        doc["decision_cross"] = decision(ds, seed=seed, cross_hardware=hardware["cross_hardware"],
                                         prices=hardware.get("prices"))
    return doc


def mark_drift_suspect(ds: xr.Dataset, parts: list[dict[str, Any]]) -> None:
    """Give each document's ranking ``drift_suspect`` (config id -> its drift-suspect trials, from
    the document's own drift section), so the ranking marks the rows that include them."""
    table = trial_table(ds)
    if "trial_id" not in table:
        return
    ids, configs = table["trial_id"].astype(str), table["config_id"].astype(str)
    for part in parts:
        drift, ranking = part.get("drift"), part.get("ranking")
        suspect = set((drift.get("suspect") or []) if isinstance(drift, dict) else [])
        if suspect and isinstance(ranking, dict) and "groups" in ranking:
            ranking["drift_suspect"] = {str(k): int(v) for k, v in configs[ids.isin(suspect)].value_counts().items()}


def decision(ds: xr.Dataset, seed: int = 0, hardware_class: str | None = None, **cross: Any) -> dict[str, Any]:
    """What ``python -m coordinator recommend`` decides with its defaults (equal weights, the spec's
    SLOs, the weighted rule, drift-suspect trials left out, its number of resamples), as JSON;
    ``{"skipped": why}`` when the data cannot support a decision."""
    from analysis.decide_cli import build_parser as recommend_parser
    from analysis.decision import recommend

    if hardware_class is not None:
        ds = dict(per_class(ds)).get(hardware_class, ds)
    try:
        n_boot = int(recommend_parser().get_default("n_boot"))
        return dict(jsonable(recommend(ds, n_boot=n_boot, seed=seed, **cross)))
    except AnalysisInputError as exc:
        return {"skipped": str(exc)}


def _model_argument(ds: xr.Dataset, model: str | None) -> Any:
    try:
        identity = json.loads(ds.attrs.get("model", "") or "{}")
    except ValueError:
        identity = {}
    return model_argument(identity if isinstance(identity, dict) else {}, model)


def decision_commands(ds: xr.Dataset, doc: dict[str, Any], model: str | None = None,
                      served_model_name: str | None = None) -> dict[str, str]:
    """config id -> the ``vllm serve`` command of each class's recommended config (the decision's
    winners; a cross-hardware entry ``<id>@<class>`` gets its config's command)."""
    from analysis.decision import serve_params

    out: dict[str, str] = {}
    marg = _model_argument(ds, model)
    for key in ("decision", "decision_cross"):
        part = doc.get(key) or {}
        cross = str(part.get("mode", "")).startswith("cross-hardware")
        for c in part.get("classes") or []:
            cid = str((c.get("winner") or {}).get("config_id") or "")
            if not cid or cid in out:
                continue
            plain = cid.rsplit("@", 1)[0] if cross else cid
            prov = {"experiment": doc.get("experiment"), "spec": str(ds.attrs.get("spec_hash", ""))[:12],
                    "config": plain[:12], "vLLM": ds.attrs.get("vllm_version"), "decision": part.get("rule")}
            out[cid] = serve_command(engine_config_from_params(serve_params(ds, plain)), marg, served_model_name,
                                     _export_provenance(ds, plain, prov)).text()
    return out


def winner_commands(ds: xr.Dataset, doc: dict[str, Any], model: str | None = None,
                    served_model_name: str | None = None) -> dict[str, str]:
    """config_id -> the ``vllm serve`` command text for the #1 config of each ranking group (of
    every hardware class's document when there are several)."""
    if doc.get("per_hardware_class"):
        out_all: dict[str, str] = {}
        for part in doc["per_hardware_class"]:
            out_all.update(winner_commands(ds, part, model, served_model_name))
        return out_all
    ranking = doc.get("ranking")
    if not isinstance(ranking, dict) or "groups" not in ranking:
        return {}
    df = trial_table(ds)
    positions = {cid: i for i, cid in reversed(list(enumerate(df["config_id"].astype(str))))}
    marg = _model_argument(ds, model)
    out: dict[str, str] = {}
    for group in ranking["groups"]:
        rows = group.get("rows") or []
        if not rows or rows[0]["config_id"] in out or rows[0]["config_id"] not in positions:
            continue
        cid = rows[0]["config_id"]
        params = param_values(df, [positions[cid]])[0]
        prov = {"experiment": doc.get("experiment"), "spec": str(ds.attrs.get("spec_hash", ""))[:12],
                "config": cid[:12], "vLLM": ds.attrs.get("vllm_version"), "policy": ranking.get("policy")}
        out[cid] = serve_command(engine_config_from_params(params), marg, served_model_name,
                                 _export_provenance(ds, cid, prov)).text()
    return out


def _export_provenance(ds: xr.Dataset, config_id: str, prov: dict[str, Any]) -> dict[str, Any]:
    """``prov`` led by the SIMULATED label when the config's trials ran on the simulator."""
    mine = np.asarray(ds["config_id"].values).astype(str) == config_id

    def values(name: str) -> list[Any]:
        return np.asarray(ds[name].values)[mine].tolist() if name in ds.variables else []

    return export_provenance(prov, values("hardware_class"), values("backend"))


def _model_text(raw: Any) -> str:
    """The dataset's model identity (JSON) in words: ``path synthetic, revision main``."""
    try:
        identity = json.loads(raw) if isinstance(raw, str) and raw else raw
    except ValueError:
        return str(raw)
    if isinstance(identity, dict):
        return ", ".join(f"{k} {v}" for k, v in identity.items() if v not in (None, "")) or "unknown"
    return str(identity or "unknown")


def provenance(ds: xr.Dataset, doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows describing where the data came from."""
    created = int(ds.attrs.get("created_at_us", 0) or 0)
    created_s = (datetime.fromtimestamp(created / 1e6, tz=timezone.utc).isoformat(timespec="seconds")
                 if created else "unknown")
    design = doc.get("design", {})
    counts = doc.get("counts", {})
    return [
        ("experiment", ", ".join(doc.get("experiments") or [doc.get("experiment", "")])),
        ("spec hash", str(ds.attrs.get("spec_hash", ""))),
        ("vLLM version", str(ds.attrs.get("vllm_version", ""))),
        ("hardware", str(ds.attrs.get("hardware_classes", ""))),
        ("model", _model_text(ds.attrs.get("model", ""))),
        ("design", f"{design.get('design') or 'unknown'}, run order "
                   f"{'randomised' if design.get('randomized') else 'as written'}"),
        ("created", created_s),
        ("synthetic", "YES: generated data, nothing was measured" if doc.get("synthetic") else "no: measured"),
        ("trials", f"{counts.get('trials', 0)} ({counts.get('ok', 0)} ok, {counts.get('failed', 0)} failed, "
                   f"{counts.get('hole', 0)} holes, {counts.get('baseline', 0)} baseline) over "
                   f"{counts.get('configs', 0)} configs"),
        ("report generated", datetime.now(tz=timezone.utc).isoformat(timespec="seconds")),
    ]


CSS = """
<style>
.st { font-family: system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif; font-size: 14px; color: #222; }
.st table { border-collapse: collapse; margin: 4px 0 12px 0; }
.st th, .st td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
.st th { background: #f3f3f3; }
.st pre { background: #f6f8fa; border: 1px solid #ddd; padding: 8px; white-space: pre-wrap; word-break: break-all; }
.st .synthetic { background: #b00020; color: white; padding: 8px; font-weight: bold; }
.st .claim { background: #eef4ff; border-left: 4px solid #3366cc; padding: 6px 10px; }
.st .winner { font-size: 16px; }
.st .bar { position: relative; width: 160px; height: 12px; background: #eee; }
.st .bar .ci { position: absolute; top: 3px; height: 6px; background: #f4a3a3; }
.st .bar .est { position: absolute; top: 0; width: 2px; height: 12px; background: #b00020; }
.st .warn li { margin-bottom: 3px; }
.st .st-warn { background: #fff4e5; border-left: 4px solid #f0a020; padding: 4px 8px; margin: 2px 0; }
.st .st-note { color: #555; font-size: 0.9em; }
.st .st-decision-winner { font-size: 16px; margin: 6px 0; }
.st .st-decision-rule { background: #f6f8fa; padding: 6px 10px; }
</style>
"""


def _html(body: str) -> Any:
    import panel as pn

    return pn.pane.HTML(CSS + f'<div class="st">{body}</div>', sizing_mode="stretch_width")


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _title_html(doc: dict[str, Any]) -> str:
    parts = [f"<h1>servetune report: {_e(doc.get('experiment', ''))}</h1>"]
    if doc.get("synthetic"):
        parts.append('<div class="synthetic">SYNTHETIC DATA: this experiment was generated with planted '
                     "effects; nothing in it was measured.</div>")
    if doc.get("simulated"):
        parts.append(f'<div class="synthetic">{_e(doc["simulated"])}: these trials ran on the simulated vLLM; '
                     "nothing in them was measured.</div>")
    return "".join(parts)


def _decision_section(ds: xr.Dataset, doc: dict[str, Any], commands: dict[str, str], key: str = "decision") -> str:
    """The report's first section: what ``python -m coordinator recommend`` decides with its defaults."""
    from dashboards.decision_view import decision_html, labels_of, named_configs, recommend_command

    dec = doc.get(key) or {}
    cross = key == "decision_cross"
    title = "CROSS-HARDWARE decision (asked for)" if cross else "Decision: what to deploy"
    skipped = _skipped(dec)
    if skipped:
        return f'<h2 class="decision">{title}</h2><p>Skipped: {_e(skipped)}</p>'
    name = doc.get("experiment") or "EXPERIMENT"
    mode = str(dec.get("mode", ""))
    cmd = recommend_command(str(name), None, None, cross_hardware=mode.split()[-1] if cross else None)
    return (f'<h2 class="decision">{title}</h2><p>This is what <code>{_e(cmd)}</code> decides (its defaults: equal '
            "traffic weights over the load points, the spec's SLOs, the weighted rule, drift-suspect trials left "
            "out); that command also writes the decision record <code>runs/" + _e(name) + "/decision.json</code>. "
            "For another traffic mix or other SLO bounds use its <code>--weights</code> and <code>--slo</code> "
            "options or the dashboard's Decision page (<code>panel serve dashboards/</code>).</p>"
            + decision_html(dec, commands, labels_of(trial_table(ds), named_configs(dec))))


def _header_html(ds: xr.Dataset, doc: dict[str, Any]) -> str:
    parts = []
    claim = doc.get("design", {}).get("claim", {})
    kind = claim.get("kind", "association")
    parts.append(f'<p class="claim">Differences between configurations are worded as <b>{_e(kind)}s</b>: '
                 f"{_e(claim.get('why', ''))}.</p>")
    parts.append("<h2>Provenance</h2>" + _table(["", ""], [[_e(k), _e(v)] for k, v in provenance(ds, doc)]))
    return "".join(parts)


def _pareto_plot(group: dict[str, Any], metrics: list[str], senses: list[int],
                 winner: str | None) -> tuple[Any, str]:
    """The front of one group as a HoloViews overlay, and a note on what was left out of the drawing."""
    import holoviews as hv  # type: ignore[import-untyped]
    import numpy as np

    y_name, x_name = metrics[0], metrics[1]
    points = group.get("points") or []
    front = [p for p in points if p.get("on_front")]
    rest = [p for p in points if not p.get("on_front")]
    note = ""
    if len(rest) > MAX_PLOT_POINTS:
        keep = np.random.default_rng(0).choice(len(rest), MAX_PLOT_POINTS, replace=False)
        note = (f"{MAX_PLOT_POINTS} of the {len(rest)} dominated configs are drawn (a random sample); "
                "every config on the front is.")
        rest = [rest[i] for i in sorted(keep)]

    def rows(pts: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return [(p["values"][x_name], p["values"][y_name], p.get("label") or p["config_id"][:12],
                 p.get("p_front") if p.get("p_front") is not None else float("nan")) for p in pts]

    kdims = [x_name]
    vdims = [y_name, "config", "p_front"]
    tools = ["hover"]
    others = hv.Scatter(rows(rest), kdims=kdims, vdims=vdims, label="dominated").opts(
        color="#9aa5b1", size=6, alpha=0.6, tools=tools)
    on_front = sorted(rows(front), key=lambda r: r[0])
    front_pts = hv.Scatter(on_front, kdims=kdims, vdims=vdims, label="on the front").opts(
        color="#d62728", size=9, tools=tools)
    line = hv.Curve([(r[0], r[1]) for r in on_front], kdims=kdims, vdims=[y_name]).opts(
        color="#d62728", line_dash="dashed", interpolation="steps-post" if (senses[0], senses[1]) == (1, -1) else "linear")
    layers = [others, line, front_pts]
    win = [p for p in points if p["config_id"] == winner]
    if win:
        layers.append(hv.Scatter(rows(win), kdims=kdims, vdims=vdims, label="ranking #1").opts(
            color="#ffbf00", marker="star", size=18, line_color="black", tools=tools))
    title = f"{_group_name(group.get('group', {}))}: {len(front)} of {len(points)} configs on the front"
    return hv.Overlay(layers).opts(title=title, width=880, height=420, legend_position="right", shared_axes=False, padding=0.08,
                                   xlabel=f"{x_name} ({'lower' if senses[1] < 0 else 'higher'} is better)",
                                   ylabel=f"{y_name} ({'higher' if senses[0] > 0 else 'lower'} is better)"), note


def _section_html(doc: dict[str, Any], key: str, title: str, render: Callable[[dict[str, Any]], str]) -> str:
    """Section ``doc[key]`` drawn by ``render``; a section the analysis skipped shows ``title`` and the reason."""
    section = doc.get(key, {})
    skipped = _skipped(section)
    return f"<h2>{title}</h2><p>Skipped: {_e(skipped)}</p>" if skipped else render(section)


def _ranking_html(ranking: dict[str, Any], doc: dict[str, Any], commands: dict[str, str]) -> str:
    slos = ", ".join(f"{s['metric']} p{_num(s['percentile'])} ≤ {_num(s['max_ms'])} ms" for s in ranking.get("slos", []))
    parts = [f"<h2>Ranking: {_e(ranking.get('policy'))} (from the {_e(doc.get('policy_source', 'spec'))})</h2>",
             f"<p>{_e(ranking.get('description', ''))}; objective {_e(ranking.get('objective'))}; "
             f"SLOs: {_e(slos or 'none')}. Scores are medians over repeats, intervals from "
             f"{_e(ranking.get('n_boot'))} bootstrap resamples.</p>"]
    suspect = ranking.get("drift_suspect") or {}
    if suspect:
        parts.append(f"<p class='drift-mark'><b>{sum(suspect.values())} drift-suspect trials</b> (measured after the "
                     "drift alarm, see the drift section) are INCLUDED in this ranking; the rows of configs with such "
                     "trials say how many. The decision above leaves them out.</p>")
    for group in ranking.get("groups", []):
        rows = group.get("rows") or []
        parts.append(f"<h3>{_e(_group_name(group.get('group', {})))}</h3>")
        if not rows:
            parts.append("<p>No config to rank.</p>")
            continue
        first = rows[0]
        parts.append(f'<p class="winner">Winner: <b>{_e(first.get("label") or first["config_id"])}</b> '
                     f'(config {_e(first["config_id"][:12])}), {_e(ranking.get("score_name"))} '
                     f'{_e(_interval(first.get("score")))}{_e(_trial_note(first))}</p>')
        if len(rows) > 1:
            parts.append(f'<p>Runner-up: <b>{_e(rows[1].get("label") or rows[1]["config_id"])}</b> '
                         f'(config {_e(rows[1]["config_id"][:12])}), {_e(_interval(rows[1].get("score")))}'
                         f'{_e(_trial_note(rows[1]))}</p>')
        parts.append(f"<p>{'Distinguishable' if group.get('distinguishable') else 'Not distinguishable'}: "
                     f"{_e(group.get('sentence', ''))}</p>")
        if first["config_id"] in commands:
            parts.append(f"<p>Serve the winner with:</p><pre>{_e(commands[first['config_id']])}</pre>")
        table_rows = [[_e(r["rank"]), _e(r.get("label") or r["config_id"][:12]), _e(_interval(r.get("score"))),
                       _e(_num(r.get("p_best"))), _e({True: "yes", False: "no", None: "–"}[r.get("slos_met")]),
                       _e(f"{r['n_ok']}/{r['n_failed']}/{r['n_holes']}")]
                      + ([_e(suspect.get(r["config_id"], "") or "")] if suspect else []) for r in rows[:TOP_ROWS]]
        parts.append(_table(["#", "config", "score [95% CI]", "P(best)", "meets SLOs", "ok/failed/holes"]
                            + (["drift-suspect trials"] if suspect else []), table_rows))
        if len(rows) > TOP_ROWS:
            parts.append(f"<p>… and {len(rows) - TOP_ROWS} more configs.</p>")
    return "".join(parts)


def _trial_note(row: dict[str, Any]) -> str:
    """Failed trials and holes of a ranked config, said next to its score (none: nothing)."""
    if not row.get("n_failed") and not row.get("n_holes"):
        return ""
    return (f"; beware: {row.get('n_failed', 0)} failed trial(s) and {row.get('n_holes', 0)} hole(s) "
            f"beside {row.get('n_ok', 0)} ok")


def _importance_html(imp: dict[str, Any]) -> str:
    claim = imp.get("claim", {})
    rows = [[_e(p["name"]), _e(_interval(p.get("permutation"))), _e(_interval(p.get("vs_probe"))),
             _e(_interval(p.get("shap"))), f"<b>{_e(p.get('verdict'))}</b>"] for p in imp.get("parameters", [])]
    return (f"<h2>Parameter importance</h2><p>Response {_e(imp.get('target') or imp.get('metric'))} at load point "
            f"{_e(imp.get('load_point'))}, {_e(imp.get('n_trials'))} trials, {_e(imp.get('n_boot'))} bootstrap "
            f"refits; surrogate out-of-bag R² {_e(_num(imp.get('oob_r2')))}, held-out R² "
            f"{_e(_interval(imp.get('heldout_r2')))}. Read as {_e(claim.get('kind', 'association'))}s: "
            f"{_e(claim.get('why', ''))}.</p>"
            + _table(["parameter", "permutation importance [95% CI]", "above the random probe by",
                      "mean |SHAP| [95% CI]", "verdict"], rows))


def _bar(iv: dict[str, Any] | None) -> str:
    if not iv or iv.get("estimate") is None:
        return ""
    est = 100 * float(iv["estimate"])
    lo = 100 * float(iv["low"]) if iv.get("low") is not None else est
    hi = 100 * float(iv["high"]) if iv.get("high") is not None else est
    return (f'<div class="bar" title="{_e(_interval(iv, pct=True))}"><div class="ci" style="left:{lo:.1f}%;'
            f'width:{max(hi - lo, 0.5):.1f}%"></div><div class="est" style="left:{est:.1f}%"></div></div>')


def _failure_html(fail: dict[str, Any]) -> str:
    kinds = [[_e(k["kind"]), _e(f"{k['failures']} of {k['of']}"), _e(_interval(k.get("rate"), pct=True)),
              "modelled" if k.get("modelled") else "counted, not blamed on configs"] for k in fail.get("by_kind", [])]
    parts = [f"<h2>Failure map</h2><p>Wilson {_e(_num(100 * float(fail.get('level', 0.95))))}% intervals per region; "
             "transport failures (a lost daemon) are never blamed on a config.</p>",
             _table(["kind", "failures", "rate [CI]", ""], kinds)]
    for group in fail.get("groups", []):
        parts.append(f"<h3>{_e(group.get('hardware_class'))}, load point {_e(group.get('load_point'))}: "
                     f"{_e(group.get('failures'))} of {_e(group.get('n'))} failed "
                     f"({_e(_interval(group.get('rate'), pct=True))}); model: {_e(group.get('model'))}</h3>")
        regions = sorted(group.get("regions", []), key=lambda r: -(r.get("rate") or {}).get("estimate", 0.0))
        rows = [[_e(", ".join(f"{p}={v}" for p, v in zip(r["params"], r["levels"], strict=False))),
                 _e(f"{r['failures']} of {r['n']}"), _e(_interval(r.get("rate"), pct=True)), _bar(r.get("rate")),
                 _e(_interval(r.get("predicted"), pct=True)) if r.get("predicted") else "–"] for r in regions[:30]]
        parts.append(_table(["region", "failures", "rate [Wilson CI]", "0% — 100%", "logistic model"], rows))
        if len(regions) > 30:
            parts.append(f"<p>… and {len(regions) - 30} more regions.</p>")
    return "".join(parts)


def _warnings_html(doc: dict[str, Any]) -> str:
    warnings = doc.get("warnings", [])
    sub = doc.get("subsampled", [])
    items = "".join(f"<li><b>{_e(w.get('section'))}</b> [{_e(w.get('code'))}] {_e(w.get('message'))}"
                    f"{' (' + _e(w['subject']) + ')' if w.get('subject') else ''}</li>" for w in warnings)
    subs = "".join(f"<li><b>{_e(s.get('section', ''))}</b>: {_e(s.get('what', ''))}, {_e(s.get('used'))} of "
                   f"{_e(s.get('of'))}{' (' + _e(s['hardware_class']) + ')' if s.get('hardware_class') else ''}</li>"
                   if isinstance(s, dict) else f"<li>{_e(s)}</li>" for s in sub)
    return (f"<h2>Warnings ({len(warnings)})</h2><ul class=\"warn\">{items or '<li>none</li>'}</ul>"
            + (f"<h3>Subsampled to stay fast</h3><ul>{subs}</ul>" if subs else ""))


def build(ds: xr.Dataset, doc: dict[str, Any], commands: dict[str, str],
          decided: dict[str, str] | None = None) -> Any:
    """The report as a Panel layout (HTML panes and HoloViews/Bokeh plots): with several hardware
    classes one section per class (never a shared ranking, front or fit), then the asked-for
    cross-hardware comparison, labelled as such. The decision comes first; ``decided`` holds its
    winners' ``vllm serve`` commands (:func:`decision_commands`), ``commands`` the rankings'."""
    import holoviews as hv  # type: ignore[import-untyped]
    import panel as pn

    hv.extension("bokeh", logo=False)
    decided = decision_commands(ds, doc) if decided is None else decided
    items: list[Any] = [_html(_title_html(doc) + _decision_section(ds, doc, decided)), _html(_header_html(ds, doc))]
    parts = doc.get("per_hardware_class") or []
    if parts:
        items.append(_html(f"<p class=\"claim\">The trials ran on {len(parts)} hardware classes "
                           f"({_e(', '.join(doc.get('hardware_classes', [])))}); each is analysed on its own below, "
                           "since incomparable hardware never shares a ranking, a front or a fit.</p>"))
        for part in parts:
            items.append(_html(f"<h1 class=\"hw-class\">Hardware class {_e(part.get('hardware_class'))}</h1>"))
            items += _sections(part, commands)
    else:
        items += _sections(doc, commands)
    items += curves_items(ds, doc)
    if isinstance(doc.get("cross_hardware"), dict):
        items.append(_html(_cross_html(doc["cross_hardware"])))
    if isinstance(doc.get("decision_cross"), dict):
        items.append(_html(_decision_section(ds, doc, decided, "decision_cross")))
    items.append(_html(_warnings_html(doc)))
    return pn.Column(*items, sizing_mode="stretch_width", max_width=1100)


def _drift_suspect(doc: dict[str, Any]) -> set[str]:
    """The trial ids of every drift section of the document (one per hardware class)."""
    out: set[str] = set()
    for part in [doc, *(doc.get("per_hardware_class") or [])]:
        drift = part.get("drift")
        out |= {str(t) for t in ((drift.get("suspect") or []) if isinstance(drift, dict) else [])}
    return out


def curves_items(ds: xr.Dataset, doc: dict[str, Any], pct: str = "p99") -> list[Any]:
    """Load curves, as on the dashboard's Load curves page with its defaults: per series (kind of
    load x workload x hardware class) throughput and each latency at ``pct`` against the load, for
    the configs with the highest peak throughput, with their knees and the SLO lines; the
    drift-suspect trials of the document's drift section are left out (the page's default)."""

    from analysis.curves import KNEE_RULE, curves
    from dashboards.app.curves import INTERVAL_NOTE, SHOWN, columns, default_configs, series_view
    from dashboards.app.labels import short_labels, slo_bounds

    df = trial_table(ds)
    suspect = _drift_suspect(doc)
    left_out = df["trial_id"].astype(str).isin(suspect) if suspect and "trial_id" in df else None
    if left_out is not None:
        df = df[~left_out.to_numpy()]
    series = curves(df, [c for c in columns(ds) if c in df])
    head = "<h2 class=\"curves\">Load curves</h2>"
    if not series:
        return [_html(f"{head}<p>Skipped: no load point of this experiment sets a request rate or a concurrency, "
                      "so there is no load to draw curves against.</p>")]
    slos = slo_bounds(ds)
    n_left = int(left_out.sum()) if left_out is not None else 0
    items: list[Any] = [_html(
        f"{head}<p>Output throughput and {_e(pct)} latencies against the load offered, for the {SHOWN} configs "
        "with the highest peak throughput of each hardware class (median over each config's repeats at each load; "
        f"SLO lines dashed). {_e(KNEE_RULE)}. {_e(INTERVAL_NOTE)}."
        + (f" {n_left} drift-suspect trials (see the drift section) are left out of these curves." if n_left else "")
        + "</p>")]
    for hw in sorted({s.hardware_class for s in series}):
        mine = [s for s in series if s.hardware_class == hw]
        chosen = default_configs(mine)
        labels = short_labels(df[df["config_id"].astype(str).isin(set(chosen))]) if chosen else {}
        for s in mine:
            items += series_view(series.index(s), s, chosen, pct, labels, slos)
    return items


def _sections(doc: dict[str, Any], commands: dict[str, str]) -> list[Any]:
    """The Pareto plots, ranking, importance and failure map of one document (one hardware class)."""
    import panel as pn

    items: list[Any] = []
    pareto = doc.get("pareto", {})
    winners = {json.dumps(g.get("group"), sort_keys=True): (g.get("rows") or [{}])[0].get("config_id")
               for g in (doc.get("ranking") or {}).get("groups", [])}
    if _skipped(pareto) or not pareto.get("groups"):
        items.append(_html(f"<h2>Pareto front</h2><p>Skipped: {_e(_skipped(pareto) or 'no ok trial')}</p>"))
    else:
        items.append(_html(f"<h2>Pareto front: {_e(pareto['metrics'][0])} against {_e(pareto['metrics'][1])}</h2>"
                           f"<p>One point per config (median of its repeats); P(on front) over "
                           f"{_e(pareto.get('n_boot'))} bootstrap resamples in the hover.</p>"))
        for group in pareto["groups"]:
            if group.get("points"):
                winner = winners.get(json.dumps(group.get("group"), sort_keys=True))
                plot, note = _pareto_plot(group, pareto["metrics"], pareto["senses"], winner)
                items.append(pn.pane.HoloViews(plot, backend="bokeh"))
                if note:
                    items.append(_html(f"<p>{_e(note)}</p>"))
    items += [_html(_section_html(doc, "ranking", "Ranking", lambda r: _ranking_html(r, doc, commands))),
              _html(_section_html(doc, "importance", "Parameter importance", _importance_html))]
    items += _pd_items(doc.get("partial_dependence"))
    items.append(_html(_section_html(doc, "interactions", "Interactions", _interactions_html)))
    items += _drift_items(doc.get("drift"))
    items.append(_html(_section_html(doc, "failure", "Failure map", _failure_html)))
    return items


def _numeric(values: Sequence[Any]) -> bool:
    return bool(values) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _pd_items(section: Any) -> list[Any]:
    """Partial dependence: per parameter its curve with the 95% band (log axis for a numeric knob
    spanning a factor of 8 or more, the y axis from 0 so noise does not look like a pattern), and
    its sentence (modelled and measured)."""
    import holoviews as hv  # type: ignore[import-untyped]
    import panel as pn

    title = "<h2>Partial dependence</h2>"
    skipped = _skipped(section)
    if skipped or not isinstance(section, list) or not section:
        return [_html(f"{title}<p>Skipped: {_e(skipped or 'nothing to show')}</p>")]
    first = section[0]
    items: list[Any] = [_html(
        f"{title}<p>How the surrogate's prediction of {_e(first.get('metric'))} ({_e(first.get('scale', ''))}) moves "
        f"with each parameter, averaged over the others, at load point {_e(first.get('load_point'))}; the band is "
        "the 95% interval. Each curve's sentence puts the modelled change beside the measured medians. Read each "
        "main effect together with its interactions (next section): a strong pair makes the average "
        "curve hide how the effect depends on the other parameter.</p>")]
    plots: list[Any] = []
    rows: list[list[str]] = []
    for pdoc in section:
        params = pdoc.get("params") or []
        grid = (pdoc.get("grid") or [[]])[0]
        est, low, high = pdoc.get("estimate") or [], pdoc.get("low") or [], pdoc.get("high") or []
        rows.append([_e(", ".join(params)), _e(pdoc.get("verdict") or "–"), _e(pdoc.get("sentence") or "")])
        ok = [i for i, y in enumerate(est) if isinstance(y, (int, float))]
        if len(params) != 1 or not _numeric(grid) or len(ok) < 2:
            continue
        x = [float(grid[i]) for i in ok]
        y = [float(est[i]) for i in ok]
        lo = [float(low[i]) if i < len(low) and low[i] is not None else float(est[i]) for i in ok]
        hi = [float(high[i]) if i < len(high) and high[i] is not None else float(est[i]) for i in ok]
        logx = min(x) > 0 and max(x) / min(x) >= 8
        top = max(hi) * 1.1 if max(hi) > 0 else 1.0
        opts = {"width": 340, "height": 240, "logx": logx, "ylim": (0, top) if min(lo) >= 0 else None,
                "xlabel": params[0] + (" (log scale)" if logx else ""), "ylabel": str(pdoc.get("metric"))}
        band = hv.Area((x, lo, hi), vdims=["low", "high"]).opts(color="#9ecae1", alpha=0.5, line_alpha=0)
        curve = hv.Curve((x, y)).opts(color="#08519c", line_width=2)
        plots.append(pn.pane.HoloViews((band * curve).opts(hv.opts.Overlay(title=params[0], **opts)), backend="bokeh"))
    for i in range(0, len(plots), 3):
        items.append(pn.Row(*plots[i:i + 3]))
    items.append(_html(_table(["parameter", "verdict", "what the data say"], rows)))
    return items


def _interactions_html(section: dict[str, Any]) -> str:
    pairs = section.get("pairs") or []
    rows = [[_e(" × ".join(p.get("params") or [])), _e(_interval(p.get("h2"))), _e(_interval(p.get("strength"))),
             _e(_num(p.get("p_value"))), _e(_num(p.get("shap_interaction"))), _e(p.get("source") or "")]
            for p in pairs[:TOP_ROWS]]
    more = f"<p>… and {len(pairs) - TOP_ROWS} more pairs.</p>" if len(pairs) > TOP_ROWS else ""
    claim = section.get("claim") or {}
    return (f"<h2>Interactions</h2><p>Pairs of parameters whose joint effect on {_e(section.get('target'))} is more "
            f"than the sum of their own, at load point {_e(section.get('load_point'))} ({_e(section.get('n_trials'))} "
            "trials). H² is Friedman's share of the pair's joint effect that is interaction (relative: two "
            "parameters that barely matter can have a large H²); strength is its size against the spread of all "
            f"predictions. Read as {_e(claim.get('kind', 'association'))}s. Method: {_e(section.get('method', ''))}.</p>"
            + _table(["pair", "H² [95% CI]", "strength [95% CI]", "p-value", "SHAP interaction", "from"], rows) + more)


def _when(us: Any) -> str:
    if not isinstance(us, (int, float)) or isinstance(us, bool):
        return "–"
    return datetime.fromtimestamp(float(us) / 1e6, tz=timezone.utc).isoformat(timespec="seconds")


def _drift_items(section: Any) -> list[Any]:
    """Drift: the alarm, how many trials it marks suspect, and per baseline chart its limits and an XmR plot."""
    import holoviews as hv  # type: ignore[import-untyped]
    import panel as pn

    title = "<h2>Drift of the baseline re-runs</h2>"
    skipped = _skipped(section)
    if skipped or not isinstance(section, dict):
        return [_html(f"{title}<p>Drift could not be checked: {_e(skipped or 'no drift analysis')}.</p>")]
    charts = section.get("charts") or []
    if not charts:
        return [_html(f"{title}<p>Drift could not be checked: no baseline re-runs to chart (this is not a "
                      "'no drift' result).</p>")]
    n_suspect = len(section.get("suspect") or [])
    head = (f"<p class='drift-alarm'><b>Drift alarm</b> at {_e(_when(section.get('alarm_at')))}: {n_suspect} trials "
            "measured after it are drift-suspect. The decision above leaves them out; the ranking, Pareto and "
            "importance sections include them (values untouched).</p>" if section.get("alarm") else
            f"<p>No drift alarm on {len(charts)} baseline chart(s) of {_e(section.get('metric'))}.</p>")
    rows = [[_e(c.get("load_point")), _e(c.get("hardware_class")), _e(len(c.get("values") or [])),
             _e(c.get("n_reference")), _e(_num(c.get("centre"))), _e(f"[{_num(c.get('lcl'))}, {_num(c.get('ucl'))}]"),
             _e(f"{c.get('alarm_rule')} at run {c.get('alarm_index')}" if c.get("alarm_rule") else "none"),
             _e(_interval({"estimate": c.get("false_alarm_probability")}, pct=True))] for c in charts]
    items: list[Any] = [_html(title + head + _table(
        ["load point", "hardware class", "baseline runs", "reference runs", "centre", "control limits", "alarm",
         "false-alarm probability"], rows))]
    plots = []
    for c in charts:
        values = [v for v in c.get("values") or [] if isinstance(v, (int, float))]
        if len(values) < 2:
            continue
        run = list(range(len(values)))
        layer = hv.Curve((run, values)).opts(color="steelblue") * hv.Scatter((run, values)).opts(color="steelblue", size=5)
        for level, dash in ((c.get("centre"), "solid"), (c.get("ucl"), "dashed"), (c.get("lcl"), "dashed")):
            if isinstance(level, (int, float)):
                layer = layer * hv.HLine(level).opts(color="crimson" if dash == "dashed" else "black", line_dash=dash)
        if isinstance(c.get("onset_index"), int):
            layer = layer * hv.VLine(c["onset_index"]).opts(color="orange", line_dash="dotted")
        plots.append(pn.pane.HoloViews(layer.opts(hv.opts.Overlay(
            width=420, height=240, title=f"XmR: {c.get('load_point')} / {c.get('hardware_class')}",
            xlabel="baseline run", ylabel=str(section.get("metric")))), backend="bokeh"))
    for i in range(0, len(plots), 2):
        items.append(pn.Row(*plots[i:i + 2]))
    return items


def _cross_html(cross: dict[str, Any]) -> str:
    """The asked-for cross-hardware comparison: normalised scores of every (config, class) pair."""
    prices = cross.get("prices") or {}
    parts = [f"<h1 class=\"cross-hardware\">CROSS-HARDWARE comparison (normalised: {_e(cross.get('normalisation'))})"
             f"</h1><p class=\"claim\">{_e(cross.get('label'))}</p>"]
    if prices:
        parts.append(f"<p>Prices used (US dollars per GPU-hour, from the {_e(cross.get('prices_from'))}): "
                     f"{_e(', '.join(f'{k} {v:g}' for k, v in prices.items()))}.</p>")
    ranking = cross.get("ranking") or {}
    for group in ranking.get("groups", []):
        rows = [[_e(r["rank"]), _e(r.get("label") or r["config_id"]),
                 _e((cross.get("measured_on") or {}).get(r["config_id"], "")), _e(_interval(r.get("score"))),
                 _e(_num(r.get("p_best"))), _e(r.get("n_failover") or "")] for r in (group.get("rows") or [])[:TOP_ROWS]]
        parts.append(f"<h3>load point {_e(group.get('group', {}).get('load_point'))}</h3><p>{_e(group.get('sentence'))}</p>"
                     + _table(["#", "config on class", "class", f"{ranking.get('score_name')} [95% CI]", "P(best)",
                               "failover trials"], rows))
    return "".join(parts)


def render(ds: xr.Dataset, policy: str | None = None, n_boot: int = 100, seed: int = 0, model: str | None = None,
           served_model_name: str | None = None, progress: Progress | None = None, **hardware: Any) -> str:
    """The report of ``ds`` as one offline HTML page (a string); ``progress`` is told of each
    analysis section as it starts."""
    from bokeh.resources import INLINE

    doc = compute(ds, policy=policy, n_boot=n_boot, seed=seed, progress=progress, **hardware)
    commands = winner_commands(ds, doc, model, served_model_name)
    layout = build(ds, doc, commands, decision_commands(ds, doc, model, served_model_name))
    buf = io.StringIO()
    layout.save(buf, title=f"servetune report: {doc.get('experiment', '')}", resources=INLINE)
    return make_offline(buf.getvalue())


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --- command line ----------------------------------------------------------------------------------------


def build_parser(prog: str = "python -m dashboards report") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Write the static, offline HTML report of an experiment.")
    p.add_argument("experiments", nargs="+", metavar="EXPERIMENT",
                   help="name, folder, spec file or results.nc path; several combine")
    p.add_argument("--out", type=Path, required=True, help="the HTML file to write")
    p.add_argument("--results-root", type=Path, default=None, help="default: $SERVETUNE_RESULTS_ROOT or ./runs")
    p.add_argument("--policy", default=None, help="ranking policy (default: the spec's, slo_throughput)")
    p.add_argument("--n-boot", type=int, default=100, help="bootstrap fits for importance (default 100)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default=None, help="model path or hub id for the vllm serve command")
    p.add_argument("--served-model-name", default=None, help="--served-model-name in the vllm serve command")
    p.add_argument("-v", "--verbose", action="count", default=0)
    add_hardware_arguments(p)
    return p


def main(argv: Sequence[str] | None = None, prog: str = "python -m dashboards report") -> int:
    """Exit codes: 0 written; 2 bad input (unknown experiment or policy: named; nothing written); 1 the
    page could not be made offline (nothing written)."""
    args = build_parser(prog).parse_args(argv)
    logging.basicConfig(level=logging.WARNING - 10 * min(args.verbose, 2), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.n_boot < 0:
        print(f"error: --n-boot must be >= 0, got {args.n_boot}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        hardware = hardware_options(args)
        ds = load_many(args.experiments, args.results_root)
        page = render(ds, policy=args.policy, n_boot=args.n_boot, seed=args.seed, model=args.model,
                      served_model_name=args.served_model_name, progress=stderr_progress("report"), **hardware)
        sys.stderr.write("report: rendering the page\n")
    except OfflineError as exc:  # a bug or a changed panel, not the user's input
        print(f"error: cannot make the report offline: {exc}", file=sys.stderr)
        return 1
    except (AnalysisInputError, ServetuneError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    write_atomic(args.out, page)
    sys.stderr.write(f"report written to {args.out} ({len(page) / 1e6:.1f} MB, {time.perf_counter() - t0:.1f} s)\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
