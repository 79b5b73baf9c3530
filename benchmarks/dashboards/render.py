"""Time to render the experiments page and the Pareto explorer on a 100,000-trial dataset, in the
real browser (Debian's chromium via playwright) against ``panel serve dashboards/``.

The dataset is SYNTHETIC: ``analysis.synthetic.planted(n_configs=100000, n_params=12)`` (100,000
trials, about 93,000 distinct configs, so the Pareto explorer rasterises them with datashader),
written as a bare ``results.nc`` under a temporary results root. A render is timed from the
navigation start to the page's content being in the DOM with its plot canvas drawn:

- ``experiments``: the row of the experiment shows its 100,000 trials;
- ``pareto``: the front summary and the metric pickers are shown and the plot's canvas has the
  cloud drawn (blue pixels: see ``READY_JS``).

Render times are taken in the page: the first animation frame in which that is true, counted from
the navigation's request (playwright's own polling noticed it about 0.7 s later in the visits traced,
which an earlier version of this benchmark included).

The server warms up before it opens its port (``dashboards/app_hooks.py``: it loads every dataset,
its trial table and the default front of a large one, and builds the Pareto explorer once), so
the time from launching ``panel serve`` to the port accepting connections is reported as the
server's start-up. Three servers. On the first, the Pareto explorer is opened the moment the port
accepts connections (first: no page was requested before), then each page ``--repeats`` more times
(warm: the server keeps datasets, tables and fronts per dataset version). On a second, the
experiments page is opened first. A third runs with ``SERVETUNE_DASHBOARD_WARM_UP_S=0`` (the port
opens at once, everything loads in the background) and opens the Pareto explorer at once: what
the first visit costs without the warm-up. A metric switch on the Pareto explorer (y =
``tpot_ms_p99``, never computed before) is timed too.

    .venv/bin/python -m benchmarks.dashboards            # from the repository root
    .venv/bin/python -m benchmarks.dashboards --dataset /path/results.nc --repeats 5
    .venv/bin/python -m benchmarks.dashboards --report-and-notebooks   # also the report and notebooks

It also times each other page once on the warm server (parameters, compare, inspector, ranking,
drift), and how long the parameters page takes to finish its four background sections.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
NAME = "planted-100k"
TIMEOUT_MS = 180_000


def make_dataset(path: Path, n_configs: int, seed: int) -> None:
    """Write the SYNTHETIC planted dataset (``n_configs`` trials) to ``path``."""
    from analysis.synthetic import planted
    from servetune.netcdf import write_netcdf

    t0 = time.perf_counter()
    ds, _ = planted(n_configs=n_configs, n_params=12, seed=seed)
    ds.attrs["experiment"] = NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    write_netcdf(ds, path)  # the coordinator's string layout, so the benchmark reads what users read
    log.info("wrote %s (%d trials) in %.1f s", path, ds.sizes["trial"], time.perf_counter() - t0)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve(root: Path, log_path: Path, env_extra: dict[str, str] | None = None) -> Iterator[tuple[str, float]]:
    """``panel serve dashboards/`` on a free port with ``root`` as results root; yields its URL and
    the seconds from launching it to its port accepting connections (its start-up, warm-up included)."""
    port = _port()
    env = dict(os.environ, SERVETUNE_RESULTS_ROOT=str(root), **(env_extra or {}))
    panel = str(Path(sys.executable).with_name("panel"))
    t0 = time.perf_counter()
    with open(log_path, "ab") as fh:
        proc = subprocess.Popen([panel, "serve", "dashboards/", "--port", str(port), "--address", "127.0.0.1",
                                 f"--allow-websocket-origin=127.0.0.1:{port}"], cwd=REPO, env=env, stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/dashboards"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"panel serve exited with {proc.returncode}; see {log_path}")
            try:  # no page request, so no session is built before the first timed visit
                with socket.create_connection(("127.0.0.1", port), timeout=5):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"panel serve did not open its port within 300 s; see {log_path}")
            time.sleep(0.1)
        yield url, time.perf_counter() - t0
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


WARM_LINE = "servetune dashboard: warm-up of"


def wait_warm(log_path: Path, timeout_s: float = 300.0) -> float:
    """Wait for the server's warm-up line in its log; returns the warm-up time it reports (s)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines():
            if WARM_LINE in line:
                return float(line.rsplit(" in ", 1)[1].split()[0])
        time.sleep(0.25)
    raise RuntimeError(f"no warm-up line in {log_path} within {timeout_s:.0f} s")


