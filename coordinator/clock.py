"""Daemon clock offsets by Cristian's algorithm: the estimator and the probing schedule (pure).

Why: records carry each daemon's wall-clock times (``started_at`` of a measurement window, request
timestamps); comparing them across nodes, or against the coordinator's log, is only honest when
each node's offset from the coordinator is known, with its error bar.

One probe (:class:`ProbeSample`): the coordinator stamps its wall clock ``t0`` and sends
TIME_PROBE; the daemon stamps its own wall clock when its handling began (``t1``) and ended
(``t2``) and sends TIME_REPLY; the coordinator stamps ``t3`` when the reply is read. The
coordinator's two stamps come from one wall-clock reading plus the monotonic time elapsed, so a
wall-clock step during the probe cannot fake a round trip. With the daemon's clock ahead by
``theta`` and one-way delays ``d1`` (there) and ``d2`` (back), both >= 0::

    offset      = (t1 + t2) / 2 - (t0 + t3) / 2    = theta + (d1 - d2) / 2
    uncertainty = ((t3 - t0) - (t2 - t1)) / 2      = (d1 + d2) / 2

so ``|offset - theta| <= uncertainty`` whatever the split of the delays (Cristian's guarantee):
the daemon's own handling time cancels, and only the unaccounted transport time is uncertain.
Every stamp is an integer of nanoseconds (no float rounding at 1.8e9 s). Of the
:attr:`ClockSchedule.probes` probes of one estimate, the one with the smallest unaccounted round
trip is kept (every probe's interval holds the truth; that one is the tightest). A probe whose
daemon claims more handling time than the whole round trip cannot be true (a stepped or lying
clock) and is dropped. An offset within its uncertainty of 0 is reported as agreeing.

The schedule (:class:`ClockSchedule`) probes a daemon when it joins (before its first batch has
measured anything: a server start takes far longer than a few loopback round trips) and again every
``clock_probe_every_s`` (fleet setting). It has one probe in flight per daemon at a time, gives one
up after :attr:`ClockSchedule.timeout_s`, and never touches a socket: the sweep sends the probes it
returns and feeds it the replies (:mod:`coordinator.sweep`). Clocks are injected.

Leases never use any of this: every lease time in :mod:`coordinator.leases` and
:mod:`coordinator.control` is the coordinator's monotonic clock, and a daemon's lease deadlines
are its own monotonic clock (:mod:`daemon.session`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servetune.messages import TimeProbe, TimeReply

NS = 1_000_000_000
#: Probes per estimate (the one with the smallest unaccounted round trip is kept).
PROBES_PER_ESTIMATE = 5
#: A probe unanswered this long is given up (its round trip would be useless anyway).
PROBE_TIMEOUT_S = 2.0
#: Where the latest estimates are written, in the experiment's folder.
CLOCK_FILE = "clock.json"


@dataclass(frozen=True)
class ProbeSample:
    """One probe's four stamps, integer ns since the epoch: ``sent_at_ns`` and ``returned_at_ns``
    on the coordinator's clock, ``received_at_ns`` and ``replied_at_ns`` on the daemon's."""

    sent_at_ns: int
    received_at_ns: int
    replied_at_ns: int
    returned_at_ns: int

    @property
    def rtt_ns(self) -> int:
        return self.returned_at_ns - self.sent_at_ns

    @property
    def handling_ns(self) -> int:
        return self.replied_at_ns - self.received_at_ns

    @property
    def transport_ns(self) -> int:
        """The round trip the daemon's handling does not account for: twice the uncertainty."""
        return self.rtt_ns - self.handling_ns

    @property
    def consistent(self) -> bool:
        """Stamps that non-negative delays can produce (handling within the round trip)."""
        return self.handling_ns >= 0 and self.transport_ns >= 0

    @property
    def offset_s(self) -> float:
        """Daemon mid-point minus coordinator mid-point, in seconds."""
        return ((self.received_at_ns + self.replied_at_ns) - (self.sent_at_ns + self.returned_at_ns)) / (2 * NS)

    @property
    def uncertainty_s(self) -> float:
        return self.transport_ns / (2 * NS)


