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

import pandas as pd
import panel as pn

from analysis.crosshw import NORMALISATIONS, CrossHardware, compare_hardware, parse_prices
from analysis.frame import AnalysisInputError
from analysis.ranking import RankingResult, policies, rank
from dashboards.app import Context, claim_html, esc, on_result, state, warnings_html
from dashboards.app.marks import clean, drift_bar, drift_marks, mode
from dashboards.app.settle import into as show_in
from dashboards.app.settle import settle
from dashboards.app.versioned import RestartOnNewVersion

log = logging.getLogger(__name__)

BOOTSTRAP_UP_TO = 5_000  # configs; above this the ranking runs without a bootstrap (scores only)


def _score(iv: Any) -> str:
    if not math.isfinite(iv.estimate):
        return "-"
    if math.isfinite(iv.low):
        return f"{iv.estimate:.4g} [{iv.low:.4g}, {iv.high:.4g}]"
    return f"{iv.estimate:.4g}"


class RankingPage(RestartOnNewVersion, pn.viewable.Viewer):
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
        self.weights = pn.widgets.TextInput(name="weights of the weighted policy (metric=weight, ...)",
                                            value=ctx.arg("weights"), css_classes=["st-weights"],
                                            placeholder="output_throughput=2, ttft_ms_p99=1 (empty: each 1)",
                                            visible=self.policy.value == "weighted")
        self.weights.param.watch(lambda e: self.start(), "value")
        self.no_failover = pn.widgets.Checkbox(name="leave out failover trials", value=False)
        self.cross = pn.widgets.Select(name="cross-hardware view", options=["off", *NORMALISATIONS], value="off")
        self.prices = pn.widgets.TextInput(name="USD per GPU-hour by class (for per_gpu_hour)",
                                           placeholder="a100=2.5, h100=4")
        self.cross_body = pn.Column(sizing_mode="stretch_width")
        for w in (self.cross, self.prices):
            w.param.watch(lambda e: self.start_cross(), "value")
        self.no_failover.param.watch(lambda e: self._restart(), "value")
        self.body = pn.Column(sizing_mode="stretch_width")
        self.apart_body = pn.Column(sizing_mode="stretch_width")
        self.marks = drift_marks(self.folder)
        self.drift_mode = mode(ctx)
        self.drift = drift_bar(ctx, self.marks, {
            "exclude": "they are left out of every ranking below (as in the decision).",
            "apart": "they are left out of the rankings below and ranked on their own at the bottom, never mixed."})
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
        self.weights.visible = policy == "weighted"
        if pn.state.location is not None:
            pn.state.location.update_query(policy=policy)
        self.describe.object = f"<div class='st-note'>{esc(policies()[policy])}</div>"
        try:
            weights = parse_weights(self.weights.value) if policy == "weighted" else None
        except AnalysisInputError as exc:
            self.body.objects = [pn.pane.HTML(f"<div class='st-warn st-weights-refused'>{esc(exc)}</div>")]
            return
        wkey = tuple(sorted(weights.items())) if weights else None
        self.body.objects = [pn.pane.HTML(f"<div class='st-progress-text'>ranking under {esc(policy)}...</div>"),
                             pn.indicators.LoadingSpinner(value=True, size=30)]
        folder, v, marks = self.folder, state.version(self.folder), self.marks

        def compute(suspect: bool) -> tuple[RankingResult, pd.DataFrame]:
            """The ranking and the trial table it ranked (the page counts and describes that table)."""
            ds, df = state.dataset(folder), state.table(folder)
            df = df[marks.mask(df)] if suspect else clean(df, marks)
            n_boot = 1000 if df["config_id"].nunique() <= BOOTSTRAP_UP_TO else 0
            return rank(ds, policy=policy, table=df, n_boot=n_boot, include_failover=keep, weights=weights), df

        keep = not self.no_failover.value
        fut = state.background(("rank", str(folder), v, policy, keep, wkey, "clean"), lambda: compute(False))
        on_result(fut, lambda f: self._done(f, policy, self.body))
        self.apart_body.objects = []
        if self.drift_mode == "apart" and marks.suspect:
            self.apart_body.objects = [pn.pane.HTML("<div class='st-progress-text'>ranking the drift-suspect "
                                                    "trials apart...</div>")]
            fut2 = state.background(("rank", str(folder), v, policy, keep, wkey, "suspect"), lambda: compute(True))
            on_result(fut2, lambda f: self._done(f, policy, self.apart_body, apart=True))

    def _done(self, fut: Future[tuple[RankingResult, pd.DataFrame]], policy: str, into: pn.Column,
              apart: bool = False) -> None:
        def use(got: tuple[RankingResult, pd.DataFrame]) -> None:
            if policy == self.policy.value:
                into.objects = self._render(got[0], policy, got[1], apart)

        settle(fut, use, show_in(into), "ranking", "st-ranking-refused")

    def _render(self, res: RankingResult, policy: str, used: pd.DataFrame, apart: bool = False) -> list[Any]:
        ds, df = state.dataset(self.folder), state.table(self.folder)
        n_suspect = int(self.marks.mask(df).sum())
        n_used = int((~used["is_baseline"].astype(bool)).sum()) if "is_baseline" in used else len(used)
        slos = ", ".join(f"{s.get('metric')} p{float(s.get('percentile', 99)):g} <= {s.get('max_ms')} ms"
                         for s in res.slos) or "none"
        which = (f"<h3 class='st-apart' data-suspect='{n_suspect}'>Drift-suspect trials, ranked apart ({n_suspect} trials; "
                 "not comparable with the ranking above)</h3>" if apart else
                 f"<div class='st-note st-ranked-on' data-trials='{n_used}' data-left-out='{len(df) - len(used)}'>"
                 f"ranked on {n_used} trials (baseline re-runs aside)"
                 + (f"; {len(df) - len(used)} drift-suspect left out" if len(df) > len(used) else "") + "</div>")
        cards: list[Any] = [pn.pane.HTML(
            f"{which}<div>{claim_html(res.claim)}</div><div class='st-note'>score: {esc(res.score_name)} "
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
            lat = latency_medians(used, g.group)
            estimable = p_best_estimable(g.rows)
            shown = g.rows[:15]
            noted = any(r.note for r in shown)  # the policy's word on a row's score, e.g. a knee extreme's 0
            rows = "".join(
                f"<tr class='st-rank-row' data-config='{esc(r.config_id)}'><td>{r.rank}</td><td>{esc(r.label)}</td>"
                f"<td>{_score(r.score)}</td>"
                + (f"<td class='st-note st-rank-note'>{esc(r.note)}</td>" if noted else "")
                + f"<td>{'-' if r.slos_met is None else ('yes' if r.slos_met else 'no')}</td>"
                + "".join(f"<td class='st-lat'>{_ms(lat.get((r.config_id, c)))}</td>" for c in LATENCY_COLUMNS)
                + f"{p_best_cell(r, estimable)}<td>{r.n_ok}/{r.n_failed}/{r.n_holes}</td>"
                f"{failover_cell(r.n_failover)}</tr>"
                for r in shown)
            winner_cls = "st-apart-winner" if apart else "st-winner"
            link = (f" <a class='st-compare-link' href='{compare_href(self.ctx, win.config_id, second.config_id, g.group)}'>"
                    "compare #1 vs #2</a>" if second else "")
            head = pn.pane.HTML(
                f"<h4>{esc(key)}</h4>"
                f"<div class='{winner_cls}' data-config='{esc(win.config_id)}' data-group='{esc(key)}'>winner: "
                f"<b>{esc(win.label)}</b> ({esc(res.score_name)} {_score(win.score)})</div>"
                f"<div class='st-runner-up'>runner-up: {esc(second.label) + ' (' + _score(second.score) + ')' if second else 'none'}{link}</div>"
                f"<div class='st-distinguishable' data-value='{str(g.distinguishable).lower()}'>{esc(g.sentence)}</div>"
                + ("" if apart else "<div class='st-note'>vllm serve command for the winner (copy):</div>"),
                sizing_mode="stretch_width")
            lat_heads = "".join(f"<th>{esc(h)}</th>" for h in LATENCY_COLUMNS.values())
            table = pn.pane.HTML("<table class='st-table st-rank-table'><tr><th>#</th><th>config</th><th>score</th>"
                                 + ("<th>about the score</th>" if noted else "")
                                 + f"<th>SLOs met</th>{lat_heads}<th title='{esc(P_BEST_HELP)}'>P(best)</th>"
                                 f"<th>ok/failed/holes</th><th>failover</th></tr>{rows}</table>"
                                 + ("" if estimable else f"<div class='st-warn st-p-best-note'>P(best) not estimable: "
                                    f"{esc(P_BEST_HELP)}</div>"), sizing_mode="stretch_width")
            parts = [head] if apart else [head, pn.widgets.TextAreaInput(
                value=cmd, height=110, sizing_mode="stretch_width", css_classes=["st-command"])]
            cards.append(pn.Column(*parts, table, sizing_mode="stretch_width"))
        return cards

    def __panel__(self) -> Any:
        return pn.Column(self.drift, pn.Row(self.policy, self.weights, self.no_failover), self.describe, self.body,
                         pn.Row(self.cross, self.prices), self.cross_body, self.apart_body, sizing_mode="stretch_width")


#: latency columns shown beside every ranking (as the CLI's table has them): column -> heading
LATENCY_COLUMNS = {"ttft_ms_p99": "TTFT p99 (ms)", "tpot_ms_p99": "TPOT p99 (ms)"}
P_BEST_HELP = ("P(best) is the share of bootstrap resamples of every config's repeats in which a config ranks #1; "
               "with a single ok repeat a resample can only redraw that one value, so the share is 1 or 0 by "
               "construction and says nothing: it needs at least 2 repeats of the config and of the leader")


def parse_weights(text: str) -> dict[str, float] | None:
    """``"output_throughput=2, ttft_ms_p99=1"`` as metric -> weight (None for an empty text: the
    policy's default, every metric at 1); a malformed entry or a negative weight is refused by name."""
    out: dict[str, float] = {}
    for item in [t.strip() for t in (text or "").replace(";", ",").split(",") if t.strip()]:
        name, sep, raw = item.partition("=")
        try:
            w = float(raw)
        except ValueError:
            w = float("nan")
        if not sep or not name.strip() or not math.isfinite(w) or w < 0:
            raise AnalysisInputError(f"weight {item!r}: write metric=weight with a weight >= 0 "
                                     "(e.g. output_throughput=2, ttft_ms_p99=1)")
        out[name.strip()] = w
    return out or None


def _ms(v: float | None) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:.4g}"


def latency_medians(df: Any, group: dict[str, str]) -> dict[tuple[str, str], float]:
    """(config id, column) -> median over the group's ok trials of each :data:`LATENCY_COLUMNS` column."""
    sub = df
    for k, v in group.items():
        if k in sub:
            sub = sub[sub[k].astype(str) == str(v)]
    if "status" in sub:
        sub = sub[sub["status"].astype(str) == "ok"]
    out: dict[tuple[str, str], float] = {}
    for col in LATENCY_COLUMNS:
        if col in sub and len(sub):
            for cid, m in sub.groupby(sub["config_id"].astype(str))[col].median().items():
                out[(str(cid), col)] = float(m)
    return out


def p_best_estimable(rows: list[Any]) -> bool:
    """Whether P(best) means anything for a group: its leader and the runner-up have >= 2 ok repeats."""
    return len(rows) >= 2 and all(r.n_ok >= 2 for r in rows[:2])


def p_best_cell(r: Any, estimable: bool) -> str:
    """A row's P(best), or "n/e" (not estimable) where a single repeat makes it 1 or 0 by construction."""
    if r.p_best is None:
        return "<td class='st-p-best'>-</td>"
    if not estimable or r.n_ok < 2:
        return f"<td class='st-p-best' data-value='n/e' title='{esc(P_BEST_HELP)}'>n/e</td>"
    return f"<td class='st-p-best' data-value='{r.p_best:.2f}'>{r.p_best:.2f}</td>"


def compare_href(ctx: Context, a: str, b: str, group: dict[str, str]) -> str:
    """The link that opens Compare with configs ``a`` and ``b`` of ``group`` preselected."""
    from urllib.parse import urlencode

    q = {"page": "compare", "experiment": ctx.experiment or "", "a": a, "b": b,  # whole ids: a prefix can be shared
         "load_point": group.get("load_point", ""), "drift": ctx.arg("drift", "exclude")}
    return "?" + esc(urlencode({k: v for k, v in q.items() if v}))


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
