"""Command line of the coordinator: one module per subcommand under :mod:`coordinator.commands`.

Usage errors exit 2 with the subcommand's help; invalid specs exit 2 naming every bad key;
an interrupted sweep exits 130.
"""

from __future__ import annotations

import argparse
import logging
import sys

from coordinator.commands import analyze as analyze_cmd
from coordinator.commands import keys as keys_cmd
from coordinator.commands import recommend as recommend_cmd
from coordinator.commands import report as report_cmd
from coordinator.commands import sweep as sweep_cmd
from coordinator.commands import validate as validate_cmd
from servetune.keys import shield_key_args


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m coordinator",
        description="servetune coordinator: find the best vLLM serving configuration for a workload.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-v info, -vv debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    validate_cmd.register(sub)
    sweep_cmd.register(sub)
    analyze_cmd.register(sub)
    report_cmd.register(sub)
    recommend_cmd.register(sub)
    keys_cmd.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(shield_key_args(sys.argv[1:] if argv is None else argv))
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    code: int = args.func(args)
    return code