@dataclass(frozen=True)
class ClockEstimate:
    """A daemon's clock offset from the coordinator's (positive: the daemon's clock is ahead).

    The true offset lies in ``offset_s ± uncertainty_s`` whenever the probe's one-way delays were
    non-negative. ``rtt_s``: that probe's whole round trip; ``measured_at``: the coordinator's
    wall clock (s since the epoch) when it came back; ``probes``: replies used / probes sent."""

    daemon_id: str
    offset_s: float
    uncertainty_s: float
    rtt_s: float
    measured_at: float
    probes_answered: int
    probes_sent: int

    @property
    def agrees(self) -> bool:
        return abs(self.offset_s) <= self.uncertainty_s

    def as_dict(self) -> dict[str, Any]:
        """The record kept per daemon (``clock.json``; ``runs/<name>/schedule.json`` takes these)."""
        return {"offset_s": self.offset_s, "uncertainty_s": self.uncertainty_s, "rtt_s": self.rtt_s,
                "agrees": self.agrees, "measured_at": self.measured_at,
                "probes_answered": self.probes_answered, "probes_sent": self.probes_sent}

    def line(self) -> str:
        """One console line: ``clock: daemon d1 offset +0.250 s ± 0.002 s`` or ``... agrees within ± ...``."""
        digits = _digits(self.uncertainty_s)
        pm = f"± {self.uncertainty_s:.{digits}f} s"
        rtt = f"round trip {self.rtt_s * 1000:.2f} ms"
        if self.agrees:
            return (f"clock: daemon {self.daemon_id} agrees within {pm} (offset {self.offset_s:+.{digits}f} s, "
                    f"{rtt})")
        return f"clock: daemon {self.daemon_id} offset {self.offset_s:+.{digits}f} s {pm} ({rtt})"


def _digits(uncertainty_s: float) -> int:
    """Decimals that show two significant figures of the uncertainty (3 at least, 9 at most)."""
    digits = 3
    while digits < 9 and uncertainty_s < 10 ** (1 - digits):
        digits += 1
    return digits


def estimate(daemon_id: str, samples: Sequence[ProbeSample], probes_sent: int | None = None) -> ClockEstimate | None:
    """Cristian's estimate from ``samples`` (the consistent one with the smallest unaccounted round
    trip), or None when no sample is consistent."""
    good = [s for s in samples if s.consistent]
    if not good:
        return None
    best = min(good, key=lambda s: s.transport_ns)
    return ClockEstimate(daemon_id=daemon_id, offset_s=best.offset_s, uncertainty_s=best.uncertainty_s,
                         rtt_s=best.rtt_ns / NS, measured_at=best.returned_at_ns / NS, probes_answered=len(good),
                         probes_sent=len(samples) if probes_sent is None else probes_sent)


# ---------------------------------------------------------------------- schedule


@dataclass
class _InFlight:
    probe_id: str
    sent_at_ns: int  # coordinator wall clock
    sent_mono_ns: int


@dataclass
class _Daemon:
    due_ns: int  # monotonic: when the next round starts (or the next probe of this one goes)
    sent: int = 0
    samples: list[ProbeSample] = field(default_factory=list)
    in_flight: _InFlight | None = None


@dataclass
class ClockStep:
    """What :meth:`ClockSchedule.step` asks for: ``probes`` to send now, ``estimates`` finished,
    ``silent``: daemons that answered no probe of a finished round."""

    probes: list[tuple[str, TimeProbe]] = field(default_factory=list)
    estimates: list[ClockEstimate] = field(default_factory=list)
    silent: list[str] = field(default_factory=list)


