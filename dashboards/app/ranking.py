"""Ranking: choose a policy (nothing re-runs), see the winner, the runner-up, whether they are
distinguishable, and copy the ``vllm serve`` command of the winner.

Rankings come from ``analysis.ranking.rank`` (one per scenario x hardware class), computed in the
background and cached per dataset version and policy; the command is rendered by
:func:`servetune.export.serve_command` from the winner's engine config.

Hardware classes never share a card. Rows with failover trials (tag ``failover-from:...``) are
marked in the ``failover`` column; ``leave out failover trials`` ranks without them. The
``cross-hardware view`` (off by default) adds one card per load point comparing every
(config, class) pair on a normalised metric (:func:`analysis.crosshw.compare_hardware`), labelled
CROSS-HARDWARE; ``per_gpu_hour`` needs the user's prices (``a100=2.5, h100=4``), else it is refused
with the reason.
"""

from __future__ import annotations

import logging
import math
from concurrent.futures import Future
from typing import Any

import panel as pn

from analysis.crosshw import NORMALISATIONS, CrossHardware, compare_hardware, parse_prices
from analysis.frame import AnalysisInputError
from analysis.ranking import RankingResult, policies, rank
from dashboards.app import Context, claim_html, esc, on_result, state, warnings_html

log = logging.getLogger(__name__)

BOOTSTRAP_UP_TO = 5_000  # configs; above this the ranking runs without a bootstrap (scores only)


def _score(iv: Any) -> str:
    if not math.isfinite(iv.estimate):
        return "-"
    if math.isfinite(iv.low):
        return f"{iv.estimate:.4g} [{iv.low:.4g}, {iv.high:.4g}]"
    return f"{iv.estimate:.4g}"


