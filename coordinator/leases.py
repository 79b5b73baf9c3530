"""The lease table: which daemon holds which batch, until when. Pure: no sockets, no store, no clock
of its own (every call that needs the time is given ``now``).

A lease covers one batch (one engine config and its trials); each trial in it has its own
attempt number, its epoch. A lease ends ``released`` when every trial has an accepted result, or
``revoked`` (expired, the daemon left or restarted, a daemon error), when the trials still
outstanding are handed back for re-granting. States and their legal moves: :mod:`servetune.states`.

Contract: at most one live lease per batch id and per (trial, epoch); a trial is in at most one
live lease; revocation returns exactly the (trial, epoch) pairs still outstanding, in run order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property

from servetune.manifest import PlannedBatch, TrialManifest
from servetune.states import LeaseState, check_lease


@dataclass(frozen=True)
class BatchWork:
    """A planned batch reduced to the trials that still need running, in run order.

    ``hardware_class``: once a batch has been granted, it is re-granted only to a daemon of the same
    hardware class (None: any daemon may take it). A batch planned for a hardware target (the spec's
    ``hardware`` section) is pinned from the start to its target's label: a class target's class, or
    ``filter:<name>``, which no daemon's class equals, until :class:`coordinator.targets.TargetBook`
    binds the filter to the first class that matches it."""

    batch: PlannedBatch
    trials: tuple[TrialManifest, ...]
    hardware_class: str | None = None

    def __post_init__(self) -> None:
        if self.hardware_class is None and self.batch.hardware_target is not None:
            object.__setattr__(self, "hardware_class", self.batch.hardware_target)

    @cached_property
    def batch_id(self) -> str:
        """Computed once per instance (a sha256 of the config: the core asks for it on every
        message; the dataclass and its batch are frozen, and :func:`dataclasses.replace` makes a
        new instance without the cached id)."""
        return f"b{self.batch.index:04d}-{self.batch.config_id[:8]}"


@dataclass
class Lease:
    batch_id: str
    daemon_id: str
    work: BatchWork
    attempts: dict[str, int]  # trial_id -> epoch (attempt number)
    outstanding: set[str]
    granted_at: float
    renewed_at: float
    ttl_s: float
    state: LeaseState = LeaseState.ACTIVE
    ready_seq: int = 0  # the seq of the READY this lease's GRANT answered
    accepted: dict[str, str] = field(default_factory=dict)  # trial_id -> submission_id

    @property
    def expires_at(self) -> float:
        return self.renewed_at + self.ttl_s

    @property
    def live(self) -> bool:
        return self.state in (LeaseState.ORPHANED, LeaseState.ACTIVE, LeaseState.SUSPECT)

    def move(self, new: LeaseState) -> None:
        self.state = check_lease(self.state, new)

    def outstanding_pairs(self) -> list[tuple[str, int]]:
        """(trial, epoch) of the trials without an accepted result, in run order."""
        return [(m.trial_id, self.attempts[m.trial_id]) for m in self.work.trials if m.trial_id in self.outstanding]

    def remaining_work(self) -> BatchWork | None:
        """The outstanding trials as a batch to re-grant (same hardware class), or None."""
        trials = tuple(m for m in self.work.trials if m.trial_id in self.outstanding)
        return BatchWork(self.work.batch, trials, self.work.hardware_class) if trials else None

    def manifest(self, trial_id: str) -> TrialManifest:
        return next(m for m in self.work.trials if m.trial_id == trial_id)


class LeaseTable:
    """Live leases, indexed by batch id, by trial id and by daemon id."""

    def __init__(self) -> None:
        self._by_batch: dict[str, Lease] = {}
        self._by_trial: dict[str, Lease] = {}
        self._by_daemon: dict[str, dict[str, Lease]] = {}  # daemon -> batch id -> lease, in grant order

    def __len__(self) -> int:
        return len(self._by_batch)

    def __iter__(self) -> Iterator[Lease]:
        return iter(list(self._by_batch.values()))

    def get(self, batch_id: str) -> Lease | None:
        return self._by_batch.get(batch_id)

    def for_trial(self, trial_id: str) -> Lease | None:
        return self._by_trial.get(trial_id)

    def held_by(self, daemon_id: str) -> list[Lease]:
        """The live leases of ``daemon_id``, oldest grant first."""
        held = self._by_daemon.get(daemon_id)
        return list(held.values()) if held else []

    def _drop(self, lease: Lease) -> None:
        self._by_batch.pop(lease.batch_id, None)
        held = self._by_daemon.get(lease.daemon_id)
        if held is not None and held.get(lease.batch_id) is lease:
            del held[lease.batch_id]
            if not held:
                del self._by_daemon[lease.daemon_id]

    def add(self, lease: Lease) -> Lease:
        if lease.batch_id in self._by_batch:
            raise ValueError(f"batch {lease.batch_id} is already leased to {self._by_batch[lease.batch_id].daemon_id}")
        for trial_id in lease.outstanding:
            if trial_id in self._by_trial:
                raise ValueError(f"trial {trial_id[:12]} is already in lease {self._by_trial[trial_id].batch_id}")
        self._by_batch[lease.batch_id] = lease
        self._by_daemon.setdefault(lease.daemon_id, {})[lease.batch_id] = lease
        for trial_id in lease.outstanding:
            self._by_trial[trial_id] = lease
        return lease

    def current(self, daemon_id: str, trial_id: str, epoch: int) -> Lease | None:
        """The live lease in which ``daemon_id`` holds ``trial_id`` at ``epoch`` with no accepted result."""
        lease = self._by_trial.get(trial_id)
        if lease is None or lease.daemon_id != daemon_id or lease.attempts.get(trial_id) != epoch:
            return None
        return lease if trial_id in lease.outstanding else None

    def renew(self, lease: Lease, now: float) -> None:
        if lease.state in (LeaseState.ORPHANED, LeaseState.SUSPECT):
            lease.move(LeaseState.ACTIVE)
        lease.renewed_at = now

    def resolve(self, lease: Lease, trial_id: str, submission_id: str, now: float) -> bool:
        """Record an accepted result; True when it was the last one (the lease is released)."""
        lease.accepted[trial_id] = submission_id
        lease.outstanding.discard(trial_id)
        self._by_trial.pop(trial_id, None)
        if lease.outstanding:
            return False
        lease.move(LeaseState.RELEASED)
        self._drop(lease)
        return True

    def revoke(self, lease: Lease) -> list[tuple[str, int]]:
        """End a lease; returns its outstanding (trial, epoch) pairs in run order."""
        lease.move(LeaseState.REVOKED)
        self._drop(lease)
        for trial_id in lease.outstanding:
            if self._by_trial.get(trial_id) is lease:
                del self._by_trial[trial_id]
        return lease.outstanding_pairs()

    def expired(self, now: float, grace_s: float) -> list[Lease]:
        """Live leases not renewed for TTL + ``grace_s``."""
        return [lease for lease in self._by_batch.values() if now > lease.expires_at + grace_s]
