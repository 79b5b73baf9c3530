"""Drawing one chaos schedule from a seeded random generator (pure: no I/O, no clock).

A :class:`Schedule` says which fleet to start (daemons, which of them dial through a fault proxy,
repeats, lease TTL) and which :class:`Fault` to apply when, in seconds after the first trial is
granted. :func:`draw` is deterministic in its ``random.Random``: the same seed gives the same
schedule on every machine (the moments faults land on trials still depend on timing).

Rules a drawn schedule keeps (tested in tests/test_chaos.py):

- 2-3 daemons, at least one behind a proxy when a proxy fault is drawn; repeats 4-8; 2-5 faults;
  a transport retry budget of 1 (the first lost attempt of a trial leaves a hole, so the sweep
  ends with exit 3 and is run again) or 3 (the default).
- Faults on one target (a daemon's process, a daemon's proxy, the coordinator) never overlap in
  time: each window starts after the previous one on that target has ended, so every fault's end
  (SIGCONT, pass-through, restart) undoes exactly that fault.
- Every SIGKILL of a daemon has a replacement (same ``--daemon-id`` or a new one) and every SIGKILL
  of the coordinator a restart with the same command, after the fault's pause.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

FaultKind = Literal["kill_daemon", "stop_daemon", "blackhole", "delay", "reset", "kill_coordinator"]

#: Relative weights of the fault kinds.
WEIGHTS: dict[FaultKind, float] = {
    "kill_daemon": 1.0, "stop_daemon": 1.0, "blackhole": 1.0, "delay": 0.7, "reset": 0.7, "kill_coordinator": 0.8,
}
PROXY_FAULTS: frozenset[FaultKind] = frozenset({"blackhole", "delay", "reset"})
#: Lease TTLs drawn from (seconds); the grace and the heartbeat are fixed (:data:`GRACE_S`, :data:`HEARTBEAT_S`).
TTLS_S = (2.0, 4.0)
#: ``--max-transport-retries`` drawn from, with their weights.
RETRIES = {1: 0.3, 3: 0.7}
GRACE_S = 1.0
HEARTBEAT_S = 0.2
#: Seconds of work one trial takes with the fake endpoint (20 requests, 16 tokens of 5 ms), for
#: spreading fault moments over the time trials run.
TRIAL_S = 0.75
#: Gap kept between two windows on one target.
GAP_S = 0.2


@dataclass(frozen=True)
class DaemonSlot:
    """A daemon position in the fleet: its first ``--daemon-id`` and whether it dials via a proxy."""

    daemon_id: str
    proxied: bool


@dataclass(frozen=True)
class Fault:
    """One fault. ``at_s``: seconds after the first grant. ``duration_s``: how long a SIGSTOP,
    blackhole, delay or reset (with new connections refused) lasts; for a SIGKILL the pause before
    the replacement (daemon) or the restart (coordinator). ``slot``: the daemon slot (None for the
    coordinator). ``delay_s``: per-chunk delay of a ``delay``. ``new_id``: a killed daemon's
    replacement takes a new ``--daemon-id``."""

    kind: FaultKind
    at_s: float
    duration_s: float
    slot: int | None = None
    delay_s: float = 0.0
    new_id: bool = False

    @property
    def end_s(self) -> float:
        return self.at_s + self.duration_s

    @property
    def target(self) -> str:
        """What the fault holds while it lasts: ``coordinator``, ``proc:N`` or ``proxy:N``."""
        if self.slot is None:
            return "coordinator"
        return f"{'proxy' if self.kind in PROXY_FAULTS else 'proc'}:{self.slot}"

    def label(self, slots: list[DaemonSlot]) -> str:
        who = "coordinator" if self.slot is None else slots[self.slot].daemon_id
        extra = {
            "kill_daemon": f"replaced after {self.duration_s:.1f}s{' by a new id' if self.new_id else ''}",
            "stop_daemon": f"{self.duration_s:.1f}s",
            "blackhole": f"{self.duration_s:.1f}s",
            "delay": f"{self.delay_s * 1000:.0f}ms for {self.duration_s:.1f}s",
            "reset": f"refusing {self.duration_s:.1f}s",
            "kill_coordinator": f"restart after {self.duration_s:.1f}s",
        }[self.kind]
        return f"{self.kind} {who} @{self.at_s:.1f}s ({extra})"


@dataclass(frozen=True)
class Schedule:
    """One drawn schedule; ``seed`` is the seed of its ``random.Random``."""

    seed: int
    repeats: int
    lease_ttl_s: float
    max_transport_retries: int
    slots: list[DaemonSlot]
    faults: list[Fault] = field(default_factory=list)

    @property
    def timings(self) -> dict[str, str]:
        """The coordinator's fleet flags for this schedule."""
        return {"--heartbeat-interval": f"{HEARTBEAT_S:g}", "--lease-ttl": f"{self.lease_ttl_s:g}",
                "--lease-grace": f"{GRACE_S:g}", "--daemon-wait": "30",
                "--max-transport-retries": str(self.max_transport_retries)}

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _duration(rng: random.Random, kind: FaultKind) -> tuple[float, float]:
    """(duration_s, delay_s) of one fault of ``kind``."""
    if kind in ("stop_daemon", "blackhole"):
        return round(rng.uniform(0.5, 5.0), 2), 0.0
    if kind == "delay":
        return round(rng.uniform(0.5, 5.0), 2), round(rng.uniform(0.05, 0.8), 3)
    if kind == "reset":
        return round(rng.uniform(0.2, 3.0), 2), 0.0
    if kind == "kill_daemon":
        return round(rng.uniform(0.2, 3.0), 2), 0.0
    return round(rng.uniform(0.0, 3.0), 2), 0.0  # kill_coordinator: the pause before the restart


