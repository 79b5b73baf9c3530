"""Experiments and live status: every experiment under the results root, and the chosen one's sweep.

The list shows each experiment's trials by status (from its ``results.nc``; ``running`` from its
store), when it was created, its design, and whether a sweep is running. For the chosen experiment
with a store: the current spec's trials by state, progress and ETA, and the daemons that worked on
it (hardware class, fingerprint, state, last phase). Both refresh when the files change
(:meth:`ExperimentsPage.refresh`, called every second by the app; only changed files are re-read).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

import panel as pn

from dashboards.app import Context, esc, state
from dashboards.app.codes import HOLES

log = logging.getLogger(__name__)


def _when(us: int) -> str:
    if not us:
        return "-"
    return dt.datetime.fromtimestamp(us / 1e6).strftime("%Y-%m-%d %H:%M:%S")


def _duration(s: float | None) -> str:
    if s is None:
        return "unknown"
    s = max(0.0, s)
    return f"{int(s // 3600)} h {int(s % 3600 // 60)} min" if s >= 3600 else f"{int(s // 60)} min {int(s % 60)} s"


def unreadable_html(bad: dict[str, str]) -> str:
    """A warning per experiment folder whose files cannot be read (``div.st-unreadable[data-exp]``)."""
    return "".join(f"<div class='st-warn st-unreadable' data-exp='{esc(name)}'><b>{esc(name)}</b> is not listed: "
                   f"its files cannot be read ({esc(err)})</div>" for name, err in bad.items())


def experiments_html(infos: list[state.ExperimentInfo], chosen: str | None) -> str:
    """The experiments table (one ``tr[data-exp=NAME]`` per experiment; counts in ``td.st-<status>``)."""
    if not infos:
        return f"<div class='st-note st-empty'>No experiment under {esc(state.root())} yet.</div>"
    rows = []
    for e in infos:
        c = e.counts
        total = sum(v for k, v in c.items() if k != "running")
        kind = "store + results.nc" if e.has_store and e.has_dataset else ("store" if e.has_store else "results.nc only")
        tags = (" <b>(running)</b>" if e.running else "") + (" <i>synthetic</i>" if e.synthetic else "")
        mark = " style='background:#eef5ff'" if e.name == chosen else ""
        rows.append(
            f"<tr data-exp='{esc(e.name)}'{mark}><td><a href='?page=experiments&experiment={esc(e.name)}' "
            f"target='_self'>{esc(e.name)}</a>{tags}</td><td class='st-trials'>{total}</td>"
            f"<td class='st-ok'>{c.get('ok', 0)}</td><td class='st-failed'>{c.get('failed', 0)}</td>"
            f"<td class='st-hole'>{c.get('hole', 0)}</td><td class='st-running'>{c.get('running', 0)}</td>"
            f"<td class='st-created' data-us='{e.created_us}'>{_when(e.created_us)}"
            f"{'' if e.has_store or not e.created_us else ' (results written)'}</td>"
            f"<td>{esc(e.design or '-')}</td><td>{kind}</td></tr>")
    head = (f"<tr><th>experiment</th><th>trials</th><th>ok</th><th>failed</th><th title='{esc(HOLES)}'>holes</th>"
            "<th>running</th><th class='st-created' title='when the sweep first registered its spec (from the store); "
            "for an experiment with only results.nc, when that file was written'>created</th><th>design</th>"
            "<th>data</th></tr>")
    return (f"<table class='st-table st-experiments'>{head}{''.join(rows)}</table>"
            f"<div class='st-note st-holes-help'>{esc(HOLES)}. <i>created</i>: when the sweep first registered its "
            "spec; marked <i>(results written)</i> where only a results.nc exists and the time is when it was "
            "last written.</div>")


def live_html(info: state.ExperimentInfo | None) -> str:
    """The chosen experiment's sweep: states, progress, ETA, daemons."""
    if info is None:
        return ""
    if not info.has_store:
        return ("<div class='st-note st-live'>This experiment has only a results.nc (no store), so there is no "
                "live sweep state: its trials are listed above.</div>")
    live = state.live_status(info.folder)
    s = live.states
    done = s["ok"] + s["failed"]
    pct = 100.0 * done / live.planned if live.planned else 0.0
    sweep = (f"sweep running since {_when(live.sweep_started_us)}; ETA {_duration(live.eta_s)}" if live.sweep_running
             else "no sweep running")
    daemons = "".join(
        f"<tr><td>{esc(d.daemon_id)}</td><td>{esc(d.hardware_class)}</td><td>{esc(d.state)}</td>"
        f"<td>{esc(d.last_phase)} ({_when(d.last_seen_us)})</td><td>{d.attempts}</td><td>{esc(d.fingerprint)}</td></tr>"
        for d in live.daemons) or "<tr><td colspan=6>no daemon has run a trial yet</td></tr>"
    mean = f"; mean trial {live.mean_trial_s:.1f} s" if live.mean_trial_s else ""
    return (
        f"<div class='st-live' data-exp='{esc(info.name)}'><h3>Current spec: {live.planned} planned trials</h3>"
        f"<div class='st-states'>ok <b class='st-live-ok'>{s['ok']}</b> &middot; failed <b>{s['failed']}</b> &middot; "
        f"running <b>{s['running']}</b> &middot; pending <b class='st-live-pending'>{s['pending']}</b></div>"
        f"<div class='st-progress'><progress max='100' value='{pct:.1f}'></progress> {done}/{live.planned} "
        f"({pct:.0f}%) &middot; {sweep}{mean}</div>"
        f"<h4>Daemons</h4><table class='st-table st-daemons'><tr><th>daemon</th><th>hardware class</th><th>state</th>"
        f"<th>last phase</th><th>attempts</th><th>fingerprint</th></tr>{daemons}</table>"
        f"{schedule_html(live.schedule)}</div>")


