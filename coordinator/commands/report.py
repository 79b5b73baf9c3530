"""``python -m coordinator report EXPERIMENT --out report.html``: the static offline HTML report.

The coordinator never imports ``analysis`` or ``dashboards``, so this subcommand runs
``python -m dashboards report`` as a child process with the same interpreter, passes every option
through (``--results-root`` included), and returns its exit code (:mod:`coordinator.commands.delegate`).
The options are documented there (``dashboards/report.py``): exit 0 written, 2 bad input (named;
nothing written).
"""

from __future__ import annotations

import argparse
from typing import Any

from coordinator.commands import delegate


def register(sub: Any) -> None:
    delegate.register(sub, "report", "write one self-contained HTML report that opens offline (--out FILE)", run)


def run(args: argparse.Namespace) -> int:
    return delegate.run_child(["dashboards", "report"], args.rest, "the report")
