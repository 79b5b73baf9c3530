"""The command: ``python -m benchmarks.analysis [importance | scale | all]``.

``importance`` and ``scale`` run one part, print its tables (Markdown) on stdout and save every
figure as JSON under ``--out-dir``; ``all`` (the default) runs both and writes the "Analysis"
section of ``benchmarks/RESULTS.md`` (``--no-write`` prints it instead). Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.analysis import report
from benchmarks.analysis.util import machine, say, write_json
from benchmarks.common import REPO, wait_for_quiet


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.analysis", description=__doc__)
    ap.add_argument("part", nargs="?", default="all", choices=("importance", "scale", "all"))
    ap.add_argument("--sizes", default="30,500", help="configs per planted dataset (default: %(default)s)")
    ap.add_argument("--seeds", type=int, default=5, help="seeded datasets per size (default: %(default)s)")
    ap.add_argument("--n-params", type=int, default=8, help="parameters of the planted datasets (default: %(default)s)")
    ap.add_argument("--n-boot", type=int, default=100, help="bootstrap fits of our importance (default: %(default)s)")
    ap.add_argument("--noise", type=float, default=0.05, help="log-scale noise sd (default: %(default)s)")
    ap.add_argument("--full-configs", type=int, default=10_000, help="trials of the full analysis (default: %(default)s)")
    ap.add_argument("--full-params", type=int, default=12, help="parameters of the full analysis (default: %(default)s)")
    ap.add_argument("--full-runs", type=int, default=3, help="repeats of the full analysis (default: %(default)s)")
    ap.add_argument("--million-configs", type=int, default=250_000, help="configs of the big dataset (default: %(default)s)")
    ap.add_argument("--million-repeats", type=int, default=4, help="trials per config there (default: %(default)s)")
    ap.add_argument("--million-runs", type=int, default=3, help="repeats of front + rank (default: %(default)s)")
    ap.add_argument("--skip", default="", help="comma list of scale parts to skip: full, million")
    ap.add_argument("--max-load", type=float, default=1.0, help="wait for a 1-min load average below this")
    ap.add_argument("--load-wait-s", type=float, default=300, help="give up waiting for it after this (then run)")
    ap.add_argument("--no-profile", action="store_true", help="skip the cProfile run of each scale part")
    ap.add_argument("--out-dir", type=Path, default=REPO / "benchmarks" / "out" / "analysis")
    ap.add_argument("--results", type=Path, default=REPO / "benchmarks" / "RESULTS.md")
    ap.add_argument("--render", type=Path, default=None, metavar="DIR",
                    help="measure nothing: write the section again from a finished run's JSON in DIR")
    ap.add_argument("--no-write", action="store_true", help="print the RESULTS.md section instead of writing it")
    args = ap.parse_args(argv)
    args.size_list = [int(s) for s in args.sizes.split(",") if s]
    args.skip_set = {s.strip() for s in args.skip.split(",") if s.strip()}
    return args


def run_importance(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks.analysis import optuna_side, side_by_side

    optuna_side.quiet()
    return side_by_side.bench(sizes=args.size_list, seeds=args.seeds, n_params=args.n_params, n_boot=args.n_boot,
                              noise=args.noise)


def run_scale(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks.analysis import scale

    out: dict[str, Any] = {}
    if "full" not in args.skip_set:
        out["full"] = scale.full_analysis(n_configs=args.full_configs, n_params=args.full_params, n_boot=args.n_boot,
                                          repeats=args.full_runs, profile=not args.no_profile)
    if "million" not in args.skip_set:
        out["million"] = scale.million(n_configs=args.million_configs, repeats_per_config=args.million_repeats,
                                       runs=args.million_runs, profile=not args.no_profile)
    return out


def render(args: argparse.Namespace) -> int:
    """Write the section from the figures a finished run saved (``summary.json``, ``importance.json``,
    ``scale.json``): the same run's numbers, laid out by the current report code."""
    import json

    d: Path = args.render
    summary = json.loads((d / "summary.json").read_text(encoding="utf-8"))
    imp = json.loads((d / "importance.json").read_text(encoding="utf-8")) if (d / "importance.json").exists() else None
    sc = json.loads((d / "scale.json").read_text(encoding="utf-8")) if (d / "scale.json").exists() else None
    started = summary.get("started") or dt.datetime.strptime(d.name, "%Y%m%dT%H%M%SZ").strftime("%Y-%m-%d %H:%M")
    text = report.section(summary["machine"], [summary["command"]], started, float(summary["wall_s"]), imp, sc)
    if args.no_write:
        print(text)
    else:
        report.write_section(args.results, text)
        say(f"wrote the analysis section of {args.results} from {d}")
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    args = parse_args(argv)
    if args.render is not None:
        return render(args)
    started = dt.datetime.now(dt.timezone.utc)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    out_dir = args.out_dir / stamp
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    mach = machine()
    load, settled = wait_for_quiet(args.max_load, args.load_wait_s, say)
    mach["1-min load average at start"] = f"{load:.2f}" + ("" if settled else f" (never fell below {args.max_load:g})")
    imp = sc = None
    if args.part in ("importance", "all"):
        imp = run_importance(args)
        write_json(out_dir / "importance.json", imp)
    if args.part in ("scale", "all"):
        sc = run_scale(args)
        for k, v in sc.items():
            if v.get("profile"):
                (out_dir / f"profile-{k}.txt").write_text(v["profile"].pop("text"), encoding="utf-8")
        write_json(out_dir / "scale.json", sc)
    wall = time.monotonic() - t0
    mach["1-min load average at end"] = f"{os.getloadavg()[0]:.2f}"
    argv_used = sys.argv[1:] if argv is None else argv
    command = ".venv/bin/python -m benchmarks.analysis" + ("".join(" " + shlex.quote(a) for a in argv_used))
    text = report.section(mach, [command], started.strftime("%Y-%m-%d %H:%M"), wall, imp, sc)
    write_json(out_dir / "summary.json", {"machine": mach, "command": command, "wall_s": wall,
                                          "started": started.strftime("%Y-%m-%d %H:%M")})
    if args.part == "all" and not args.no_write:
        report.write_section(args.results, text)
        say(f"wrote the analysis section of {args.results}; raw figures in {out_dir}")
    else:
        print(text)
        say(f"raw figures in {out_dir}")
    return 0
