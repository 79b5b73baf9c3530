"""``python -m coordinator analyze EXPERIMENT [--json]``: the full analysis of an experiment.

The coordinator never imports ``analysis`` (the wings stand side by side on ``servetune``), so
this subcommand runs ``python -m analysis analyze`` as a child process with the same interpreter,
passes every option through, and returns its exit code (:mod:`coordinator.commands.delegate`).
The options and the JSON document are documented there (``analysis/__main__.py``,
``analysis/analyze.schema.json``).
"""

from __future__ import annotations

import argparse
from typing import Any

from coordinator.commands import delegate


def register(sub: Any) -> None:
    delegate.register(sub, "analyze",
                      "Pareto fronts, rankings, parameter importance, effects, failures, drift (--json)", run)


def run(args: argparse.Namespace) -> int:
    return delegate.run_child(["analysis", "analyze"], args.rest, "analysis")
