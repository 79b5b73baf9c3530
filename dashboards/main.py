"""Entry point of ``panel serve dashboards/`` (Bokeh serves a folder through its ``main.py``).

Each browser session runs this file: it makes the repository importable (``panel serve`` puts only
this folder on ``sys.path``) and serves :func:`dashboards.app.build`'s page. Experiments are read
from the same results root as the CLI: ``$SERVETUNE_RESULTS_ROOT``, else ``./runs`` where the
server was started. ``app_hooks.py`` next to this file loads them before the server opens its port.
"""

from __future__ import annotations

import sys
from pathlib import Path

_REPO = str(Path(__file__).resolve().parents[1])
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from dashboards.app import build  # noqa: E402

build().servable(title="servetune")
