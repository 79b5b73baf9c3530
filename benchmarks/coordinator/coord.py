"""The real coordinator as a child process, what it uses, and what its log says.

It is started exactly as a user starts a fleet sweep (``python -m coordinator sweep SPEC
--no-local-daemon --bind tcp://127.0.0.1:PORT`` plus the fleet flags), pinned with ``taskset``.
Its stdout and stderr go to one log file; warnings carry the logging module's wall-clock
timestamp (``2026-12-01 10:00:00,123``, local time, millisecond resolution), which is how the
dead-daemon probe learns when the coordinator suspected the frozen daemon and revoked its lease.
"""

from __future__ import annotations

import bisect
import datetime as dt
import math
import os
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from benchmarks.loadgen.procs import Child

#: ``%(asctime)s %(levelname)s %(name)s: %(message)s`` as ``coordinator.cli`` configures logging.
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ([A-Z]+) (\S+): (.*)$")
SUSPECTED = re.compile(r"^daemon (\S+) suspected: ")
HEARD_AGAIN = re.compile(r"^daemon (\S+) is heard from again")
PRESUMED_DEAD = re.compile(r"^daemon (\S+) presumed dead")
LEASE_EXPIRED = re.compile(r"^(\S+): (\d+) trial\(s\) queued again \(lease expired: no heartbeat from daemon (\S+) ")
BOUND = re.compile(r"coordinator on (tcp://\S+?);")


@dataclass(frozen=True)
class FleetTimings:
    heartbeat_s: float
    ttl_s: float
    grace_s: float
    daemon_wait_s: float = 60.0

    def flags(self) -> list[str]:
        return ["--heartbeat-interval", f"{self.heartbeat_s:g}", "--lease-ttl", f"{self.ttl_s:g}",
                "--lease-grace", f"{self.grace_s:g}", "--daemon-wait", f"{self.daemon_wait_s:g}"]

    def describe(self) -> str:
        return f"heartbeat {self.heartbeat_s:g} s, TTL {self.ttl_s:g} s, grace {self.grace_s:g} s"


def free_port() -> int:
    """A loopback port free right now (the coordinator binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def coordinator_child(spec: Path, results_root: Path, port: int, timings: FleetTimings, log_path: Path,
                      cpus: str, cwd: Path, env: dict[str, str] | None = None) -> Child:
    argv = [sys.executable, "-m", "coordinator", "sweep", str(spec), "--results-root", str(results_root),
            "--no-local-daemon", "--bind", f"tcp://127.0.0.1:{port}", *timings.flags()]
    return Child("coordinator", argv, log_path, cpus=cpus, cwd=cwd, env=env)


@dataclass
class LogEvent:
    wall: float
    level: str
    logger: str
    text: str


def parse_log(path: Path) -> list[LogEvent]:
    """Every timestamped logging line of the coordinator's log (progress lines have no timestamp)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return _events(text)


_SECONDS: dict[str, float] = {}


def _events(text: str) -> list[LogEvent]:
    events = []
    for line in text.splitlines():
        m = LOG_LINE.match(line)
        if m:
            second = _SECONDS.get(m.group(1))
            if second is None:
                second = _SECONDS[m.group(1)] = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
            events.append(LogEvent(second + int(m.group(2)) / 1000, m.group(3), m.group(4), m.group(5)))
    return events


