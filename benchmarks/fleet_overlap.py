"""Measurement-window overlap on one shared endpoint: two real daemons, a real coordinator, the FAKE
``openai`` endpoint of tests/fakes/openai_server.py (its own request log, each daemon under its
own API key), with the fleet file declaring the two a resource group and without it.

    .venv/bin/python -m benchmarks.fleet_overlap --runs 3

Prints a Markdown table for benchmarks/RESULTS.md: per setting, the pairs of windows of the two
daemons that overlapped (a window: a daemon's requests merged where one starts before the last
ended) and the seconds they overlapped, medians over the runs, with the range.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fakes.openai_server import FakeOpenAIServer  # noqa: E402
from tests.fleet_harness import window_overlaps  # noqa: E402
from tests.test_fleet_groups import FLEET_FILE, run_shared_fleet  # noqa: E402

SETTINGS = {"declared group (policy)": FLEET_FILE, "no group": None}


def one_run(fleet_file: str | None, repeats: int, requests: int) -> tuple[int, float, dict[str, int]]:
    with tempfile.TemporaryDirectory() as tmp, FakeOpenAIServer(token_delay_ms=2.0, ttft_ms=5.0) as server:
        fleet, _ = run_shared_fleet(Path(tmp), server, fleet_file, repeats=repeats, requests=requests)
        pairs, seconds = window_overlaps(list(server.fake.request_log))
        rows = fleet.query("SELECT daemon_id, COUNT(*) FROM attempts WHERE status='ok' GROUP BY daemon_id")
        return pairs, seconds, {str(d): int(n) for d, n in rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=4, help="spec repeats (one batch each; 2 load points a batch)")
    ap.add_argument("--requests", type=int, default=20, help="requests per load point")
    args = ap.parse_args(argv)
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    print(f"machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, Python "
          f"{platform.python_version()}; servetune {git}; {args.runs} run(s) per setting, {args.repeats} batches of "
          f"2 trials x {args.requests} requests\n")
    print("| setting | overlapping window pairs, median (range) | seconds overlapped, median (range) | "
          "ok trials per daemon (each run) |")
    print("| --- | ---: | ---: | --- |")
    for name, fleet_file in SETTINGS.items():
        runs = [one_run(fleet_file, args.repeats, args.requests) for _ in range(args.runs)]
        pairs = [p for p, _, _ in runs]
        secs = [s for _, s, _ in runs]
        split = "; ".join(" / ".join(f"{d} {n}" for d, n in sorted(by.items())) for _, _, by in runs)
        print(f"| {name} | {statistics.median(pairs):g} ({min(pairs)}-{max(pairs)}) | "
              f"{statistics.median(secs):.2f} ({min(secs):.2f}-{max(secs):.2f}) | {split} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
