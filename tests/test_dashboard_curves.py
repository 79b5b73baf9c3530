"""Browser test of the Load curves page (issue 14, "the views users already know").

``panel serve dashboards/`` over a results root of SYNTHETIC experiments with load levels
(:func:`analysis.synthetic.planted` with ``load_levels``: 7 concurrencies and 6 request rates, a
planted saturation per config, :meth:`analysis.synthetic.Truth.saturation`): ``curves`` (3 repeats)
and ``single`` (1 repeat). The page's Bokeh models are read in the browser (the sources of each
line, the knee marks, the SLO spans, the axis labels); expected numbers come from :mod:`analysis`
and the planted truth, never from the page. Screenshots: ``test-artifacts/dashboard-curves-*.png``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests import test_dashboard
from tests.test_dashboard import PAGE_TIMEOUT_MS, Page, panel_served, write_dataset
from tests.test_dashboard_marks import _MODELS_JS

CONC = (1, 2, 4, 8, 16, 32, 64)
RATES = (1, 2, 4, 8, 16, 32)
LEVELS = {f"c{c}": ("concurrency", float(c)) for c in CONC} | {f"r{r}": ("rate", float(r)) for r in RATES}

#: every named ColumnDataSource of the page: its name and its columns xs, ys (lists of lists), x, y, config
_SOURCES_JS = """() => {
  const out = [];
  for (const doc of Bokeh.documents) for (const m of doc.all_models) {
    if (m.type !== 'ColumnDataSource' || !m.name) continue;
    const d = m.data, get = (k) => Array.from((d instanceof Map ? d.get(k) : d[k]) ?? []);
    out.push({name: m.name, xs: get('xs').map(a => Array.from(a)), ys: get('ys').map(a => Array.from(a)),
              x: get('x'), y: get('y'), config: get('config')});
  }
  return out;
}"""


def _planted(repeats: int, seed: int) -> tuple[Any, Any]:
    from analysis.synthetic import planted

    return planted(n_configs=7, params=["max_num_seqs"], design="grid", repeats=repeats, load_levels=LEVELS,
                   fail_rate_base=0.0, fail_rate_region=0.0, seed=seed)


class Server:
    def __init__(self, port: int, root: Path, truth: Any) -> None:
        self.port, self.root, self.truth = port, root, truth

    def url(self, query: str) -> str:
        return f"http://127.0.0.1:{self.port}/dashboards?{query}"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("curves") / "runs"
    ds, truth = _planted(3, seed=1)
    write_dataset(ds, root / "curves", "curves")
    write_dataset(_planted(1, seed=2)[0], root / "single", "single")
    log = tmp_path_factory.mktemp("curves-log") / "server.log"
    with panel_served(root, log) as (_, port):
        yield Server(port, root, truth)


browser = test_dashboard.browser  # the same module-scoped chromium fixture


def _open(browser, server: Server, query: str) -> Page:
    tab = Page(browser, server.url(query))
    tab.page.locator(".st-knees").first.wait_for(state="attached", timeout=PAGE_TIMEOUT_MS)
    return tab


def _sources(tab: Page, n_min: int, timeout_s: float = 30.0) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    got: list[dict] = []
    while time.monotonic() < deadline:
        got = list(tab.page.evaluate(_SOURCES_JS))
        if sum(s["name"].startswith("lines|") for s in got) >= n_min:
            return got
        tab.page.wait_for_timeout(250)
    raise AssertionError(f"the page never drew {n_min} curves: {[s['name'] for s in got]}")


def _models(tab: Page, type_: str) -> list[dict]:
    return list(tab.page.evaluate(_MODELS_JS, type_))


def _max_num_seqs(config_id: str) -> int:
    return int(config_id.split(": ")[1].rstrip("}"))


def test_one_line_per_config_with_the_planted_knees_and_slo_lines(server: Server, browser) -> None:
    import analysis
    from analysis.curves import curves

    df = analysis.load(server.root / "curves" / "results.nc").sweep.table()
    rate, conc = curves(df, ["output_throughput"])
    tab = _open(browser, server, "page=curves&experiment=curves")
    try:
        got = _sources(tab, 2 * 4)
        lines_of = {}
        for si, s in enumerate((rate, conc)):
            src = next(g for g in got if g["name"] == f"lines|{si}|output_throughput")
            assert sorted(src["config"]) == sorted(s.config_ids), src["config"]  # one line per config, each once
            lines_of[si] = {cid: (x, y) for cid, x, y in zip(src["config"], src["xs"], src["ys"])}
            for i, cid in enumerate(s.config_ids):
                assert lines_of[si][cid][0] == s.loads.tolist()
                assert np.allclose(lines_of[si][cid][1], s.medians["output_throughput"][i], rtol=1e-9)
        # the closed-loop numbers are the planted ones: capacity x min(1, N / max_num_seqs), 5% noise
        for cid, (_, ys) in lines_of[1].items():
            cap = np.exp(server.truth.log_throughput({"max_num_seqs": _max_num_seqs(cid)}))
            planted = cap * np.minimum(1.0, np.asarray(CONC) / _max_num_seqs(cid))
            assert np.allclose(ys, planted, rtol=0.2), (cid, ys, planted)
        # knees: closed loop exactly where the planted throughput stops growing (max_num_seqs); none where
        # that is at or past the last concurrency measured
        ksrc = {si: next((g for g in got if g["name"] == f"knees|{si}"), {"x": [], "config": []}) for si in (0, 1)}
        knees = dict(zip(ksrc[1]["config"], ksrc[1]["x"]))
        for cid in conc.config_ids:
            sat = server.truth.saturation({"max_num_seqs": _max_num_seqs(cid)}, "concurrency")
            want = sat if sat < max(CONC) else None
            assert knees.get(cid) == want, (cid, knees.get(cid), want)
            cell = tab.page.locator(f".st-knee[data-series='1'][data-config='{cid}']").first
            assert cell.get_attribute("data-load") == ("" if want is None else f"{want:g}")
        # open loop: at the rate level bracketing the planted capacity
        assert ksrc[0]["x"], "no open-loop knee: every planted capacity lies inside the rates measured"
        for cid, x in zip(ksrc[0]["config"], ksrc[0]["x"]):
            sat = server.truth.saturation({"max_num_seqs": _max_num_seqs(cid)}, "rate")
            assert x in (max(r for r in RATES if r <= sat), min(r for r in RATES if r >= sat)), (cid, x, sat)
        assert any(g["name"].startswith("intervals|") for g in got)  # 3 repeats: error bars
        spans = [m["location"] for m in _models(tab, "Span")]
        assert spans.count(200.0) == 2, f"one TTFT p99 SLO line per series: {spans}"
        labels = {m["label"] for t in ("LinearAxis", "LogAxis") for m in _models(tab, t)}
        for want_label in ("output_throughput (tok/s)", "ttft_ms_p99 (ms)", "tpot_ms_p99 (ms)", "e2el_ms_p99 (ms)",
                           "request rate (req/s)", "concurrency (requests in flight)"):
            assert want_label in labels, labels
        assert "knee:" in tab.text(".st-knee-rule")
        assert not tab.page.locator(".st-single-repeat").count()
        tab.page.wait_for_timeout(1000)
        tab.shot("curves")
        assert not tab.page.locator(".st-error").count(), tab.text(".st-error")
        assert tab.errors == [], tab.errors
    finally:
        tab.close()


def test_single_repeat_says_so_and_p50_moves_the_slo_to_a_note(server: Server, browser) -> None:
    tab = _open(browser, server, "page=curves&experiment=single&pct=p50")
    try:
        got = _sources(tab, 2 * 4)
        assert "single repeat: no interval" in tab.text(".st-single-repeat")
        assert not [g for g in got if g["name"].startswith("intervals|")]  # no band drawn from one trial
        assert any(g["name"] == "lines|0|ttft_ms_p50" for g in got)
        assert 200.0 not in [m["location"] for m in _models(tab, "Span")]  # the p99 SLO is not drawn on p50
        assert "ttft_ms_p99" in tab.text(".st-slo-elsewhere")
        tab.page.wait_for_timeout(1000)
        tab.shot("curves-single")
        assert tab.errors == [], tab.errors
    finally:
        tab.close()


def test_drift_suspect_trials_are_left_out_of_the_curves_and_drawn_apart(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """No browser: the page built in a Bokeh document (as a session's first request builds it) on a
    planted drift with ``?drift=apart``; the suspect trials are in no median and drawn on their own."""
    from bokeh.document import Document
    from panel.io.state import set_curdoc

    from analysis.curves import curves
    from analysis.synthetic import planted

    ds, _ = planted(n_configs=7, params=["max_num_seqs"], design="grid", repeats=3, load_levels=LEVELS,
                    fail_rate_base=0.0, fail_rate_region=0.0, baseline_every=20, drift_at=0.6, drift_size=-0.3, seed=1)
    write_dataset(ds, tmp_path / "drifted", "drifted")
    monkeypatch.setenv("SERVETUNE_RESULTS_ROOT", str(tmp_path))
    from dashboards.app import App
    from dashboards.app.marks import drift_marks

    marks = drift_marks(tmp_path / "drifted")
    assert marks.checked and marks.suspect, "the planted drift must mark trials for this test to mean anything"
    doc = Document()
    with set_curdoc(doc):
        app = App({"page": "curves", "experiment": "drifted", "drift": "apart"}, live=False)
        app.template().server_doc(doc)
    sources = {m.name: m for m in doc.models if getattr(m, "name", None)}
    apart = sources["suspect|output_throughput"]
    assert len(apart.data["x"]) > 0 and set(apart.data["config"]) <= set(ds["config_id"].values.tolist())
    df = ds.sweep.table()
    clean = curves(df[~df["trial_id"].isin(marks.suspect)], ["output_throughput"])
    lines = sources["lines|0|output_throughput"]
    for cid, ys in zip(lines.data["config"], lines.data["ys"]):
        i = clean[0].config_ids.index(cid)
        want = clean[0].medians["output_throughput"][i]
        assert np.allclose(ys, want[np.isfinite(want)]), cid
    banner = app.current.drift.objects[0].object  # the banner of dashboards.app.marks, with its count
    assert f"data-suspect='{len(marks.suspect)}'" in banner and "drawn apart" in banner, banner
