"""The three clients, each run as pinned children against the same target, their CPU sampled.

- servetune: :mod:`.drive_ours` (``daemon.loadgen.run_load_point``), one process for the ladder;
- ``vllm bench serve``: :mod:`.drive_vllm` (``vllm.benchmarks.serve``), one process for the ladder;
- GuideLLM: ``guidellm run`` from its own virtual environment, one process per rate (its report
  is per run), the same scenario each time but the rate and the request count.

Every ladder runs the same offered rates with the same request counts (``seconds`` of the
rate, at least ``min_requests``) and stops after two consecutive unsustained rates. Each client
process tree's CPU is sampled (:class:`~.cpu.TreeCPU`) and cut to each point's measurement window.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import median
from benchmarks.loadgen.cpu import TreeCPU
from benchmarks.loadgen.points import Point, ladder_done, requests_for
from benchmarks.loadgen.procs import BenchmarkError, Child, Children, tail
from benchmarks.loadgen.sse import MODEL, OUTPUT_TOKENS, PROMPT_TOKENS

log = logging.getLogger(__name__)

GUIDELLM = "GuideLLM"


@dataclass
class Setup:
    """What every client run shares."""

    repo: Path
    python: str
    base_url: str
    tiny_dir: Path
    out_dir: Path
    rates: list[float]
    seconds: float
    min_requests: int
    warmup: int
    repeats: int
    client_cpus: str
    guidellm_venv: Path
    say: Callable[[str], None] = print

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
        env.update(extra)
        return env


@dataclass
class ToolRun:
    """One client's ladder: its points (CPU attached), whole-process CPU and wall time, logs."""

    client: str
    points: list[Point] = field(default_factory=list)
    process_cpu_s: float = 0.0
    wall_s: float = 0.0
    logs: list[str] = field(default_factory=list)
    loadavg: tuple[float, float] = (0.0, 0.0)


def run_child(setup: Setup, children: Children, child: Child, timeout_s: float, label: str) -> TreeCPU:
    """Start ``child``, sample its tree's CPU, echo its progress lines; raise if it failed."""
    children.start(child)
    sampler = TreeCPU(child.pid).start()
    last_note = time.monotonic()

    def tick(elapsed: float) -> None:
        nonlocal last_note
        lines = child.progress_lines()
        for line in lines:
            setup.say(f"  {line}")
        if lines:
            last_note = time.monotonic()
        elif time.monotonic() - last_note > 15:
            setup.say(f"  {label}: running, {elapsed:.0f} s")
            last_note = time.monotonic()

    try:
        code = child.wait(timeout_s, on_tick=tick)
        tick(0.0)
    finally:
        sampler.stop()
    if code != 0:
        raise BenchmarkError(f"{label} exited with {code} (log: {child.log_path})", tail(child.log_path))
    return sampler


def _attach_cpu(points: list[Point], sampler: TreeCPU) -> None:
    for p in points:
        p.cpu_s = sampler.between(p.first_send_s, p.last_end_s, p.clock)


def _driver_points(path: Path) -> list[Point]:
    if not path.exists():
        return []
    return [Point.from_json(obj) for obj in json.loads(path.read_text())["points"]]


def _ladder_args(setup: Setup) -> list[str]:
    return [
        "--base-url", setup.base_url,
        "--rates", ",".join(f"{r:g}" for r in setup.rates),
        "--seconds", f"{setup.seconds:g}",
        "--min-requests", str(setup.min_requests),
        "--warmup", str(setup.warmup),
        "--repeats", str(setup.repeats),
        "--stop-early",
    ]  # fmt: skip


def _ladder_timeout(setup: Setup, startup_s: float) -> float:
    """A bound on a whole ladder: start-up, then up to 4x each point's offered duration plus 30 s."""
    per_point = [4 * requests_for(r, setup.seconds, setup.min_requests) / r + 30 for r in setup.rates]
    return startup_s + setup.repeats * sum(per_point)


