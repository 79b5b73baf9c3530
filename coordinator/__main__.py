"""``python -m coordinator``: see :mod:`coordinator.cli`."""

from coordinator.cli import main

raise SystemExit(main())
