"""What every benchmark command shares: the machine's description, waiting for a quiet machine,
medians, the machine table and the replacement of one section of ``benchmarks/RESULTS.md``.

Standard library only: the load generator's driver scripts import it in their own child processes.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import platform
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]


def version(dist: str) -> str:
    """The installed version of distribution ``dist``, or ``"not installed"``."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def git_revision(watched: Sequence[str]) -> str:
    """The commit of this checkout, and whether the folders ``watched`` (relative to the repository
    root: the code the benchmark measures) differ from it; ``"unknown"`` when git does not answer."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             timeout=10).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "status", "--porcelain", "--", *watched], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.strip()  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    folders = ", ".join(f"{w}/" for w in watched)
    return f"{sha} + uncommitted changes in {folders}" if dirty else sha or "unknown"


def host() -> dict[str, str]:
    """Cores, CPU model, RAM, kernel and Python, in that order (``"unknown"`` where /proc cannot be read)."""
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
    }


def wait_for_quiet(max_load: float, timeout_s: float, say: Callable[[str], None],
                   load_format: str = ".2f") -> tuple[float, bool]:
    """Poll the 1-min load average until it is below ``max_load`` or ``timeout_s`` passed, telling
    ``say`` each time (the load written with ``load_format``); returns the last load average and
    whether it settled (the figures go on the record either way)."""
    deadline = time.monotonic() + timeout_s
    while True:
        load = os.getloadavg()[0]
        if load < max_load:
            say(f"1-min load average {load:{load_format}} (< {max_load:g}): starting")
            return load, True
        left = deadline - time.monotonic()
        if left <= 0:
            say(f"1-min load average still {load:.2f} after {timeout_s:.0f} s: running anyway (it goes on the record)")
            return load, False
        say(f"1-min load average {load:{load_format}}, waiting for < {max_load:g} ({left:.0f} s left)")
        time.sleep(min(15.0, max(left, 0.1)))


def median(xs: Sequence[float]) -> float:
    """The median of ``xs`` (the mean of the middle two for an even count).

    Raises:
        ValueError: ``xs`` is empty.
    """
    s = sorted(xs)
    if not s:
        raise ValueError("median of nothing")
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def machine_table(machine: Mapping[str, str]) -> list[str]:
    """The Markdown table of a run's machine description, one row per entry."""
    return ["| machine | |", "| --- | --- |", *[f"| {k} | {v} |" for k, v in machine.items()]]


def replace_section(path: Path, section: str, begin: str, end: str, blank_line_after: bool = True) -> None:
    """Put ``section`` (which starts with ``begin`` and ends with ``end`` and a newline) in place of
    the text from ``begin`` to ``end`` in ``path``, leaving the rest of the file alone; with no such
    text, append it after a blank line (a missing file starts as ``# Benchmark results``).
    ``blank_line_after`` keeps one blank line between the section and what follows it."""
    old = path.read_text(encoding="utf-8") if path.exists() else "# Benchmark results\n"
    start = old.find(begin)
    stop = old.find(end, start + len(begin)) if start >= 0 else -1
    if stop >= 0:
        tail = old[stop + len(end) :].lstrip("\n")
        new = old[:start] + section + ("\n" if tail and blank_line_after else "") + tail
    else:
        new = old.rstrip("\n") + "\n\n" + section
    path.write_text(new, encoding="utf-8")
