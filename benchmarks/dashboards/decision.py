"""Time the dashboard's Decision page on about 100,000 trials (server side, no browser).

The dataset is SYNTHETIC: ``analysis.synthetic.planted(n_configs=50000, n_params=12, repeats=1,
load_points=("short", "long"), baseline_every=50, drift_at=0.6)`` (104,000 trials with the
baseline re-runs), written as a bare ``results.nc`` under a temporary results root. Timed, with
``time.perf_counter``:

- ``recommend``: :func:`analysis.decision.recommend` with the page's (the CLI's) defaults
  (``n_boot`` 1000), on the loaded dataset, from scratch; and with its input-independent part
  (:func:`analysis.decision.prepare`: trial table, drift check, fingerprint) already made, as the
  page keeps it per dataset version;
- ``warm-up``: what the server's start-up adds for the decision page (``dashboards/app_hooks.py``
  rehearses it on the largest experiment: the per-version part and the default inputs' decision);
- ``page``: the Decision page built in a Bokeh document (``dashboards.app.App`` with
  ``page=decision``, as a browser session's first request builds it) until its decision is shown,
  with the dataset and trial table already loaded (the server's warm-up loads them before it opens
  its port): after the warm-up (the default inputs' decision is cached: what a first visit costs the
  server), with no decision cached (other inputs, e.g. a ``?weights=`` link; the per-version part
  cached), with nothing cached (as after a new ``results.nc`` arrives); then a weight change (a
  new decision) on the same page.

Browser paint is not included (the browser benchmark, ``benchmarks/dashboards/render.py``, times
the other pages).

    .venv/bin/python -m benchmarks.dashboards.decision [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dashboards.decision")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--configs", type=int, default=50_000)
    args = parser.parse_args(argv)

    from analysis.decision import prepare, recommend
    from analysis.synthetic import planted
    from benchmarks.dashboards.planted import forget, planted_root, visit
    from dashboards.app import rehearse, state

    ds, _ = planted(n_configs=args.configs, n_params=12, repeats=1, load_points=("short", "long"), baseline_every=50,
                    drift_at=0.6, drift_size=-0.3, seed=3)
    with planted_root(ds, "bench-decision") as folder:
        loaded = state.dataset(folder)
        state.table(folder)

        def ready(page: Any) -> bool:
            return "st-decision-winner" in str(page.body.objects[0].object)

        times: dict[str, list[float]] = {k: [] for k in (
            "recommend", "recommend, prepared", "warm-up (rehearsal)", "page first visit", "page, no decision cached",
            "page, nothing cached", "page weight change")}
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            recommend(loaded, n_boot=1000)
            times["recommend"].append(time.perf_counter() - t0)
        prepared = prepare(loaded)
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            recommend(loaded, n_boot=1000, prepared=prepared)
            times["recommend, prepared"].append(time.perf_counter() - t0)
        for i in range(args.repeats):
            forget("decision", "decision-prepared")
            t0 = time.perf_counter()
            rehearse("bench-decision", "decision")  # what dashboards/app_hooks.py does before the port opens
            times["warm-up (rehearsal)"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            visit(folder.name, "decision", ready)
            times["page first visit"].append(time.perf_counter() - t0)
            forget("decision")
            t0 = time.perf_counter()
            visit(folder.name, "decision", ready)
            times["page, no decision cached"].append(time.perf_counter() - t0)
            forget("decision", "decision-prepared")
            t0 = time.perf_counter()
            page = visit(folder.name, "decision", ready)
            times["page, nothing cached"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            page.weights[0].value = 2.0 + i  # type: ignore[attr-defined]
            assert "st-decision-winner" in str(page.body.objects[0].object)  # type: ignore[attr-defined]
            times["page weight change"].append(time.perf_counter() - t0)
    print(f"{ds.sizes['trial']} trials, {args.repeats} repeats; median [min, max] seconds")
    for name, values in times.items():
        print(f"  {name:26s} {statistics.median(values):6.2f} [{min(values):.2f}, {max(values):.2f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