class RankingPage(pn.viewable.Viewer):
    """Policy picker and one card per scenario x hardware class."""

    def __init__(self, ctx: Context, **params: Any) -> None:
        super().__init__(**params)
        assert ctx.folder is not None
        self.ctx, self.folder = ctx, ctx.folder
        names = list(policies())
        want = ctx.arg("policy", "slo_throughput")
        self.policy = pn.widgets.Select(name="Ranking policy", options=names,
                                        value=want if want in names else names[0], css_classes=["st-policy"])
        self.describe = pn.pane.HTML(sizing_mode="stretch_width")
        self.no_failover = pn.widgets.Checkbox(name="leave out failover trials", value=False)
        self.cross = pn.widgets.Select(name="cross-hardware view", options=["off", *NORMALISATIONS], value="off")
        self.prices = pn.widgets.TextInput(name="USD per GPU-hour by class (for per_gpu_hour)",
                                           placeholder="a100=2.5, h100=4")
        self.cross_body = pn.Column(sizing_mode="stretch_width")
        for w in (self.cross, self.prices):
            w.param.watch(lambda e: self.start_cross(), "value")
        self.no_failover.param.watch(lambda e: self._restart(), "value")
        self.body = pn.Column(sizing_mode="stretch_width")
        self.policy.param.watch(lambda e: self.start(), "value")
        self.version = state.version(self.folder)
        self.start()
        self.start_cross()

    def _restart(self) -> None:
        self.start()
        self.start_cross()

    def start_cross(self) -> None:
        """The asked-for cross-hardware comparison (nothing when off), in the background."""
        mode = self.cross.value
        if mode == "off":
            self.cross_body.objects = []
            return
        folder, v, keep = self.folder, state.version(self.folder), not self.no_failover.value
        text = self.prices.value or ""

        def compute() -> CrossHardware:
            prices = parse_prices([t.strip() for t in text.replace(";", ",").split(",") if t.strip()])
            return compare_hardware(state.dataset(folder), mode, prices, include_failover=keep)

        self.cross_body.objects = [pn.pane.HTML("<div class='st-progress-text'>cross-hardware comparison...</div>")]
        fut = state.background(("cross", str(folder), v, mode, text, keep), compute)
        on_result(fut, lambda f: self._cross_done(f, mode, text))

    def _cross_done(self, fut: Future[CrossHardware], mode: str, text: str) -> None:
        if (mode, text) != (self.cross.value, self.prices.value or ""):
            return
        try:
            self.cross_body.objects = [cross_view(fut.result())]
        except AnalysisInputError as exc:
            self.cross_body.objects = [pn.pane.HTML(f"<div class='st-warn st-cross-refused'>cross-hardware view "
                                                    f"refused: {esc(exc)}</div>")]

    def start(self) -> None:
        """Compute (or fetch from the cache) the ranking under the chosen policy, in the background."""
        policy = self.policy.value
        if pn.state.location is not None:
            pn.state.location.update_query(policy=policy)
        self.describe.object = f"<div class='st-note'>{esc(policies()[policy])}</div>"
        self.body.objects = [pn.pane.HTML(f"<div class='st-progress-text'>ranking under {esc(policy)}...</div>"),
                             pn.indicators.LoadingSpinner(value=True, size=30)]
        folder, v = self.folder, state.version(self.folder)

        def compute() -> RankingResult:
            ds, df = state.dataset(folder), state.table(folder)
            n_boot = 1000 if df["config_id"].nunique() <= BOOTSTRAP_UP_TO else 0
            return rank(ds, policy=policy, table=df, n_boot=n_boot, include_failover=keep)

        keep = not self.no_failover.value
        fut = state.background(("rank", str(folder), v, policy, keep), compute)
        on_result(fut, lambda f: self._done(f, policy))

    def _done(self, fut: Future[RankingResult], policy: str) -> None:
        try:
            result = fut.result()
        except AnalysisInputError as exc:
            self.body.objects = [pn.pane.HTML(f"<div class='st-warn'>{esc(exc)}</div>")]
            return
        except Exception as exc:
            log.exception("ranking failed")
            self.body.objects = [pn.pane.HTML(f"<div class='st-error'>ranking failed: {esc(exc)}</div>")]
            return
        if policy == self.policy.value:
            self._render(result, policy)

    def _render(self, res: RankingResult, policy: str) -> None:
        ds, df = state.dataset(self.folder), state.table(self.folder)
        slos = ", ".join(f"{s.get('metric')} p{float(s.get('percentile', 99)):g} <= {s.get('max_ms')} ms"
                         for s in res.slos) or "none"
        cards: list[Any] = [pn.pane.HTML(
            f"<div>{claim_html(res.claim)}</div><div class='st-note'>score: {esc(res.score_name)} "
            f"({'higher' if res.higher_is_better else 'lower'} is better); {res.n_boot} bootstrap resamples; "
            f"SLOs: {esc(slos)}"
            f"</div>{warnings_html(res.warnings)}", sizing_mode="stretch_width")]
        for g in res.groups:
            key = " / ".join(f"{k}={v}" for k, v in g.group.items())
            if not g.rows:
                cards.append(pn.pane.HTML(f"<h4>{esc(key)}</h4><div class='st-warn'>{esc(g.sentence)}</div>"))
                continue
            win = g.rows[0]
            second = g.rows[1] if len(g.rows) > 1 else None
            try:
                cmd = state.serve_command(self.folder, ds, df, win.config_id)
            except Exception as exc:
                cmd = f"# cannot render the command: {exc}"
            rows = "".join(
                f"<tr><td>{r.rank}</td><td>{esc(r.label)}</td><td>{_score(r.score)}</td>"
                f"<td>{'-' if r.slos_met is None else ('yes' if r.slos_met else 'no')}</td>"
                f"<td>{'-' if r.p_best is None else f'{r.p_best:.2f}'}</td><td>{r.n_ok}/{r.n_failed}/{r.n_holes}</td>"
                f"{failover_cell(r.n_failover)}</tr>"
                for r in g.rows[:15])
            cards.append(pn.Column(pn.pane.HTML(
                f"<h4>{esc(key)}</h4>"
                f"<div class='st-winner' data-config='{esc(win.config_id)}' data-group='{esc(key)}'>winner: "
                f"<b>{esc(win.label)}</b> ({esc(res.score_name)} {_score(win.score)})</div>"
                f"<div class='st-runner-up'>runner-up: {esc(second.label) + ' (' + _score(second.score) + ')' if second else 'none'}</div>"
                f"<div class='st-distinguishable' data-value='{str(g.distinguishable).lower()}'>{esc(g.sentence)}</div>"
                f"<div class='st-note'>vllm serve command for the winner (copy):</div>", sizing_mode="stretch_width"),
                pn.widgets.TextAreaInput(value=cmd, height=110, sizing_mode="stretch_width", css_classes=["st-command"]),
                pn.pane.HTML(f"<table class='st-table'><tr><th>#</th><th>config</th><th>score</th><th>SLOs met</th>"
                             f"<th>P(best)</th><th>ok/failed/holes</th><th>failover</th></tr>{rows}</table>",
                             sizing_mode="stretch_width"),
                sizing_mode="stretch_width"))
        self.body.objects = cards

    def refresh(self) -> None:
        v = state.version(self.folder)
        if v != self.version:
            self.version = v
            self.start()

    def __panel__(self) -> Any:
        return pn.Column(pn.Row(self.policy, self.no_failover), self.describe, self.body,
                         pn.Row(self.cross, self.prices), self.cross_body, sizing_mode="stretch_width")


def failover_cell(n: int) -> str:
    """The marker of a row with failover trials (empty cell for none)."""
    return f"<td class='st-failover' title='failover trials (moved from other hardware)'>{n} moved</td>" if n else "<td></td>"


def cross_view(c: CrossHardware) -> Any:
    """One card per load point of the labelled cross-hardware ranking."""
    parts = [f"<div class='st-cross-label'><b>{esc(c.label)}</b></div>",
             f"<div class='st-note'>score: {esc(c.ranking.score_name)}"
             + (f"; prices (USD per GPU-hour, from the {esc(c.prices_from)}): "
                + ", ".join(f"{esc(k)} {v:g}" for k, v in c.prices.items()) if c.prices else "") + "</div>",
             warnings_html(c.warnings)]
    for g in c.ranking.groups:
        rows = "".join(f"<tr><td>{r.rank}</td><td>{esc(r.label)}</td><td>{esc(c.measured_on.get(r.config_id, ''))}</td>"
                       f"<td>{_score(r.score)}</td>{failover_cell(r.n_failover)}</tr>" for r in g.rows[:15])
        parts.append(f"<h4>{esc(g.group.get('load_point', ''))}: {esc(g.group.get('hardware_class', ''))}</h4>"
                     f"<div class='st-note'>{esc(g.sentence)}</div><table class='st-table'><tr><th>#</th><th>config</th>"
                     f"<th>class</th><th>normalised score</th><th>failover</th></tr>{rows}</table>")
    return pn.pane.HTML("".join(parts), sizing_mode="stretch_width")


def view(ctx: Context) -> RankingPage:
    return RankingPage(ctx)