class LogTail:
    """New timestamped lines of a growing log, read incrementally (the log grows to tens of MB)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pos = 0

    def new_events(self) -> list[LogEvent]:
        try:
            with self.path.open("rb") as f:
                f.seek(self._pos)
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self._pos += end + 1
        return _events(data[: end + 1].decode("utf-8", "replace"))


def bound_address(path: Path) -> str | None:
    try:
        m = BOUND.search(path.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return None
    return m.group(1) if m else None


@dataclass
class LogSummary:
    suspected: dict[str, list[float]] = field(default_factory=dict)  # daemon -> wall times
    heard_again: dict[str, list[float]] = field(default_factory=dict)
    presumed_dead: dict[str, float] = field(default_factory=dict)
    lease_expired: list[tuple[float, str, str]] = field(default_factory=list)  # (wall, batch, daemon)
    warnings: dict[str, int] = field(default_factory=dict)  # first words of other warnings -> count
    errors: list[str] = field(default_factory=list)


def summarize_log(events: list[LogEvent]) -> LogSummary:
    out = LogSummary()
    for e in events:
        if m := SUSPECTED.match(e.text):
            out.suspected.setdefault(m.group(1), []).append(e.wall)
        elif m := HEARD_AGAIN.match(e.text):
            out.heard_again.setdefault(m.group(1), []).append(e.wall)
        elif m := PRESUMED_DEAD.match(e.text):
            out.presumed_dead[m.group(1)] = e.wall
        elif m := LEASE_EXPIRED.match(e.text):
            out.lease_expired.append((e.wall, m.group(1), m.group(3)))
        elif e.level in ("ERROR", "CRITICAL"):
            out.errors.append(e.text[:300])
        elif e.level == "WARNING":
            key = " ".join(re.sub(r"\b[0-9a-f]{8,}\b|\bfake-\d+\b|\d+(\.\d+)?", "#", e.text).split()[:8])
            out.warnings[key] = out.warnings.get(key, 0) + 1
    return out


_S = TypeVar("_S", bound="_Sampler")


class _Sampler:
    """A daemon thread running ``_run`` (which loops until ``_stop`` is set) between start() and stop()."""

    def __init__(self, name: str) -> None:
        self._hz = os.sysconf("SC_CLK_TCK")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self: _S) -> _S:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        raise NotImplementedError


class ProcSampler(_Sampler):
    """Samples a process's VmRSS and VmHWM (``/proc/PID/status``) every ``tick_s`` until stopped;
    the last VmHWM read before it exits is its peak resident set."""

    def __init__(self, pid: int, tick_s: float = 0.1) -> None:
        self.pid = pid
        self.tick_s = tick_s
        self.mono: list[float] = []
        self.rss_mib: list[float] = []
        self.hwm_mib = 0.0
        self.children_hwm_mib = 0.0  # its child processes (the results.nc writer): sum of their VmHWM, peak
        #: peak of the coordinator's VmRSS plus its children's, read together (every tick: a --once
        #: results.nc child lives for seconds only)
        self.tree_rss_peak_mib = 0.0
        self.threads_cpu_s: dict[str, float] = {}  # thread name (tid) -> CPU-seconds, last read
        super().__init__(f"mem-sampler-{pid}")

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with open(f"/proc/{self.pid}/status", encoding="ascii", errors="replace") as f:
                    fields = dict(line.split(":", 1) for line in f if ":" in line)
            except OSError:
                return
            try:
                rss = int(fields["VmRSS"].split()[0]) / 1024
                self.hwm_mib = max(self.hwm_mib, int(fields["VmHWM"].split()[0]) / 1024)
            except (KeyError, ValueError, IndexError):
                return  # a zombie has no memory lines
            self.mono.append(time.monotonic())
            self.rss_mib.append(rss)
            self.tree_rss_peak_mib = max(self.tree_rss_peak_mib, rss + self._read_children())
            if len(self.mono) % 10 == 1:
                self._read_threads()
            self._stop.wait(self.tick_s)

    def _read_children(self) -> float:
        """Update the children's VmHWM sum; returns the sum of their VmRSS now (MiB)."""
        try:
            with open(f"/proc/{self.pid}/task/{self.pid}/children", encoding="ascii") as f:
                kids = f.read().split()
        except OSError:
            return 0.0
        total = rss = 0.0
        for kid in kids:
            try:
                with open(f"/proc/{kid}/status", encoding="ascii", errors="replace") as f:
                    fields = dict(line.split(":", 1) for line in f if ":" in line)
                total += int(fields["VmHWM"].split()[0]) / 1024
                rss += int(fields["VmRSS"].split()[0]) / 1024
            except (OSError, KeyError, ValueError, IndexError):
                continue
        self.children_hwm_mib = max(self.children_hwm_mib, total)
        return rss

    def _read_threads(self) -> None:
        try:
            tids = os.listdir(f"/proc/{self.pid}/task")
        except OSError:
            return
        for tid in tids:
            try:
                with open(f"/proc/{self.pid}/task/{tid}/stat", "rb") as f:
                    raw = f.read()
            except OSError:
                continue
            comm = raw[raw.find(b"(") + 1 : raw.rfind(b")")].decode("ascii", "replace")
            fields = raw[raw.rfind(b")") + 2 :].split()
            label = "main thread" if tid == str(self.pid) else f"{comm} ({tid})"
            self.threads_cpu_s[label] = (int(fields[11]) + int(fields[12])) / self._hz

    def max_between(self, start: float, end: float) -> float | None:
        xs = [r for t, r in zip(self.mono, self.rss_mib) if start <= t <= end]
        return max(xs) if xs else None


class MachineCPU(_Sampler):
    """Samples the whole machine's busy CPU-seconds (``/proc/stat``, all cores) every ``tick_s``, so
    that what other processes used during a run's steady span can be told apart from our two."""

    def __init__(self, tick_s: float = 0.1) -> None:
        self.tick_s = tick_s
        self.mono: list[float] = []
        self.busy_s: list[float] = []
        super().__init__("machine-cpu-sampler")

    def _run(self) -> None:
        while not self._stop.is_set():
            with open("/proc/stat", encoding="ascii") as f:
                vals = [int(x) for x in f.readline().split()[1:]]
            self.mono.append(time.monotonic())
            self.busy_s.append((sum(vals[:8]) - vals[3] - vals[4]) / self._hz)
            self._stop.wait(self.tick_s)

    def between(self, start: float, end: float) -> float:
        def at(x: float) -> float:
            i = bisect.bisect_left(self.mono, x)
            if i == 0:
                return self.busy_s[0]
            if i >= len(self.mono):
                return self.busy_s[-1]
            x0, x1, y0, y1 = self.mono[i - 1], self.mono[i], self.busy_s[i - 1], self.busy_s[i]
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1

        if not self.mono:
            return math.nan
        return at(end) - at(start)
