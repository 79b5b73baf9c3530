"""How fast, and in how much memory, `validate` refuses hostile or oversized specs and plans a
sampled design over a space too large to list.

Each case runs `python -m coordinator validate FILE` in a fresh process, REPEATS times (medians of
wall time and of the child's peak RSS, ru_maxrss; interpreter start and imports included), and
`load_spec` + `plan_experiment` in this warm interpreter (median, the cost of the spec itself). Usage:

    python benchmarks/spec/refusals.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.test_planner_designs import BIG  # noqa: E402  (the 700,000-config space the tests use)
from tests.test_spec_strict import ALIAS_BOMB  # noqa: E402

BASE = "name: b\nload_points: [{name: a, request_rate: 1, num_requests: 1}]\n"

def cases() -> dict[str, str]:
    grid_million = BIG.replace("block_size: [1, 8, 16, 32, 64, 128, 256, 8, 16, 32]",
                               "block_size: [1, 8, 16, 32, 64, 128, 256]").replace(
        "VLLM_X: [a, b, c, d, e]", "VLLM_X: [a, b, c, d, e, f, g, h, i, j]")  # 10^4 x 7 x 2 x 10
    return {
        "alias bomb (9^9 values)": ALIAS_BOMB,
        "50,000-deep flow list": BASE + "description: " + "[" * 50_000 + "]" * 50_000 + "\n",
        "grid of 1,400,000 configs (refused)": grid_million,
        "random design, 30 of 1,400,000": grid_million + "planner: {kind: random, n_configs: 30}\n",
        "quasi-random design, 30 of 1,400,000": grid_million + "planner: {kind: quasi-random, n_configs: 30}\n",
        "valid quickstart (reference)": (REPO / "configs" / "quickstart.yaml").read_text(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        from coordinator.planning import plan_experiment
        from servetune.errors import SpecError
        from servetune.spec import load_spec

        print("| case | exit | `validate` wall s | `validate` peak RSS MiB | in-process load + plan s |")
        print("| --- | --- | --- | --- | --- |")
        for name, text in cases().items():
            path = Path(tmp) / "spec.yaml"
            path.write_text(text)
            walls, rss, codes = [], [], set()
            for _ in range(args.repeats):
                code = (
                    "import resource, subprocess, sys, time; t=time.perf_counter(); "
                    "p=subprocess.run([sys.executable, '-m', 'coordinator', 'validate', sys.argv[1]], "
                    "capture_output=True, timeout=600); "
                    "print(p.returncode, time.perf_counter()-t, "
                    "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
                )
                out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                                     timeout=700, cwd=REPO).stdout.split()
                codes.add(int(out[0]))
                walls.append(float(out[1]))
                rss.append(int(out[2]) / 1024)
            warm = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                try:
                    plan_experiment(load_spec(path))
                except SpecError:
                    pass
                warm.append(time.perf_counter() - t0)
            print(f"| {name} | {','.join(map(str, sorted(codes)))} | {statistics.median(walls):.2f} | "
                  f"{statistics.median(rss):.0f} | {statistics.median(warm):.3f} |", flush=True)


if __name__ == "__main__":
    main()
