"""Browser tests: what travels with the data on every page (drift-suspect marks, the SYNTHETIC
banner) and the fixed defects of the Ranking, Pareto and Compare pages (issue 14).

``panel serve dashboards/`` is started as a user starts it on a results root of SYNTHETIC
experiments only (no vLLM): ``planted`` (:func:`tests.test_dashboard.build_planted`: two load
points, 2 repeats, baseline re-runs and a planted drift, so a real alarm marks trials suspect) and
``single`` (one repeat per trial and no baseline re-runs: drift cannot be checked, P(best) cannot be
estimated). Expected numbers come from :mod:`analysis` directly, never from the page. Screenshots
go to ``test-artifacts/dashboard-marks-*.png``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from tests import test_dashboard
from tests.test_dashboard import PAGE_TIMEOUT_MS, Page, build_planted, panel_served, write_dataset

TIMEOUT_MS = PAGE_TIMEOUT_MS


class Server:
    def __init__(self, port: int, root: Path) -> None:
        self.port, self.root = port, root

    def url(self, query: str) -> str:
        return f"http://127.0.0.1:{self.port}/dashboards?{query}"


def _build(folder: Path, repeats: int, seed: int) -> None:
    from analysis.synthetic import planted

    ds, _ = planted(n_configs=12, n_params=3, repeats=repeats, load_points=("lp",), fail_rate_region=0.0,
                    fail_rate_base=0.0, seed=seed)
    write_dataset(ds, folder, folder.name)


def _build_single(folder: Path) -> None:
    _build(folder, repeats=1, seed=3)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("marks") / "runs"
    build_planted(root / "planted")
    _build_single(root / "single")
    _build(root / "repeated", repeats=3, seed=4)
    log = tmp_path_factory.mktemp("marks-log") / "server.log"
    with panel_served(root, log) as (_, port):
        yield Server(port, root)


browser = test_dashboard.browser  # the same module-scoped chromium fixture


def _planted_truth(server: Server) -> tuple[int, int]:
    """(drift-suspect trials, non-baseline trials) of ``planted``, from analysis itself."""
    import analysis
    from analysis.drift import drift

    ds = analysis.load(server.root / "planted" / "results.nc")
    df = ds.sweep.table()
    res = drift(ds, metric="output_throughput")
    assert res.alarm and res.suspect, "the planted drift must raise an alarm for this test to mean anything"
    return len(res.suspect), int((~df["is_baseline"].astype(bool)).sum())


def _suspects(server: Server) -> set[str]:
    import analysis
    from analysis.drift import drift

    return set(drift(analysis.load(server.root / "planted" / "results.nc"), metric="output_throughput").suspect)


def _open(browser, server: Server, query: str, marker: str) -> Page:
    tab = Page(browser, server.url(query))
    tab.page.locator(marker).first.wait_for(state="attached", timeout=TIMEOUT_MS)
    return tab


@pytest.mark.parametrize("page", ["ranking", "pareto", "parameters", "compare"])
def test_drift_suspect_trials_are_marked_and_left_out_on_every_page(server: Server, browser, page: str) -> None:
    n_suspect, n_runs = _planted_truth(server)
    tab = _open(browser, server, f"page={page}&experiment=planted", ".st-drift-banner")
    try:
        assert tab.attr(".st-drift-banner", "data-suspect") == str(n_suspect)
        assert "left out" in tab.text(".st-drift-banner")
        assert tab.page.locator(".st-drift-mode").count() == 1, "no exclude / show-apart switch"
        if page == "ranking":  # counted from the table the ranking actually read
            assert tab.attr(".st-ranked-on", "data-left-out") == str(n_suspect)
            assert tab.attr(".st-ranked-on", "data-trials") == str(n_runs - n_suspect)
        if page == "compare":  # each side's repeats are its clean ok trials at the load point
            import analysis

            df = analysis.load(server.root / "planted" / "results.nc").sweep.table()
            df = df[~df["trial_id"].astype(str).isin(_suspects(server)) & (df["status"] == "ok")]
            for side in ("a", "b"):
                cfg, lp = tab.attr(".st-verdict", f"data-{side}"), tab.attr(".st-verdict", "data-lp")
                want = int(((df["config_id"] == cfg) & (df["load_point"].astype(str) == lp)).sum())
                assert tab.attr(".st-verdict", f"data-n-{side}") == str(want), side
        if page == "pareto":  # the front and the table read the clean trials only
            assert tab.attr(".st-pareto-summary", "data-trials") == str(n_runs - n_suspect)
            assert tab.attr(".st-table-note", "data-rows") == str(n_runs - n_suspect)
        tab.shot(f"marks-{page}-drift")
        assert not tab.page.locator(".st-error").count(), tab.text(".st-error")
        assert tab.errors == [], tab.errors
    finally:
        tab.close()


def test_show_apart_ranks_the_suspect_trials_on_their_own(server: Server, browser) -> None:
    n_suspect, _ = _planted_truth(server)
    tab = _open(browser, server, "page=ranking&experiment=planted", ".st-winner")
    try:
        assert not tab.page.locator(".st-apart").count()
        tab.page.locator(".st-drift-mode button", has_text="show them apart").click()
        tab.page.locator(".st-apart").first.wait_for(state="attached", timeout=TIMEOUT_MS)
        assert tab.attr(".st-apart", "data-suspect") == str(n_suspect)
        assert tab.attr(".st-ranked-on", "data-left-out") == str(n_suspect)  # the main ranking stays clean
        assert "drift=apart" in tab.page.url
        tab.shot("marks-ranking-apart")
        assert tab.errors == [], tab.errors
    finally:
        tab.close()


def test_drift_page_says_it_could_not_check_without_baseline_runs(server: Server, browser) -> None:
    tab = _open(browser, server, "page=drift&experiment=single", ".st-alarm")
    try:
        assert tab.attr(".st-alarm", "data-alarm") == "unchecked"
        assert "could not be checked" in tab.text(".st-alarm")
        assert "no drift alarm" not in tab.text(".st-alarm")
    finally:
        tab.close()
    tab = _open(browser, server, "page=ranking&experiment=single", ".st-drift-banner")
    try:  # and every other page says the same rather than "no drift-suspect trial"
        assert tab.attr(".st-drift-banner", "data-suspect") == "unchecked"
    finally:
        tab.close()


@pytest.mark.parametrize("page", ["experiments", "ranking", "pareto"])
def test_synthetic_experiments_carry_a_synthetic_banner(server: Server, browser, page: str) -> None:
    tab = _open(browser, server, f"page={page}&experiment=planted", ".st-title")
    try:
        tab.page.locator(".st-synthetic").first.wait_for(state="attached", timeout=TIMEOUT_MS)
        assert "SYNTHETIC" in tab.text(".st-synthetic")
    finally:
        tab.close()


def test_ranking_shows_latency_columns_and_no_p_best_from_single_repeats(server: Server, browser) -> None:
    tab = _open(browser, server, "page=ranking&experiment=single", ".st-winner")
    try:
        head = tab.text(".st-rank-table")
        assert "TTFT p99 (ms)" in head and "TPOT p99 (ms)" in head
        cells = [c.get_attribute("data-value") for c in tab.page.locator(".st-p-best").all()]
        assert cells and set(cells) == {"n/e"}, cells  # one repeat each: 1.00 / 0.00 would be an artefact
        assert "not estimable" in tab.text(".st-p-best-note")
    finally:
        tab.close()
    tab = _open(browser, server, "page=ranking&experiment=repeated", ".st-winner")
    try:  # three repeats each: a real P(best) in [0, 1]
        cells = [c.get_attribute("data-value") for c in tab.page.locator(".st-p-best").all()]
        assert any(v not in ("n/e", None) for v in cells), cells
    finally:
        tab.close()


def test_ranking_links_first_vs_second_to_compare(server: Server, browser) -> None:
    tab = _open(browser, server, "page=ranking&experiment=planted", ".st-winner")
    try:
        first = tab.attr(".st-winner", "data-config")
        second = tab.page.locator(".st-rank-table").first.locator(".st-rank-row").nth(1).get_attribute("data-config")
        tab.page.locator(".st-compare-link").first.click()
        tab.page.locator(".st-verdict").first.wait_for(state="attached", timeout=TIMEOUT_MS)
        q = parse_qs(urlparse(tab.page.url).query)
        assert q["page"] == ["compare"]
        assert q["a"] == [first] and q["b"] == [second]
        # the comparison is of exactly those two configs
        tab.wait_attr(".st-verdict", "data-a", lambda v: v == first)
        assert tab.attr(".st-verdict", "data-b") == second
        assert tab.errors == [], tab.errors
    finally:
        tab.close()


def test_weighted_policy_takes_the_users_weights(server: Server, browser) -> None:
    import analysis
    from analysis.ranking import rank

    ds = analysis.load(server.root / "single" / "results.nc")
    want = rank(ds, policy="weighted", weights={"ttft_ms_p99": 1.0}, n_boot=0).groups[0].rows[0].config_id
    default = rank(ds, policy="weighted", n_boot=0).groups[0].rows[0].config_id
    assert want != default, "the dataset must make the weights matter"
    tab = _open(browser, server, "page=ranking&experiment=single&policy=weighted", ".st-winner")
    try:
        assert tab.attr(".st-winner", "data-config") == default
        box = tab.page.locator(".st-weights input")
        box.fill("ttft_ms_p99=1")
        box.press("Enter")
        tab.wait_attr(".st-winner", "data-config", lambda v: v == want)
        box.fill("ttft_ms_p99=-1")
        box.press("Enter")
        tab.wait_text(".st-weights-refused", lambda t: "ttft_ms_p99=-1" in t)
    finally:
        tab.close()


# ------------------------------------------------------------------------------------- Pareto, Compare

#: the page's Bokeh models of a given type, read from BokehJS (what the browser draws)
_MODELS_JS = """(type) => {
  const out = [];
  for (const doc of Bokeh.documents) for (const m of doc.all_models) if (m.type === type) out.push(m);
  return out.map(m => ({label: m.axis_label ?? null, location: m.location ?? null, factors: m.factors ?? null,
                        palette: m.palette ?? null}));
}"""


def _models(tab: Page, type_: str) -> list[dict]:
    return list(tab.page.evaluate(_MODELS_JS, type_))


def _wait_models(tab: Page, type_: str, ok, timeout_s: float = 30.0) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    got: list[dict] = []
    while time.monotonic() < deadline:
        got = _models(tab, type_)
        if ok(got):
            return got
        tab.page.wait_for_timeout(250)
    raise AssertionError(f"{type_} models never satisfied the condition: {got}")


def test_pareto_colours_load_points_apart_with_units_and_slo_lines(server: Server, browser) -> None:
    tab = _open(browser, server, "page=pareto&experiment=planted", ".st-pareto-summary")
    try:
        axes = _wait_models(tab, "LinearAxis", lambda a: len(a) >= 2)
        labels = {a["label"] for a in axes}
        assert "output_throughput (tok/s)" in labels and "ttft_ms_p99 (ms)" in labels, labels
        mappers = [m for m in _models(tab, "CategoricalColorMapper") if m["factors"]]
        groups = [m for m in mappers if sorted(m["factors"]) == ["long sim-gpu-a", "short sim-gpu-a"]]
        assert groups, f"no colour per load point: {mappers}"
        assert len(set(groups[0]["palette"][:2])) == 2
        spans = [s["location"] for s in _models(tab, "Span")]
        assert 200.0 in spans, f"no SLO line at ttft_ms_p99 = 200 ms: {spans}"
        tab.shot("marks-pareto")
    finally:
        tab.close()


_SELECT_JS = """(prefix) => {
  // the points' source: the largest one with config columns (each front line has a smaller one)
  let best = null;
  for (const doc of Bokeh.documents) for (const m of doc.all_models)
    if (m.type === "ColumnDataSource" && m.data.group && m.data.config_id && m.data.repeats
        && (best === null || m.data.group.length > best.data.group.length)) best = m;
  if (best === null) return null;
  const g = Array.from(best.data.group);
  const i = g.findIndex(v => v.startsWith(prefix));
  best.selected.indices = [i];
  return [g[i], best.data.config_id[i], Number(best.data.repeats[i])];
}"""


def test_pareto_selection_lists_the_trials_of_the_selected_load_point_only(server: Server, browser) -> None:
    tab = _open(browser, server, "page=pareto&experiment=planted", ".st-pareto-summary")
    try:
        _wait_models(tab, "LinearAxis", lambda a: len(a) >= 2)
        tab.page.wait_for_timeout(1500)
        picked = tab.page.evaluate(_SELECT_JS, "long")
        assert picked is not None, "no point source on the page"
        group, config_id, repeats = picked
        assert group.startswith("long")
        tab.page.locator(".st-table-note", has_text="selected configs").wait_for(timeout=TIMEOUT_MS)
        # the point stands for its repeats at that load point: exactly those trials are listed
        assert int(tab.attr(".st-table-note", "data-rows")) == repeats
        lps = {c.inner_text().strip() for c in
               tab.page.locator(".tabulator-row .tabulator-cell[tabulator-field='load_point']").all()}
        assert lps == {"long"}, lps
        trial = tab.page.locator(".tabulator-row .tabulator-cell[tabulator-field='trial']").first.inner_text()
        assert 0 < len(trial.strip()) <= 12  # a 64-hex id is cut to 12 (synthetic ids are shorter)
        header = tab.text(".st-trials-table .tabulator-header")
        assert "output_throughput (tok/s)" in header and "ttft_ms_p99 (ms)" in header, header
        tab.shot("marks-pareto-selected")
        assert tab.errors == [], tab.errors
    finally:
        tab.close()


def test_pareto_table_labels_configs_by_what_differs(server: Server, browser) -> None:
    import analysis

    full = set(analysis.load(server.root / "planted" / "results.nc").sweep.table()["config_label"].astype(str))
    tab = _open(browser, server, "page=pareto&experiment=planted", ".st-table-note")
    try:
        cell = tab.page.locator(".tabulator-row .tabulator-cell[tabulator-field='config']").first
        cell.wait_for(timeout=TIMEOUT_MS)
        label = cell.inner_text().strip()
        assert label not in full and "=" in label, label  # not the full label: the differing parameters only
    finally:
        tab.close()


_FITS_JS = """(el) => {
  const ctx = document.createElement("canvas").getContext("2d");
  const style = getComputedStyle(el);
  ctx.font = style.font;
  const text = el.options[el.selectedIndex].text;
  const pad = parseFloat(style.paddingLeft) + parseFloat(style.paddingRight) + 24;  // the arrow
  return [ctx.measureText(text).width, el.clientWidth - pad, text];
}"""


def test_compare_pickers_lead_with_what_differs_and_the_ratio_axis_is_named(server: Server, browser) -> None:
    tab = _open(browser, server, "page=compare&experiment=planted", ".st-verdict")
    try:
        for picker in (".st-a select", ".st-b select"):  # the chosen label fits its picker: nothing cut off
            text_px, box_px, text = tab.page.locator(picker).first.evaluate(_FITS_JS)
            assert text_px <= box_px, f"{picker} cuts its label ({text_px:.0f} px in {box_px} px): {text}"
        axes = _wait_models(tab, "LinearAxis", lambda a: any(x["label"] for x in a))
        labels = {a["label"] for a in axes}
        assert "ratio of medians b / a" in labels and "y" not in labels, labels
        assert "output_throughput (tok/s)" in labels, labels
        tab.shot("marks-compare")
    finally:
        tab.close()


# ------------------------------------------------------------------------------------- layout

_SIZES_JS = "(el) => parseFloat(getComputedStyle(el).fontSize)"


def _heading_sizes(tab: Page) -> tuple[float, float]:
    title = tab.page.locator("h2.st-title").first
    title.wait_for(state="attached", timeout=TIMEOUT_MS)
    section = tab.page.locator("h4").first
    section.wait_for(state="attached", timeout=TIMEOUT_MS)
    return float(title.evaluate(_SIZES_JS)), float(section.evaluate(_SIZES_JS))


def test_heading_sizes_stay_put_across_navigation_and_refresh(server: Server, browser) -> None:
    tab = _open(browser, server, "page=ranking&experiment=planted", ".st-winner")
    try:
        tab.page.wait_for_timeout(1000)
        first = _heading_sizes(tab)
        tab.page.locator(".st-nav button", has_text="Pareto explorer").click()
        tab.page.locator(".st-pareto-summary").first.wait_for(state="attached", timeout=TIMEOUT_MS)
        tab.page.locator(".st-nav button", has_text="Ranking").click()
        tab.page.locator(".st-winner").first.wait_for(state="attached", timeout=TIMEOUT_MS)
        tab.page.wait_for_timeout(1000)
        after_nav = _heading_sizes(tab)
        tab.page.reload()
        tab.page.locator(".st-winner").first.wait_for(state="attached", timeout=TIMEOUT_MS)
        tab.page.wait_for_timeout(1000)
        after_reload = _heading_sizes(tab)
        assert first == after_nav == after_reload, (first, after_nav, after_reload)
        assert 20 <= first[0] <= 28 and first[1] <= first[0], first
    finally:
        tab.close()


_PLOTS_JS = """() => {
  const ctx = document.createElement("canvas").getContext("2d");
  const out = [];
  for (const doc of Bokeh.documents) for (const m of doc.all_models) {
    if (!m.title || typeof m.title.text !== "string" || !m.title.text || !m.width) continue;
    const t = m.title;
    ctx.font = `${t.text_font_style} ${t.text_font_size} ${t.text_font}`;
    out.push({title: t.text, text_px: ctx.measureText(t.text).width, inner: m.inner_width ?? m.width,
              y: [m.y_range.start, m.y_range.end], log_x: m.x_scale.type === "LogScale"});
  }
  return out;
}"""


def _parameters_page(browser, server: Server, query: str) -> tuple[Page, list[dict]]:
    tab = _open(browser, server, f"page=parameters&experiment=planted&{query}", ".st-drift-banner")
    for section in ("failure", "pd", "interactions", "importance"):
        tab.page.locator(f"[data-section='{section}'].st-section-done").first.wait_for(state="attached", timeout=240_000)
    tab.page.wait_for_timeout(1500)
    return tab, list(tab.page.evaluate(_PLOTS_JS))


def test_parameters_log_axes_whole_titles_and_a_pointer_to_the_strong_interaction(server: Server, browser) -> None:
    tab, plots = _parameters_page(browser, server, "pd=max_num_batched_tokens")
    try:
        assert plots, "no titled plot on the page"
        for p in plots:  # every title fits its plot (a cut title read "...held-out R²) o")
            assert p["text_px"] <= p["inner"], p
        pd_plot = next(p for p in plots if p["title"].startswith("partial dependence"))
        assert pd_plot["log_x"], "max_num_batched_tokens (512..8192, powers of two) must be on a log axis"
        # the planted interaction: its main effect points to it
        pointer = tab.page.locator(".st-interaction-pointer[data-param='max_num_batched_tokens']").first
        pointer.wait_for(state="attached", timeout=TIMEOUT_MS)
        assert pointer.get_attribute("data-partner") == "enable_chunked_prefill"
        tab.shot("marks-parameters")
        assert tab.errors == [], tab.errors
    finally:
        tab.close()


def test_partial_dependence_of_a_small_effect_is_not_stretched_to_fill_the_plot(server: Server, browser) -> None:
    from dashboards.app.parameters import MIN_Y_SPAN

    tab, plots = _parameters_page(browser, server, "pd=block_size")
    try:
        pd_plot = next(p for p in plots if p["title"].startswith("partial dependence"))
        lo, hi = pd_plot["y"]
        mid = (lo + hi) / 2
        assert hi - lo >= 2 * MIN_Y_SPAN * abs(mid) * 0.99, (lo, hi)
    finally:
        tab.close()


def test_holes_created_and_warning_codes_are_explained_in_place(server: Server, browser) -> None:
    from dashboards.app.codes import MEANING

    tab = _open(browser, server, "page=experiments&experiment=planted", ".st-experiments")
    try:
        assert "never measured" in tab.text(".st-holes-help")
        # a results.nc-only experiment: its time is when that file was written, and the cell says so
        assert "(results written)" in tab.text("tr[data-exp='planted'] td.st-created") or \
            tab.attr("tr[data-exp='planted'] td.st-created", "data-us") == "0"
    finally:
        tab.close()
    tab = _open(browser, server, "page=ranking&experiment=single", ".st-winner")
    try:
        boxes = tab.page.locator(".st-warn[data-code]").all()
        assert boxes, "the single-repeat ranking must carry caveats"
        for box in boxes:
            code = str(box.get_attribute("data-code"))
            if code in MEANING:
                assert MEANING[code] in box.inner_text(), (code, box.inner_text())
        assert tab.page.locator(".st-code-help").count() >= 1
    finally:
        tab.close()