def _run_driver(setup: Setup, children: Children, tool: str, module: str, extra: list[str],
                env: dict[str, str], startup_s: float) -> ToolRun:
    """Run a ladder driver (``python -m MODULE``) pinned to the client CPUs; its points, CPU and log."""
    run = ToolRun(tool, loadavg=(os.getloadavg()[0], 0.0))
    stem = "ours" if tool == "servetune" else "vllm"
    out, logf = setup.out_dir / f"{stem}.json", setup.out_dir / f"{stem}.log"
    argv = [setup.python, "-m", module, *_ladder_args(setup), *extra, "--out", str(out)]
    child = Child(f"{tool} driver", argv, logf, cpus=setup.client_cpus, cwd=setup.repo, env=env)
    start = time.monotonic()
    sampler = run_child(setup, children, child, _ladder_timeout(setup, startup_s), tool)
    run.wall_s = time.monotonic() - start
    run.points = _driver_points(out)
    _attach_cpu(run.points, sampler)
    run.process_cpu_s = child.cpu_s or 0.0
    run.logs = [str(logf)]
    run.loadavg = (run.loadavg[0], os.getloadavg()[0])
    return run


def run_ours(setup: Setup, children: Children) -> ToolRun:
    return _run_driver(setup, children, "servetune", "benchmarks.loadgen.drive_ours", [], setup.env(), 60)


def run_vllm(setup: Setup, children: Children) -> ToolRun:
    extra = ["--tokenizer", str(setup.tiny_dir), "--result-dir", str(setup.out_dir)]
    return _run_driver(setup, children, "vllm bench serve", "benchmarks.loadgen.drive_vllm", extra,
                       setup.env(VLLM_TARGET_DEVICE="cpu"), 180)


# --------------------------------------------------------------------------- GuideLLM


def guidellm_scenario(setup: Setup, rate: float, n: int, report: Path) -> dict[str, Any]:
    """One constant-rate GuideLLM benchmark of ``n`` requests (bounded in time) on the completions API."""
    return {
        "spec": {
            "backend": {
                "kind": "openai_http",
                "target": setup.base_url,
                "model": MODEL,
                "request_format": "/v1/completions",
            },
            "profile": {"kind": "constant", "rate": [rate]},
            "tokenizer": {"kind": "huggingface_auto", "model": str(setup.tiny_dir)},
            "data": [{"kind": "synthetic_text", "prompt_tokens": PROMPT_TOKENS, "output_tokens": OUTPUT_TOKENS}],
            "constraints": [
                {"kind": "max_requests", "count": n},
                {"kind": "max_duration", "seconds": round(2 * n / rate + 5, 1)},
            ],
            "outputs": [{"kind": "json", "path": str(report)}],
        }
    }


def guidellm_point(rate: float, report: dict[str, Any]) -> Point:
    """A point from GuideLLM's JSON report (per-request timings are ``time.time()`` seconds)."""
    bench = report["benchmarks"][0]
    reqs = bench["requests"]
    ok = reqs["successful"]
    others = reqs["errored"] + reqs["incomplete"]

    def timing(r: dict[str, Any], key: str) -> float | None:
        value = r["info"]["timings"].get(key)
        return float(value) if value is not None else None

    starts = [t for r in ok + others if (t := timing(r, "request_start")) is not None]
    ends = [t for r in ok if (t := timing(r, "request_end")) is not None]
    ttft = bench["metrics"]["time_to_first_token_ms"]["successful"]
    errors = sorted({str(r["info"].get("error"))[:200] for r in reqs["errored"]})
    return Point(
        client=GUIDELLM,
        offered=rate,
        n_sent=len(starts),
        n_ok=len(ok),
        first_send_s=min(starts) if starts else 0.0,
        last_end_s=max(ends) if ends else (min(starts) if starts else 0.0),
        clock="wall",
        ttft_ms={"p50": ttft["median"], "mean": ttft["mean"], "p99": ttft["percentiles"]["p99"]},
        extra={
            "requests_per_second_mean": bench["metrics"]["requests_per_second"]["successful"]["mean"],
            "incomplete": len(reqs["incomplete"]),
            "errors": errors[:5],
            "warnings": [w.get("code") for w in bench.get("warnings", [])],
        },
    )


