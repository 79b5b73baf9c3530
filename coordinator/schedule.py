"""The schedule state of a sweep, kept in the store as it changes and written to
``runs/<name>/schedule.json`` from it (atomically: a temporary file, then ``os.replace``).

The adapter (:class:`coordinator.sweep.SweepRunner`) tells a :class:`ScheduleBook` what happened
(daemons joining and leaving, breaker changes, retries, drained classes, clock offsets); each
call updates the store's ``schedule`` table (:meth:`coordinator.store.Store.put_schedule`) and
rewrites the file from the table (joins and departures: at most every :data:`WRITE_EVERY_S`, by
:meth:`ScheduleBook.flush`). ``schedule.json``::

    {"experiment": ..., "updated_at": <s since epoch>, "sweep_status": "running" | "finished" | ...,
     "policy": {breaker_failures, recovery_after_s, drain_after_s, max_transport_retries,
                lease_ttl_s, lease_grace_s, heartbeat_interval_s},
     "daemons": {<id>: {hardware_class, hostname, connected, joined_at, left_at, left_reason,
                        breaker: {state, failures, opened_at, down_since, trips, ...}, retries,
                        outcome}},
     "breaker_trips": [{daemon_id, at, reason, closed_at?}, ...],
     "retries": {"retry": n, "given_up": n, "failover": n},
     "drained": {<class>: {trials, reason}},
     "clock_offsets": {...}}          # as given by the clock estimator; {} until it reports

``outcome`` of a daemon: "in service", "breaker open since ...", "half-open (probing)", or
"left: <reason>". Times are wall-clock seconds since the epoch.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from coordinator.breaker import BreakerBoard, Drained
from coordinator.fleet import FleetSettings
from coordinator.retries import RetryEvent
from coordinator.store import Store

SCHEDULE_FILE = "schedule.json"
#: Joins and departures rewrite schedule.json at most this often (:meth:`ScheduleBook.flush`, each
#: tick): every rewrite holds every daemon, so one per join was O(daemons) per daemon, and 1,000
#: daemons joining took minutes. The store's table is updated at once either way.
WRITE_EVERY_S = 2.0


class ScheduleBook:
    """One sweep's schedule state: the store's ``schedule`` table and ``schedule.json`` from it."""

    def __init__(self, store: Store, experiment: str, fleet: FleetSettings,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.clock = clock  # the control core's clock: the breakers' times are on it
        self.experiment = experiment
        self.path = store.folder / SCHEDULE_FILE
        store.clear_schedule()
        self._daemons: dict[str, dict[str, Any]] = {}
        self._retries = {"retry": 0, "given_up": 0, "failover": 0}
        self._dirty = False
        self._written_at = -float("inf")  # time.monotonic() of the last rewrite
        store.put_schedule("policy", {
            "breaker_failures": fleet.breaker_failures, "recovery_after_s": fleet.recovery_after_s,
            "drain_after_s": 2 * fleet.recovery_after_s, "max_transport_retries": fleet.max_transport_retries,
            "lease_ttl_s": fleet.lease_ttl_s, "lease_grace_s": fleet.lease_grace_s,
            "heartbeat_interval_s": fleet.heartbeat_interval_s,
        })
        store.put_schedule("sweep_status", "running")
        store.put_schedule("clock_offsets", {})
        store.put_schedule("retries", self._retries)
        self.write()

    # ------------------------------------------------------------------ changes

    def joined(self, daemon_id: str, hardware_class: str, hostname: str, board: BreakerBoard) -> None:
        d = self._daemons.setdefault(daemon_id, {"retries": 0, "joined_at": time.time()})
        d.update(hardware_class=hardware_class, hostname=hostname, connected=True, left_at=None, left_reason=None)
        self._put_daemon(daemon_id, board, write=False)
        self.flush()

    def left(self, daemon_id: str, reason: str, board: BreakerBoard) -> None:
        d = self._daemons.setdefault(daemon_id, {"retries": 0, "joined_at": None, "hardware_class": "",
                                                 "hostname": ""})
        d.update(connected=False, left_at=time.time(), left_reason=reason)
        self._put_daemon(daemon_id, board, write=False)
        self.flush()

    def breaker(self, board: BreakerBoard, daemon_ids: set[str]) -> None:
        for daemon_id in sorted(daemon_ids):
            self._daemons.setdefault(daemon_id, {"retries": 0, "joined_at": None, "hardware_class": "",
                                                 "hostname": "", "connected": True})
            self._put_daemon(daemon_id, board, write=False)
        self.write()

    def retried(self, events: list[RetryEvent], board: BreakerBoard) -> None:
        for e in events:
            self._retries[e.event] = self._retries.get(e.event, 0) + 1
            if e.daemon_id in self._daemons:
                self._daemons[e.daemon_id]["retries"] += 1
        self.store.put_schedule("retries", self._retries)
        for daemon_id in {e.daemon_id for e in events if e.daemon_id in self._daemons}:
            self._put_daemon(daemon_id, board, write=False)
        self.write()

    def drained(self, ins: Drained) -> None:
        key = ins.hardware_class if ins.hardware_class is not None else "(unclaimed)"
        old = self.store.schedule().get(f"drained:{key}", {"trials": 0})
        self.store.put_schedule(f"drained:{key}", {"trials": int(old["trials"]) + len(ins.trial_ids),
                                                   "reason": ins.reason})
        self.write()

    def clock_offsets(self, offsets: dict[str, Any]) -> None:
        """The clock estimator's latest offsets (any JSON-able mapping), stored as given."""
        self.store.put_schedule("clock_offsets", dict(offsets))
        self.write()

    def finished(self, status: str, board: BreakerBoard) -> None:
        self.store.put_schedule("sweep_status", status)
        for daemon_id in self._daemons:
            self._put_daemon(daemon_id, board, write=False)
        self.write()

    # ------------------------------------------------------------------ output

    def _put_daemon(self, daemon_id: str, board: BreakerBoard, write: bool = True) -> None:
        snap = board.snapshot(wall=time.time(), now=self.clock(), only=daemon_id)
        breaker = snap.get(daemon_id, {"state": "closed", "failures": 0, "trips": []})
        d = {**self._daemons[daemon_id], "breaker": breaker}
        d["outcome"] = _outcome(d)
        self.store.put_schedule(f"daemon:{daemon_id}", d)
        self._dirty = True
        if write:
            self.write()

    def flush(self) -> None:
        """Rewrite ``schedule.json`` if the store's state changed since the last rewrite and that
        was at least :data:`WRITE_EVERY_S` ago (the sweep calls this every tick)."""
        if self._dirty and time.monotonic() - self._written_at >= WRITE_EVERY_S:
            self.write()

    def document(self) -> dict[str, Any]:
        return schedule_document(self.store.schedule(), self.experiment)

    def write(self) -> Path:
        """Rewrite ``schedule.json`` from the store, atomically."""
        self._dirty, self._written_at = False, time.monotonic()
        text = json.dumps(self.document(), indent=2, sort_keys=True)
        fd, tmp = tempfile.mkstemp(prefix=".schedule-", suffix=".json", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return self.path


def schedule_document(rows: dict[str, Any], experiment: str) -> dict[str, Any]:
    """``schedule.json`` from the store's schedule rows."""
    daemons = {k.removeprefix("daemon:"): v for k, v in sorted(rows.items()) if k.startswith("daemon:")}
    trips = [{"daemon_id": did, **t} for did, d in daemons.items() for t in d.get("breaker", {}).get("trips", [])]
    return {
        "experiment": experiment,
        "updated_at": round(time.time(), 3),
        "sweep_status": rows.get("sweep_status", ""),
        "policy": rows.get("policy", {}),
        "daemons": daemons,
        "breaker_trips": sorted(trips, key=lambda t: t.get("at") or 0),
        "retries": rows.get("retries", {}),
        "drained": {k.removeprefix("drained:"): v for k, v in sorted(rows.items()) if k.startswith("drained:")},
        "clock_offsets": rows.get("clock_offsets", {}),
    }


def _outcome(d: dict[str, Any]) -> str:
    if not d.get("connected", False):
        return f"left: {d.get('left_reason') or 'unknown'}"
    b = d.get("breaker", {})
    state = b.get("state", "closed")
    if state == "open":
        since = b.get("down_since")
        when = time.strftime("%H:%M:%S UTC", time.gmtime(since)) if since else "?"
        return f"breaker open (down since {when}, {len(b.get('trips', []))} trip(s))"
    if state == "half-open":
        return "breaker half-open (probing)"
    return "in service"
