"""The full analysis on 10,000 trials x 12 parameters, timed by wall clock AND by the CPU time it used.

``python -m benchmarks.analysis.full_cpu [--runs 3] [--n-configs 10000] [--n-params 12] [--n-boot 100]``

On a machine shared with other jobs the wall time includes waiting for a CPU, so it says little
about the analysis; the process's CPU time (user + system, every thread, from ``getrusage``) does
not wait. On an otherwise idle 2-core machine the wall time is at least CPU time / 2 (both cores
busy the whole time) and at most the CPU time (one core busy); both figures, the 1-minute load
average at the start and end of each run and the per-section wall times (``timings_s``) are
printed as JSON, one line per run, then the medians. Every run starts cold
(:func:`analysis.surrogate.clear_cache`). Data: :func:`analysis.synthetic.planted` (SYNTHETIC).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return float(r.ru_utime + r.ru_stime)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--n-configs", type=int, default=10_000)
    ap.add_argument("--n-params", type=int, default=12)
    ap.add_argument("--n-boot", type=int, default=100)
    args = ap.parse_args(argv)
    from analysis.report import analyze
    from analysis.surrogate import clear_cache
    from analysis.synthetic import planted

    ds, _ = planted(n_configs=args.n_configs, n_params=args.n_params, seed=0)
    analyze(planted(n_configs=30, n_params=4, seed=1)[0], n_boot=2)  # imports (scikit-learn, shap, ...) not timed
    runs = []
    for r in range(args.runs):
        clear_cache()
        load0, c0, t0 = os.getloadavg()[0], _cpu_s(), time.perf_counter()
        doc = analyze(ds, n_boot=args.n_boot, seed=0)
        wall, cpu, load1 = time.perf_counter() - t0, _cpu_s() - c0, os.getloadavg()[0]
        run = {"run": r + 1, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "load_start": load0, "load_end": load1,
               "sections_s": doc["timings_s"]}
        runs.append(run)
        print(json.dumps(run), flush=True)
    print(json.dumps({"median_wall_s": statistics.median(r["wall_s"] for r in runs),
                      "median_cpu_s": statistics.median(r["cpu_s"] for r in runs),
                      "trials": int(ds.sizes["trial"])}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