def draw(seed: int) -> Schedule:
    """The schedule of ``random.Random(seed)``."""
    rng = random.Random(seed)
    n_daemons = rng.choice((2, 3))
    repeats = rng.randint(4, 8)
    ttl = rng.choice(TTLS_S)
    retries = rng.choices(list(RETRIES), weights=list(RETRIES.values()))[0]
    kinds: list[FaultKind] = list(WEIGHTS)
    drawn = rng.choices(kinds, weights=[WEIGHTS[k] for k in kinds], k=rng.randint(2, 5))
    proxied = [rng.random() < 0.5 for _ in range(n_daemons)]
    if any(k in PROXY_FAULTS for k in drawn) and not any(proxied):
        proxied[rng.randrange(n_daemons)] = True
    slots = [DaemonSlot(f"d{i + 1}", p) for i, p in enumerate(proxied)]
    window_s = max(2.0, TRIAL_S * 2 * repeats / n_daemons)  # about when the trials run (two load points)
    free_at: dict[str, float] = {}
    faults: list[Fault] = []
    for kind in drawn:
        at = round(rng.uniform(0.0, window_s), 2)
        duration, delay = _duration(rng, kind)
        if kind == "kill_coordinator":
            slot = None
        elif kind in PROXY_FAULTS:
            slot = rng.choice([i for i, s in enumerate(slots) if s.proxied])
        else:
            slot = rng.randrange(n_daemons)
        fault = Fault(kind, at, duration, slot, delay, new_id=kind == "kill_daemon" and rng.random() < 0.5)
        start = max(at, free_at.get(fault.target, 0.0))
        fault = Fault(kind, round(start, 2), duration, slot, delay, fault.new_id)
        free_at[fault.target] = fault.end_s + GAP_S
        faults.append(fault)
    faults.sort(key=lambda f: f.at_s)
    return Schedule(seed=seed, repeats=repeats, lease_ttl_s=ttl, max_transport_retries=retries, slots=slots,
                    faults=faults)
