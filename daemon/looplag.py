"""The load generator's own event-loop lag: how late the client could stamp what it measures.

:class:`LoopProbe` runs as a task on the load generator's event loop during a measurement. It
sleeps :data:`PROBE_INTERVAL_S` again and again and records how much later than asked it woke
(its oversleep). Whatever keeps the loop from running on time (callbacks that take long, a
blocking call, a host that does not schedule the client) delays every timestamp the client takes
by as much, on the receive side (chunk arrivals: TTFT, ITL) as on the send side. The send lag
alone cannot see a receive-side stall: in a closed loop the next send is scheduled from the
previous request's end, which the same stall stamped late.

The readings are summarised as a :class:`~servetune.result.LoopLag` (p50, p99, max in ms); the
client self-check (:func:`servetune.metrics.summarize`) flags a client whose p99 exceeds its lag
tolerance. Quantiles come from at most :data:`PROBE_KEEP` readings (a uniform reservoir under a
fixed seed beyond that, about 17 minutes at the default interval); the maximum is exact.
"""

from __future__ import annotations

import asyncio
import random
import time

from servetune.metrics import quantile
from servetune.result import LoopLag

#: How often the probe wakes (seconds).
PROBE_INTERVAL_S = 0.01
#: Readings kept for the quantiles.
PROBE_KEEP = 100_000


class LoopProbe:
    """Oversleep readings of one event loop; :meth:`run` is the task, :meth:`summary` the result.

    Used from the loop it measures only.
    """

    def __init__(self, interval_s: float = PROBE_INTERVAL_S, keep: int = PROBE_KEEP) -> None:
        if interval_s <= 0 or keep < 1:
            raise ValueError("interval_s must be positive and keep at least 1")
        self.interval_s = interval_s
        self.keep = keep
        self.n = 0
        self.max_ms = 0.0
        self._kept: list[float] = []
        self._rng = random.Random(0)

    async def run(self) -> None:
        """Measure until cancelled."""
        interval_ns = int(self.interval_s * 1e9)
        while True:
            asked = time.monotonic_ns()
            await asyncio.sleep(self.interval_s)
            self.add(max(0, time.monotonic_ns() - asked - interval_ns) / 1e6)

    def add(self, lag_ms: float) -> None:
        """One reading (ms)."""
        self.n += 1
        self.max_ms = max(self.max_ms, lag_ms)
        if len(self._kept) < self.keep:
            self._kept.append(lag_ms)
        else:
            slot = self._rng.randrange(self.n)
            if slot < self.keep:
                self._kept[slot] = lag_ms

    def summary(self) -> LoopLag | None:
        """The readings so far; None before the first."""
        if not self.n:
            return None
        return LoopLag(interval_ms=self.interval_s * 1e3, n=self.n, p50_ms=quantile(self._kept, 0.5),
                       p99_ms=quantile(self._kept, 0.99), max_ms=self.max_ms)