def run_guidellm(setup: Setup, children: Children) -> ToolRun:
    run = ToolRun(GUIDELLM, loadavg=(os.getloadavg()[0], 0.0))
    guidellm = setup.guidellm_venv / "bin" / "guidellm"
    if not guidellm.exists():
        raise BenchmarkError(f"GuideLLM is not installed in {setup.guidellm_venv}")
    gdir = setup.out_dir / "guidellm"
    gdir.mkdir(parents=True, exist_ok=True)
    ratios: list[float] = []
    start = time.monotonic()
    for rate in setup.rates:
        runs: list[Point] = []
        for rep in range(setup.repeats):
            n = requests_for(rate, setup.seconds, setup.min_requests)
            tag = f"r{rate:g}_{rep}"
            report = gdir / f"{tag}.json"
            scenario = gdir / f"{tag}.scenario.json"
            scenario.write_text(json.dumps(guidellm_scenario(setup, rate, n, report), indent=1))
            logf = gdir / f"{tag}.log"
            argv = [str(guidellm), "run", "--scenario", str(scenario), "--disable-console-interactive"]
            child = Child(f"guidellm {tag}", argv, logf, cpus=setup.client_cpus, cwd=gdir, env=setup.env())
            sampler = run_child(setup, children, child, 180 + 4 * n / rate, f"GuideLLM {rate:g} req/s")
            p = guidellm_point(rate, json.loads(report.read_text()))
            p.extra["repeat"] = rep
            _attach_cpu([p], sampler)
            run.process_cpu_s += child.cpu_s or 0.0
            run.points.append(p)
            runs.append(p)
            run.logs.append(str(logf))
            setup.say(
                f"  {GUIDELLM} {rate:g} req/s (run {rep + 1}/{setup.repeats}): achieved {p.achieved:.1f} "
                f"({p.ratio:.4f}), {p.n_errors} errors, TTFT p50 {p.ttft_ms['p50']:.3f} ms"
            )
        ratios.append(median([p.ratio for p in runs]))
        if ladder_done(ratios):
            setup.say(f"  {GUIDELLM}: stopping the ladder after {rate:g} req/s (two rates unsustained)")
            break
    run.wall_s = time.monotonic() - start
    run.loadavg = (run.loadavg[0], os.getloadavg()[0])
    return run


def guidellm_version(venv: Path) -> str:
    py = venv / "bin" / "python"
    code = "import importlib.metadata as m; print(m.version('guidellm'))"
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=60)
    return out.stdout.strip() or "unknown"


def ensure_guidellm(venv: Path, say: Callable[[str], None], timeout_s: float = 1800) -> None:
    """Create GuideLLM's own virtual environment if missing: ``torch==2.13.0`` first, then GuideLLM.

    torch first, so that pip takes the CPU build (the local wheel here; PyTorch's CPU index on a
    user's machine) instead of pulling a multi-GB CUDA build as a dependency of GuideLLM.
    """
    if (venv / "bin" / "guidellm").exists():
        return
    say(f"GuideLLM not found: creating {venv} (torch==2.13.0, then guidellm==0.8.1; a few minutes)")
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(venv / "bin" / "pip"), "install", "-q", "torch==2.13.0"],
        [str(venv / "bin" / "pip"), "install", "-q", "guidellm==0.8.1"],
    ]
    deadline = time.monotonic() + timeout_s
    for step in steps:
        say(f"  $ {' '.join(step)}")
        left = deadline - time.monotonic()
        try:
            res = subprocess.run(step, capture_output=True, text=True, timeout=max(left, 1))
        except subprocess.TimeoutExpired as err:
            raise BenchmarkError(f"installing GuideLLM took over {timeout_s:.0f} s") from err
        if res.returncode != 0:
            raise BenchmarkError(f"{' '.join(step)} failed ({res.returncode})", (res.stdout + res.stderr)[-3000:])
