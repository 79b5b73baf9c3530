"""``python -m benchmarks.loadgen``: see :mod:`benchmarks.loadgen.run`."""

import sys

from benchmarks.loadgen.run import main

sys.exit(main())
