"""One measured load point of one client, and the rules that judge it (pure, no I/O).

The achieved rate is computed the same way for every client, from the per-request records the
tool itself wrote (our samples, ``vllm bench serve --save-detailed``, GuideLLM's JSON report):

    achieved = (requests completed - 1) / (last response end - first request send)

For a client that sends exactly on a constant schedule and gets instant answers this is the
offered rate (N requests span N - 1 gaps); a client that falls behind, or reads its responses
late, stretches the span and gets less. A point is *sustained* when achieved/offered >= 0.99.

TTFT figures are each tool's own report (its percentiles, its definition of TTFT).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

#: achieved/offered at or above which a point counts as sustained.
SUSTAINED_RATIO = 0.99
#: Consecutive unsustained points after which a client's ladder stops.
STOP_AFTER_FAILURES = 2


def achieved_rate(n_ok: int, first_send_s: float, last_end_s: float) -> float:
    """Requests/s by the rule above; 0 when fewer than two requests completed."""
    span = last_end_s - first_send_s
    if n_ok < 2 or span <= 0:
        return 0.0
    return (n_ok - 1) / span


@dataclass
class Point:
    """One client at one offered rate.

    ``first_send_s``/``last_end_s`` are seconds on ``clock``: ``"mono"`` (CLOCK_MONOTONIC) or
    ``"wall"`` (``time.time()``). ``ttft_ms`` holds the tool's own ``p50``, ``mean``, ``p99``.
    ``cpu_s`` is the client's process-tree CPU between those two instants.
    """

    client: str
    offered: float
    n_sent: int
    n_ok: int
    first_send_s: float
    last_end_s: float
    clock: str
    ttft_ms: dict[str, float]
    cpu_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def n_errors(self) -> int:
        return self.n_sent - self.n_ok

    @property
    def window_s(self) -> float:
        return self.last_end_s - self.first_send_s

    @property
    def achieved(self) -> float:
        return achieved_rate(self.n_ok, self.first_send_s, self.last_end_s)

    @property
    def ratio(self) -> float:
        return self.achieved / self.offered

    @property
    def sustained(self) -> bool:
        return self.ratio >= SUSTAINED_RATIO

    @property
    def cpu_per_1k(self) -> float | None:
        if self.cpu_s is None or self.n_ok == 0:
            return None
        return self.cpu_s / self.n_ok * 1000.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Point:
        return cls(**obj)


def ladder_done(ratios: Sequence[float]) -> bool:
    """True when the last :data:`STOP_AFTER_FAILURES` rates were all unsustained.

    ``ratios`` holds achieved/offered of each rate run so far, in ladder order (the median of
    its repeats where a rate was repeated).
    """
    tail = list(ratios)[-STOP_AFTER_FAILURES:]
    return len(tail) == STOP_AFTER_FAILURES and all(r < SUSTAINED_RATIO for r in tail)


def highest_sustained(ratios: Sequence[tuple[float, float]]) -> float | None:
    """The highest offered rate such that it and every lower rate were sustained.

    ``ratios`` holds ``(offered, achieved/offered)`` pairs; None when even the lowest failed.
    """
    best = None
    for offered, ratio in sorted(ratios):
        if ratio < SUSTAINED_RATIO:
            break
        best = offered
    return best


def requests_for(rate: float, seconds: float, min_requests: int) -> int:
    """Requests of one point: ``seconds`` of the offered rate, at least ``min_requests``."""
    return max(min_requests, round(rate * seconds))
