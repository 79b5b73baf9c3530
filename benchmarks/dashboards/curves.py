"""Time the dashboard's Load curves page on 100,000 trials (server side, no browser).

The dataset is SYNTHETIC: ``analysis.synthetic.planted(n_configs=10000, n_params=12, repeats=1,
load_levels=...)`` with 5 request rates (1-16 req/s) and 5 concurrencies (1-16): 100,000 trials,
10,000 configs x 10 load levels, written as a bare ``results.nc`` under a temporary results root.
Timed with ``time.perf_counter``:

- ``page first visit``: the page built in a Bokeh document (``dashboards.app.App`` with
  ``page=curves``, as a browser session's first request builds it) until its curves are shown, with
  the dataset, its trial table and drift marks loaded and the page modules imported (the server's
  warm-up does that before it opens its port) but no curves cached;
- ``page again``: the same with the curves cached (a second visit);
- ``switch to p50``: the latency percentile switched on the page (panels rebuilt, nothing recomputed).

Browser paint is not included (``benchmarks/dashboards/render.py`` times the other pages in chromium).

    .venv/bin/python -m benchmarks.dashboards.curves [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

RATES = (1, 2, 4, 8, 16)
CONCURRENCIES = (1, 2, 4, 8, 16)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dashboards.curves")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--configs", type=int, default=10_000)
    args = parser.parse_args(argv)

    from analysis.synthetic import planted
    from benchmarks.dashboards.planted import planted_root, summary, visits, warm

    levels = {f"r{r}": ("rate", float(r)) for r in RATES} | {f"c{c}": ("concurrency", float(c)) for c in CONCURRENCIES}
    ds, _ = planted(n_configs=args.configs, n_params=12, repeats=1, load_levels=levels, seed=5)

    def ready(page: Any) -> bool:
        return "st-knees" in str(page.body.objects[-1].object)

    def to_p50(page: Any) -> None:
        page.pct.value = "p50"

    with planted_root(ds, "bench-curves") as folder:
        warm(folder)  # as the server's warm-up leaves it: dataset, trial table, drift marks, page modules
        times = visits(folder.name, "curves", ready, ("curves",), args.repeats, ("switch to p50", to_p50))
    print(f"{ds.sizes['trial']} trials, {args.configs} configs x {len(levels)} load levels, {args.repeats} repeats; "
          "median [min, max] seconds")
    print(summary(times))
    return 0


if __name__ == "__main__":
    sys.exit(main())
