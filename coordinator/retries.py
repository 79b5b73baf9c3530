"""Retries written down: what the control core re-ran, and the warning the result that finally
succeeds carries.

- :class:`RetryLedger` (pure): the transport failures of each trial in this sweep (attempt,
  daemon, reason) and :meth:`~RetryLedger.warning`, e.g. "produced on attempt 2 of 3 after 1
  transport failure(s) on node-b" (``of 3``: the sweep's ``max_transport_retries``).
- :class:`RetryLog` (adapter): ``runs/<name>/retries.jsonl``, append-only, one JSON object a line
  per event, fsynced before the call returns. Fields: ``event`` (``retry``: queued again;
  ``given_up``: its budget spent, left a hole; ``failover``: moved to other hardware), ``trial_id``,
  ``attempt`` (the attempt that was lost), ``daemon_id``, ``reason``, ``time`` (seconds since the
  epoch) and, for a retry, ``next_attempt_of`` (the budget).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RETRIES_FILE = "retries.jsonl"


@dataclass(frozen=True)
class Loss:
    attempt: int
    daemon_id: str
    reason: str


@dataclass(frozen=True)
class RetryEvent:
    """One line of ``retries.jsonl`` (an instruction of the control core: append it)."""

    event: str
    trial_id: str
    attempt: int
    daemon_id: str
    reason: str
    budget: int

    def record(self, wall: float) -> dict[str, Any]:
        out: dict[str, Any] = {"event": self.event, "trial_id": self.trial_id, "attempt": self.attempt,
                               "daemon_id": self.daemon_id, "reason": self.reason, "time": round(wall, 6)}
        if self.event == "retry":
            out["budget"] = self.budget
        return out


class RetryLedger:
    """Transport failures per trial in one sweep."""

    def __init__(self) -> None:
        self._lost: dict[str, list[Loss]] = {}

    def lost(self, trial_id: str, attempt: int, daemon_id: str, reason: str) -> None:
        self._lost.setdefault(trial_id, []).append(Loss(attempt, daemon_id, reason.splitlines()[0] if reason else ""))

    def losses(self, trial_id: str) -> list[Loss]:
        return list(self._lost.get(trial_id, ()))

    def warning(self, trial_id: str, budget: int) -> str | None:
        """The warning for the result of ``trial_id`` that came after its losses (None: none)."""
        losses = self._lost.get(trial_id)
        if not losses:
            return None
        daemons = ", ".join(dict.fromkeys(x.daemon_id for x in losses))
        return (f"produced on attempt {len(losses) + 1} of {budget} after {len(losses)} transport failure(s) "
                f"on {daemons}")


class RetryLog:
    """``retries.jsonl`` of one experiment folder: append-only, each line fsynced."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / RETRIES_FILE

    def append(self, events: list[RetryEvent], wall: float | None = None) -> None:
        if not events:
            return
        when = time.time() if wall is None else wall
        text = "".join(json.dumps(e.record(when), sort_keys=True) + "\n" for e in events)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, text.encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)


def read_retries(folder: Path) -> list[dict[str, Any]]:
    """Every line of ``retries.jsonl`` (empty when there is none)."""
    path = folder / RETRIES_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