#: Injected into every timed page before its own scripts: on each animation frame until it is
#: satisfied, look (through Bokeh's shadow roots) for every selector in ``window.__stChecks`` with a
#: non-empty box, and, where ``cloud`` is set, for a plot canvas with at least ``CLOUD_PIXELS``
#: drawn blue pixels (the datashaded cloud or the scatter's points: blue clearly above red, so
#: axes, text and the red front do not count); records ``performance.now()`` of that frame.
READY_JS = """
(() => {
  const checks = %s;
  const walk = (root, sel, out) => {
    root.querySelectorAll(sel).forEach(e => out.push(e));
    root.querySelectorAll('*').forEach(e => { if (e.shadowRoot) walk(e.shadowRoot, sel, out); });
    return out;
  };
  const shown = e => { const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
  const drawn = c => {
    if (!shown(c) || !c.width || !c.height) return false;
    const ctx = c.getContext('2d');
    if (!ctx) return false;
    const px = ctx.getImageData(0, 0, c.width, c.height).data;
    let n = 0;
    for (let i = 0; i < px.length; i += 4) if (px[i + 3] > 0 && px[i + 2] - px[i] > 40 && ++n >= %d) return true;
    return false;
  };
  const frame = () => {
    if (document.body) {
      const ok = checks.selectors.every(sel => walk(document, sel, []).some(shown)) &&
                 (!checks.cloud || walk(document, 'canvas', []).some(drawn));
      if (ok) { window.__stReady = performance.now(); return; }
    }
    requestAnimationFrame(frame);
  };
  requestAnimationFrame(frame);
})();
"""
CLOUD_PIXELS = 500


def timed(browser: Any, url: str, ready: list[str], errors: list[str], cloud: bool = False) -> float:
    """Seconds from the navigation's request until the first animation frame in which every selector
    in ``ready`` is shown (and, with ``cloud``, a plot canvas has its points drawn), timed in the page
    (:data:`READY_JS`): what a person sees, not when playwright's polling notices it (about 0.7 s
    later in the visits traced). The page's clock starts at its ``performance.timeOrigin``; the few
    milliseconds between the request and that origin are added from the wall clock."""
    page = browser.new_page(viewport={"width": 1500, "height": 1100})
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.add_init_script(READY_JS % (json.dumps({"selectors": ready, "cloud": cloud}), CLOUD_PIXELS))
    try:
        t0 = time.time()
        page.goto(url, timeout=TIMEOUT_MS, wait_until="commit")
        page.wait_for_function("window.__stReady !== undefined", timeout=TIMEOUT_MS, polling=100)
        origin_ms, ready_ms = page.evaluate("[performance.timeOrigin, window.__stReady]")
        return max(0.0, origin_ms / 1000 - t0) + ready_ms / 1000
    finally:
        page.close()


#: the other pages, each timed once on the warm server until its main content is in the DOM
OTHER_PAGES = {
    "parameters": [".st-progress-text, .st-section-done"],  # the page, with its background work started
    "compare": [".st-verdict"],
    "inspector": [".st-trial"],
    "ranking": [".st-winner"],
    "drift": ["div.st-alarm, div.st-warn"],  # the synthetic data has no baseline re-runs: a warning says so
}
PARAMETER_SECTIONS = 4  # importance, partial dependence, interactions, failure


def timed_attached(browser: Any, url: str, ready: list[str], errors: list[str], count: int = 1) -> float:
    """Seconds from navigation start until each selector in ``ready`` matches ``count`` elements."""
    page = browser.new_page(viewport={"width": 1500, "height": 1100})
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    try:
        t0 = time.perf_counter()
        page.goto(url, timeout=TIMEOUT_MS, wait_until="commit")
        deadline = t0 + 900
        for sel in ready:
            page.locator(sel).first.wait_for(state="attached", timeout=TIMEOUT_MS)
            while page.locator(sel).count() < count:
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"{sel} matched {page.locator(sel).count()} of {count} within 900 s")
                page.wait_for_timeout(250)
        return time.perf_counter() - t0
    finally:
        page.close()


def metric_switch(browser: Any, url: str) -> float:
    """Seconds from choosing y = tpot_ms_p99 until the new front is shown."""
    page = browser.new_page(viewport={"width": 1500, "height": 1100})
    try:
        page.goto(url, timeout=TIMEOUT_MS)
        page.locator(".st-pareto-summary").first.wait_for(timeout=TIMEOUT_MS)
        t0 = time.perf_counter()
        page.locator(".st-y select").first.select_option("tpot_ms_p99")
        page.locator(".st-pareto-summary", has_text="tpot_ms_p99").first.wait_for(timeout=TIMEOUT_MS)
        return time.perf_counter() - t0
    finally:
        page.close()


