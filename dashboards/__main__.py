"""``python -m dashboards COMMAND ...``: command-line entry points of the dashboards package.

``report EXPERIMENT --out FILE``: the static offline HTML report (:mod:`dashboards.report`).
``python -m coordinator report`` runs exactly this as a child process.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

USAGE = "usage: python -m dashboards report EXPERIMENT [EXPERIMENT ...] --out FILE [options]"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    if args[0] != "report":
        print(f"error: unknown command {args[0]!r}\n{USAGE}", file=sys.stderr)
        return 2
    from dashboards.report import main as report_main

    return report_main(args[1:])


if __name__ == "__main__":
    raise SystemExit(main())
