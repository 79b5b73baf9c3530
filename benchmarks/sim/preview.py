"""Speed of ``python -m coordinator sweep CONFIG --preview`` on the example configs (SIMULATED).

Two figures per config, medians of ``--repeats`` runs:

- ``command``: the whole command as a user runs it (a fresh interpreter: imports, the plan, the
  child ``python -m daemon.sim_preview`` and its imports, the simulation, the tables), wall seconds;
- ``simulate``: :func:`coordinator.preview.simulate` alone (the child process: its start, imports
  and the simulation), wall seconds;

each with the CPU seconds of the processes it ran (user + system, children included): on a shared,
loaded machine the CPU time is the per-core cost, the wall time what a user waited.

Usage: ``PYTHONPATH=. python benchmarks/sim/preview.py [--repeats 5]``. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIGS = ["quickstart.yaml", "random-design.yaml", "workloads.yaml", "fleet-example.yaml"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from coordinator.planning import plan_experiment
    from coordinator.preview import _job, resolve_targets, simulate
    from servetune.spec import load_spec

    print("| config | targets x configs x load points simulated | command wall s | command CPU s | simulate wall s "
          "| simulate CPU s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in CONFIGS:
        path = REPO / "configs" / name
        spec = load_spec(path)
        plan = plan_experiment(spec)
        targets = resolve_targets(spec)
        jobs = [_job(spec, plan, t) for t in targets]
        n_points = sum(len(j["points"]) for j in jobs)
        cmd_s, cmd_cpu, sim_s, cpu_s = [], [], [], []
        for _ in range(args.repeats):
            before = os.times()
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "coordinator", "sweep", str(path), "--preview"], check=True,
                           capture_output=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
            cmd_s.append(time.perf_counter() - t0)
            mid = os.times()
            cmd_cpu.append((mid.children_user - before.children_user) + (mid.children_system - before.children_system))
            before = os.times()
            t0 = time.perf_counter()
            simulate(jobs)
            sim_s.append(time.perf_counter() - t0)
            after = os.times()
            cpu_s.append((after.children_user - before.children_user) + (after.children_system - before.children_system))
        print(f"| {name} | {len(targets)} x {len({p['config_id'] for j in jobs for p in j['points']})} x "
              f"{len(spec.load_points)} = {n_points} | {statistics.median(cmd_s):.2f} | {statistics.median(cmd_cpu):.2f} | {statistics.median(sim_s):.2f} | "
              f"{statistics.median(cpu_s):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