class ClockSchedule:
    """When to probe which daemon, and what its replies say. Not thread-safe (the sweep's loop owns
    it). ``wall_ns`` / ``mono_ns``: the coordinator's clocks (injected for tests).

    Contract: at most one probe in flight per daemon; a reply counts only for the daemon and the
    probe id it was sent with (the caller checks session and key first); an estimate is finished
    after ``probes`` replies or ``2 * probes`` probes sent, whichever comes first, and the next round
    starts ``every_s`` after that."""

    def __init__(self, every_s: float, *, probes: int = PROBES_PER_ESTIMATE, timeout_s: float = PROBE_TIMEOUT_S,
                 wall_ns: Callable[[], int] = time.time_ns, mono_ns: Callable[[], int] = time.monotonic_ns):
        if every_s <= 0 or probes < 1 or timeout_s <= 0:
            raise ValueError(f"every_s ({every_s}), probes ({probes}) and timeout_s ({timeout_s}) must be positive")
        self.every_ns = int(every_s * NS)
        self.probes = probes
        self.timeout_ns = int(timeout_s * NS)
        self._wall_ns = wall_ns
        self._mono_ns = mono_ns
        self._daemons: dict[str, _Daemon] = {}
        self._next_id = 0
        #: The latest estimate of every daemon seen this sweep (kept after it leaves).
        self.latest: dict[str, ClockEstimate] = {}

    def join(self, daemon_id: str) -> None:
        """A daemon (re)joined: probe it now (a new session may be a new process or a new node)."""
        self._daemons[daemon_id] = _Daemon(due_ns=self._mono_ns())

    def leave(self, daemon_id: str) -> None:
        self._daemons.pop(daemon_id, None)

    def step(self, connected: Iterable[str] | None = None) -> ClockStep:
        """Probes due now (stamped as sent: send them at once), and rounds ended by timeouts.
        ``connected``: the daemons with a live session (others are forgotten)."""
        out = ClockStep()
        if connected is not None:
            live = connected if isinstance(connected, (set, frozenset, dict)) else set(connected)
            for gone in [d for d in self._daemons if d not in live]:
                del self._daemons[gone]
        now = self._mono_ns()
        for daemon_id, d in self._daemons.items():
            self._advance(daemon_id, d, now, out)
        return out

    def step_one(self, daemon_id: str) -> ClockStep:
        """:meth:`step` for one daemon (connected: the caller checked its session): its next probe
        at once after a reply, without visiting every other daemon (at 1,000 daemons a reply
        each, that visit was O(daemons) work per reply on the sweep's loop)."""
        out = ClockStep()
        d = self._daemons.get(daemon_id)
        if d is not None:
            self._advance(daemon_id, d, self._mono_ns(), out)
        return out

    def _advance(self, daemon_id: str, d: _Daemon, now: int, out: ClockStep) -> None:
        """One daemon's part of a step: give up a timed-out probe (finishing its round if that was
        the last), then send its next probe if one is due."""
        if d.in_flight is not None:
            if now - d.in_flight.sent_mono_ns < self.timeout_ns:
                return
            d.in_flight = None  # given up: counts as sent, not answered
            if self._round_over(d):
                self._finish(daemon_id, d, now, out)
                return
        if now < d.due_ns:
            return
        self._next_id += 1
        probe_id = f"clk{self._next_id}"
        sent_wall, sent_mono = self._wall_ns(), self._mono_ns()
        d.in_flight = _InFlight(probe_id, sent_wall, sent_mono)
        d.sent += 1
        out.probes.append((daemon_id, TimeProbe(probe_id=probe_id, sent_at_ns=max(0, sent_wall))))

    def reply(self, daemon_id: str, msg: TimeReply) -> ClockStep:
        """A TIME_REPLY from ``daemon_id`` (session and key already checked), read just now. Returns
        the estimate when this reply finished a round (the next probe goes at the next :meth:`step`)."""
        out = ClockStep()
        now_mono = self._mono_ns()
        d = self._daemons.get(daemon_id)
        if d is None or d.in_flight is None or d.in_flight.probe_id != msg.probe_id:
            return out  # late (given up), unknown or another daemon's probe: ignored
        f = d.in_flight
        d.in_flight = None
        d.samples.append(ProbeSample(sent_at_ns=f.sent_at_ns, received_at_ns=msg.received_at_ns,
                                     replied_at_ns=msg.replied_at_ns,
                                     returned_at_ns=f.sent_at_ns + (now_mono - f.sent_mono_ns)))
        if self._round_over(d):
            self._finish(daemon_id, d, now_mono, out)
        return out

    def _round_over(self, d: _Daemon) -> bool:
        return len(d.samples) >= self.probes or d.sent >= 2 * self.probes

    def _finish(self, daemon_id: str, d: _Daemon, now_mono: int, out: ClockStep) -> None:
        result = estimate(daemon_id, d.samples, d.sent)
        if result is None:
            out.silent.append(daemon_id)
        else:
            self.latest[daemon_id] = result
            out.estimates.append(result)
        d.samples, d.sent = [], 0
        d.due_ns = now_mono + self.every_ns

    def offsets(self) -> dict[str, dict[str, Any]]:
        """The latest estimate per daemon as plain data (what ``clock.json`` holds under ``daemons``)."""
        return {k: v.as_dict() for k, v in sorted(self.latest.items())}


def write_clock_file(folder: Path, offsets: dict[str, dict[str, Any]], every_s: float) -> Path:
    """Write ``folder/clock.json`` atomically (a temporary file renamed over it): the latest
    estimate per daemon, for ``runs/<name>/schedule.json`` and the dashboard."""
    path = folder / CLOCK_FILE
    tmp = folder / f".{CLOCK_FILE}.{os.getpid()}.tmp"
    doc = {"method": "cristian", "probe_every_s": every_s, "probes_per_estimate": PROBES_PER_ESTIMATE,
           "sign": "offset_s > 0: the daemon's wall clock is ahead of the coordinator's", "daemons": offsets}
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def read_clock_offsets(folder: Path) -> dict[str, dict[str, Any]]:
    """The per-daemon estimates in ``folder/clock.json`` ({} when there is none or it is unreadable)."""
    try:
        doc = json.loads((folder / CLOCK_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    daemons = doc.get("daemons") if isinstance(doc, dict) else None
    return daemons if isinstance(daemons, dict) else {}
