"""``python -m benchmarks.analysis``: see :mod:`benchmarks.analysis.run`."""

import sys

from benchmarks.analysis.run import main

sys.exit(main())
