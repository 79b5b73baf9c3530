"""CPU time of a process tree, sampled from ``/proc`` so it can be cut to any time window.

A client's CPU-seconds per 1,000 requests must count what it spends while it measures, not its
start-up (``vllm bench serve`` imports vLLM; GuideLLM spawns ten worker processes). So a thread
samples the cumulative CPU time of the client's whole process tree every ``tick_s``, stamped with
both ``time.monotonic_ns()`` (CLOCK_MONOTONIC, shared by every process on the machine) and
``time.time()``; :meth:`TreeCPU.between` interpolates the cumulative curve at a window's ends,
whichever clock the tool reported its window in.

Cumulative CPU of the tree = sum over its live processes of utime + stime + cutime + cstime: a
child that ended and was reaped moved its time into its parent's cutime/cstime, so nothing is
lost or counted twice. Resolution is one clock tick (``SC_CLK_TCK``, 10 ms) per process.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from dataclasses import dataclass, field

_TICK_HZ = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of ``/proc/PID/stat`` after the command name (field 3 onward), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return raw[raw.rfind(b")") + 2 :].decode().split()


def _ppid_map() -> dict[int, int]:
    out: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat_fields(int(name))
            if fields is not None:
                out[int(name)] = int(fields[1])
    return out


def tree_pids(root: int) -> list[int]:
    """``root`` and every live descendant."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _ppid_map().items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _cpu_ticks(pid: int) -> int:
    fields = _stat_fields(pid)
    if fields is None:
        return 0
    # utime, stime, cutime, cstime are fields 14-17 of stat; fields[0] is field 3.
    return sum(int(x) for x in fields[11:15])


@dataclass
class TreeCPU:
    """Samples of one process tree's cumulative CPU: ``(monotonic_ns, wall_s, cpu_s)``."""

    root: int
    tick_s: float = 0.05
    refresh_every: int = 10
    mono_ns: list[int] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> TreeCPU:
        self._thread = threading.Thread(target=self._run, name=f"cpu-sampler-{self.root}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        pids: list[int] = []
        n = 0
        while not self._stop.is_set():
            if n % self.refresh_every == 0:
                pids = tree_pids(self.root)
            n += 1
            total = sum(_cpu_ticks(pid) for pid in pids) / _TICK_HZ
            self.mono_ns.append(time.monotonic_ns())
            self.wall_s.append(time.time())
            self.cpu_s.append(total)
            self._stop.wait(self.tick_s)

    def _at(self, xs: list[float] | list[int], x: float) -> float:
        """Cumulative CPU at ``x`` on the clock of ``xs``, linearly interpolated."""
        if not xs:
            raise ValueError("no CPU samples were taken")
        i = bisect.bisect_left(xs, x)
        if i == 0:
            return self.cpu_s[0]
        if i >= len(xs):
            return self.cpu_s[-1]
        x0, x1 = xs[i - 1], xs[i]
        y0, y1 = self.cpu_s[i - 1], self.cpu_s[i]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1

    def between(self, start: float, end: float, clock: str) -> float:
        """CPU-seconds the tree used from ``start`` to ``end`` (seconds on ``clock``: mono or wall)."""
        if clock == "mono":
            return self._at(self.mono_ns, end * 1e9) - self._at(self.mono_ns, start * 1e9)
        if clock == "wall":
            return self._at(self.wall_s, end) - self._at(self.wall_s, start)
        raise ValueError(f"clock must be 'mono' or 'wall', got {clock!r}")
