"""Bokeh server lifecycle hooks of ``panel serve dashboards/`` (Bokeh runs this file of the served
folder once per server process).

:func:`on_server_loaded` starts loading every experiment's dataset, trial table and (for large
ones) the default Pareto front in the background as soon as the server starts, so the first browser
visit finds them in memory (or already on their way) instead of paying a cold ``analysis.load``
(about 5 s for 100,000 trials). The work goes through :func:`dashboards.app.state.warm`: the same
per-version cache the pages read, so a page that asks for a dataset still loading waits for that
one load rather than starting a second. A log line says when the warm-up finished.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any

_REPO = str(Path(__file__).resolve().parents[1])
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

log = logging.getLogger("dashboards.app_hooks")


def _warm() -> None:
    from dashboards.app import state

    t0 = time.perf_counter()
    try:
        started = state.warm_all()
        for name, fut in started:
            try:
                fut.result()
            except Exception:
                log.exception("warm-up of experiment %s failed", name)
    except Exception:
        log.exception("dashboard warm-up failed")
        return
    # print, not only log: `panel serve` shows no INFO lines by default, and the benchmark waits for this
    print(f"servetune dashboard: warm-up of {len(started)} experiment(s) under {state.root()} done in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)


def on_server_loaded(server_context: Any) -> None:
    """Start the warm-up in a background thread (the server answers meanwhile)."""
    threading.Thread(target=_warm, name="dashboard-warm-up", daemon=True).start()
