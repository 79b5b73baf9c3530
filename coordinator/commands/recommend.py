"""``python -m coordinator recommend EXPERIMENT [--weights lp=w,...] [--slo metric<=value ...]
[--rule weighted|regret] [--include-drift] [--json]``: one engine config to deploy per hardware class.

The coordinator never imports ``analysis``, so this subcommand runs ``python -m analysis.decide_cli``
as a child process with the same interpreter and passes every option through
(:mod:`coordinator.commands.delegate`). The options, the rule and the decision record
(``runs/<name>/decision.json``) are documented there and in :mod:`analysis.decision`:
exit 0 decided, 2 bad input (named; nothing written).
"""

from __future__ import annotations

import argparse
from typing import Any

from coordinator.commands import delegate


def register(sub: Any) -> None:
    delegate.register(sub, "recommend", "one config to deploy per hardware class for a traffic mix and SLOs", run)


def run(args: argparse.Namespace) -> int:
    return delegate.run_child(["analysis.decide_cli"], args.rest, "the recommendation")
