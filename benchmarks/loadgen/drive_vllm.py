"""Driver of ``vllm bench serve``: the installed vLLM's benchmark, one pinned process, a ladder of rates.

Run by :mod:`benchmarks.loadgen.run` as ``python -m benchmarks.loadgen.drive_vllm ...``. Each
point is exactly what ``vllm bench serve`` does for its command line (``add_cli_args`` + ``main``
of ``vllm.benchmarks.serve``, the way ``vllm bench serve`` itself runs them): the random dataset
(prompts made with the tiny model's tokenizer), ``--request-rate R --burstiness inf`` (constant
gaps), ``--ignore-eos``, ``--save-result --save-detailed``. Its saved JSON gives every request's
start (``time.perf_counter``, CLOCK_MONOTONIC on Linux), latency, TTFT and error; the point is
built from those and from the TTFT percentiles vLLM reports.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from benchmarks.loadgen import ladder
from benchmarks.loadgen.ladder import Measure
from benchmarks.loadgen.points import Point
from benchmarks.loadgen.sse import MODEL, OUTPUT_TOKENS, PROMPT_TOKENS

CLIENT = "vllm bench serve"


def vllm_argv(args: argparse.Namespace, rate: float, n: int, rep: int, filename: str) -> list[str]:
    return [
        "--backend", "openai",
        "--base-url", args.base_url,
        "--endpoint", "/v1/completions",
        "--model", MODEL,
        "--served-model-name", MODEL,
        "--tokenizer", args.tokenizer,
        "--dataset-name", "random",
        "--random-input-len", str(PROMPT_TOKENS),
        "--random-output-len", str(OUTPUT_TOKENS),
        "--num-prompts", str(n),
        "--request-rate", f"{rate:g}",
        "--burstiness", "inf",
        "--ignore-eos",
        "--temperature", "0",
        "--seed", str(rep),
        "--num-warmups", str(args.warmup),
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,99",
        "--disable-tqdm",
        "--save-result",
        "--save-detailed",
        "--result-dir", args.result_dir,
        "--result-filename", filename,
    ]  # fmt: skip


def point_from(rate: float, result: dict[str, Any]) -> Point:
    starts: list[float] = result["start_times"]
    lats: list[float] = result["latencies"]
    errors: list[str] = result["errors"]
    ok = [i for i, err in enumerate(errors) if not err]
    first_send = min(starts) if starts else 0.0
    last_end = max(starts[i] + lats[i] for i in ok) if ok else first_send
    return Point(
        client=CLIENT,
        offered=rate,
        n_sent=len(starts),
        n_ok=len(ok),
        first_send_s=first_send,
        last_end_s=last_end,
        clock="mono",
        ttft_ms={"p50": result["median_ttft_ms"], "mean": result["mean_ttft_ms"], "p99": result["p99_ttft_ms"]},
        extra={
            "request_throughput": result["request_throughput"],
            "duration": result["duration"],
            "errors": sorted({e.strip().splitlines()[-1] for e in errors if e})[:5],
        },
    )


def measure(args: argparse.Namespace) -> Measure:
    """One point: ``vllm bench serve``'s own ``add_cli_args`` + ``main`` for the rate."""
    # Imported here: vLLM takes seconds to import and --help should not wait for it.
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    if time.get_clock_info("perf_counter").implementation != "clock_gettime(CLOCK_MONOTONIC)":
        raise SystemExit("vLLM's start_times use time.perf_counter, which is not CLOCK_MONOTONIC here")

    def one(rate: float, rep: int, n: int, out: dict[str, Any]) -> Point:
        filename = f"vllm_r{rate:g}_{rep}.json"
        parser = FlexibleArgumentParser()
        add_cli_args(parser)
        p = point_from(rate, bench_main(parser.parse_args(vllm_argv(args, rate, n, rep, filename))))
        p.extra["result_file"] = filename
        return p

    return one


def main(argv: list[str] | None = None) -> int:
    ap = ladder.parser(__doc__)
    ap.add_argument("--tokenizer", required=True, help="the tiny model directory")
    ap.add_argument("--result-dir", required=True, help="where vLLM saves its JSON results")
    args = ap.parse_args(argv)
    ladder.run(args, CLIENT, measure(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
