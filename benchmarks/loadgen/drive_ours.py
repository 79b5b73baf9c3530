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
import urllib.request
from collections.abc import Callable
from typing import Any

from benchmarks.loadgen import ladder
from benchmarks.loadgen.ladder import Measure
from benchmarks.loadgen.points import Point
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


def measure(args: argparse.Namespace) -> Measure:
    """One point: ``run_load_point`` with a :class:`~servetune.spec.LoadPoint` of the rate."""

    def one(rate: float, rep: int, n: int, out: dict[str, Any]) -> Point:
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
        return point_from(rate, result.samples, result.window_s)

    return one


def main(argv: list[str] | None = None) -> int:
    ap = ladder.parser(__doc__)
    ap.add_argument("--arrival", choices=["constant", "poisson"], default="constant")
    ap.add_argument("--samples", action="store_true", help="also write every request's times")
    ap.add_argument("--clear-url", help="GET this URL between warm-up and measurement")
    args = ap.parse_args(argv)
    ladder.run(args, CLIENT, measure(args), out={"samples": []})
    return 0


if __name__ == "__main__":
    sys.exit(main())
