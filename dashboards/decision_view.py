"""The decision of :func:`analysis.decision.recommend` as HTML: one renderer for the dashboard's
decision page (:mod:`dashboards.app.decision`) and the static report (:mod:`dashboards.report`).

It reads the decision as plain JSON (``analysis.common.jsonable`` of a ``Decision``: the shape the
decision record ``decision.json`` of ``python -m coordinator recommend`` holds), so the page, the
report and the record say the same thing from the same object. What it shows, per hardware class
(or the one labelled cross-hardware group): the recommended config with its ``vllm serve``
command, the rule in words, the runner-up with the margin and its 95% interval and whether the
two are distinguishable, per load point the objective, its normalised value and the SLO columns'
upper bounds, what would change the answer (per weight and per SLO bound, the value at which the
winner changes, or "never in range"), and the evidence (repeats, failures, retries, holes, drift-
suspect trials left out) and warnings. :func:`recommend_command` is the CLI line that gives the
same decision and writes its record.

Elements carry ``st-decision-*`` classes and ``data-*`` attributes (config ids, thresholds) so a
browser test can read the numbers it shows.
"""

from __future__ import annotations

import html
import math
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from analysis.decision import RULES

NEVER = "never in range"


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def exact(x: float) -> str:
    """``x`` with every significant digit (for a command line that must reproduce the input)."""
    return f"{float(x):.15g}"


