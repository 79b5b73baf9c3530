"""Per-daemon circuit breakers and the drain of hardware classes nobody serves. Pure: no socket,
no store, no clock of its own (every call that needs the time is given ``now``).

Breaker of one daemon (:class:`Breaker`), counting *transport* failures only (a lease lost: expired,
its daemon left, restarted or dropped the batch, a daemon error; measurement failures are results
and never count)::

    closed --N consecutive failures--> open --recovery_after_s--> half-open
    half-open --its one probe succeeds--> closed            (UP)
    half-open --its probe fails---------> open, cool-down restarted

- ``closed``: the daemon may be granted work; an accepted result resets the count to 0.
- ``open``: it is granted nothing (:meth:`BreakerBoard.may_grant` is False) until
  ``opened_at + recovery_after_s``; then it is half-open.
- ``half-open``: it may be granted exactly one batch, the probe (:meth:`BreakerBoard.granted`
  marks it taken); nothing more until the probe ends.
- ``down_since``: when it first went down in this outage (kept through every re-open, cleared
  when it closes); ``opened_at``: the latest open (each re-open restarts the cool-down from it).

Every change is returned as a :class:`BreakerChanged` (``DOWN``/``UP`` console lines come from
its :attr:`~BreakerChanged.line`); the board's :meth:`~BreakerBoard.snapshot` is what the store and
``schedule.json`` keep.

Drain (:class:`ServiceWatch`): a hardware class is *in service* while a connected daemon of it has a
closed breaker. A class out of service for ``drain_after_s`` (two cool-downs) with no probe of it in
flight is due: its queued trials become holes that say why (:func:`drain_reason`), once per outage.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


@dataclass(frozen=True)
class BreakerChanged:
    """A breaker moved (an instruction of :class:`coordinator.control.ControlCore`): record it, and
    print :attr:`line` on the console."""

    daemon_id: str
    old: BreakerState
    new: BreakerState
    at: float
    reason: str

    @property
    def line(self) -> str:
        if self.new is BreakerState.CLOSED:
            return f"UP {self.daemon_id}: its probe succeeded; breaker closed"
        if self.new is BreakerState.HALF_OPEN:
            return f"PROBE {self.daemon_id}: cool-down over; breaker half-open (one batch may be granted)"
        again = " again" if self.old is BreakerState.HALF_OPEN else ""
        return f"DOWN {self.daemon_id}: breaker open{again}: {self.reason}"


@dataclass
class Breaker:
    """One daemon's breaker (see the module docstring). Times are the injected clock's."""

    daemon_id: str
    state: BreakerState = BreakerState.CLOSED
    failures: int = 0  # consecutive transport failures while closed
    opened_at: float | None = None
    down_since: float | None = None
    probe_out: bool = False
    trips: list[dict[str, Any]] = field(default_factory=list)  # each open: at, reason, (closed_at)
    last_reason: str = ""


class BreakerBoard:
    """The breakers of every daemon seen in a sweep, by daemon id (kept when a daemon leaves and
    rejoins: reconnecting never resets a breaker). ``failures``: N; ``recovery_after_s``: the cool-down."""

    def __init__(self, failures: int = 3, recovery_after_s: float = 30.0) -> None:
        if failures < 1 or recovery_after_s <= 0:
            raise ValueError(f"breaker_failures must be >= 1 and recovery_after_s > 0 "
                             f"(got {failures}, {recovery_after_s})")
        self.failures = failures
        self.recovery_after_s = recovery_after_s
        self._by: dict[str, Breaker] = {}

    def get(self, daemon_id: str) -> Breaker:
        b = self._by.get(daemon_id)
        if b is None:
            b = self._by[daemon_id] = Breaker(daemon_id)
        return b

    def state(self, daemon_id: str) -> BreakerState:
        b = self._by.get(daemon_id)
        return b.state if b else BreakerState.CLOSED

    def closed(self, daemon_id: str) -> bool:
        return self.state(daemon_id) is BreakerState.CLOSED

    def probing(self, daemon_id: str) -> bool:
        b = self._by.get(daemon_id)
        return b is not None and b.state is BreakerState.HALF_OPEN and b.probe_out

    def may_grant(self, daemon_id: str, now: float) -> bool:
        """Whether ``daemon_id`` may be granted a batch now: closed, or half-open with its probe
        not yet taken (an open breaker whose cool-down is over counts as half-open)."""
        b = self._by.get(daemon_id)
        if b is None or b.state is BreakerState.CLOSED:
            return True
        if b.state is BreakerState.OPEN:
            return b.opened_at is not None and now >= b.opened_at + self.recovery_after_s
        return not b.probe_out

    def granted(self, daemon_id: str, now: float) -> list[BreakerChanged]:
        """A batch was granted to ``daemon_id``: when its breaker is not closed, that is its probe."""
        b = self._by.get(daemon_id)
        if b is None or b.state is BreakerState.CLOSED:
            return []
        out = self._half_open(b, now)
        b.probe_out = True
        return out

    def failure(self, daemon_id: str, now: float, reason: str) -> list[BreakerChanged]:
        """A transport failure of ``daemon_id`` (one lost lease, however many trials it held)."""
        b = self.get(daemon_id)
        b.last_reason = reason
        if b.state is BreakerState.CLOSED:
            b.failures += 1
            if b.failures < self.failures:
                return []
            b.down_since = now
            return [self._open(b, now, f"{b.failures} consecutive transport failures; last: {reason}")]
        if b.state is BreakerState.HALF_OPEN and b.probe_out:
            return [self._open(b, now, f"its probe failed: {reason}")]
        return []  # open, or half-open with no probe out: a late loss of what it held before

    def success(self, daemon_id: str, now: float) -> list[BreakerChanged]:
        """A result of ``daemon_id`` was accepted (ok or a measurement failure: the daemon answered)."""
        b = self._by.get(daemon_id)
        if b is None:
            return []
        if b.state is BreakerState.CLOSED:
            b.failures = 0
            return []
        if b.state is BreakerState.HALF_OPEN and b.probe_out:
            old = b.state
            b.state, b.failures, b.probe_out, b.down_since = BreakerState.CLOSED, 0, False, None
            if b.trips:
                b.trips[-1]["closed_at"] = now
            return [BreakerChanged(daemon_id, old, b.state, now, "probe succeeded")]
        return []

    def tick(self, now: float) -> list[BreakerChanged]:
        """Open breakers whose cool-down is over become half-open."""
        out: list[BreakerChanged] = []
        for b in self._by.values():
            if b.state is BreakerState.OPEN and b.opened_at is not None and now >= b.opened_at + self.recovery_after_s:
                out += self._half_open(b, now)
        return out

    def snapshot(self, wall: float | None = None, now: float | None = None,
                 only: str | None = None) -> dict[str, dict[str, Any]]:
        """Every breaker (or ``only`` that daemon's) as JSON-able data. With ``wall`` and ``now``
        (the wall clock and the injected clock at one instant), times are given as wall-clock
        seconds since the epoch."""
        shift = (wall - now) if wall is not None and now is not None else 0.0

        def t(x: Any) -> Any:
            return None if x is None else round(float(x) + shift, 3)

        out = {}
        items = sorted(self._by.items()) if only is None else [(only, self._by[only])] if only in self._by else []
        for did, b in items:
            d = asdict(b)
            d["state"] = str(b.state)
            d["opened_at"], d["down_since"] = t(b.opened_at), t(b.down_since)
            d["trips"] = [{k: (t(v) if k in ("at", "closed_at") else v) for k, v in trip.items()} for trip in b.trips]
            out[did] = d
        return out

    def _open(self, b: Breaker, now: float, reason: str) -> BreakerChanged:
        old = b.state
        b.state, b.opened_at, b.probe_out = BreakerState.OPEN, now, False
        if b.down_since is None:
            b.down_since = now
        b.trips.append({"at": now, "reason": reason})
        return BreakerChanged(b.daemon_id, old, b.state, now, reason)

    def _half_open(self, b: Breaker, now: float) -> list[BreakerChanged]:
        if b.state is not BreakerState.OPEN:
            return []
        b.state = BreakerState.HALF_OPEN
        return [BreakerChanged(b.daemon_id, BreakerState.OPEN, b.state, now, "cool-down over")]


def drain_reason(hardware_class: str, since_wall: float) -> str:
    """The hole reason of a drained trial (``since_wall``: seconds since the epoch)."""
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since_wall))
    return f"not attempted: no daemon of class {hardware_class} in service since {when}; re-run to retry"


@dataclass(frozen=True)
class Drained:
    """Queued trials of ``hardware_class`` drained to holes (an instruction of the control core):
    record each with ``reason`` and print it. ``hardware_class`` None: work no class had taken yet."""

    hardware_class: str | None
    trial_ids: tuple[str, ...]
    reason: str


class ServiceWatch:
    """When each hardware class was last in service, and which are due to be drained."""

    def __init__(self, drain_after_s: float, first_wait_s: float = 0.0) -> None:
        self.drain_after_s = drain_after_s
        #: A class none of whose daemons has joined yet (they may still be starting: a preflight
        #: imports vLLM) is drained only after the longer of this and ``drain_after_s``.
        self.first_wait_s = first_wait_s
        self.out_since: dict[str, float] = {}  # class -> first instant seen out of service
        self.known: set[str] = set()
        self.served: set[str] = set()  # classes a daemon of which joined, or was in service
        self.drained: set[str] = set()  # classes drained in their current outage

    def update(self, now: float, in_service: dict[str, bool], probing: set[str]) -> list[tuple[str, float]]:
        """``in_service``: class -> whether a connected daemon of it has a closed breaker (classes
        with no connected daemon may be left out: every class seen once is remembered);
        ``probing``: classes with a probe in flight. Returns (class, out of service since) of each
        class newly due for draining."""
        self.known |= set(in_service)
        due = []
        for cls in sorted(self.known):
            if in_service.get(cls, False):
                self.out_since.pop(cls, None)
                self.drained.discard(cls)
                self.served.add(cls)
                continue
            since = self.out_since.setdefault(cls, now)
            after = self.drain_after_s if cls in self.served else max(self.drain_after_s, self.first_wait_s)
            if cls not in self.drained and cls not in probing and now - since >= after:
                self.drained.add(cls)
                due.append((cls, since))
        return due

    def all_out_since(self) -> float | None:
        """When the last known class went out of service (None: one is in service, or none known)."""
        if not self.known or any(c not in self.out_since for c in self.known):
            return None
        return max(self.out_since.values())
