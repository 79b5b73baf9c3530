"""``python -m benchmarks.search [--surfaces all|NAME,...] [--seeds 20] [--planners ...] [--quick]``.

Prints a line per surface and planner, writes every run and the table as JSON (``--out``) and the
Markdown table (``--markdown``). Outcomes are cached under ``--cache`` (default
``~/.cache/servetune-searchbench``): a second run re-simulates nothing. SIMULATED.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.search.run import PLANNERS, run_surface
from benchmarks.search.surfaces import SURFACES

DEFAULT_PLANNERS = ["grid", "random", "quasi-random", "tpe", "tpe-startup5", "nsga2"]


def _fmt(x: float, budget: int) -> str:
    if x == -math.inf:
        return "-"  # too few seeds for a 95% interval
    return f">{budget}" if math.isinf(x) else f"{x:g}"


def markdown(results: list[dict[str, Any]]) -> str:
    lines = ["| surface (grid, within 2%) | planner | median trials to 2% [95% CI] | % of grid | censored | "
             "median GPU-s to 2% |", "| --- | --- | --- | --- | --- | --- |"]
    for r in results:
        head = f"{r['surface']} ({r['grid']}, {r['within']})"
        for name, s in r["planners"].items():
            b = s["budget"]
            pct = "censored" if math.isinf(s["median"]) else f"{s['median_pct']:.1f}%"
            gpu = f">{s['gpu_s_spent_median']:.0f}" if math.isinf(s["gpu_s_median"]) else f"{s['gpu_s_median']:.0f}"
            ci = "[too few seeds for a 95% interval]" if s["lo"] == -math.inf else f"[{_fmt(s['lo'], b)}, {_fmt(s['hi'], b)}]"
            lines.append(f"| {head} | {name} | {_fmt(s['median'], b)} {ci} | "
                         f"{pct} | {s['censored']}/{s['n']} | {gpu} |")
            head = ""
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.search", description=__doc__.split("\n\n")[0])
    ap.add_argument("--surfaces", default="all", help=f"all, or some of: {', '.join(SURFACES)}")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--planners", default=",".join(DEFAULT_PLANNERS), help=f"some of: {', '.join(PLANNERS)}")
    ap.add_argument("--quick", action="store_true", help="1 surface, every other value of each grid axis, 2 seeds, 3 planners")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "servetune-searchbench")
    ap.add_argument("--no-cache", action="store_true")
    ap.add_argument("--out", type=Path, default=None, help="JSON of every run")
    ap.add_argument("--markdown", type=Path, default=None)
    a = ap.parse_args(argv)
    names = list(SURFACES) if a.surfaces == "all" else a.surfaces.split(",")
    planners = a.planners.split(",")
    bad = [n for n in names if n not in SURFACES] + [p for p in planners if p not in PLANNERS]
    if bad:
        ap.error(f"unknown: {', '.join(bad)}")
    limit, seeds = None, list(range(a.seeds))
    if a.quick:
        names, limit, seeds, planners = names[:1], 2, [0, 1], ["grid", "random", "tpe"]
    t0 = time.time()
    results = [run_surface(n, planners, seeds, None if a.no_cache else a.cache, limit) for n in names]
    table = markdown(results)
    print(table)
    print(f"{time.time() - t0:.0f} s wall on {platform.processor() or platform.machine()}, python {platform.python_version()}")
    if a.out:
        a.out.write_text(json.dumps(results, indent=1, default=str))
    if a.markdown:
        a.markdown.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