def num(value: Any, digits: int = 4) -> str:
    """A number for people (``–`` when missing)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return f"{value:.{digits}g}" if abs(value) < 1e5 else f"{value:,.0f}"


def slo_text(slo: Mapping[str, Any]) -> str:
    """``{"metric": "ttft_ms", "percentile": 99, "max_ms": 200}`` -> ``ttft_ms p99 <= 200 ms``."""
    return f"{slo.get('metric')} p{float(slo.get('percentile', 99.0)):g} <= {num(slo.get('max_ms'), 6)} ms"


def slo_arg(slo: Mapping[str, Any]) -> str:
    """The ``--slo`` argument of ``recommend`` for one SLO (``ttft_ms_p99<=200``)."""
    return f"{slo.get('metric')}_p{float(slo.get('percentile', 99.0)):g}<={exact(float(slo['max_ms']))}"


def recommend_command(experiment: str, weights: Mapping[str, float] | None, slos: Sequence[Mapping[str, Any]] | None,
                      rule: str = "weighted", include_drift: bool = False, cross_hardware: str | None = None,
                      prices: Mapping[str, float] | None = None) -> str:
    """The ``python -m coordinator recommend`` line that decides on these inputs (and writes the
    decision record). ``weights``/``slos`` None: the defaults (equal weights, the spec's SLOs)."""
    words = ["python", "-m", "coordinator", "recommend", experiment]
    if weights is not None:
        words += ["--weights", ",".join(f"{lp}={exact(w)}" for lp, w in weights.items())]
    for s in slos or []:
        words += ["--slo", slo_arg(s)]
    if rule != "weighted":
        words += ["--rule", rule]
    if include_drift:
        words.append("--include-drift")
    if cross_hardware:
        words += ["--cross-hardware", cross_hardware]
        for cls, usd in (prices or {}).items():
            words += ["--gpu-hour-price", f"{cls}={exact(usd)}"]
    return shlex.join(words)


def _label(cid: str | None, labels: Mapping[str, str]) -> str:
    if cid is None:
        return "no config (none is feasible)"
    return labels.get(cid) or cid


def _threshold_row(t: Mapping[str, Any], labels: Mapping[str, str]) -> str:
    kind, name = str(t.get("kind")), str(t.get("name"))
    what = f"weight of {name}" if kind == "weight" else f"SLO bound {name} (ms)"

    def side(value: Any, who: Any, word: str) -> str:
        if value is None:
            return NEVER
        return f"{word} {num(value, 5)}: {_e(_label(who, labels))}"

    up = "" if t.get("up") is None else exact(t["up"])
    down = "" if t.get("down") is None else exact(t["down"])
    return (f"<tr class='st-decision-threshold' data-kind='{_e(kind)}' data-name='{_e(name)}' data-up='{up}' "
            f"data-down='{down}' data-up-winner='{_e(t.get('up_winner') or '')}' "
            f"data-down-winner='{_e(t.get('down_winner') or '')}'><td>{_e(what)}</td><td>{num(t.get('current'), 6)}</td>"
            f"<td>{side(t.get('up'), t.get('up_winner'), 'above' if kind == 'weight' else 'at')}</td>"
            f"<td>{side(t.get('down'), t.get('down_winner'), 'below')}</td></tr>")


_EVIDENCE = (("failed", "failed trials"), ("lost_to_transport", "of them lost to transport (not held against it)"),
             ("holes", "holes"), ("retried", "retried trials"), ("stopped_early", "stopped early"),
             ("client_fell_behind", "client fell behind"), ("failover", "failover trials"),
             ("drift_suspect_left_out", "drift-suspect trials left out"))


def _evidence_rows(evidence: Mapping[str, Any], labels: Mapping[str, str], choices: Mapping[str, Any]) -> str:
    rows = []
    for who, title in (("winner", "recommended"), ("runner_up", "runner-up")):
        ev = evidence.get(who) or {}
        choice = choices.get(who)
        if not ev or not choice:
            continue
        if "runs" in ev:  # an SLA search's: its runs and probes; only the counts it has
            runs = ", ".join(f"{_e(lp)} {n}" for lp, n in (ev.get("runs") or {}).items())
            rest = "; ".join([f"probes {ev.get('probes', 0)}", *(f"{label} {ev[key]}" for key, label in _EVIDENCE
                                                                 if key in ev)])
            rows.append(f"<tr class='st-decision-evidence' data-who='{who}'><td>{title}: {_e(choice.get('label'))}</td>"
                        f"<td>SLA search runs per load point: {runs}</td><td>{_e(rest)}</td></tr>")
            continue
        reps = ", ".join(f"{_e(lp)} {n}" for lp, n in (ev.get("repeats") or {}).items())
        rest = "; ".join(f"{label} {ev.get(key, 0)}" for key, label in _EVIDENCE)
        rows.append(f"<tr class='st-decision-evidence' data-who='{who}'><td>{title}: {_e(choice.get('label'))}</td>"
                    f"<td>repeats per load point: {reps}</td><td>{_e(rest)}</td></tr>")
    return "".join(rows)


def _is_sla(c: Mapping[str, Any]) -> bool:
    """Whether ``c`` is a decision on SLA searches' max rate at SLO (:mod:`analysis.sla_decision`)."""
    return any("boundary_ci95_rps" in cell for who in ("winner", "runner_up")
               for cell in ((c.get(who) or {}).get("per_load_point") or {}).values())


def _sla_per_load_point(c: Mapping[str, Any]) -> str:
    rows = []
    for who in ("winner", "runner_up"):
        for lp, cell in ((c.get(who) or {}).get("per_load_point") or {}).items():
            ci = cell.get("boundary_ci95_rps")
            typical = (f"{num(cell.get('boundary_estimate_rps'))} [{num(ci[0])}, {num(ci[1])}]" if ci else
                       "– (one run: no interval over runs)")
            brackets = ", ".join(f"[{num(lo)}, {num(hi)}]" for lo, hi in cell.get("brackets_rps") or [])
            rows.append(f"<tr class='st-decision-sla' data-who='{who}' data-rate='{cell.get('objective')}'>"
                        f"<td>{'recommended' if who == 'winner' else 'runner-up'}</td><td>{_e(lp)}</td>"
                        f"<td>{num(cell.get('objective'))}</td><td>{typical}</td><td>{_e(brackets)}</td>"
                        f"<td>{cell.get('repeats')}</td><td>{_e(', '.join(cell.get('stopped') or []))}</td></tr>")
    return ("<table class='st-table st-decision-cells'><tr><th></th><th>SLA search load point</th>"
            "<th>max rate at SLO, met in every run (req/s)</th><th>typical boundary, 95% over runs (req/s)</th>"
            f"<th>each run's bracket</th><th>runs</th><th>stopped</th></tr>{''.join(rows)}</table>") if rows else ""


def _per_load_point(c: Mapping[str, Any], slo_cols: Sequence[str]) -> str:
    if _is_sla(c):
        return _sla_per_load_point(c)
    head = "".join(f"<th>{_e(col)} upper bound (ms)</th>" for col in slo_cols)
    rows = []
    for who in ("winner", "runner_up"):
        ch = c.get(who)
        if not ch:
            continue
        for lp, cell in (ch.get("per_load_point") or {}).items():
            bounds = cell.get("slo_upper_bound") or {}
            rows.append(f"<tr><td>{'recommended' if who == 'winner' else 'runner-up'}</td><td>{_e(lp)}</td>"
                        f"<td>{num(cell.get('objective'))}</td><td>{num(cell.get('normalised'), 3)}</td>"
                        f"<td>{cell.get('repeats')}</td>" + "".join(f"<td>{num(bounds.get(col))}</td>" for col in slo_cols)
                        + "</tr>")
    return ("<table class='st-table st-decision-cells'><tr><th></th><th>load point</th><th>objective (median)</th>"
            f"<th>normalised (1 = best there)</th><th>repeats</th>{head}</tr>{''.join(rows)}</table>") if rows else ""


def class_html(c: Mapping[str, Any], doc: Mapping[str, Any], commands: Mapping[str, str],
               labels: Mapping[str, str]) -> str:
    """One hardware class's recommendation (see the module docstring)."""
    cls = str(c.get("hardware_class") or "")
    title = (cls if str(doc.get("mode", "")).startswith("cross-hardware") else
             (f"Hardware class {cls}" if cls else "All trials (no hardware class recorded)"))
    win, run = c.get("winner"), c.get("runner_up")
    parts = [f"<div class='st-decision-class' data-class='{_e(cls)}'><h3 style='font-size: 1.2em'>{_e(title)}</h3>"]
    if win:
        parts.append(f"<div class='st-decision-winner winner' data-config='{_e(win['config_id'])}' data-class='{_e(cls)}'>"
                     f"Recommended: <b>{_e(win.get('label') or win['config_id'])}</b> (config "
                     f"<code>{_e(str(win['config_id'])[:16])}</code>), rule score {num(win.get('score'))}</div>")
        cmd = commands.get(str(win["config_id"]))
        if cmd:
            parts.append(f"<div class='st-note'>serve it with (copy):</div><pre class='st-cmd st-decision-command'>"
                         f"{_e(cmd)}</pre>")
    else:
        why = ("no config's SLA search found a rate meeting every SLO in every run" if _is_sla(c) or
               "no_rate_meeting_slos_in_every_run" in (c.get("excluded") or {}) else
               "no config meets every SLO on every load point")
        parts.append(f"<div class='st-decision-winner st-decision-none winner' data-config='' data-class='{_e(cls)}'>"
                     f"Nothing to recommend: {why}.</div>")
    margin = c.get("margin") or {}
    dist = bool(c.get("distinguishable"))
    if run:
        low, high = margin.get("low"), margin.get("high")
        shown = (f"{num(margin.get('estimate'))} [{num(low)}, {num(high)}] (95% bootstrap interval)"
                 if low is not None and high is not None else
                 f"{num(margin.get('estimate'))} (judged by the intervals over runs below)" if _is_sla(c) else
                 f"{num(margin.get('estimate'))} (no interval)")
        parts.append(f"<div class='st-decision-runner-up' data-config='{_e(run['config_id'])}'>Runner-up: "
                     f"<b>{_e(run.get('label') or run['config_id'])}</b>, rule score {num(run.get('score'))}; margin "
                     f"{shown}: <span class='st-decision-margin' data-distinguishable='{str(dist).lower()}'>"
                     f"{'distinguishable' if dist else 'NOT distinguishable'}</span></div>")
    elif win:
        parts.append("<div class='st-decision-runner-up' data-config=''>Runner-up: none (the only feasible config)</div>")
    parts.append(f"<p class='st-decision-sentence'>{_e(c.get('sentence', ''))}</p>")
    excluded = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in (c.get("excluded") or {}).items())
    parts.append(f"<div class='st-note'>{c.get('n_feasible')} of {c.get('n_configs')} configs feasible; left out: "
                 f"{_e(excluded)}</div>")
    slo_cols = [t["name"] for t in c.get("thresholds") or [] if t.get("kind") == "slo"]
    parts.append(_per_load_point(c, slo_cols))
    thresholds = c.get("thresholds") or []
    if thresholds:
        parts.append("<h4 style='font-size: 1.05em'>What would change the answer</h4><div class='st-note'>one input at a time, the others "
                     "held; the config that wins past each value is named</div>"
                     "<table class='st-table st-decision-thresholds'><tr><th>input</th><th>now</th>"
                     "<th>raised: winner changes</th><th>lowered: winner changes</th></tr>"
                     + "".join(_threshold_row(t, labels) for t in thresholds) + "</table>")
    ev = c.get("evidence") or {}
    rows = _evidence_rows(ev, labels, {"winner": win, "runner_up": run})
    parts.append(f"<h4 style='font-size: 1.05em'>Evidence</h4><div class='st-note'>{ev.get('trials', 0)} trials of {ev.get('configs', 0)} configs "
                 f"used; {ev.get('drift_suspect_left_out', 0)} drift-suspect trials left out</div>"
                 + (f"<table class='st-table'>{rows}</table>" if rows else ""))
    parts.append("</div>")
    return "".join(parts)


