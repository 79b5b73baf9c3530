"""``python -m analysis analyze EXPERIMENT [EXPERIMENT ...] [--json]``: the full analysis.

``python -m coordinator analyze`` runs exactly this (the coordinator never imports ``analysis``;
it starts this module as a process). Exit codes: 0 done, 2 bad input (unknown experiment, metric,
load point or policy: the message names it).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from analysis.crosshw import parse_prices
from analysis.frame import AnalysisInputError
from analysis.load import load_many
from analysis.report import analyze, stderr_progress, validate_report
from servetune.errors import ServetuneError

_MAX_WARNING_LINES = 10


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m analysis", description="servetune analysis")
    parser.add_argument("-v", "--verbose", action="count", default=0)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    p = sub.add_parser("analyze", help="Pareto, rankings, importance, effects, failures and drift of experiments")
    p.add_argument("experiments", nargs="+", metavar="EXPERIMENT", help="name, folder or spec file; several combine")
    p.add_argument("--results-root", type=Path, default=None, help="default: $SERVETUNE_RESULTS_ROOT or ./runs")
    p.add_argument("--json", action="store_true", help="print the JSON document (analysis/analyze.schema.json)")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON document to this file")
    p.add_argument("--metric", default=None, help="response of the parameter analyses (default: the spec's objective)")
    p.add_argument("--load-point", default=None, help="scenario for the parameter analyses (default: the largest)")
    p.add_argument("--policy", default="slo_throughput", help="ranking policy (default: slo_throughput)")
    p.add_argument("--n-boot", type=int, default=100, help="bootstrap fits for importance (default 100)")
    p.add_argument("--seed", type=int, default=0)
    add_hardware_arguments(p)
    return parser


def add_hardware_arguments(p: argparse.ArgumentParser) -> None:
    """The hardware-class options shared by ``analyze`` and the static report."""
    p.add_argument("--hardware-class", default=None,
                   help="analyse this hardware class only (default: each class on its own; classes never mix)")
    p.add_argument("--exclude-failover", action="store_true",
                   help="leave out failover trials (tag failover-from:...); default: included and marked")
    p.add_argument("--cross-hardware", choices=("per_gpu", "per_gpu_hour"), default=None,
                   help="add the labelled cross-hardware comparison on a normalised metric")
    p.add_argument("--gpu-hour-price", action="append", default=[], metavar="CLASS=USD",
                   help="US dollars per GPU-hour of a hardware class, for --cross-hardware per_gpu_hour (repeat)")


def hardware_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of :func:`analysis.report.analyze` from :func:`add_hardware_arguments`."""
    return {"hardware_class": args.hardware_class, "include_failover": not args.exclude_failover,
            "cross_hardware": args.cross_hardware, "prices": parse_prices(args.gpu_hour_price)}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING - 10 * min(args.verbose, 2), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.n_boot < 0:
        print(f"error: --n-boot must be >= 0, got {args.n_boot}", file=sys.stderr)
        return 2
    try:
        hw = hardware_options(args)
        ds = load_many(args.experiments, args.results_root)
        doc = analyze(ds, metric=args.metric, load_point=args.load_point, policy=args.policy,
                      n_boot=args.n_boot, seed=args.seed, progress=stderr_progress("analysis"), **hw)
    except (AnalysisInputError, ServetuneError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    validate_report(doc)
    text = json.dumps(doc, indent=1, allow_nan=False)
    if args.out is not None:
        tmp = args.out.with_name(args.out.name + ".tmp")
        tmp.write_text(text + "\n", encoding="utf-8")
        tmp.replace(args.out)
    if args.json:
        print(text)
    else:
        print(summary_text(doc))
    return 0


def summary_text(doc: dict[str, Any]) -> str:
    """A few lines a person can act on: the winner per scenario, what matters, what to distrust."""
    lines = [f"experiment {doc['experiment']}: {doc['counts']['trials']} trials "
             f"({doc['counts']['ok']} ok, {doc['counts']['failed']} failed, {doc['counts']['hole']} holes); "
             f"{doc['design']['claim']['kind']}s: {doc['design']['claim']['why']}"]
    if doc.get("simulated"):
        lines.insert(0, f"{doc['simulated']}: a model's expectation, nothing here was measured")
    for part in doc.get("per_hardware_class") or []:
        sim = f" {part['simulated']}" if part.get("simulated") else ""
        lines.append(f"hardware class {part.get('hardware_class')}{sim} (analysed on its own):")
        lines.extend("  " + line for line in summary_text(part).splitlines()[1:])
    cross = doc.get("cross_hardware")
    if isinstance(cross, dict):
        lines.append(f"  {cross.get('label')}")
        for group in (cross.get("ranking") or {}).get("groups", []):
            rows = group.get("rows") or []
            if rows:
                lines.append(f"    load point {group.get('group', {}).get('load_point')}: #1 {rows[0].get('label')}")
    ranking = doc.get("ranking", {})
    for group in ranking.get("groups", []) if isinstance(ranking, dict) else []:
        rows = group.get("rows") or []
        if rows:
            where = ", ".join(f"{k} {v}" for k, v in (group.get("group") or {}).items())
            lines.append(f"  {where}: #1 {rows[0].get('label') or rows[0].get('config_id')}")
            lines.append(f"    {group.get('sentence', '')}")
    imp = doc.get("importance", {})
    for p in imp.get("parameters", []) if isinstance(imp, dict) else []:
        lines.append(f"  {p.get('name')}: {p.get('verdict')}")
    counted: dict[tuple[str, str], int] = {}
    for w in doc.get("warnings", []):  # one line per distinct caveat, however many groups repeat it
        key = (str(w.get("section")), str(w.get("message")))
        counted[key] = counted.get(key, 0) + 1
    for (section, message), n in list(counted.items())[:_MAX_WARNING_LINES]:
        lines.append(f"  warning [{section}] {message}" + (f" (x{n})" if n > 1 else ""))
    if len(counted) > _MAX_WARNING_LINES:
        lines.append(f"  ... and {len(counted) - _MAX_WARNING_LINES} more distinct warning(s) (see --json)")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
