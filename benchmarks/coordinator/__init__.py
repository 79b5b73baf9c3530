"""Fleet-scale benchmark of the real coordinator: ``python -m benchmarks.coordinator``.

The coordinator is the real CLI (``python -m coordinator sweep SPEC --no-local-daemon --bind ...``)
in its own process, pinned to one core, with its real store (SQLite + one fsynced JSON file per
result before the ACK, ``results.nc`` rewritten every 2 s). The daemons are FAKE: light ZeroMQ
DEALERs with an instant backend (:mod:`.clients`), many per process driven by one poller loop,
pinned to another core, speaking protocol 2 exactly as :mod:`servetune.messages` states it.

Modules: :mod:`.workload` (the spec and its size), :mod:`.clients` (the FAKE daemons, a child
process), :mod:`.coord` (starting the coordinator, reading its log), :mod:`.run` (one run per fleet
size and the command), :mod:`.profile` (py-spy top functions), :mod:`.report` (tables, JSON,
the section of ``benchmarks/RESULTS.md``).
"""
