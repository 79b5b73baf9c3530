"""The static report, opened the way a person opens it: a file:// URL in a real browser (Debian's
chromium through playwright) with the network off and every request recorded.

The report must load with zero requests beyond the file itself, no console error, a drawn plot and
the ranking's winner on the page, for the real vLLM sweep (``e2e_sweep``) and for a SYNTHETIC
planted experiment. The same check must fail on a plain ``panel ... .save(resources=INLINE)``
export, which still fetches CSS from a CDN, so the check can fail. Screenshots go to test-artifacts/.
Runtime: about 60 s on 2 cores (plus the shared sweep when it has not run yet).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, Route, expect, sync_playwright

import analysis
from analysis.ranking import rank
from analysis.synthetic import planted
from dashboards.report import OfflineError, external_references, make_offline
from servetune.netcdf import write_netcdf
from tests.conftest import ARTIFACTS, SweepRun, coordinator_cmd

CHROMIUM = "/usr/bin/chromium"
TIMEOUT_MS = 30_000


@dataclass
class Visit:
    """What a page did when opened offline: every request the browser tried, console errors,
    uncaught page errors, and the page itself (still open) for further checks."""

    url: str
    page: Page
    requests: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)

    @property
    def outside_requests(self) -> list[str]:
        return [u for u in self.requests if u != self.url]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"], timeout=TIMEOUT_MS)
        try:
            yield b
        finally:
            b.close()


@contextlib.contextmanager
def open_offline(browser: Browser, path: Path, settle_ms: int = 2000) -> Iterator[Visit]:
    """Open ``path`` with the network off; every request is recorded and only the file itself is
    let through. The browser context closes when the caller's block ends."""
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    context.set_offline(True)
    url = path.resolve().as_uri()
    page = context.new_page()
    visit = Visit(url, page)

    def route(r: Route) -> None:
        visit.requests.append(r.request.url)
        if r.request.url == url:
            r.continue_()
        else:
            r.abort()

    context.route("**/*", route)
    page.on("console", lambda m: visit.console_errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: visit.page_errors.append(str(e)))
    page.on("requestfailed", lambda r: visit.requests.append(r.url) if r.url not in visit.requests else None)
    try:
        page.goto(url, wait_until="load", timeout=TIMEOUT_MS)
        page.wait_for_timeout(settle_ms)  # style sheets and lazy loads start after the document renders
        yield visit
    finally:
        context.close()


def _report(args: list[str], tmp: Path, name: str) -> Path:
    out = tmp / name
    proc = subprocess.run([*args, "--out", str(out), "--n-boot", "20"], capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out.is_file() and not [p for p in tmp.iterdir() if p.name.endswith(".tmp")]
    assert "report [1/" in proc.stderr and "report: rendering the page" in proc.stderr, proc.stderr[-2000:]
    return out


def _check_offline_report(browser: Browser, path: Path, winner_label: str, screenshot: str) -> Visit:
    with open_offline(browser, path) as visit:
        page = visit.page
        canvas = page.locator("canvas").first
        expect(canvas).to_be_visible(timeout=TIMEOUT_MS)
        box = canvas.bounding_box()
        assert box and box["width"] > 200 and box["height"] > 200, box
        expect(page.locator("p.winner", has_text=winner_label).first).to_be_visible(timeout=TIMEOUT_MS)
        expect(page.locator("pre", has_text="vllm serve").first).to_be_visible(timeout=TIMEOUT_MS)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / screenshot), full_page=True, timeout=TIMEOUT_MS)
        assert visit.outside_requests == [], f"the report made requests: {visit.outside_requests}"
        assert visit.requests.count(visit.url) == 1, visit.requests
        assert visit.console_errors == [] and visit.page_errors == [], (visit.console_errors, visit.page_errors)
    return visit


def _winner(ds: object) -> tuple[str, str]:
    result = rank(ds, policy="slo_throughput", n_boot=0)  # type: ignore[arg-type]
    groups = [g for g in result.groups if g.rows]
    return groups[0].rows[0].label, groups[0].rows[0].config_id


