"""Driver of servetune's load generator: one pinned process that runs a ladder of offered rates.

Run by :mod:`benchmarks.loadgen.run` as ``python -m benchmarks.loadgen.drive_ours ...``; it uses
only the public API of ``daemon.loadgen`` (:func:`~daemon.loadgen.run_load_point` with a
:class:`~servetune.spec.LoadPoint`) and our own report (:func:`servetune.metrics.summarize`).
After each point it rewrites ``--out`` (JSON: the points and, with ``--samples``, every request's
send / first-token / end times) and prints a ``[progress]`` line.
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import median
from benchmarks.loadgen.points import Point, ladder_done, requests_for
from benchmarks.loadgen.procs import progress, write_json
from benchmarks.loadgen.sse import MODEL, OUTPUT_TOKENS, PROMPT_TOKENS
from daemon.loadgen import run_load_point
from servetune.metrics import summarize
from servetune.result import RequestSample
from servetune.spec import LoadPoint
from servetune.tiny import TINY_VOCAB_SIZE

CLIENT = "servetune"


def point_from(rate: float, samples: list[RequestSample], window_s: float) -> Point:
    measured = [s for s in samples if not s.warmup]
    ok = [s for s in measured if s.error is None]
    m = summarize(measured, window_s, quantiles=(0.5, 0.99), offered_rate=rate)
    first_send = min(s.send_ns for s in measured) / 1e9 if measured else 0.0
    last_end = max(s.end_ns for s in ok) / 1e9 if ok else first_send
    errors = sorted({s.error for s in measured if s.error is not None})
    return Point(
        client=CLIENT,
        offered=rate,
        n_sent=len(measured),
        n_ok=len(ok),
        first_send_s=first_send,
        last_end_s=last_end,
        clock="mono",
        ttft_ms={"p50": m.ttft_ms[0], "mean": m.mean_ttft_ms, "p99": m.ttft_ms[1]},
        extra={
            "send_rate": m.achieved_rate,
            "sched_lag_p99_ms": m.sched_lag_p99_ms,
            "client_fell_behind": m.client_fell_behind,
            "errors": errors[:5],
        },
    )


def clear_hook(url: str | None) -> Callable[[], None] | None:
    """GET ``url`` between warm-up and measurement (the timing target forgets the warm-up)."""
    if url is None:
        return None

    def hook() -> None:
        with urllib.request.urlopen(url, timeout=10) as resp:
            resp.read()

    return hook


def run_ladder(args: argparse.Namespace) -> None:
    rates = [float(r) for r in args.rates.split(",")]
    out: dict[str, Any] = {"client": CLIENT, "points": [], "samples": []}
    ratios: list[float] = []
    for rate in rates:
        runs: list[Point] = []
        for rep in range(args.repeats):
            n = requests_for(rate, args.seconds, args.min_requests)
            lp = LoadPoint(
                name=f"r{rate:g}-{rep}",
                request_rate=rate,
                arrival=args.arrival,
                num_requests=n,
                input_len=PROMPT_TOKENS,
                output_len=OUTPUT_TOKENS,
                warmup_requests=args.warmup,
                seed=rep,
            )
            deadline_s = n / rate + args.warmup + 60.0
            _, result = run_load_point(
                args.base_url,
                MODEL,
                TINY_VOCAB_SIZE,
                lp,
                deadline_s,
                on_measure_start=clear_hook(args.clear_url),
                request_timeout_s=30.0,
                drain_timeout_s=10.0,
            )
            p = point_from(rate, result.samples, result.window_s)
            p.extra["repeat"] = rep
            runs.append(p)
            out["points"].append(p.to_json())
            if args.samples:
                out["samples"].append(
                    {
                        "offered": rate,
                        "repeat": rep,
                        "send_ns": [s.send_ns for s in result.samples],
                        "first_token_ns": [s.first_token_ns for s in result.samples],
                        "end_ns": [s.end_ns for s in result.samples],
                        "error": [s.error for s in result.samples],
                    }
                )
            write_json(Path(args.out), out)
            progress(
                f"{CLIENT} {rate:g} req/s (run {rep + 1}/{args.repeats}): achieved {p.achieved:.1f} "
                f"({p.ratio:.4f}), {p.n_errors} errors, TTFT p50 {p.ttft_ms['p50']:.3f} ms"
            )
        ratios.append(median([p.ratio for p in runs]))
        if args.stop_early and ladder_done(ratios):
            progress(f"{CLIENT}: stopping the ladder after {rate:g} req/s (two rates unsustained)")
            return


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--rates", required=True, help="comma-separated offered rates (req/s)")
    ap.add_argument("--seconds", type=float, default=4.0, help="offered seconds per point")
    ap.add_argument("--min-requests", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--arrival", choices=["constant", "poisson"], default="constant")
    ap.add_argument("--stop-early", action="store_true", help="stop after two unsustained rates")
    ap.add_argument("--samples", action="store_true", help="also write every request's times")
    ap.add_argument("--clear-url", help="GET this URL between warm-up and measurement")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    start = time.monotonic()
    run_ladder(args)
    progress(f"{CLIENT}: ladder done in {time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
