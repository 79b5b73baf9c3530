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

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from tests.test_dashboard import (
    CHROMIUM,
    PAGE_TIMEOUT_MS,
    REPO,
    SERVE_DEADLINE_S,
    Page,
    _free_port,
    build_planted,
    write_dataset,
)

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
    port = _free_port()
    env = dict(os.environ, SERVETUNE_RESULTS_ROOT=str(root), PYTHONUNBUFFERED="1")
    log = tmp_path_factory.mktemp("marks-log") / "server.log"
    panel = str(Path(sys.executable).with_name("panel"))
    with open(log, "wb") as fh:
        proc = subprocess.Popen([panel, "serve", "dashboards/", "--port", str(port), "--address", "127.0.0.1",
                                 f"--allow-websocket-origin=127.0.0.1:{port}"],
                                cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + SERVE_DEADLINE_S
        while True:
            assert proc.poll() is None, f"panel serve exited with {proc.returncode}: {log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/dashboards", timeout=30) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"panel serve did not serve within {SERVE_DEADLINE_S} s"
            time.sleep(0.5)
        yield Server(port, root)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def browser() -> Iterator:
    playwright = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: the browser tests need Debian's chromium")
    with playwright.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def _planted_truth(server: Server) -> tuple[int, int]:
    """(drift-suspect trials, non-baseline trials) of ``planted``, from analysis itself."""
    import analysis
    from analysis.drift import drift

    ds = analysis.load(server.root / "planted" / "results.nc")
    df = ds.sweep.table()
    res = drift(ds, metric="output_throughput")
    assert res.alarm and res.suspect, "the planted drift must raise an alarm for this test to mean anything"
    return len(res.suspect), int((~df["is_baseline"].astype(bool)).sum())


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
        if page == "ranking":
            assert tab.attr(".st-ranked-on", "data-left-out") == str(n_suspect)
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
        assert first.startswith(q["a"][0]) and str(second).startswith(q["b"][0])
        text = tab.text(".st-verdict + div")
        assert "a = " in text and "b = " in text
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
        tab.page.locator(".st-weights-refused").first.wait_for(state="attached", timeout=TIMEOUT_MS)
        assert "ttft_ms_p99=-1" in tab.text(".st-weights-refused")
    finally:
        tab.close()
