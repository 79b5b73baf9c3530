"""Micro-benchmark of the clock probes' cost on the coordinator's loop at join time, in one process.

Every daemon joins at once and answers each TIME_PROBE at once (as the FAKE daemons of
:mod:`benchmarks.coordinator.clients` do), until each has its estimate (5 replies). After each
reply the sweep asks :class:`coordinator.clock.ClockSchedule` for that daemon's next probe: this
compares asking with ``step(connected)`` (every daemon visited per reply: what the sweep did up
to round 5) and with ``step_one(daemon_id)`` (what it does now). CPU time (``time.process_time``)
of the whole join burst and per reply. Run: ``python -m benchmarks.coordinator.clockstep``.
"""

from __future__ import annotations

import argparse
import time

from coordinator.clock import ClockSchedule
from servetune.messages import TimeProbe, TimeReply


def burst(n: int, every_daemon: bool) -> tuple[float, int]:
    """CPU seconds and replies of one join burst of ``n`` daemons."""
    sched = ClockSchedule(300.0)
    daemons = {f"d{i:05d}": None for i in range(n)}
    for d in daemons:
        sched.join(d)
    in_flight: dict[str, TimeProbe] = dict(sched.step(daemons).probes)
    t0 = time.process_time()
    replies = 0
    while in_flight:
        daemon_id, probe = in_flight.popitem()
        sched.reply(daemon_id, TimeReply(session_nonce="s", probe_id=probe.probe_id,
                                         received_at_ns=probe.sent_at_ns + 1000, replied_at_ns=probe.sent_at_ns + 2000))
        replies += 1
        step = sched.step(daemons) if every_daemon else sched.step_one(daemon_id)
        in_flight.update(dict(step.probes))
    return time.process_time() - t0, replies


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.coordinator.clockstep", description=__doc__)
    ap.add_argument("--sizes", default="10,100,1000")
    args = ap.parse_args(argv)
    print("| daemons | replies | step(every daemon) per reply: CPU-ms (us/reply) | step_one: CPU-ms (us/reply) |")
    print("| ---: | ---: | --- | --- |")
    for n in (int(s) for s in args.sizes.split(",")):
        (old, replies), (new, _) = burst(n, True), burst(n, False)
        print(f"| {n} | {replies} | {old * 1000:.0f} ({old / replies * 1e6:.0f}) | {new * 1000:.0f} ({new / replies * 1e6:.0f}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
