"""The ladder of offered rates that each client's driver runs (``drive_ours``, ``drive_vllm``).

A driver supplies how to measure one point; :func:`run` walks the rates, repeats each, rewrites
``--out`` after every point (so a stopped run keeps what it measured), prints a ``[progress]``
line per point and, with ``--stop-early``, stops after two unsustained rates in a row
(:func:`benchmarks.loadgen.points.ladder_done`).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import median
from benchmarks.loadgen.points import Point, ladder_done, requests_for
from benchmarks.loadgen.procs import progress, write_json

#: ``measure(rate, repeat, n_requests, out)``: one point; ``out`` is the JSON being written, for
#: what a driver keeps beside the points (our driver's per-request samples)
Measure = Callable[[float, int, int, dict[str, Any]], Point]


def parser(description: str | None) -> argparse.ArgumentParser:
    """The options every driver takes; a driver adds its own."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--rates", required=True, help="comma-separated offered rates (req/s)")
    ap.add_argument("--seconds", type=float, default=4.0, help="offered seconds per point")
    ap.add_argument("--min-requests", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--stop-early", action="store_true", help="stop after two unsustained rates")
    ap.add_argument("--out", required=True)
    return ap


def run(args: argparse.Namespace, client: str, measure: Measure, out: dict[str, Any] | None = None) -> None:
    """Measure every rate of ``args.rates`` ``args.repeats`` times (see the module doc)."""
    start = time.monotonic()
    doc: dict[str, Any] = {"client": client, "points": [], **(out or {})}
    ratios: list[float] = []
    for rate in [float(r) for r in args.rates.split(",")]:
        runs: list[Point] = []
        for rep in range(args.repeats):
            p = measure(rate, rep, requests_for(rate, args.seconds, args.min_requests), doc)
            p.extra["repeat"] = rep
            runs.append(p)
            doc["points"].append(p.to_json())
            write_json(Path(args.out), doc)
            progress(
                f"{client} {rate:g} req/s (run {rep + 1}/{args.repeats}): achieved {p.achieved:.1f} "
                f"({p.ratio:.4f}), {p.n_errors} errors, TTFT p50 {p.ttft_ms['p50']:.3f} ms"
            )
        ratios.append(median([p.ratio for p in runs]))
        if args.stop_early and ladder_done(ratios):
            progress(f"{client}: stopping the ladder after {rate:g} req/s (two rates unsustained)")
            break
    progress(f"{client}: ladder done in {time.monotonic() - start:.1f} s")
