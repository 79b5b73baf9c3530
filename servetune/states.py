"""Attempt and lease states, and their legal transitions: one definition for every wing.

An **attempt** is one execution of a trial; its number is the lease epoch it was granted with.
It moves ``running -> ok | failed`` exactly once (a store refuses anything else).

A **lease** is the coordinator's grant of one batch (one engine config and its trials) to one
daemon, valid while the daemon renews it by heartbeat::

    active -> suspect      heartbeats missed for a few intervals (shown and logged, nothing revoked)
    suspect -> active      a heartbeat renewed it
    active|suspect -> released   every trial of the batch has an accepted result
    active|suspect -> revoked    expired (TTL + grace without renewal), the daemon left, restarted
                                 under its old id, or reported a daemon error; its outstanding
                                 attempts close as ``transport`` failures and are re-granted
                                 with epoch + 1
    orphaned -> active     after a coordinator restart: a lease found running in the store is
                           adopted when its daemon comes back within the TTL
    orphaned -> revoked    ... or revoked when it does not
"""

from __future__ import annotations

from enum import Enum

from servetune.errors import ServetuneError


class StateError(ServetuneError):
    """A state change that the state machine does not allow."""


class AttemptStatus(str, Enum):
    RUNNING = "running"
    OK = "ok"
    FAILED = "failed"


class LeaseState(str, Enum):
    ORPHANED = "orphaned"
    ACTIVE = "active"
    SUSPECT = "suspect"
    RELEASED = "released"
    REVOKED = "revoked"


ATTEMPT_TRANSITIONS: dict[AttemptStatus, frozenset[AttemptStatus]] = {
    AttemptStatus.RUNNING: frozenset({AttemptStatus.OK, AttemptStatus.FAILED}),
    AttemptStatus.OK: frozenset(),
    AttemptStatus.FAILED: frozenset(),
}

LEASE_TRANSITIONS: dict[LeaseState, frozenset[LeaseState]] = {
    LeaseState.ORPHANED: frozenset({LeaseState.ACTIVE, LeaseState.REVOKED}),
    LeaseState.ACTIVE: frozenset({LeaseState.SUSPECT, LeaseState.RELEASED, LeaseState.REVOKED}),
    LeaseState.SUSPECT: frozenset({LeaseState.ACTIVE, LeaseState.RELEASED, LeaseState.REVOKED}),
    LeaseState.RELEASED: frozenset(),
    LeaseState.REVOKED: frozenset(),
}


def check_attempt(current: AttemptStatus | str, new: AttemptStatus | str) -> AttemptStatus:
    """``new`` as an :class:`AttemptStatus` if ``current -> new`` is legal, else :class:`StateError`."""
    legal = _LEGAL_ATTEMPT.get((current, new))  # a str enum hashes as its value: one lookup for both
    if legal is not None:  # (the store checks every finished attempt; an Enum call costs microseconds)
        return legal
    cur, nxt = AttemptStatus(current), AttemptStatus(new)
    if nxt not in ATTEMPT_TRANSITIONS[cur]:
        raise StateError(f"attempt cannot go from {cur.value} to {nxt.value}")
    return nxt


#: Every legal (current, new) attempt transition -> ``new`` as its enum.
_LEGAL_ATTEMPT: dict[tuple[str, str], AttemptStatus] = {
    (cur.value, nxt.value): nxt for cur, nexts in ATTEMPT_TRANSITIONS.items() for nxt in nexts
}


def check_lease(current: LeaseState, new: LeaseState) -> LeaseState:
    """``new`` if ``current -> new`` is legal, else :class:`StateError`."""
    if new not in LEASE_TRANSITIONS[current]:
        raise StateError(f"lease cannot go from {current.value} to {new.value}")
    return new