def decision_html(doc: Mapping[str, Any], commands: Mapping[str, str], labels: Mapping[str, str]) -> str:
    """The whole decision: the rule and inputs, the drift banner, one block per class, the warnings."""
    parts = []
    if (doc.get("dataset") or {}).get("synthetic"):
        parts.append("<div class='st-warn st-synthetic'>SYNTHETIC data: nothing here was measured.</div>")
    rule = str(doc.get("rule", ""))
    weights = doc.get("weights") or {}
    total = sum(float(w) for w in weights.values()) or 1.0
    mix = ", ".join(f"{_e(lp)} {num(w, 6)} ({100 * float(w) / total:.0f}%)" for lp, w in weights.items())
    slos = "; ".join(_e(slo_text(s)) for s in doc.get("slos") or []) or "none"
    parts.append(f"<div class='st-decision-rule'><b>Rule ({_e(rule)})</b>: {_e(doc.get('rule_text') or RULES.get(rule, ''))}."
                 f"<br><b>SLO check</b>: {_e(doc.get('slo_rule', ''))}.<br><b>Objective</b> "
                 f"{_e(doc.get('objective'))}; <b>traffic mix</b> {mix}; <b>SLOs</b> {slos}; mode {_e(doc.get('mode'))}; "
                 f"{doc.get('n_boot')} bootstrap resamples.</div>")
    n_out = int(doc.get("n_drift_excluded") or 0)
    codes = {w.get("code") for w in doc.get("warnings") or []}
    if n_out:
        parts.append(f"<div class='st-warn st-drift-banner' data-excluded='{n_out}'><b>{n_out} drift-suspect trials are "
                     "left out of this decision</b> (measured after a drift alarm on the baseline re-runs).</div>")
    elif doc.get("include_drift") and "drift_included" in codes:
        parts.append("<div class='st-warn st-drift-banner' data-excluded='0'><b>drift-suspect trials are INCLUDED in "
                     "this decision</b>.</div>")
    elif "drift_unchecked" in codes:
        parts.append("<div class='st-warn st-drift-banner' data-excluded='0'>drift could not be checked (see the "
                     "warnings): no trial is left out as drift-suspect.</div>")
    for c in doc.get("classes") or []:
        parts.append(class_html(c, doc, commands, labels))
    apart = [c for c in doc.get("sla") or [] if c not in (doc.get("classes") or [])]
    if apart:
        parts.append("<h3 style='font-size: 1.2em' class='st-decision-sla-apart'>SLA search load points, decided apart "
                     "on max rate at SLO</h3>")
        parts.extend(class_html(c, doc, commands, labels) for c in apart)
    warns = doc.get("warnings") or []
    if warns:
        parts.append("<h4 style='font-size: 1.05em'>Warnings</h4>" + "".join(
            f"<div class='st-warn st-decision-warning'><b>{_e(w.get('code'))}</b>: {_e(w.get('message'))}"
            f"{' (' + _e(w['subject']) + ')' if w.get('subject') else ''}</div>" for w in warns))
    return "".join(parts)


