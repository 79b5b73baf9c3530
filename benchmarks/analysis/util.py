"""Small shared pieces of the analysis benchmarks: progress lines, timing, the machine's description."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from benchmarks import common

log = logging.getLogger(__name__)

T = TypeVar("T")
_T0 = time.monotonic()


def say(msg: str) -> None:
    """One progress line on stderr, with the seconds since the command started."""
    print(f"[{time.monotonic() - _T0:7.1f} s] {msg}", file=sys.stderr, flush=True)


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    """``fn()`` and its wall time in seconds (``time.perf_counter``)."""
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def median(xs: Sequence[float]) -> float:
    """The median of the values that are not None, as a float; NaN when there are none."""
    vals = [float(x) for x in xs if x is not None]
    return common.median(vals) if vals else float("nan")


def machine() -> dict[str, str]:
    """Cores, CPU model, RAM, kernel, Python and the versions of the libraries that do the work."""
    libraries = ("optuna", "scikit-learn", "shap", "numpy", "pandas", "xarray")
    return {
        **common.host(),
        **{lib: common.version(lib) for lib in libraries},
        "servetune (git)": common.git_revision(("analysis", "benchmarks/analysis")),
    }


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str, allow_nan=True) + "\n", encoding="utf-8")
