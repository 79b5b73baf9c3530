"""Running one :class:`~benchmarks.chaos.schedule.Schedule` against a real fleet on loopback.

:class:`Executor` starts the coordinator (``sweep --no-local-daemon``) and the daemons of the
schedule through :class:`tests.fleet_harness.Fleet`, each proxied daemon behind its own
:class:`tests.fakes.faultproxy.FaultProxy`, waits for the first grant, then applies the faults as
a timeline of start and end events (the end undoes the start: SIGCONT, pass-through, a
replacement daemon, the coordinator started again with the same command). A sweep that ends with
holes (exit 3 or 4) is started again, at most ``max_reruns`` times.

Every wait has a deadline. When the sweep is over, the ends still pending are applied at once
(nothing stays stopped or cut off) and starts still pending are recorded as never applied; then
the daemons get ``coordinator_lost_s`` + a margin to exit by themselves, and whatever is still
running is killed and reported (:meth:`Fleet.close`). Each fault records whether it took effect
(a SIGSTOP of a daemon that had exited, a blackhole that dropped no byte: recorded, counted, not
a violation).
"""

from __future__ import annotations

import functools
import heapq
import logging
import os
import signal
import subprocess
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from benchmarks.chaos.schedule import Fault, Schedule
from tests.fakes.faultproxy import FaultProxy
from tests.fleet_harness import Fleet

log = logging.getLogger(__name__)

POLL_S = 0.05
#: How long to wait for the first grant of a schedule.
FIRST_GRANT_S = 60.0
#: The daemons' ``--coordinator-lost``: short, so a daemon cut off when the sweep ended exits soon.
COORDINATOR_LOST_S = 10.0
#: After a sweep with holes, how long daemons get to exit on its SHUTDOWN before fresh ones start.
SHUTDOWN_WAIT_S = 3.0
#: Daemon exit codes that are no violation: stopped by SHUTDOWN, no word from the coordinator.
CLEAN_DAEMON_EXITS = {0: "shutdown", 6: "coordinator lost"}


@dataclass
class AppliedFault:
    """What became of one fault: applied (when, seconds after the first grant), took effect, why."""

    fault: Fault
    label: str
    applied_at_s: float | None = None
    took_effect: bool | None = None
    detail: str = ""
    ended: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.fault.kind, "label": self.label, "planned_at_s": self.fault.at_s,
                "applied_at_s": None if self.applied_at_s is None else round(self.applied_at_s, 2),
                "took_effect": bool(self.took_effect), "detail": self.detail}


@dataclass
class _Slot:
    """A daemon slot at run time: its current id, proxy and process."""

    base_id: str
    daemon_id: str
    proxy: FaultProxy | None
    proc: subprocess.Popen[bytes] | None = None
    stopped: bool = False
    awaiting_replacement: bool = False
    replacements: int = 0


@dataclass(order=True)
class _Event:
    at: float
    seq: int
    start: bool = field(compare=False)
    fault_no: int = field(compare=False)
    action: Callable[[], None] = field(compare=False)


@dataclass
class Execution:
    """What :meth:`Executor.run` saw; the checks after it are in :mod:`benchmarks.chaos.checks`."""

    faults: list[AppliedFault]
    sweep_exits: list[int | None] = field(default_factory=list)
    finished: bool = False
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    daemon_exits: dict[str, int | None] = field(default_factory=dict)
    left_behind: list[str] = field(default_factory=list)
    #: seconds from the start: the first grant, the end of the last sweep, all processes gone
    timeline: dict[str, float] = field(default_factory=dict)


