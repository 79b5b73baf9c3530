"""Side-by-side benchmark of servetune's load generator, ``vllm bench serve`` and GuideLLM.

Run it from the repository root with ``.venv/bin/python -m benchmarks.loadgen`` (``--help`` lists
the options). It starts Debian's nginx on loopback as a target that cannot be the bottleneck (a
canned SSE completion stream), pins the target to core 0 and each client to core 1, drives every
client at increasing constant offered rates, measures each client's CPU over its own measurement
window, checks our client's TTFT against a target that logs its own receive and first-byte times
on the same monotonic clock, and writes the figures into ``benchmarks/RESULTS.md``.

Modules: :mod:`.sse` (the canned stream), :mod:`.nginx` (the target), :mod:`.timing_target`
(the self-timing target), :mod:`.procs` (pinned children, cleanup), :mod:`.cpu` (process-tree CPU
sampler), :mod:`.points` (per-point records and the achieved-rate rule), :mod:`.clients` (the three
clients), :mod:`.drive_ours` and :mod:`.drive_vllm` (driver scripts run as pinned children),
:mod:`.report` (RESULTS.md), :mod:`.run` (the command).
"""