def schedule_html(rows: dict[str, Any]) -> str:
    """The sweep's schedule state: each daemon's breaker and outcome, retries, drained classes,
    clock offsets (the store's schedule table, which ``schedule.json`` is written from)."""
    if not rows:
        return ""
    policy = rows.get("policy", {})
    daemons = "".join(
        f"<tr class='st-breaker' data-daemon='{esc(k.removeprefix('daemon:'))}' data-state='{esc(v.get('breaker', {}).get('state', ''))}'>"
        f"<td>{esc(k.removeprefix('daemon:'))}</td><td>{esc(v.get('hardware_class', ''))}</td>"
        f"<td>{esc(v.get('breaker', {}).get('state', ''))}</td><td>{len(v.get('breaker', {}).get('trips', []))}</td>"
        f"<td>{v.get('retries', 0)}</td><td>{esc(v.get('outcome', ''))}</td></tr>"
        for k, v in sorted(rows.items()) if k.startswith("daemon:"))
    drained = "".join(f"<li class='st-drained'>{esc(k.removeprefix('drained:'))}: {v.get('trials', 0)} trial(s): "
                      f"{esc(v.get('reason', ''))}</li>" for k, v in sorted(rows.items()) if k.startswith("drained:"))
    retries = rows.get("retries", {})
    offsets = rows.get("clock_offsets") or {}
    return (
        f"<h4>Schedule</h4><div class='st-note st-schedule'>sweep {esc(rows.get('sweep_status', ''))}; breaker opens after "
        f"{esc(policy.get('breaker_failures', '?'))} consecutive transport failures, probes after "
        f"{esc(policy.get('recovery_after_s', '?'))} s; a class out of service for {esc(policy.get('drain_after_s', '?'))} s "
        f"is drained to holes. Retries: {retries.get('retry', 0)} re-run, {retries.get('given_up', 0)} given up, "
        f"{retries.get('failover', 0)} failed over (runs/&lt;name&gt;/retries.jsonl)</div>"
        f"<table class='st-table st-schedule-daemons'><tr><th>daemon</th><th>hardware class</th><th>breaker</th>"
        f"<th>trips</th><th>retries</th><th>outcome</th></tr>{daemons}</table>"
        + (f"<ul class='st-drained-list'>{drained}</ul>" if drained else "")
        + (f"<div class='st-note st-clock-offsets'>clock offsets: {esc(json.dumps(offsets, sort_keys=True))}</div>"
           if offsets else ""))


class ExperimentsPage(pn.viewable.Viewer):
    """The experiments table and the chosen experiment's live status."""

    def __init__(self, ctx: Context, **params: Any) -> None:
        super().__init__(**params)
        self.ctx = ctx
        self.table = pn.pane.HTML(sizing_mode="stretch_width")
        self.live = pn.pane.HTML(sizing_mode="stretch_width")
        self._signature: tuple[Any, ...] = ()
        self.refresh()

    def show(self, ctx: Context) -> None:
        """Show ``ctx``'s experiment in the same panes (their text changes, no new models)."""
        self.ctx = ctx
        self._signature = ()
        self.refresh()

    def refresh(self) -> None:
        infos = state.list_experiments()
        bad = state.unreadable()
        chosen = next((e for e in infos if e.name == self.ctx.experiment), None)
        sig = (tuple((e.name, e.version, state.store_version(e.folder), e.running) for e in infos), tuple(bad.items()))
        if sig == self._signature:
            return
        self._signature = sig
        self.table.object = experiments_html(infos, self.ctx.experiment) + unreadable_html(bad)
        self.live.object = live_html(chosen)

    def __panel__(self) -> Any:
        return pn.Column(self.table, self.live, sizing_mode="stretch_width")


def view(ctx: Context) -> ExperimentsPage:
    return ExperimentsPage(ctx)