def report_and_notebooks(target: Path, work: Path, n_configs: int, seed: int) -> dict[str, Any]:
    """Time the static report and the three notebooks (nbclient, top to bottom, their own asserts)
    on the dataset; notebook 03 compares it with a second SYNTHETIC one (seed + 1)."""
    import nbformat
    from nbclient import NotebookClient

    out: dict[str, Any] = {}
    html = work / "report.html"
    log.info("timing python -m dashboards report")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "dashboards", "report", str(target), "--out", str(html)], cwd=REPO,
                   check=True, timeout=1800)
    out["report_s"], out["report_mb"] = time.perf_counter() - t0, html.stat().st_size / 1e6
    other = work / "other" / "results.nc"
    make_dataset(other, n_configs, seed + 1)
    env = {"SERVETUNE_RESULTS_ROOT": str(target.parents[1]), "SERVETUNE_EXPERIMENT": str(target),
           "SERVETUNE_EXPERIMENT_B": str(other), "SERVETUNE_N_BOOT": "20"}
    saved = {k: os.environ.get(k) for k in [*env, "PYTHONPATH"]}
    os.environ.update(env, PYTHONPATH=str(REPO))
    try:
        out["notebooks_s"] = {}
        for nb_path in sorted((REPO / "notebooks").glob("*.ipynb")):
            log.info("timing notebook %s", nb_path.name)
            nb = nbformat.read(nb_path, as_version=4)
            t0 = time.perf_counter()
            NotebookClient(nb, timeout=1800, kernel_name="python3", resources={"metadata": {"path": str(work)}}).execute()
            out["notebooks_s"][nb_path.name] = time.perf_counter() - t0
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", type=Path, help="an existing results.nc to use (else one is generated)")
    ap.add_argument("--n-configs", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", type=Path, help="also copy the generated results.nc here for later runs")
    ap.add_argument("--report-and-notebooks", action="store_true",
                    help="also time `python -m dashboards report` and the three notebooks on the dataset")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    from playwright.sync_api import sync_playwright

    work = Path(tempfile.mkdtemp(prefix="dash-bench-"))
    root = work / "runs"
    target = root / NAME / "results.nc"
    if args.dataset:
        target.parent.mkdir(parents=True)
        shutil.copy(args.dataset, target)
    else:
        make_dataset(target, args.n_configs, args.seed)
        if args.keep:
            shutil.copy(target, args.keep)
    exp_url = f"?page=experiments&experiment={NAME}"
    par_url = f"?page=pareto&experiment={NAME}"
    exp_ready = [f"tr[data-exp='{NAME}'] .st-trials"]
    par_ready = [".st-pareto-summary", ".st-x"]
    errors: list[str] = []
    out: dict[str, Any] = {"trials": args.n_configs, "repeats": args.repeats}
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            with serve(root, work / "server-1.log") as (url, start_s):
                out["server_start_s"] = [start_s]
                out["server_warm_up_s"] = wait_warm(work / "server-1.log")
                out["pareto_first_s"] = timed(browser, url + par_url, par_ready, errors, cloud=True)
                out["pareto_warm_s"] = [timed(browser, url + par_url, par_ready, errors, cloud=True)
                                        for _ in range(args.repeats)]
                out["experiments_warm_s"] = [timed(browser, url + exp_url, exp_ready, errors)
                                             for _ in range(args.repeats)]
                out["pareto_metric_switch_s"] = metric_switch(browser, url + par_url)
                log.info("timing the parameters page's four background sections (first visit: computed now)")
                out["parameters_all_sections_s"] = timed_attached(
                    browser, f"{url}?page=parameters&experiment={NAME}", [".st-section-done"], errors,
                    count=PARAMETER_SECTIONS)
                out["other_pages_s"] = {}
                for name, ready in OTHER_PAGES.items():
                    log.info("timing the %s page", name)
                    out["other_pages_s"][name] = timed_attached(browser, f"{url}?page={name}&experiment={NAME}",
                                                                ready, errors)
            with serve(root, work / "server-2.log") as (url, start_s):
                out["server_start_s"].append(start_s)
                out["experiments_first_s"] = timed(browser, url + exp_url, exp_ready, errors)
            with serve(root, work / "server-3.log", {"SERVETUNE_DASHBOARD_WARM_UP_S": "0"}) as (url, start_s):
                out["server_start_no_warm_up_s"] = start_s
                out["pareto_first_no_warm_up_s"] = timed(browser, url + par_url, par_ready, errors, cloud=True)
            browser.close()
        if args.report_and_notebooks:
            out.update(report_and_notebooks(target, work, args.n_configs, args.seed))
    finally:
        out["console_errors"] = errors
        shutil.rmtree(work, ignore_errors=True)
    for k in ("pareto_warm_s", "experiments_warm_s"):
        out[k.replace("_s", "_median_s")] = statistics.median(out[k])
    print(json.dumps(out, indent=2))
    print("\nserver start-up (launch to port open, warm-up included): "
          + ", ".join(f"{v:.1f} s" for v in out["server_start_s"]))
    print(f"experiments page, 100k trials: first {out['experiments_first_s']:.2f} s, warm median "
          f"{out['experiments_warm_median_s']:.2f} s")
    print(f"Pareto explorer, 100k trials:  first {out['pareto_first_s']:.2f} s, warm median "
          f"{out['pareto_warm_median_s']:.2f} s, metric switch {out['pareto_metric_switch_s']:.2f} s")
    print("other pages on the warm server: " + ", ".join(f"{k} {v:.2f} s" for k, v in out["other_pages_s"].items())
          + f"; the parameters page's four sections done after {out['parameters_all_sections_s']:.1f} s")
    if "report_s" in out:
        print(f"static report {out['report_s']:.1f} s ({out['report_mb']:.1f} MB); notebooks: "
              + ", ".join(f"{k} {v:.1f} s" for k, v in out["notebooks_s"].items()))
    print(f"without the warm-up (SERVETUNE_DASHBOARD_WARM_UP_S=0): port open after "
          f"{out['server_start_no_warm_up_s']:.1f} s, first Pareto visit {out['pareto_first_no_warm_up_s']:.2f} s")
    return 0
