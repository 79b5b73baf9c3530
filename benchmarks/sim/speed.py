"""Simulated trials per second on one core: ``python benchmarks/sim/speed.py [--trials N]``.

A 500-request load point (closed loop at concurrency 64, 128 in / 64 out tokens, the tiny model on
the CPU profile and Llama-3-8B on H100) played against the simulator, median of the per-trial
CPU times of this process (``time.process_time``: the shared machine's other jobs do not count;
the figure is per core): ``core`` is the scheduler alone (servetune.sim.engine), ``record`` adds turning the run into
the RequestSample records a daemon sends (daemon.sim_backend) and ``metrics`` the coordinator's
summarize over them.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

from daemon.sim_backend import _arrivals, _requests, sim_server, simulate_trial
from servetune.manifest import EngineConfig
from servetune.metrics import summarize
from servetune.sim.engine import NoiseModel, SimLoad
from servetune.spec import BackendSpec, EngineArgs, LoadPoint


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=50)
    n = ap.parse_args().trials
    lp = LoadPoint(name="c64", max_concurrency=64, num_requests=500, input_len=128, output_len=64)
    for backend in (BackendSpec(kind="sim"), BackendSpec(kind="sim", profile="H100-80G", model_shape="llama-3-8b")):
        server = sim_server(backend, EngineConfig(args=EngineArgs(max_num_seqs=64)))
        reqs = list(itertools.islice(_requests(lp, server.shape.vocab_size, None, False), 500))
        core, record, metrics = [], [], []
        for seed in range(n):
            t0 = time.process_time()
            server.run(SimLoad(requests=iter(reqs), arrivals=_arrivals(lp), max_concurrency=64), NoiseModel(seed))
            t1 = time.process_time()
            trial = simulate_trial(server, backend, lp, seed=seed, deadline_s=1e9, vocab_size=server.shape.vocab_size)
            t2 = time.process_time()
            summarize(trial.samples, trial.window_s)
            t3 = time.process_time()
            core.append(t1 - t0)
            record.append(t2 - t1)
            metrics.append(t3 - t2)
        print(f"{backend.sim_target()}: core {1 / statistics.median(core):.0f} trials/s, "
              f"with records {1 / statistics.median(record):.0f} trials/s, "
              f"with records and metrics {1 / (statistics.median(record) + statistics.median(metrics)):.0f} trials/s")


if __name__ == "__main__":
    main()
