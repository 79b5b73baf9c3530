"""``python -m coordinator analyze EXPERIMENT [--json]``: the full analysis of an experiment.

The coordinator never imports ``analysis`` (the wings stand side by side on ``servetune``), so
this subcommand runs ``python -m analysis analyze`` as a child process with the same interpreter,
passes every option through, and returns its exit code. The options and the JSON document are
documented there (``analysis/__main__.py``, ``analysis/analyze.schema.json``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Any

DEFAULT_TIMEOUT_S = 3600.0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "analyze", help="Pareto fronts, rankings, parameter importance, effects, failures, drift (--json)",
        add_help=False, prefix_chars="+",  # every option, --help included, belongs to the analysis
    )
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cmd = [sys.executable, "-m", "analysis", "analyze", *args.rest]
    try:
        return subprocess.run(cmd, timeout=DEFAULT_TIMEOUT_S, check=False).returncode
    except subprocess.TimeoutExpired:
        print(f"error: analysis did not finish within {DEFAULT_TIMEOUT_S:.0f} s", file=sys.stderr)
        return 1
