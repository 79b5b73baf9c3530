"""Small shared pieces of the analysis benchmarks: progress lines, timing, the machine's description."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[2]
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
    vals = [float(x) for x in xs if x is not None]
    return statistics.median(vals) if vals else float("nan")


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def git_revision() -> str:
    """The commit of this checkout, and whether analysis/ or benchmarks/analysis/ differ from it."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             timeout=10).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "analysis", "benchmarks/analysis"], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.strip()  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return f"{sha} + uncommitted changes in analysis/, benchmarks/analysis/" if dirty else sha or "unknown"


def machine() -> dict[str, str]:
    """Cores, CPU model, RAM, kernel, Python and the versions of the libraries that do the work."""
    cpu_model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            mem_kb = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
        ram = f"{mem_kb / 2**20:.1f} GiB"
    except OSError:
        ram = "unknown"
    return {
        "cores (nproc)": str(os.cpu_count()),
        "CPU model": cpu_model,
        "RAM": ram,
        "kernel": platform.release(),
        "Python": platform.python_version(),
        "optuna": version("optuna"),
        "scikit-learn": version("scikit-learn"),
        "shap": version("shap"),
        "numpy": version("numpy"),
        "pandas": version("pandas"),
        "xarray": version("xarray"),
        "servetune (git)": git_revision(),
    }


def wait_for_quiet(max_load: float, timeout_s: float) -> tuple[float, bool]:
    """Poll the 1-min load average until it is below ``max_load`` or ``timeout_s`` passed; returns
    the last load average and whether it settled (the figures go on the record either way)."""
    deadline = time.monotonic() + timeout_s
    while True:
        load = os.getloadavg()[0]
        if load < max_load:
            say(f"1-min load average {load:.2f} (< {max_load:g}): starting")
            return load, True
        left = deadline - time.monotonic()
        if left <= 0:
            say(f"1-min load average still {load:.2f} after {timeout_s:.0f} s: running anyway (it goes on the record)")
            return load, False
        say(f"1-min load average {load:.2f}, waiting for < {max_load:g} ({left:.0f} s left)")
        time.sleep(min(15.0, max(left, 0.1)))


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str, allow_nan=True) + "\n", encoding="utf-8")
