"""GPU telemetry over a measurement window: power, temperature, SM clock and memory used, via NVML.

A :class:`TelemetrySampler` is started when a trial's measurement window opens and stopped when
the server has drained (:mod:`daemon.batch`, beside the ``/metrics`` scraper). Its thread opens an
NVML session (:mod:`daemon.nvml`) and reads the trial's GPUs every ``interval_s``. What it yields,
:class:`Telemetry`, goes with the trial:

- ``summary`` (:class:`~servetune.result.GPUTelemetry`, in the RESULT's ``gpu_telemetry``): per GPU
  the number of readings, mean and max power (W), mean and max temperature (C), mean and min SM
  clock (MHz), max memory used (MiB), over **every** reading taken;
- ``samples``: the readings themselves (``t_ns`` on the daemon's monotonic clock, as the request
  samples), spooled as the attempt's ``gpu_telemetry.json`` artifact (kind ``metric_series``).

Memory is bounded: past ``max_points`` readings per GPU the kept series is thinned to every other
point and its spacing doubles (the summary still covers every reading, taken every ``interval_s``). :meth:`TelemetrySampler.stop`
waits at most its deadline; a sampler stuck in a driver call is left behind (a daemon thread) and
the note says so. Where NVML is absent (a CPU-only node, no driver, no ``nvidia-ml-py``) nothing is
sampled: ``sampled`` is False and ``note`` gives the reason. No number is ever made up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from daemon.nvml import GPUReading, nvml_session, read_telemetry
from servetune.result import GPUTelemetry, GPUTelemetrySummary

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 0.5
#: Readings kept per GPU for the artifact before thinning (one hour at 0.5 s is 7,200).
DEFAULT_MAX_POINTS = 4096
STOP_DEADLINE_S = 5.0
_FIELDS = ("power_w", "temperature_c", "sm_clock_mhz", "memory_used_mib")


@dataclass
class _Stats:
    n: int = 0
    sums: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    maxs: dict[str, float] = field(default_factory=dict)
    mins: dict[str, float] = field(default_factory=dict)

    def add(self, reading: GPUReading) -> None:
        self.n += 1
        for name in _FIELDS:
            value = getattr(reading, name)
            if value is None:
                continue
            self.sums[name] = self.sums.get(name, 0.0) + value
            self.counts[name] = self.counts.get(name, 0) + 1
            self.maxs[name] = max(self.maxs.get(name, value), value)
            self.mins[name] = min(self.mins.get(name, value), value)

    def mean(self, name: str) -> float | None:
        return self.sums[name] / self.counts[name] if self.counts.get(name) else None

    def summary(self, index: int) -> GPUTelemetrySummary:
        return GPUTelemetrySummary(
            index=index, n=self.n, power_w_mean=self.mean("power_w"), power_w_max=self.maxs.get("power_w"),
            temperature_c_mean=self.mean("temperature_c"), temperature_c_max=self.maxs.get("temperature_c"),
            sm_clock_mhz_mean=self.mean("sm_clock_mhz"), sm_clock_mhz_min=self.mins.get("sm_clock_mhz"),
            memory_used_mib_max=self.maxs.get("memory_used_mib"),
        )


@dataclass(frozen=True)
class Telemetry:
    """What a sampler yields: the summary for the record and the kept readings for the artifact."""

    summary: GPUTelemetry
    samples: list[dict[str, float]]


class TelemetrySampler:
    """Samples GPUs ``gpus`` (None: all) on a background thread between :meth:`start` and :meth:`stop`.

    ``clock_ns`` stamps the readings (default: the monotonic clock of the request samples). Not
    reusable: one sampler per measurement window.
    """

    def __init__(self, gpus: list[int] | None = None, interval_s: float = DEFAULT_INTERVAL_S,
                 max_points: int = DEFAULT_MAX_POINTS, clock_ns: Callable[[], int] = time.monotonic_ns,
                 name: str = "gpu-telemetry"):
        if not interval_s > 0 or max_points < 2:
            raise ValueError(f"interval_s must be > 0 and max_points >= 2, got {interval_s}, {max_points}")
        self.gpus = gpus
        self.interval_s = interval_s
        self.max_points = max_points
        self._clock_ns = clock_ns
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._stats: dict[int, _Stats] = {}
        self._samples: list[dict[str, float]] = []
        self._ticks_kept = 0
        self._stride = 1  # keep every stride-th tick
        self._tick = 0
        self._note = ""
        self._available: bool | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self, deadline_s: float = STOP_DEADLINE_S) -> Telemetry:
        """Stop sampling (waiting at most ``deadline_s``) and return what was read."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=deadline_s)
        stuck = self._thread.is_alive()
        with self._lock:
            note = self._note
            if stuck:
                note = (note + "; " if note else "") + f"sampler did not stop within {deadline_s:g} s (left behind)"
            if not self._available:
                return Telemetry(GPUTelemetry(sampled=False, note=note or "not started"), [])
            gpus = [stats.summary(i) for i, stats in sorted(self._stats.items())]
            sampled = any(s.n for s in gpus)
            return Telemetry(GPUTelemetry(sampled=sampled, note=note if sampled else note or "no reading taken",
                                          interval_s=self.interval_s, gpus=gpus),
                             list(self._samples))

    def _main(self) -> None:
        with nvml_session() as (nvml, status):
            if nvml is None:
                with self._lock:
                    self._available, self._note = False, f"nothing sampled: {status.reason}"
                return
            try:
                count = int(nvml.nvmlDeviceGetCount())
            except Exception as exc:
                with self._lock:
                    self._available, self._note = False, f"nothing sampled: NVML gave no GPU count ({exc})"
                return
            indices = [i for i in (self.gpus if self.gpus is not None else range(count)) if 0 <= i < count]
            with self._lock:
                self._available = bool(indices)
                if not indices:
                    self._note = "nothing sampled: NVML reports no GPU of this trial"
                    return
                self._stats = {i: _Stats() for i in indices}
            next_at = time.monotonic()
            while not self._stop.is_set():
                self._sample(nvml, indices)
                next_at += self.interval_s
                self._stop.wait(max(0.0, next_at - time.monotonic()))

    def _sample(self, nvml: object, indices: list[int]) -> None:
        try:
            readings = read_telemetry(nvml, indices)
        except Exception as exc:  # a driver error mid-window: say so, keep what was read
            with self._lock:
                self._note = f"a reading failed: {exc}"
            log.warning("GPU telemetry reading failed: %s", exc)
            return
        t_ns = self._clock_ns()
        with self._lock:
            for r in readings:
                self._stats[r.index].add(r)
            self._tick += 1
            if (self._tick - 1) % self._stride:
                return
            for r in readings:
                self._samples.append({"t_ns": t_ns, "gpu": r.index, **{k: v for k in _FIELDS
                                                                      if (v := getattr(r, k)) is not None}})
            self._ticks_kept += 1
            if self._ticks_kept >= self.max_points:  # thin: keep every other tick, sample half as often
                times = sorted({s["t_ns"] for s in self._samples})
                keep = set(times[::2])
                self._samples = [s for s in self._samples if s["t_ns"] in keep]
                self._ticks_kept = len(keep)
                self._stride *= 2