@pytest.mark.vllm  # e2e_sweep starts a real vLLM server
def test_report_of_the_real_sweep_opens_offline(e2e_sweep: SweepRun, browser: Browser, tmp_path: Path) -> None:
    out = _report(coordinator_cmd("report", "e2e", "--results-root", str(e2e_sweep.root)), tmp_path, "e2e.html")
    page = out.read_text(encoding="utf-8")
    assert external_references(page) == []
    label, _ = _winner(analysis.load("e2e", e2e_sweep.root))
    _check_offline_report(browser, out, label, "report-e2e.png")
    assert "vllm serve ./tiny-model" in page and "--max-num-seqs" in page
    assert "spec hash" in page and "0.32" in page  # provenance: vLLM version of the real run


def test_report_of_planted_data_opens_offline(browser: Browser, tmp_path: Path) -> None:
    ds, truth = planted(n_configs=120, n_params=6, repeats=2, seed=11)
    nc = tmp_path / "results.nc"
    write_netcdf(ds, nc)
    out = _report([sys.executable, "-m", "dashboards", "report", str(nc)], tmp_path, "planted.html")
    label, _ = _winner(ds)
    with open_offline(browser, out) as visit:
        expect(visit.page.get_by_text("SYNTHETIC DATA").first).to_be_visible(timeout=TIMEOUT_MS)
        # importance: the planted strong effect is found and says so next to its interval
        row = visit.page.locator("tr", has_text="max_num_seqs").filter(has_text="important").first
        expect(row).to_be_visible(timeout=TIMEOUT_MS)
        expect(visit.page.get_by_text("Failure map").first).to_be_visible(timeout=TIMEOUT_MS)
        expect(visit.page.get_by_text("worded as").first).to_be_visible(timeout=TIMEOUT_MS)
    _check_offline_report(browser, out, label, "report-planted.png")
    assert truth.important[0] == "max_num_seqs"


def test_the_offline_check_fails_on_a_plain_inline_export(browser: Browser, tmp_path: Path) -> None:
    import holoviews as hv  # type: ignore[import-untyped]
    import panel as pn
    from bokeh.resources import INLINE

    hv.extension("bokeh", logo=False)
    plain = tmp_path / "plain.html"
    pn.Column("# plain", pn.pane.HoloViews(hv.Scatter([(1, 2), (2, 3)]), backend="bokeh")).save(
        str(plain), resources=INLINE)
    page = plain.read_text(encoding="utf-8")
    assert any("cdn.holoviz.org" in u for u in external_references(page))
    with open_offline(browser, plain) as visit:
        visit.page.screenshot(path=str(ARTIFACTS / "report-plain-inline-export.png"), timeout=TIMEOUT_MS)
        assert visit.outside_requests, "a plain INLINE export fetches CSS from the CDN: the checker must see it"
        assert any("cdn.holoviz.org" in u for u in visit.outside_requests), visit.outside_requests
    # and the same page, made offline, passes the same check
    fixed = tmp_path / "fixed.html"
    fixed.write_text(make_offline(page), encoding="utf-8")
    with open_offline(browser, fixed) as visit:
        expect(visit.page.locator("canvas").first).to_be_visible(timeout=TIMEOUT_MS)
        assert visit.outside_requests == [] and visit.console_errors == [], (visit.outside_requests,
                                                                              visit.console_errors)


def test_make_offline_refuses_a_style_sheet_it_cannot_find() -> None:
    doc = {"x": {"version": "3", "roots": [{"type": "object", "name": "ImportedStyleSheet", "id": "p1",
                                            "attributes": {"url": "https://example.com/theme.css"}}]}}
    page = f'<html><script type="application/json" id="a">{json.dumps(doc)}</script></html>'
    with pytest.raises(OfflineError, match="example.com/theme.css"):
        make_offline(page)


def test_bad_experiment_exits_2_naming_it_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    proc = subprocess.run(coordinator_cmd("report", "no-such-experiment", "--results-root", str(tmp_path),
                                          "--out", str(out)), capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "no-such-experiment" in proc.stderr
    assert list(tmp_path.iterdir()) == []
