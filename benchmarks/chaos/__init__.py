"""Seeded chaos schedules against a real fleet on loopback (``python -m benchmarks.chaos``).

Each schedule is drawn from ``random.Random(seed + i)`` (:mod:`.schedule`, pure): an experiment
with the ``openai`` backend against one FAKE streaming endpoint (tests/fakes), 2-3 daemons (some
dialling through their own fault proxy), short lease timings, and 2-5 faults from the fault suite
(SIGKILL a daemon then start a replacement, SIGSTOP/SIGCONT a daemon, blackhole / delay / reset a
proxy for a while, SIGKILL the coordinator then start it again with the same command) applied at
random moments while trials run (:mod:`.execute`). A sweep that ends with holes is run again, a
bounded number of times. After each schedule the store's invariants are checked
(:mod:`.checks`, built on ``tests/fleet_harness.check_invariants``) and no process may be left.

Layout: :mod:`.schedule` (what to do), :mod:`.execute` (doing it, every wait with a deadline),
:mod:`.checks` (what must hold after), :mod:`.report` (progress lines, summary, JSON),
:mod:`.run` (the loop over schedules), :mod:`.__main__` (the command line).
"""
