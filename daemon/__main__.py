"""``python -m daemon``: same as the ``daemon`` console script."""

from daemon.cli import main

raise SystemExit(main())
