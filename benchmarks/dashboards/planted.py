"""The set-up the server-side page benchmarks share: a planted dataset written into a temporary
results root, and the dashboard's pages opened on it in a Bokeh document, as a browser session's
first request builds them (no browser: paint is not included).

    with planted_root(ds, "bench-curves") as folder:
        warm(folder)                                   # what the server's warm-up loads
        took, page = timed_visit("bench-curves", "curves", ready)
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np


@contextmanager
def planted_root(ds: Any, name: str) -> Iterator[Path]:
    """Write the SYNTHETIC dataset ``ds`` as experiment ``name`` (a bare ``results.nc``, in the
    coordinator's layout) under a temporary results root, point ``$SERVETUNE_RESULTS_ROOT`` at it,
    and yield the experiment's folder; the root is removed (and the variable restored) afterwards."""
    from servetune.netcdf import write_netcdf

    ds.attrs["experiment"] = name
    ds = ds.assign_coords(experiment=("trial", np.full(ds.sizes["trial"], name, dtype=object)))
    before = os.environ.get("SERVETUNE_RESULTS_ROOT")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / name
        folder.mkdir()
        write_netcdf(ds, folder / "results.nc")
        os.environ["SERVETUNE_RESULTS_ROOT"] = tmp
        try:
            yield folder
        finally:
            if before is None:
                os.environ.pop("SERVETUNE_RESULTS_ROOT", None)
            else:
                os.environ["SERVETUNE_RESULTS_ROOT"] = before


def warm(folder: Path) -> None:
    """Load what the server's warm-up loads before it opens its port (dataset, trial table, drift
    marks) and import every page module (by building the experiments page once)."""
    from bokeh.document import Document
    from panel.io.state import set_curdoc

    from dashboards.app import App, state
    from dashboards.app.marks import drift_marks

    state.dataset(folder)
    state.table(folder)
    drift_marks(folder)
    with set_curdoc(Document()):
        App({"page": "experiments", "experiment": folder.name}, live=False)


def visit(name: str, page: str, ready: Callable[[Any], bool], **args: str) -> Any:
    """Build ``page`` of experiment ``name`` in a fresh Bokeh document, every model of it, and
    return the page object; raises ``AssertionError`` unless ``ready(page)`` (its content is shown)."""
    from bokeh.document import Document
    from panel.io.state import set_curdoc

    from dashboards.app import App

    doc = Document()
    with set_curdoc(doc):
        app = App({"page": page, "experiment": name, **args}, live=False)
        app.template().server_doc(doc)
    assert ready(app.current), f"the {page} page is not ready"
    return app.current


def timed_visit(name: str, page: str, ready: Callable[[Any], bool], **args: str) -> tuple[float, Any]:
    """:func:`visit`, timed with ``time.perf_counter``: (seconds, the page)."""
    t0 = time.perf_counter()
    got = visit(name, page, ready, **args)
    return time.perf_counter() - t0, got


def forget(*kinds: str) -> None:
    """Drop the dashboard's cached results and background futures of these kinds (the first
    element of their keys), so the next visit computes them again."""
    from dashboards.app import state

    for cache in (state._FUTURES, state._CACHE):
        for key in [k for k in cache if k[0] in kinds]:
            del cache[key]


def visits(name: str, page: str, ready: Callable[[Any], bool], kinds: tuple[str, ...], repeats: int,
           change: tuple[str, Callable[[Any], None]]) -> dict[str, list[float]]:
    """Seconds, ``repeats`` times: the page's first visit (its cached results of ``kinds`` forgotten
    first), a second visit, and ``change`` (its name, and what it does to the second visit's page)."""
    what, act = change
    times: dict[str, list[float]] = {"page first visit": [], "page again": [], what: []}
    for _ in range(repeats):
        forget(*kinds)
        times["page first visit"].append(timed_visit(name, page, ready)[0])
        took, got = timed_visit(name, page, ready)
        times["page again"].append(took)
        t0 = time.perf_counter()
        act(got)
        times[what].append(time.perf_counter() - t0)
    return times


def summary(times: dict[str, list[float]]) -> str:
    """One line per timing: its median [min, max] in seconds."""
    import statistics

    return "\n".join(f"  {k:20s} {statistics.median(v):6.2f} [{min(v):.2f}, {max(v):.2f}]" for k, v in times.items())
