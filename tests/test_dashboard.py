"""Browser tests of the dashboard: ``panel serve dashboards/`` started as a user starts it, driven
by Debian's chromium through playwright.

The results root holds the REAL ``e2e`` experiment (the shared vLLM CPU sweep, copied) and two
SYNTHETIC experiments written as a bare ``results.nc`` (no store; the dashboard lists any folder
with ``experiment.sqlite`` or ``results.nc``): ``planted`` (``analysis.synthetic.planted`` with
baseline re-runs and a planted drift) and ``slo-trap``, where the config with the highest throughput
misses the TTFT SLO but has the best goodput, so ``slo_throughput`` and ``goodput`` must crown
different winners. One server serves every test (module scope) and is killed with its process
group at teardown. Screenshots of each page go to ``test-artifacts/dashboard-*.png``.

Runtime: about 1.5-2.5 min on 2 cores after the shared sweep (which other tests also use).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from servetune.netcdf import write_netcdf
from tests.conftest import cli_env, coordinator_cmd

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
SERVE_DEADLINE_S = 90.0
#: a deadline for anything a page shows, background computations included: it only costs time when a test
#: fails, so it is sized for the slowest CI machine seen (60 s ran out there on a bootstrapped ranking)
PAGE_TIMEOUT_MS = 150_000

pytestmark = [pytest.mark.vllm]


# ------------------------------------------------------------------------------------- synthetic data


def write_dataset(ds: xr.Dataset, folder: Path, name: str) -> Path:
    """Write ``ds`` as ``folder/results.nc`` atomically (as the coordinator does), named ``name``."""
    folder.mkdir(parents=True, exist_ok=True)
    ds = ds.assign_coords(experiment=("trial", np.full(ds.sizes["trial"], name, dtype=object)))
    ds.attrs["experiment"] = name
    tmp = folder / ".results.nc.tmp"
    write_netcdf(ds, tmp)
    os.replace(tmp, folder / "results.nc")
    return folder / "results.nc"


def build_planted(folder: Path, n_configs: int = 40, seed: int = 1) -> xr.Dataset:
    """A SYNTHETIC experiment with two load points, repeats, baseline re-runs and a planted drift."""
    from analysis.synthetic import planted

    ds, _ = planted(n_configs=n_configs, n_params=6, repeats=2, load_points=("short", "long"), baseline_every=10,
                    drift_at=0.6, drift_size=-0.3, seed=seed)
    write_dataset(ds, folder, folder.name)
    return ds


def build_slo_trap(folder: Path) -> tuple[str, str]:
    """A SYNTHETIC experiment whose throughput winner misses the TTFT p99 SLO (200 ms) but has the
    best goodput. Returns (the throughput/goodput winner's label, the SLO-respecting winner's label)."""
    from analysis.synthetic import planted

    ds, _ = planted(n_configs=8, n_params=3, repeats=3, noise=0.02, fail_rate_region=0.0, fail_rate_base=0.0,
                    seed=2)
    df = ds.sweep.table()
    med = df.groupby("config_id")["output_throughput"].median().sort_values(ascending=False)
    fast, second = str(med.index[0]), str(med.index[1])
    is_fast = (df["config_id"] == fast).to_numpy()
    ttft = ds["ttft_ms"].values.copy()
    ttft[:, 3] = np.where(is_fast, 5000.0, 100.0)  # p99: the fast config misses 200 ms, every other meets it
    goodput = ds["request_throughput"].values * np.where(is_fast, 1.0, 0.5)
    ds = ds.assign(ttft_ms=(("trial", "quantile"), ttft), request_goodput=("trial", goodput))
    write_dataset(ds, folder, folder.name)
    labels = df.drop_duplicates("config_id").set_index("config_id")["config_label"]
    return str(labels[fast]), str(labels[second])


def build_big(folder: Path) -> xr.Dataset:
    """A SYNTHETIC experiment with more configs than the Pareto explorer plots as points (it
    rasterises them with datashader above ``DATASHADE_ABOVE``)."""
    from analysis.synthetic import planted
    from dashboards.app.pareto import DATASHADE_ABOVE

    # 12 parameters so that nearly every config is distinct (about 23,600 of 24,000), none failing
    ds, _ = planted(n_configs=DATASHADE_ABOVE + 4_000, n_params=12, fail_rate_region=0.0, fail_rate_base=0.0, seed=5)
    write_dataset(ds, folder, folder.name)
    return ds


# ------------------------------------------------------------------------------------- the server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    """A running ``panel serve dashboards/`` and what the tests planted."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, root: Path, trap: tuple[str, str], log: Path):
        self.proc, self.port, self.root, self.trap, self.log = proc, port, root, trap, log

    def url(self, query: str = "") -> str:
        return f"http://127.0.0.1:{self.port}/dashboards" + (f"?{query}" if query else "")


