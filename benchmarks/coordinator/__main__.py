"""``python -m benchmarks.coordinator``: see :mod:`benchmarks.coordinator.run`."""

import sys

from benchmarks.coordinator.run import main

sys.exit(main())
