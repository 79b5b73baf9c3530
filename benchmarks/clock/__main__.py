"""``python -m benchmarks.clock [--runs N] [--planted S,S,...] [--write]``: clock-offset estimates
(Cristian's algorithm, coordinator/clock.py) against TEST-ONLY planted offsets.

Each run is one real loopback sweep (tests/clock_fleet.py): one ``daemon start`` process per
planted offset (``SERVETUNE_TEST_CLOCK_OFFSET_S``; 0 plants nothing), all on this machine, so the
truth of each is exactly what was planted; the ``openai`` backend against the FAKE endpoint
(tests/fakes). Per run it reads the latest estimate of every daemon from ``runs/<name>/clock.json``
and checks that the planted offset lies within the reported uncertainty. ``--write`` puts the
table in benchmarks/RESULTS.md (section "Clock offsets"). Exit 0 when every planted offset was
covered, 1 otherwise, 2 for bad usage."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO, git_revision, host, machine_table, median, replace_section, wait_for_quiet
from tests.clock_fleet import ClockRun, run_clock_fleet
from tests.fakes.openai_server import FakeOpenAIServer

BEGIN = "## Clock offsets"
END = "<!-- clock:end -->"


def _daemon_id(offset: float) -> str:
    return f"planted{offset:+g}".replace("+", "p").replace("-", "m").replace(".", "_")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.clock", description=__doc__)
    parser.add_argument("--runs", type=int, default=3, help="sweeps (each estimates every daemon)")
    parser.add_argument("--planted", default="-1.0,0,0.25,2.5", help="planted offsets in seconds, comma-separated")
    parser.add_argument("--write", action="store_true", help="write the section into benchmarks/RESULTS.md")
    parser.add_argument("--max-load", type=float, default=2.0, help="wait for a 1-min load average below this")
    parser.add_argument("--quiet-timeout", type=float, default=120.0, help="... for at most this many seconds")
    args = parser.parse_args(argv)
    try:
        planted = [float(x) for x in args.planted.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--planted {args.planted!r}: expected numbers separated by commas")
    if args.runs < 1 or not planted or len(set(planted)) != len(planted) or any(abs(p) > 3600 for p in planted):
        parser.error("--runs must be >= 1 and --planted distinct offsets within ±3600 s")
    ids = {_daemon_id(p): p for p in planted}
    # the FAKE endpoint's aiohttp logs a traceback for each stream a daemon closes at the end of a window
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    wait_for_quiet(args.max_load, args.quiet_timeout, lambda text: print(text, flush=True))
    runs: list[ClockRun] = []
    load0 = os.getloadavg()[0]
    started = time.time()
    with FakeOpenAIServer(token_delay_ms=5.0, ttft_ms=5.0) as server, tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            run = run_clock_fleet(Path(tmp) / f"run{i}", server.base_url, ids)
            runs.append(run)
            print(f"run {i + 1}/{args.runs}: exit {run.exit_code}; " + "; ".join(
                f"{d} {run.offsets[d]['offset_s']:+.6f} ± {run.offsets[d]['uncertainty_s']:.6f} s"
                if d in run.offsets else f"{d} not estimated" for d in ids), flush=True)
    rows, covered_all = [], True
    for daemon_id, truth in ids.items():
        got = [r.offsets[daemon_id] for r in runs if daemon_id in r.offsets]
        covered = sum(1 for e in got if abs(e["offset_s"] - truth) <= e["uncertainty_s"])
        agrees = sum(1 for e in got if e["agrees"])
        covered_all &= covered == len(got) == len(runs)
        if not got:
            rows.append(f"| {truth:+g} | not estimated | | | | 0 of {len(runs)} | |")
            continue
        errs = [abs(e["offset_s"] - truth) * 1e6 for e in got]
        rows.append(f"| {truth:+g} | {median([e['offset_s'] for e in got]):+.6f} | "
                    f"{median([e['uncertainty_s'] for e in got]) * 1e6:.0f} | {median(errs):.1f} | "
                    f"{median([e['rtt_s'] for e in got]) * 1e3:.2f} | {covered} of {len(got)} | "
                    f"{agrees} of {len(got)} |")
    command = "python -m benchmarks.clock " + " ".join(argv if argv is not None else sys.argv[1:])
    section = "\n".join([
        BEGIN, "",
        f"Command (from the repository root): `.venv/bin/python -m benchmarks.clock{command[len('python -m benchmarks.clock'):].rstrip()}`. "
        f"Run on {time.strftime('%Y-%m-%d', time.gmtime(started))} at "
        f"{git_revision(['coordinator', 'daemon', 'servetune'])}, 1-min load average {load0:.2f} at the start, "
        f"{time.time() - started:.0f} s for {args.runs} run(s). Each run is one real loopback sweep "
        "(tests/clock_fleet.py: a coordinator and one `daemon start` process per planted offset, the `openai` "
        "backend against the FAKE endpoint); every daemon runs on this machine, so the truth of each is "
        "exactly its TEST-ONLY planted offset (`SERVETUNE_TEST_CLOCK_OFFSET_S`; 0 plants nothing). The estimate "
        "is the latest of the run (probes on join, then every 1 s here; 5 probes per estimate, the one with the "
        "smallest unaccounted round trip kept). Medians over runs; \"covered\": the planted offset lies "
        "within estimate ± uncertainty (Cristian's bound, which holds whenever one-way delays are >= 0). "
        "On a shared machine the round trips are mostly scheduling delays of the coordinator's and the "
        "daemons' loops (the daemons measure meanwhile); the load average is on the record for that reason.", "",
        "| planted (s) | estimate (s) | uncertainty (µs) | abs. error (µs) | round trip (ms) | covered | agrees (within ± of 0) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *rows, "",
        *machine_table(host()), "",
        END, "",
    ])
    print(section)
    if args.write:
        replace_section(REPO / "benchmarks" / "RESULTS.md", section, BEGIN, END)
    return 0 if covered_all else 1


if __name__ == "__main__":
    sys.exit(main())
