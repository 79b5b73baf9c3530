"""Which daemon runs which batch, and which results count. Pure logic: no sockets, no store.

The sweep loop feeds it events (a daemon said HELLO / READY / RESULT, a daemon was lost, time
passed) and acts on its answers. The clock is injected so lease expiry is testable without waiting.

Contract: one batch is leased to one daemon at a time; a trial's result is accepted once, for the
attempt (epoch) it was granted with. A second identical submission is a ``duplicate`` (re-ACK it),
a different one for the same attempt a ``conflict``, a result for an attempt that is no longer
current ``stale``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from servetune.manifest import PlannedBatch, TrialManifest

Verdict = Literal["accept", "duplicate", "conflict", "stale"]


@dataclass(frozen=True)
class BatchWork:
    """A planned batch reduced to the trials that still need running, in run order."""

    batch: PlannedBatch
    trials: tuple[TrialManifest, ...]

    @property
    def batch_id(self) -> str:
        return f"b{self.batch.index:04d}-{self.batch.config_id[:8]}"


@dataclass
class Lease:
    batch_id: str
    daemon_id: str
    work: BatchWork
    attempts: dict[str, int]
    outstanding: set[str]
    granted_at: float
    last_activity: float
    accepted: dict[str, str] = field(default_factory=dict)  # trial_id -> submission_id

    def work_order(self) -> list[str]:
        return [t.trial_id for t in self.work.trials]


class Scheduler:
    """Hands out batches in plan order and tracks what each daemon holds."""

    def __init__(self, work: Sequence[BatchWork], clock: Callable[[], float] = time.monotonic):
        self._queue: deque[BatchWork] = deque(work)
        self._clock = clock
        self.leases: dict[str, Lease] = {}
        self.daemons: dict[str, float] = {}
        self.stopping = False

    # ----------------------------------------------------------------- daemons

    def add_daemon(self, daemon_id: str) -> None:
        self.daemons[daemon_id] = self._clock()

    def touch(self, daemon_id: str) -> None:
        if daemon_id in self.daemons:
            self.daemons[daemon_id] = self._clock()
        for lease in self.leases.values():
            if lease.daemon_id == daemon_id:
                lease.last_activity = self._clock()

    def remove_daemon(self, daemon_id: str) -> list[tuple[str, int]]:
        """Forget a daemon; returns the (trial, attempt) pairs it held, to be closed as transport failures."""
        self.daemons.pop(daemon_id, None)
        lost: list[tuple[str, int]] = []
        for batch_id in [b for b, lease in self.leases.items() if lease.daemon_id == daemon_id]:
            lease = self.leases.pop(batch_id)
            lost += [(t, lease.attempts[t]) for t in lease.work_order() if t in lease.outstanding]
        return lost

    # ----------------------------------------------------------------- work

    def take(self, daemon_id: str) -> BatchWork | None:
        """The next batch for a READY daemon, or None when there is none (or the sweep is stopping)."""
        if self.stopping or daemon_id not in self.daemons or not self._queue:
            return None
        return self._queue.popleft()

    def add(self, work: BatchWork) -> bool:
        """Queue a batch planned during the sweep (e.g. a rate sweep's follow-ups); False when stopping."""
        if self.stopping:
            return False
        self._queue.append(work)
        return True

    def grant(self, daemon_id: str, work: BatchWork, attempts: dict[str, int]) -> Lease:
        now = self._clock()
        lease = Lease(
            batch_id=work.batch_id,
            daemon_id=daemon_id,
            work=work,
            attempts=dict(attempts),
            outstanding={t.trial_id for t in work.trials},
            granted_at=now,
            last_activity=now,
        )
        self.leases[work.batch_id] = lease
        return lease

    def classify_result(self, daemon_id: str, batch_id: str, trial_id: str, epoch: int, submission_id: str) -> Verdict:
        lease = self.leases.get(batch_id)
        if lease is None or lease.daemon_id != daemon_id or trial_id not in lease.attempts:
            return "stale"
        if lease.attempts[trial_id] != epoch:
            return "stale"
        if trial_id in lease.accepted:
            return "duplicate" if lease.accepted[trial_id] == submission_id else "conflict"
        return "accept"

    def resolve(self, batch_id: str, trial_id: str, submission_id: str) -> None:
        """Mark a trial's result accepted; the lease ends when none is outstanding."""
        lease = self.leases[batch_id]
        lease.accepted[trial_id] = submission_id
        lease.outstanding.discard(trial_id)
        lease.last_activity = self._clock()
        if not lease.outstanding:
            del self.leases[batch_id]

    def expired(self, timeout_s: float) -> list[Lease]:
        """Leases with no sign of life for ``timeout_s`` (the caller revokes them)."""
        now = self._clock()
        return [lease for lease in self.leases.values() if now - lease.last_activity > timeout_s]

    def revoke(self, batch_id: str) -> list[tuple[str, int]]:
        lease = self.leases.pop(batch_id)
        return [(t, lease.attempts[t]) for t in lease.work_order() if t in lease.outstanding]

    def stop(self) -> int:
        """Grant nothing more; returns how many queued batches are left unrun (they stay holes)."""
        self.stopping = True
        left = len(self._queue)
        self._queue.clear()
        return left

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def finished(self) -> bool:
        return not self._queue and not self.leases
