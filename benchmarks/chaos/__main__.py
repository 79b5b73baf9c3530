"""``python -m benchmarks.chaos --schedules N [--seed S] [--json PATH]``: seeded chaos schedules
against a real fleet on loopback; exit 0 only when no schedule broke an invariant (1 otherwise,
2 for bad usage)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from benchmarks.chaos import report
from benchmarks.chaos.run import ChaosOptions, ScheduleResult, run_chaos
from benchmarks.common import REPO, git_revision, host


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__)
    parser.add_argument("--schedules", type=int, required=True, help="how many schedules to run")
    parser.add_argument("--seed", type=int, default=0, help="schedule i is drawn from random.Random(seed + i)")
    parser.add_argument("--json", type=Path, default=None, help="write per-schedule details here")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for the schedules' stores and logs (default benchmarks/out/chaos/<UTC time>)")
    parser.add_argument("--schedule-timeout", type=float, default=120.0, help="seconds one schedule may take")
    parser.add_argument("--max-reruns", type=int, default=3, help="sweeps run again after holes, per schedule")
    parser.add_argument("--cold-cache", action="store_true",
                        help="let each schedule's daemons generate the tiny model themselves (concurrently)")
    args = parser.parse_args(argv)
    if args.schedules < 1 or args.schedule_timeout <= 0 or args.max_reruns < 0:
        parser.error("--schedules must be >= 1, --schedule-timeout > 0, --max-reruns >= 0")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    out = args.out or REPO / "benchmarks" / "out" / "chaos" / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    options = ChaosOptions(schedules=args.schedules, out=out.resolve(), seed=args.seed,
                           deadline_s=args.schedule_timeout, max_reruns=args.max_reruns, cold_cache=args.cold_cache)
    print(f"chaos: {args.schedules} schedules from seed {args.seed}; folders under {options.out}", flush=True)

    def say(result: ScheduleResult, index: int) -> None:
        print(report.line(result, index, args.schedules), flush=True)

    started = time.time()
    load_at_start = os.getloadavg()[0]
    results = run_chaos(options, say)
    summary = report.summary(results)
    print(report.summary_text(summary), flush=True)
    if args.json is not None:
        meta = {"command": " ".join(["python -m benchmarks.chaos", *(argv if argv is not None else sys.argv[1:])]),
                "started_at_unix": int(started), "wall_s": round(time.time() - started, 1), "machine": host(),
                "git": git_revision(["coordinator", "daemon", "servetune", "tests", "benchmarks/chaos"]),
                "out": str(options.out), "code": sorted({c for r in results for c in r.code}),
                "load_average_1min": {"start": round(load_at_start, 2), "end": round(os.getloadavg()[0], 2)}}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report.document(results, meta), indent=2) + "\n")
    return 0 if summary["violations"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
