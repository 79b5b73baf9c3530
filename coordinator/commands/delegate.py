"""Subcommands that hand the whole command line to another wing's ``python -m <module> <command>``.

The coordinator never imports ``analysis`` or ``dashboards`` (the wings stand side by side on
``servetune``), so such a subcommand runs the other wing as a child process with the same
interpreter, passes every option through (``--help`` included) and returns the child's exit code.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 3600.0


def register(sub: Any, name: str, help_text: str, run: Callable[[argparse.Namespace], int]) -> None:
    """Add subcommand ``name``, whose every argument (``--help`` included) lands in ``args.rest``
    for ``run`` to pass on to the child.

    Args:
        sub: the coordinator's subparsers.
        name: the subcommand.
        help_text: its one-line help in the coordinator's command list.
        run: the subcommand's ``run(args)``, returning the exit code.
    """
    p = sub.add_parser(name, help=help_text, add_help=False, prefix_chars="+")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=run)


def run_child(command: list[str], rest: list[str], what: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
    """Run ``python -m <command...> <rest...>`` with this interpreter; its exit code, or 1 when it
    runs past ``timeout_s`` (then killed, and said on stderr naming ``what``)."""
    cmd = [sys.executable, "-m", *command, *rest]
    try:
        return subprocess.run(cmd, timeout=timeout_s, check=False).returncode
    except subprocess.TimeoutExpired:
        print(f"error: {what} did not finish within {timeout_s:.0f} s", file=sys.stderr)
        return 1