def named_configs(doc: Mapping[str, Any]) -> set[str]:
    """Every config id the decision names (winners, runners-up, the winners past each threshold),
    without a cross-hardware entry's ``@<class>``."""
    out: set[str] = set()
    for c in [*(doc.get("classes") or []), *(doc.get("sla") or [])]:
        for who in ("winner", "runner_up"):
            if c.get(who):
                out.add(str(c[who]["config_id"]))
        for t in c.get("thresholds") or []:
            out.update(str(t[k]) for k in ("up_winner", "down_winner") if t.get(k))
    return out | {cid.rsplit("@", 1)[0] for cid in out}


def labels_of(table: Any, only: set[str] | None = None) -> dict[str, str]:
    """config id -> label from a trial table (of the configs in ``only``; None: all), plus the
    cross-hardware entries (``<id>@<class>`` -> ``<label> on <class>``, as :mod:`analysis.crosshw`
    names them)."""
    if table is None or "config_id" not in table or not len(table):
        return {}
    if only is not None:
        table = table[table["config_id"].astype(str).isin(only)]
    keep = [c for c in ("config_id", "config_label", "hardware_class") if c in table]
    table = table[keep].astype(str).drop_duplicates()
    ids = table["config_id"].tolist()
    names = table["config_label"].astype(str).tolist() if "config_label" in table else ids
    hw = table["hardware_class"].astype(str).tolist() if "hardware_class" in table else [""] * len(ids)
    out: dict[str, str] = {}
    for cid, name, cls in zip(ids, names, hw):
        out.setdefault(cid, name or cid)
        if cls:
            out.setdefault(f"{cid}@{cls}", f"{name or cid} on {cls}")
    return out
