"""Server-side metrics during a measurement: a thread that reads ``/metrics`` into a time series.

:class:`MetricsScraper` calls ``read(timeout_s)`` every ``period_s`` (0.5 s) on its own daemon
thread, from :meth:`~MetricsScraper.start` (the start of the measurement window) until
:meth:`~MetricsScraper.stop`, and keeps one point per read: ``{"t_ns": ..., <metric>: value}``.
``t_ns`` is the middle of the HTTP request on ``time.monotonic_ns()`` of the daemon, the clock of
every :class:`~servetune.result.RequestSample`, so the series lines up with the requests.
With :func:`endpoint_reader` a point holds vLLM's queue and KV-cache gauges
(:data:`~daemon.endpoint.GAUGE_METRICS`) and its cumulative counters
(:data:`~daemon.endpoint.COUNTER_METRICS`: preemptions, prefix-cache hits and queries, tokens,
finished requests) from one scrape; subtract two points for a delta.

Guarantees: a read that fails or times out is counted (:attr:`MetricsScraper.failures`), logged
once at warning level, and skipped; nothing raises out of the thread. The series is bounded: at
``max_points`` every other point is dropped and the period doubles, so a long measurement keeps
its whole span at a coarser step. :meth:`~MetricsScraper.stop` makes the thread take one last
reading (so the series ends at the moment of the stop, e.g. a drained server) and waits for it at
most ``join_timeout_s``; the thread also ends by itself after ``max_lifetime_s`` if nobody stops it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from daemon.endpoint import COUNTER_METRICS, GAUGE_METRICS, Endpoint, select_all

log = logging.getLogger(__name__)

#: Seconds between two reads of ``/metrics``.
SCRAPE_PERIOD_S = 0.5
#: Limit on one read: a server under heavy load answers ``/metrics`` late, never the scraper.
SCRAPE_TIMEOUT_S = 2.0
#: Most points kept per trial (about 2.8 h at 0.5 s before the step doubles).
MAX_POINTS = 20_000
#: A scraper nobody stopped ends by itself after this long (seconds).
MAX_LIFETIME_S = 24 * 3600.0

Reader = Callable[[float], Mapping[str, float]]


def endpoint_reader(endpoint: Endpoint) -> Reader:
    """Read gauges and counters of ``endpoint``'s ``/metrics`` with one request (absent ones left out)."""
    names = {**GAUGE_METRICS, **COUNTER_METRICS}
    wanted = frozenset(names.values())

    def read(timeout_s: float) -> dict[str, float]:
        return select_all(endpoint.scrape_samples(timeout_s, names=wanted), names)  # parses ~10 of ~600 lines

    return read


class MetricsScraper:
    """One trial's scrape thread. Start and stop it from one thread; read :attr:`series` after stop.

    Args:
        read: returns the metric values now; gets the timeout in seconds; may raise anything.
        period_s: seconds between the starts of two reads.
        timeout_s: passed to ``read``.
        max_points: bound on the series (then it is thinned, see the module docstring).
        clock: monotonic nanoseconds (injectable for tests).
    """

    def __init__(
        self,
        read: Reader,
        *,
        period_s: float = SCRAPE_PERIOD_S,
        timeout_s: float = SCRAPE_TIMEOUT_S,
        max_points: int = MAX_POINTS,
        max_lifetime_s: float = MAX_LIFETIME_S,
        clock: Callable[[], int] = time.monotonic_ns,
        name: str = "metrics-scraper",
    ) -> None:
        if period_s <= 0 or timeout_s <= 0 or max_points < 2 or max_lifetime_s <= 0:
            raise ValueError("period_s, timeout_s and max_lifetime_s must be positive and max_points >= 2")
        self._read = read
        self.period_s = period_s
        self.timeout_s = timeout_s
        self.max_points = max_points
        self.max_lifetime_s = max_lifetime_s
        self._clock = clock
        self._name = name
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._series: list[dict[str, float]] = []
        self._thread: threading.Thread | None = None
        self.failures = 0
        self.thinned = 0

    @classmethod
    def for_endpoint(cls, endpoint: Endpoint, **kwargs: Any) -> MetricsScraper | None:
        """A scraper of ``endpoint``'s ``/metrics``; None when it has none (``has_metrics`` false)."""
        if not getattr(endpoint, "has_metrics", True):
            return None
        return cls(endpoint_reader(endpoint), **kwargs)

    @property
    def running(self) -> bool:
        """The thread is reading (started, and neither stopped nor past its lifetime)."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def series(self) -> list[dict[str, float]]:
        """A copy of the points so far, oldest first."""
        with self._lock:
            return [dict(p) for p in self._series]

    def start(self) -> None:
        """Read once now, on the calling thread (so the series starts before whatever the caller
        does next, e.g. the first request), then every ``period_s`` on a daemon thread. Never
        raises for a failed read. Starting twice is an error."""
        if self._thread is not None:
            raise RuntimeError("a MetricsScraper is started once")
        try:
            self._read_once()
        except Exception:  # same guarantee as the thread: a scrape never fails the caller
            log.exception("metrics scraper: unexpected error")
        self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
        self._thread.start()

    def stop(self, join_timeout_s: float = 5.0) -> list[dict[str, float]]:
        """Stop reading and return the series (idempotent; a no-op when never started)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(join_timeout_s)
            if thread.is_alive():
                log.warning("metrics scraper did not stop within %.1f s; keeping %d points", join_timeout_s,
                            len(self._series))
        return self.series

    def __enter__(self) -> MetricsScraper:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _loop(self) -> None:
        period_ns = int(self.period_s * 1e9)
        start = self._clock()
        end = start + int(self.max_lifetime_s * 1e9)
        next_ns = start + period_ns  # start() took the first reading
        self._stop.wait(self.period_s)
        while True:
            last = self._stop.is_set()
            try:
                self._read_once()
            except Exception:  # never out of the thread; _read_once already handles read errors
                log.exception("metrics scraper: unexpected error")
            if last:  # that read began after stop() was called: the series ends there
                return
            if len(self._series) >= self.max_points:
                self._thin()
                period_ns *= 2
            now = self._clock()
            if now >= end:
                log.warning("metrics scraper ran %.0f s without being stopped; stopping", self.max_lifetime_s)
                return
            next_ns = max(next_ns + period_ns, now)  # a slow read delays the next one, never a burst
            if not self._stop.is_set():
                self._stop.wait((next_ns - now) / 1e9)

    def _read_once(self) -> None:
        t0 = self._clock()
        try:
            values = self._read(self.timeout_s)
        except Exception as exc:
            self.failures += 1
            if self.failures == 1:
                log.warning("metrics scrape failed (further failures logged at debug): %s", exc)
            else:
                log.debug("metrics scrape failed: %s", exc)
            return
        t1 = self._clock()
        point = {"t_ns": float((t0 + t1) // 2)}
        point.update({k: float(v) for k, v in values.items()})
        with self._lock:
            self._series.append(point)

    def _thin(self) -> None:
        with self._lock:
            self._series = self._series[::2]
        self.thinned += 1
        log.info("metrics series reached %d points: keeping every other one, step now %.1f s",
                 self.max_points, self.period_s * 2**self.thinned)
