"""Time the dashboard's Search views page (``?page=history``) on 100,000 trials, in the real browser.

The dataset is SYNTHETIC, the one :mod:`benchmarks.dashboards.render` times the other pages on:
``analysis.synthetic.planted(n_configs=100000, n_params=12)`` (100,000 trials at one load point,
about 93,000 distinct configs), written as a bare ``results.nc`` under a temporary results root.
``panel serve dashboards/`` is started as a user starts it (with its warm-up: the dataset and trial
table are loaded before the port opens; the views themselves are not precomputed), and, in Debian's
chromium via playwright, a visit is timed from the navigation's request to the first animation frame
in which the views' summary (``.st-views-done``: written once the background computation is done and
the four views are set) and a drawn plot canvas are shown (:func:`benchmarks.dashboards.render.timed`).

- ``first``: the first visit to the page (nothing of it computed yet: the background computation of
  the views of the load point and objective runs during this visit);
- ``warm``: later visits (the computed views are cached per dataset version; each visit still builds
  and sends its plots and table page).

At this size the page draws 2,000 of the configs on the parallel coordinates (the 100 best and a
fixed-seed random choice), and every ok trial on each slice plot and on the history as a density
image (datashader, :mod:`dashboards.app.raster`) with the 100 best as points to hover (the
best-so-far line uses every trial); the page says so.

With ``--server-side`` it times the page in-process instead (no browser, no server: the page built
in a Bokeh document until its views are shown, :mod:`benchmarks.dashboards.planted`), with the
dataset, trial table and drift marks loaded and the page modules imported, as the server's warm-up
leaves them: ``first`` with nothing of the page computed (no views, no labels), ``again`` with the
views cached, and an objective switch (``ttft_ms_p99``; the labels are kept per load point).

    .venv/bin/python -m benchmarks.dashboards.views [--dataset PATH/results.nc] [--repeats 3] [--server-side]
"""

from __future__ import annotations

import argparse
import logging
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.dashboards import render
from benchmarks.dashboards.render import CHROMIUM, NAME, make_dataset, serve, timed, wait_warm

READY = [".st-views-done", ".tabulator-row"]  # selectors do not cross shadow roots: one element each


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dashboards.views")
    parser.add_argument("--dataset", type=Path, help="an existing results.nc (default: generate 100k trials)")
    parser.add_argument("--configs", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--server-side", action="store_true", help="time the page in-process, without a browser")
    args = parser.parse_args(argv)
    if args.server_side:
        return server_side(args.dataset, args.configs, args.repeats)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    render.TIMEOUT_MS = 600_000  # a loaded machine: report a slow visit rather than give up after 3 min
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "runs"
        target = root / NAME / "results.nc"
        if args.dataset:
            target.parent.mkdir(parents=True)
            shutil.copy(args.dataset, target)
        else:
            make_dataset(target, args.configs, seed=0)
        log_path = Path(tmp) / "server.log"
        errors: list[str] = []
        with serve(root, log_path) as (url, startup), sync_playwright() as pw:
            warm_s = wait_warm(log_path)
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page_url = f"{url}?page=history&experiment={NAME}"
            first = timed(browser, page_url, READY, errors, cloud=True)
            warm = [timed(browser, page_url, READY, errors, cloud=True) for _ in range(args.repeats)]
            browser.close()
    print(f"server start-up {startup:.1f} s (its warm-up {warm_s:.1f} s)")
    print(f"Search views, first visit: {first:.2f} s")
    print(f"Search views, warm: median {statistics.median(warm):.2f} s [{min(warm):.2f}, {max(warm):.2f}] "
          f"over {len(warm)} visits")
    if errors:
        print(f"console errors: {errors}")
        return 1
    return 0


def server_side(dataset: Path | None, n_configs: int, repeats: int) -> int:
    """The page built in-process (see the module doc); prints median [min, max] seconds."""
    from typing import Any

    import analysis
    from analysis.synthetic import planted
    from benchmarks.dashboards.planted import planted_root, summary, visits, warm

    ds = analysis.load(dataset) if dataset else planted(n_configs=n_configs, n_params=12, seed=0)[0]

    def ready(page: Any) -> bool:
        return "st-views-done" in str(page.summary.object)

    def switch(page: Any) -> None:
        page.objective.value = "ttft_ms_p99"
        assert ready(page) and "ttft_ms_p99" in str(page.summary.object)

    with planted_root(ds, NAME) as folder:
        warm(folder)
        times = visits(folder.name, "history", ready, ("views", "views-labels", "views-table"), repeats,
                       ("switch objective", switch))
    print(f"{ds.sizes['trial']} trials, {repeats} repeats; median [min, max] seconds")
    print(summary(times))
    return 0


if __name__ == "__main__":
    sys.exit(main())
