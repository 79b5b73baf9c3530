"""``python -m benchmarks.dashboards``: see :mod:`benchmarks.dashboards.render`."""

import sys

from benchmarks.dashboards.render import main

sys.exit(main())
