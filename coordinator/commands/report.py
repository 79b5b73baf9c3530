"""``python -m coordinator report EXPERIMENT --out report.html``: the static offline HTML report.

The coordinator never imports ``analysis`` or ``dashboards``, so this subcommand runs
``python -m dashboards report`` as a child process with the same interpreter, passes every option
through (``--results-root`` included), and returns its exit code. The options are documented there
(``dashboards/report.py``): exit 0 written, 2 bad input (named; nothing written).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Any

DEFAULT_TIMEOUT_S = 3600.0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "report", help="write one self-contained HTML report that opens offline (--out FILE)",
        add_help=False, prefix_chars="+",  # every option, --help included, belongs to the report
    )
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cmd = [sys.executable, "-m", "dashboards", "report", *args.rest]
    try:
        return subprocess.run(cmd, timeout=DEFAULT_TIMEOUT_S, check=False).returncode
    except subprocess.TimeoutExpired:
        print(f"error: the report did not finish within {DEFAULT_TIMEOUT_S:.0f} s", file=sys.stderr)
        return 1