class Executor:
    """Run ``schedule`` in ``fleet`` (whose timings are set from the schedule), within ``deadline_s``."""

    def __init__(self, schedule: Schedule, fleet: Fleet, *, deadline_s: float = 120.0, max_reruns: int = 3) -> None:
        self.schedule = schedule
        self.fleet = fleet
        self.deadline_s = deadline_s
        self.max_reruns = max_reruns
        self.slots: list[_Slot] = []
        self.events: list[_Event] = []
        self._seq = 0
        self.t0 = 0.0
        self.coordinator_down = False
        self.finished = False
        self.over = False
        self.reruns = 0
        self.killed_by_us: set[int] = set()
        self.out = Execution([AppliedFault(f, f.label(schedule.slots)) for f in schedule.faults])

    # ------------------------------------------------------------------ the run

    def run(self) -> Execution:
        self.started = time.monotonic()
        deadline = self.started + self.deadline_s
        try:
            self._run(deadline)
        except Exception:  # the runner's own failure is a reported failure of the schedule, never a hang
            self.out.problems.append("runner error: " + traceback.format_exc(limit=6).strip())
        finally:
            self._mark("sweep_over")
            self._flush_ends()
            for a in self.out.faults:
                if a.applied_at_s is None and not a.detail:
                    a.took_effect, a.detail = False, "never applied: no trial was granted"
            self._wait_daemons(min(deadline + 15, time.monotonic() + COORDINATOR_LOST_S + 5))
            self._close()
            self._mark("processes_gone")
        return self.out

    def _mark(self, what: str) -> None:
        self.out.timeline[what] = round(time.monotonic() - self.started, 2)

    def _run(self, deadline: float) -> None:
        fleet = self.fleet
        fleet.start_coordinator()
        for i, s in enumerate(self.schedule.slots):
            proxy = FaultProxy("127.0.0.1", fleet.port) if s.proxied else None
            self.slots.append(_Slot(s.daemon_id, s.daemon_id, proxy))
            self._start_daemon(i)
        self._wait_first_grant(min(deadline, time.monotonic() + FIRST_GRANT_S))
        if self.finished or self.out.problems:
            return
        self.t0 = time.monotonic()
        self._mark("first_grant")
        for n, fault in enumerate(self.schedule.faults):
            self._push(self.t0 + fault.at_s, True, n, functools.partial(self._begin, n))
        while True:
            now = time.monotonic()
            if now >= deadline:
                self.out.problems.append(f"the experiment did not finish within {self.deadline_s:g} s "
                                         f"(sweeps: {self.out.sweep_exits + ['running']})")
                return
            while self.events and self.events[0].at <= now:
                heapq.heappop(self.events).action()
            if self._sweep_ended():
                return
            self._keep_a_daemon()
            time.sleep(POLL_S)

    def _wait_first_grant(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self.fleet.query("SELECT 1 FROM attempts WHERE status='running' LIMIT 1"):
                return
            if self._sweep_ended():
                return
            time.sleep(POLL_S)
        self.out.problems.append("no trial was granted within the first-grant deadline")

    def _sweep_ended(self) -> bool:
        """Handle a coordinator that exited by itself: True when the experiment is over (finished,
        or a failure recorded)."""
        if self.coordinator_down:
            return False
        code = self.fleet.poll_coordinator()
        if code is None:
            return False
        self.out.sweep_exits.append(code)
        if code == 0:
            self.finished = self.out.finished = True
            return True
        if code in (3, 4):
            if self.reruns >= self.max_reruns:
                self.out.problems.append(f"holes left after {len(self.out.sweep_exits)} sweeps (exits "
                                         f"{self.out.sweep_exits}): {self._holes_line()}")
                return True
            self.reruns += 1
            self._rerun()
            return False
        self.out.problems.append(f"the coordinator exited with {code}:\n{self.fleet.coordinator_log()[-3000:]}")
        return True

    def _holes_line(self) -> str:
        lines = [ln.strip() for ln in self.fleet.coordinator_log().splitlines() if ln.startswith("  ")]
        return "; ".join(lines[:5])

    def _rerun(self) -> None:
        """The same sweep command again; daemons that exited on its SHUTDOWN are started again."""
        wait_until = time.monotonic() + SHUTDOWN_WAIT_S
        for s in self.slots:
            if s.proc is not None and not s.stopped:
                try:
                    s.proc.wait(timeout=max(0.0, wait_until - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass  # still running: it will rejoin the new coordinator by itself
        self.fleet.start_coordinator()
        for i, s in enumerate(self.slots):
            if not s.awaiting_replacement and (s.proc is None or s.proc.poll() is not None):
                self._start_daemon(i)
        self.out.notes.append(f"sweep run again after exit {self.out.sweep_exits[-1]}")

    def _keep_a_daemon(self) -> None:
        """Once every fault has ended, some daemon must be alive for the sweep to finish."""
        if self.events or self.coordinator_down:
            return
        if any(s.proc is not None and s.proc.poll() is None for s in self.slots):
            return
        if any(s.awaiting_replacement for s in self.slots):
            return
        if any(s.proc is not None and s.proc.returncode == 0 for s in self.slots):
            return  # told SHUTDOWN: the coordinator is finishing, or will exit with holes and be run again
        self._start_daemon(0)
        self.out.notes.append(f"no daemon alive after the faults: started {self.slots[0].daemon_id} again")

    # ------------------------------------------------------------------ processes

    def _start_daemon(self, i: int) -> None:
        s = self.slots[i]
        address = s.proxy.address if s.proxy is not None else None
        s.proc = self.fleet.start_daemon(s.daemon_id, address, "--coordinator-lost", f"{COORDINATOR_LOST_S:g}")
        s.stopped = False
        s.awaiting_replacement = False

    def _push(self, at: float, start: bool, fault_no: int, action: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self.events, _Event(at, self._seq, start, fault_no, action))

    def _held(self, daemon_id: str) -> int:
        return len(self.fleet.running_on(daemon_id))

    # ------------------------------------------------------------------ faults

    def _begin(self, n: int) -> None:
        a = self.out.faults[n]
        a.applied_at_s = time.monotonic() - self.t0
        f = a.fault
        if f.kind == "kill_coordinator":
            self._kill_coordinator(n, a)
            return
        assert f.slot is not None
        s = self.slots[f.slot]
        if f.kind == "kill_daemon":
            self._kill_daemon(n, a, s)
        elif f.kind == "stop_daemon":
            self._stop_daemon(n, a, s)
        else:
            self._proxy_fault(n, a, s)

    def _end_at(self, n: int, action: Callable[[], None]) -> None:
        """Push the end of fault ``n``: its duration after it was applied."""
        a = self.out.faults[n]
        assert a.applied_at_s is not None
        self._push(self.t0 + a.applied_at_s + a.fault.duration_s, False, n, action)

    def _kill_coordinator(self, n: int, a: AppliedFault) -> None:
        proc = self.fleet.coordinator
        if proc is None or self.coordinator_down or proc.poll() is not None:
            a.took_effect, a.detail = False, "the coordinator had already exited"
            return
        running = len(self.fleet.query("SELECT 1 FROM attempts WHERE status='running'"))
        proc.kill()
        proc.wait(timeout=10)
        self.fleet.poll_coordinator()
        self.killed_by_us.add(proc.pid)
        self.coordinator_down = True
        a.took_effect, a.detail = True, f"killed with {running} attempt(s) running"
        self.out.sweep_exits.append(-signal.SIGKILL)

        def restart() -> None:
            if self.over:
                a.detail += "; not restarted: the run was over"
                return
            self.fleet.start_coordinator()
            self.coordinator_down = False
            a.ended = True

        self._end_at(n, restart)

    def _kill_daemon(self, n: int, a: AppliedFault, s: _Slot) -> None:
        proc = s.proc
        if proc is None or proc.poll() is not None:
            a.took_effect = False
            a.detail = "the daemon had already exited" + ("" if proc is None else f" (exit {proc.returncode})")
        else:
            held = self._held(s.daemon_id)
            proc.kill()
            proc.wait(timeout=10)
            self.killed_by_us.add(proc.pid)
            a.took_effect, a.detail = True, f"killed holding {held} running attempt(s)"
        s.awaiting_replacement = True

        def replace() -> None:
            if self.over:
                s.awaiting_replacement = False
                a.detail += "; no replacement: the run was over"
                return
            if a.fault.new_id:
                s.replacements += 1
                s.daemon_id = f"{s.base_id}-r{s.replacements}"
            self._start_daemon(self.slots.index(s))
            a.detail += f"; replaced by {s.daemon_id}"
            a.ended = True

        self._end_at(n, replace)

    def _stop_daemon(self, n: int, a: AppliedFault, s: _Slot) -> None:
        proc = s.proc
        if proc is None or proc.poll() is not None:
            a.took_effect = False
            a.detail = "the daemon had already exited" + ("" if proc is None else f" (exit {proc.returncode})")
            return
        held = self._held(s.daemon_id)
        os.kill(proc.pid, signal.SIGSTOP)
        s.stopped = True
        a.took_effect, a.detail = True, f"stopped holding {held} running attempt(s)"

        def cont() -> None:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
            s.stopped = False
            a.ended = True

        self._end_at(n, cont)

    def _proxy_fault(self, n: int, a: AppliedFault, s: _Slot) -> None:
        proxy = s.proxy
        assert proxy is not None, "a proxy fault on a daemon without a proxy"
        f = a.fault
        before = proxy.stats()
        held = self._held(s.daemon_id)
        reset = 0
        if f.kind == "blackhole":
            proxy.blackhole()
        elif f.kind == "delay":
            proxy.delay(f.delay_s)
        else:
            proxy.refuse(True)
            reset = proxy.reset()
        a.detail = f"{held} running attempt(s) on {s.daemon_id}" + (" (the coordinator was down)"
                                                                   if self.coordinator_down else "")

        def end() -> None:
            if f.kind == "reset":
                proxy.refuse(False)
            else:
                proxy.pass_through()
            after = proxy.stats()
            if f.kind == "blackhole":
                moved = after["bytes_dropped"] - before["bytes_dropped"]
                a.detail += f"; {moved} bytes dropped"
            elif f.kind == "delay":
                moved = after["chunks_delayed"] - before["chunks_delayed"]
                a.detail += f"; {moved} chunks delayed"
            else:
                refused = after["connections_refused"] - before["connections_refused"]
                moved = reset + refused
                a.detail += f"; {reset} connection(s) reset, {refused} refused"
            a.took_effect = moved > 0
            a.ended = True

        self._end_at(n, end)

    # ------------------------------------------------------------------ the end

    def _flush_ends(self) -> None:
        """Apply every pending end now (in time order) and record starts never applied; no
        replacement daemon or coordinator is started any more."""
        self.over = True
        while self.events:
            ev = heapq.heappop(self.events)
            a = self.out.faults[ev.fault_no]
            if ev.start:
                a.took_effect, a.detail = False, "never applied: the sweep was over"
                continue
            try:
                ev.action()
            except Exception as exc:  # keep undoing the others
                self.out.problems.append(f"undoing {a.label} failed: {exc!r}")

    def _wait_daemons(self, deadline: float) -> None:
        for s in self.slots:
            if s.proc is not None and s.proc.poll() is None and s.stopped:
                os.kill(s.proc.pid, signal.SIGCONT)
                s.stopped = False
        for proc in self.fleet.procs:
            left = deadline - time.monotonic()
            if proc.poll() is None and left > 0:
                try:
                    proc.wait(timeout=left)
                except subprocess.TimeoutExpired:
                    pass

    def _close(self) -> None:
        fleet = self.fleet
        alive = {p.pid for p in fleet.procs if p.poll() is None}
        self.out.left_behind += fleet.close()  # SIGCONT, SIGTERM, then SIGKILL whatever is still running
        for proc in fleet.procs:
            log_path = getattr(proc, "log_path", None)
            if log_path is None or proc.pid in alive or proc.pid in self.killed_by_us:
                continue  # not a daemon, left behind (reported as such), or killed by a fault
            args = [str(a) for a in proc.args]  # type: ignore[union-attr]
            name = f"{args[args.index('--daemon-id') + 1]} (pid {proc.pid})"
            self.out.daemon_exits[name] = proc.returncode
            if proc.returncode not in CLEAN_DAEMON_EXITS:
                self.out.problems.append(f"daemon {name} exited with {proc.returncode}:\n{_tail(log_path)}")
            elif proc.returncode == 6:
                self.out.notes.append(f"daemon {name} exited 6 (coordinator lost)")
        for s in self.slots:
            if s.proxy is not None:
                try:
                    s.proxy.close()
                except Exception as exc:
                    self.out.problems.append(f"the fault proxy of {s.base_id} did not close: {exc!r}")


def _tail(path: str, n: int = 2000) -> str:
    try:
        with open(path, errors="replace") as fh:
            return fh.read()[-n:]
    except OSError as exc:
        return f"(log unreadable: {exc})"
