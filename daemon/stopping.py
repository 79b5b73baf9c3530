"""Watching a measurement's stop conditions from inside the load generator's event loop.

:class:`StopMonitor` is the thin adapter between the load generator and the pure deciders of
:mod:`daemon.saturation`: the load generator tells it when a request finished
(:meth:`StopMonitor.on_finished`, which also checks the error budget at once, a constant-time
test) and runs :meth:`StopMonitor.run` as a task, which looks for over-saturation every
:data:`~daemon.saturation.CHECK_INTERVAL_S`. Either calls ``trigger(reason)`` once; the load
generator then stops sending and cancels what is in flight with :func:`cancel_error` of the
reason. Requests the load generator cancels never reach :meth:`StopMonitor.on_finished`, so they
never count as errors.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator

from daemon.saturation import CHECK_INTERVAL_S, ErrorBudget, SaturationDetector, SaturationPolicy
from daemon.stream import RequestRecord
from servetune.spec import LoadPoint

log = logging.getLogger(__name__)

#: Prefix of every stop reason this module gives; the daemon treats them as results, not failures.
EARLY_STOP_KINDS: tuple[str, ...] = ("over-saturation", "error budget")


def cancel_error(reason: str) -> str:
    """The error recorded on requests cancelled by an early stop: ``cancelled: stopped early (<kind>)``."""
    kind = reason.split(":", 1)[0]
    return f"cancelled: stopped early ({kind})"


class StopMonitor:
    """The stop conditions of one measurement (``lp.stop``), or None from :meth:`for_load_point`
    when the load point sets none that apply.

    Args:
        lp: the load point.
        start_ns: when the measurement started (monotonic ns).
        inflight: the requests sent and not finished (read, never changed).
        backlog: arrivals that are due but held back in the client by a concurrency cap (a
            callable, read at each check).
        trigger: called once with the reason when a condition is met.
    """

    def __init__(
        self,
        lp: LoadPoint,
        start_ns: int,
        inflight: Collection[RequestRecord],
        backlog: Callable[[int], float],
        trigger: Callable[[str], None],
    ) -> None:
        self.lp = lp
        self.budget = ErrorBudget(lp.stop)
        self.detector: SaturationDetector | None = None
        if lp.stop.over_saturation and lp.request_rate is not None:
            self.detector = SaturationDetector(SaturationPolicy.from_stop(lp.stop), start_ns)
        self._inflight = inflight
        self._backlog = backlog
        self._trigger = trigger
        self.reason: str | None = None
        # (end_ns, send_ns, first_token_ns) of finished requests, in the order they ended
        self._finished: deque[tuple[int, int, int]] = deque()

    @classmethod
    def for_load_point(
        cls,
        lp: LoadPoint,
        start_ns: int,
        inflight: Collection[RequestRecord],
        backlog: Callable[[int], float],
        trigger: Callable[[str], None],
    ) -> StopMonitor | None:
        if lp.stop.over_saturation and lp.request_rate is None:
            log.info("load point %s: over_saturation applies to an open-loop request_rate only; "
                     "a closed loop's concurrency bounds its queue", lp.name)
        monitor = cls(lp, start_ns, inflight, backlog, trigger)
        return monitor if monitor.budget.active or monitor.detector is not None else None

    def _stop(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
            log.info("load point %s stopped early: %s", self.lp.name, reason)
            self._trigger(reason)

    def on_finished(self, rec: RequestRecord) -> None:
        """A measured request ended by itself (ok or failed; never a cancellation)."""
        self.budget.record(rec.error is not None)
        if self.detector is not None and rec.first_token_ns is not None and rec.send_ns is not None:
            self._finished.append((rec.end_ns or rec.first_token_ns, rec.send_ns, rec.first_token_ns))
        if self.reason is None and rec.error is not None:
            reason = self.budget.exceeded()
            if reason is not None:
                self._stop(reason)

    def _first_tokens(self, since_ns: int) -> Iterator[tuple[int, int]]:
        for _, send, first in self._finished:
            if first >= since_ns:
                yield send, first
        for rec in list(self._inflight):
            token_ns, send_ns = rec.first_token_ns, rec.send_ns
            if token_ns is not None and send_ns is not None and token_ns >= since_ns:
                yield send_ns, token_ns

    def check(self, now_ns: int) -> str | None:
        """One look for over-saturation; the reason when it stops the measurement."""
        if self.detector is None or self.reason is not None:
            return self.reason
        policy = self.detector.policy
        keep_ns = int(policy.window_s * policy.ttft_lookback_windows * 1e9)  # what evaluate() may look at
        while self._finished and self._finished[0][0] < now_ns - keep_ns:
            self._finished.popleft()
        outstanding = len(self._inflight) + self._backlog(now_ns)

        def source(since_ns: int) -> Iterable[tuple[int, int]]:
            return list(self._first_tokens(since_ns))

        reason = self.detector.check(now_ns, outstanding, source)
        if reason is not None:
            self._stop(reason)
        return reason

    async def run(self) -> None:
        """Check every :data:`CHECK_INTERVAL_S` until cancelled or stopped (a no-op without a detector)."""
        if self.detector is None:
            return
        next_ns = time.monotonic_ns()
        step = int(CHECK_INTERVAL_S * 1e9)
        while self.reason is None:
            next_ns += step
            await asyncio.sleep(max(0.0, (next_ns - time.monotonic_ns()) / 1e9))
            now = time.monotonic_ns()
            next_ns = max(next_ns, now - step)  # after a stall, no burst of catch-up checks
            self.check(now)