@pytest.fixture(scope="module")
def served(e2e_sweep, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    assert e2e_sweep.proc.returncode == 0, e2e_sweep.proc.stderr[-3000:]
    root = tmp_path_factory.mktemp("dash") / "runs"
    shutil.copytree(e2e_sweep.folder, root / "e2e")
    build_planted(root / "planted")
    build_big(root / "big")
    trap = build_slo_trap(root / "slo-trap")
    log = ARTIFACTS / "dashboard-server.log"
    with panel_served(root, log) as (proc, port):
        yield Served(proc, port, root, trap, log)


@contextlib.contextmanager
def panel_served(root: Path, log: Path, address: str | None = "127.0.0.1", extra: Sequence[str] = (),
                 env_extra: dict[str, str] | None = None) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``panel serve dashboards/`` on a free loopback port over the results root ``root``, output
    to ``log``, once it answers; killed with its process group when the block ends. ``address``
    None passes no ``--address`` (the dashboard's own default); ``extra`` are more options."""
    port = _free_port()
    env = dict(os.environ, SERVETUNE_RESULTS_ROOT=str(root), PYTHONUNBUFFERED="1", **(env_extra or {}))
    log.parent.mkdir(exist_ok=True)
    panel = str(Path(sys.executable).with_name("panel"))
    where = [] if address is None else ["--address", address, f"--allow-websocket-origin={address}:{port}"]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [panel, "serve", "dashboards/", "--port", str(port), *where, *extra],
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
        yield proc, port
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


class Page:
    """A browser tab that records console errors and uncaught page errors."""

    def __init__(self, browser, url: str):
        self.errors: list[str] = []
        self.page = browser.new_page(viewport={"width": 1500, "height": 1100})
        self.page.set_default_timeout(PAGE_TIMEOUT_MS)
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        # with the top of the stack, so a failure in CI says where in BokehJS it came from
        self.page.on("pageerror", lambda e: self.errors.append(
            f"page error: {e}" + "".join(f"\n  {line.strip()}" for line in (getattr(e, "stack", "") or "").splitlines()[1:6])))
        self.page.goto(url, timeout=PAGE_TIMEOUT_MS)

    def text(self, selector: str) -> str:
        loc = self.page.locator(selector).first
        loc.wait_for(state="attached", timeout=PAGE_TIMEOUT_MS)
        return str(loc.inner_text())

    def attr(self, selector: str, name: str) -> str:
        loc = self.page.locator(selector).first
        loc.wait_for(state="attached", timeout=PAGE_TIMEOUT_MS)
        return str(loc.get_attribute(name))

    def wait_attr(self, selector: str, name: str, ok, timeout_s: float = PAGE_TIMEOUT_MS / 1000) -> str:
        """Wait until ``ok(value)`` for the attribute of the first match; returns the value."""
        deadline = time.monotonic() + timeout_s
        value = ""
        while time.monotonic() < deadline:
            loc = self.page.locator(selector)
            if loc.count():
                value = str(loc.first.get_attribute(name))
                if ok(value):
                    return value
            self.page.wait_for_timeout(250)
        raise AssertionError(f"{selector}[{name}] never satisfied the condition; last value {value!r}")

    def wait_text(self, selector: str, ok, timeout_s: float = PAGE_TIMEOUT_MS / 1000) -> str:
        """Wait until ``ok(text)`` for the first match's text; returns the text.

        An element can be attached before Panel has filled it in, so a single read may see ''.
        """
        deadline = time.monotonic() + timeout_s
        text = ""
        while time.monotonic() < deadline:
            loc = self.page.locator(selector)
            if loc.count():
                text = str(loc.first.text_content() or "")
                if ok(text):
                    return text
            self.page.wait_for_timeout(250)
        raise AssertionError(f"{selector} text never satisfied the condition; last text {text!r}")

    def drag_on_plot(self, x0: float, y0: float, x1: float, y1: float) -> None:
        """Drag with the mouse across the first plot canvas, from ``(x0, y0)`` to ``(x1, y1)`` as
        fractions of its box (the canvas also holds the title and axes: a drag meant for the frame
        must start inside it)."""
        canvas = self.page.locator("canvas").first
        canvas.wait_for(state="visible", timeout=PAGE_TIMEOUT_MS)
        self.page.wait_for_timeout(1500)  # let BokehJS attach its tools
        box = canvas.bounding_box()
        assert box is not None
        self.page.mouse.move(box["x"] + x0 * box["width"], box["y"] + y0 * box["height"])
        self.page.mouse.down()
        self.page.mouse.move(box["x"] + x1 * box["width"], box["y"] + y1 * box["height"], steps=10)
        self.page.mouse.up()

    def shot(self, name: str) -> None:
        ARTIFACTS.mkdir(exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / f"dashboard-{name}.png"), full_page=True)

    def close(self) -> None:
        self.page.close()


# ------------------------------------------------------------------------------------- tests

#: every page of the dashboard (its key in ``dashboards.app.PAGES``): the marker its content shows when
#: it has loaded, and the experiment it is shot on (``test-artifacts/dashboard-PAGE-EXPERIMENT.png``)
PAGES = {
    "decision": (".st-decision", "planted"),
    "curves": (".st-series, .st-curves-empty", "e2e"),
    "history": (".st-views-done, .st-views-refused", "e2e"),
    "experiments": (".st-experiments", "e2e"),
    "pareto": (".st-pareto-summary", "e2e"),
    "parameters": (".st-progress-text, .st-section-done", "planted"),
    "compare": (".st-verdict", "planted"),
    "inspector": (".st-server-log", "e2e"),
    "ranking": (".st-winner", "e2e"),
    "drift": (".st-alarm", "planted"),
}


@pytest.mark.parametrize("page", list(PAGES))
def test_every_page_loads_without_console_errors(served: Served, browser, page: str) -> None:
    marker, exp = PAGES[page]
    tab = Page(browser, served.url(f"page={page}&experiment={exp}"))
    try:
        try:
            tab.page.locator(marker).first.wait_for(state="attached", timeout=PAGE_TIMEOUT_MS)
        except Exception as exc:  # say what the page showed instead, and what the server logged
            # Panel renders into shadow roots, which body.inner_text() does not enter; locators do
            body = "\n".join(tab.page.locator(".st-title, .st-progress-text, .st-warn, .st-error").all_inner_texts())[-2000:]
            server = served.log.read_text(encoding="utf-8", errors="replace")[-3000:]
            raise AssertionError(f"{marker} never appeared ({type(exc).__name__}); the page showed:\n{body}\n"
                                 f"console errors: {tab.errors}\nserver log tail:\n{server}") from exc
        if page == "parameters":  # four background analyses: each replaces its progress text when done
            for section in ("failure", "pd", "interactions", "importance"):
                tab.page.locator(f"[data-section='{section}'].st-section-done").first.wait_for(
                    state="attached", timeout=240_000)
            assert tab.page.locator(".st-claim").count() >= 4  # the causal/associational label of each
        tab.page.wait_for_timeout(1000)
        tab.shot(f"{page}-{exp}")
        assert not tab.page.locator(".st-error").count(), tab.text(".st-error")
        assert tab.errors == [], tab.errors
    finally:
        tab.close()


def test_server_warms_up_before_it_opens_its_port(served: Served) -> None:
    """Every experiment is loaded and the largest one's Pareto explorer and Decision page built once before Bokeh
    announces its URL, so the first visit costs no more than later ones."""
    lines = served.log.read_text(encoding="utf-8", errors="replace").splitlines()

    def first(text: str) -> int:
        hits = [i for i, line in enumerate(lines) if text in line]
        assert hits, f"no line with {text!r} in the server log:\n" + "\n".join(lines[:40])
        return hits[0]

    names = sorted(p.name for p in served.root.iterdir())
    assert len([ln for ln in lines if "servetune dashboard: [" in ln and " loaded (" in ln]) == len(names), lines[:20]
    rehearsed = first("servetune dashboard: rehearsed the pareto page of big")  # the largest (24k configs)
    done = first(f"servetune dashboard: warm-up of {len(names)} experiment(s)")
    decided = first("servetune dashboard: rehearsed the decision page of big")  # its default decision, cached
    assert first("servetune dashboard: loading") < rehearsed < decided < done < first("Bokeh app running at")


def test_the_rasterised_front_lies_inside_the_plot_frame(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The front's extreme configs are the cloud's edges: the plot pads its ranges so that their
    marks are not cut by the frame (in-process, the plot Bokeh would draw)."""
    import holoviews as hv

    from dashboards.app import Context
    from dashboards.app.pareto import ParetoPage

    build_big(tmp_path / "big")
    monkeypatch.setenv("SERVETUNE_RESULTS_ROOT", str(tmp_path))
    hv.extension("bokeh", logo=False)
    page = ParetoPage(Context("big", tmp_path / "big", {}, lambda *a, **k: None))
    fig = hv.render(page.plot.object, backend="bokeh")
    assert fig.output_backend == "canvas"
    x, y = page.x.value, page.y.value
    front = page.points[page.points["front"] == "on front"]
    assert len(front) > 3
    assert fig.x_range.start < page.points[x].min() <= front[x].min() and front[x].max() < fig.x_range.end
    assert fig.y_range.start < front[y].min() and page.points[y].max() < fig.y_range.end


def test_an_unreadable_experiment_is_logged_once_and_named_on_the_page(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """A foreign or broken results.nc never breaks the listing; the page names it with the reason, the
    log says it once per version of the file (not on every refresh), and mending it lists it again."""
    import logging

    from dashboards.app import state
    from dashboards.app.experiments import unreadable_html

    build_planted(tmp_path / "good")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "results.nc").write_bytes(b"not a netCDF file")
    with caplog.at_level(logging.WARNING, logger="dashboards.app.state"):
        for _ in range(3):  # three refresh ticks
            infos = state.list_experiments(tmp_path)
    assert [e.name for e in infos] == ["good"]
    assert len([r for r in caplog.records if "broken" in r.getMessage()]) == 1, caplog.text
    bad = state.unreadable(tmp_path)
    assert list(bad) == ["broken"] and bad["broken"]
    assert "data-exp='broken'" in unreadable_html(bad) and "cannot be read" in unreadable_html(bad)
    shutil.copy(tmp_path / "good" / "results.nc", tmp_path / "broken" / "results.nc")
    assert [e.name for e in state.list_experiments(tmp_path)] == ["broken", "good"]
    assert state.unreadable(tmp_path) == {}


def test_a_bad_warm_up_limit_stops_the_server_with_its_name(tmp_path: Path) -> None:
    panel = str(Path(sys.executable).with_name("panel"))
    env = dict(os.environ, SERVETUNE_RESULTS_ROOT=str(tmp_path), SERVETUNE_DASHBOARD_WARM_UP_S="soon")
    proc = subprocess.run([panel, "serve", "dashboards/", "--port", str(_free_port()), "--address", "127.0.0.1"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "SERVETUNE_DASHBOARD_WARM_UP_S='soon' is not a number of seconds" in proc.stdout + proc.stderr


def test_pareto_filters_change_what_is_shown(served: Served, browser) -> None:
    tab = Page(browser, served.url("page=pareto&experiment=planted"))
    try:
        before = int(tab.attr(".st-pareto-summary", "data-points"))
        trials_before = int(tab.attr(".st-pareto-summary", "data-trials"))
        assert before > 0
        # drop the "long" scenario from the scenario filter: fewer trials and fewer points
        tab.page.locator(".st-filter-load_point .choices__item--selectable", has_text="long").locator(
            "button").first.click()
        tab.wait_attr(".st-pareto-summary", "data-trials", lambda v: int(v) < trials_before)
        after = int(tab.attr(".st-pareto-summary", "data-points"))
        assert 0 < after < before, (before, after)
        tab.shot("pareto-filtered")
        assert tab.errors == [], tab.errors
    finally:
        tab.close()


def test_selecting_a_trial_opens_its_logs(served: Served, browser) -> None:
    tab = Page(browser, served.url("page=pareto&experiment=e2e"))
    try:
        n = int(tab.attr(".st-table-note", "data-rows"))
        assert n == 6  # every trial of the real sweep (no filter narrowed yet)
        # box-select the whole plot frame (the points sit inside its 15% padding; box select is the
        # active drag tool): the table follows the selection (linked selection)
        selected = tab.page.locator(".st-table-note", has_text="selected configs")
        for frac in ((0.10, 0.085, 0.97, 0.93), (0.14, 0.12, 0.93, 0.86)):
            tab.drag_on_plot(*frac)
            try:
                selected.wait_for(timeout=20_000)
                break
            except Exception:
                tab.shot("pareto-box-select-missed")
        selected.wait_for(timeout=PAGE_TIMEOUT_MS)
        rows = int(tab.attr(".st-table-note", "data-rows"))
        assert 0 < rows <= n
        # pick the first listed trial and open it
        # the table shows the trial id's first 12 characters (the whole id opens in the inspector)
        first_cell = tab.page.locator(".tabulator-row .tabulator-cell[tabulator-field='trial']").first
        prefix = first_cell.inner_text().strip()
        assert len(prefix) == 12, prefix
        first_cell.click()
        tab.page.locator(".st-open-trial button:not([disabled])").first.wait_for(timeout=PAGE_TIMEOUT_MS)
        tab.page.locator(".st-open-trial button").first.click()
        log = tab.page.locator(".st-server-log").first
        log.wait_for(timeout=PAGE_TIMEOUT_MS)
        server_log = log.inner_text()
        assert "vllm" in server_log.lower() or "uvicorn" in server_log.lower(), server_log[:500]
        client_log = tab.text(".st-client-log")
        assert "daemon." in client_log, client_log[:500]
        trial_id = tab.attr(".st-trial", "data-trial")
        assert len(trial_id) == 64 and trial_id.startswith(prefix), (trial_id, prefix)
        assert "page=inspector" in tab.page.url and f"trial={trial_id}" in tab.page.url
        tab.shot("inspector-from-pareto")
        assert tab.errors == [], tab.errors
    finally:
        tab.close()


def test_a_large_cloud_is_rasterised_and_box_selection_narrows_the_table(served: Served, browser) -> None:
    from dashboards.app.pareto import DATASHADE_ABOVE

    tab = Page(browser, served.url("page=pareto&experiment=big"))
    try:
        assert tab.attr(".st-pareto-summary", "data-cloud") == "raster"
        assert int(tab.attr(".st-pareto-summary", "data-points")) > DATASHADE_ABOVE
        total = int(tab.attr(".st-table-note", "data-rows"))
        tab.drag_on_plot(0.15, 0.12, 0.5, 0.9)  # a box over the left part of the frame: some configs inside, not all
        tab.page.locator(".st-table-note", has_text="selected configs").wait_for(timeout=PAGE_TIMEOUT_MS)
        rows = int(tab.attr(".st-table-note", "data-rows"))
        assert 0 < rows < total, (rows, total)
        tab.shot("pareto-raster-selected")
        assert tab.errors == [], tab.errors
    finally:
        tab.close()


@pytest.mark.parametrize(("page", "shown", "total"), [("compare", ".st-verdict", "data-configs"),
                                                       ("inspector", ".st-trial", "data-trials")])
def test_pickers_of_a_large_experiment_list_a_bounded_subset(served: Served, browser, page: str, shown: str,
                                                             total: str) -> None:
    """With ~24,000 configs a picker of every config (or trial) would not load; the page lists the
    best few hundred, says so, and still shows a comparison / a trial."""
    tab = Page(browser, served.url(f"page={page}&experiment=big"))
    try:
        tab.text(shown)
        listed = int(tab.attr(".st-picker-note", "data-listed"))
        assert 0 < listed <= 502, listed
        assert int(tab.attr(".st-picker-note", total)) > 20_000
        assert tab.errors == [], tab.errors
    finally:
        tab.close()


def test_switching_the_ranking_policy_changes_the_winner(served: Served, browser) -> None:
    fast, respecting = served.trap
    tab = Page(browser, served.url("page=ranking&experiment=slo-trap&policy=slo_throughput"))
    try:
        try:  # the winner box is attached first and filled when the background ranking lands
            tab.page.locator(".st-winner", has_text=respecting).first.wait_for(timeout=PAGE_TIMEOUT_MS)
        except Exception as exc:
            shown = [w.inner_text() for w in tab.page.locator(".st-winner").all()]
            raise AssertionError(f"slo_throughput must crown the best config meeting the SLO ({respecting}); "
                                 f"the page shows {shown}") from exc
        assert "vllm serve" in tab.page.locator(".st-command textarea").first.input_value()
        tab.page.wait_for_timeout(500)
        tab.page.locator(".st-policy select").first.select_option("goodput")
        try:
            tab.page.locator(".st-winner", has_text=fast).first.wait_for(timeout=PAGE_TIMEOUT_MS)
        except Exception as exc:
            shown = [w.inner_text() for w in tab.page.locator(".st-winner").all()]
            raise AssertionError(f"goodput must crown {fast}; the page shows {shown}; "
                                 f"policy in the page: {tab.page.locator('.st-policy select').first.input_value()}"
                                 ) from exc
        assert "policy=goodput" in tab.page.url
        tab.shot("ranking-goodput")
        assert tab.errors == [], tab.errors
    finally:
        tab.close()


def test_live_page_picks_up_new_results(served: Served, browser) -> None:
    folder = served.root / "planted"
    tab = Page(browser, served.url("page=experiments&experiment=planted"))
    try:
        sel = "tr[data-exp='planted'] .st-trials"
        before = int(tab.text(sel))
        ds = build_planted(folder, n_configs=55, seed=1)
        expected = ds.sizes["trial"]
        assert expected != before
        t0 = time.monotonic()
        tab.page.locator(sel, has_text=str(expected)).wait_for(timeout=15_000)
        assert time.monotonic() - t0 < 15
        tab.shot("experiments-live")
        assert tab.errors == [], tab.errors
    finally:
        tab.close()
        build_planted(folder)  # back to what the other tests expect


LIVE_POINTS = 6
LIVE = ".st-live[data-exp='live']"
LIVE_SPEC = """\
name: live
model: {{source: tiny, served_name: tiny}}
backend: {{kind: openai, base_url: "{url}"}}
load_points:
""" + "".join(f"  - {{{{name: r{i}, request_rate: 3, num_requests: 9, input_len: 16, output_len: 8}}}}\n"
              for i in range(LIVE_POINTS))


def test_live_status_follows_a_running_sweep(served: Served, browser, vllm_server, tiny_cache: Path) -> None:
    """A real sweep (coordinator + daemon over ZeroMQ, the `openai` backend measuring the session's
    vLLM server, ~3 s per load point) runs while the experiments page is open: the page must show
    it in progress (some trials ok, some pending, a busy daemon with its hardware class and
    fingerprint, progress and an ETA) and then every trial ok, without a reload. The page is opened on the experiment's URL
    before the sweep has created it, and must switch to it when it appears."""
    spec = served.root.parent / "live.yaml"
    spec.write_text(LIVE_SPEC.format(url=vllm_server.base_url))
    tab = Page(browser, served.url("page=experiments&experiment=live"))
    seen: list[tuple[int, int]] = []  # (ok, pending) as the page showed them while the sweep ran
    busy_text = ""
    with open(ARTIFACTS / "dashboard-live-sweep.log", "wb") as fh:
        proc = subprocess.Popen(coordinator_cmd("sweep", str(spec), "--results-root", str(served.root)),
                                env=cli_env(tiny_cache), stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None:
            assert time.monotonic() < deadline, "the live sweep did not finish within 300 s"
            ok, pending = tab.page.locator(f"{LIVE} .st-live-ok"), tab.page.locator(f"{LIVE} .st-live-pending")
            if ok.count() and pending.count():
                shown = (int(ok.first.inner_text()), int(pending.first.inner_text()))
                if not seen or seen[-1] != shown:
                    seen.append(shown)
                live = tab.page.locator(LIVE).first.inner_text()
                if 0 < shown[0] < LIVE_POINTS and "busy" in live and not busy_text:
                    busy_text = live
                    tab.shot("experiments-live-sweep")
            tab.page.wait_for_timeout(200)
        assert proc.returncode == 0, (ARTIFACTS / "dashboard-live-sweep.log").read_text()[-3000:]
        t_end = time.monotonic()
        listed = "tr[data-exp='live'] .st-ok"  # from results.nc, rewritten just after the store records a result
        while int(tab.text(f"{LIVE} .st-live-ok")) != LIVE_POINTS or int(tab.text(listed)) != LIVE_POINTS:
            assert time.monotonic() - t_end < 10, \
                f"10 s after the sweep the page still shows {tab.text(LIVE)!r}, {tab.text(listed)} ok listed"
            tab.page.wait_for_timeout(200)
        final = tab.text(LIVE)
        assert tab.errors == [], tab.errors
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        tab.close()
    in_progress = [s for s in seen if 0 < s[0] < LIVE_POINTS]
    assert in_progress, f"the page never showed the sweep in progress; it showed (ok, pending) {seen}"
    assert [s[0] for s in seen] == sorted(s[0] for s in seen), f"ok counts went backwards: {seen}"
    assert all(ok + pending <= LIVE_POINTS for ok, pending in seen), seen
    assert busy_text, f"no busy daemon was shown while trials were running; states seen {seen}"
    assert "ETA" in busy_text and f"/{LIVE_POINTS}" in busy_text, busy_text
    assert "cpu-" in busy_text and "vLLM" in busy_text, f"no hardware class / fingerprint: {busy_text!r}"
    assert f"{LIVE_POINTS}/{LIVE_POINTS}" in final, final
