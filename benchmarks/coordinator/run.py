"""The command: ``python -m benchmarks.coordinator`` runs the real coordinator against FAKE fleets.

For each fleet size (``--sizes``, default 10, 100, 1000) and each repeat (``--repeats``): write the
spec (:mod:`.workload`), start the coordinator CLI pinned to ``--coord-cpu`` with a fresh results
root in a temporary folder, wait until it has bound its port, start ``--client-procs`` processes
of FAKE daemons (:mod:`.clients`) pinned to ``--client-cpu``, one of them running the dead-daemon
probe, sample both sides' CPU and the coordinator's memory from ``/proc``, and wait (every wait
has a deadline) until the coordinator has finished the sweep and exited. The store is then
checked: every ACKed result has its ``ok`` attempt in SQLite and its JSON file.

``--profile`` adds one more run at the largest size with py-spy attached to the coordinator.
``--quick``: 10 daemons, a small workload and short fleet timings, a few seconds (a smoke run).
Output: a table on stdout, ``--json PATH``, and with ``--results PATH`` the benchmark's section of
``benchmarks/RESULTS.md``. Raw output (logs, every run's records) goes to ``--out-dir``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.common import REPO
from benchmarks.coordinator import figures, report, workload
from benchmarks.coordinator.coord import (
    FleetTimings,
    LogTail,
    MachineCPU,
    ProcSampler,
    bound_address,
    coordinator_child,
    free_port,
    parse_log,
    summarize_log,
)
from benchmarks.coordinator.profile import SAMPLE_HZ, summarize_raw
from benchmarks.loadgen.cpu import TreeCPU
from benchmarks.loadgen.procs import BenchmarkError, Child, Children, install_sigterm_as_interrupt, tail
from benchmarks.loadgen.spy import ensure_pyspy
from servetune.keys import HOME_ENV
from tests.fakes.keys import fleet_home

log = logging.getLogger(__name__)

BIND_TIMEOUT_S = 120.0
#: After the fleet is done, the coordinator writes results.nc and its ranking, then exits.
COORD_EXIT_TIMEOUT_S = 180.0


def say(msg: str) -> None:
    print(msg, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.coordinator", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10,100,1000", help="fleet sizes, FAKE daemons (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=1, help="runs per size; figures are medians (default: %(default)s)")
    ap.add_argument("--trials", type=int, default=4000,
                    help="trials per run, at least 3 batches per daemon (default: %(default)s)")
    ap.add_argument("--load-points", type=int, default=4, help="trials per batch (default: %(default)s)")
    ap.add_argument("--shape", choices=workload.SHAPES, default="grid",
                    help="grid: backend vllm, many batches; openai: backend openai, at most 100 batches")
    ap.add_argument("--heartbeat", type=float, default=1.0, help="--heartbeat-interval (default: %(default)s)")
    ap.add_argument("--ttl", type=float, default=30.0, help="--lease-ttl (default: %(default)s)")
    ap.add_argument("--grace", type=float, default=5.0, help="--lease-grace (default: %(default)s)")
    ap.add_argument("--probe-after-s", type=float, default=3.0,
                    help="freeze the first daemon granted this long after the fleet starts (default: %(default)s)")
    ap.add_argument("--no-probe", action="store_true", help="no dead-daemon probe")
    ap.add_argument("--client-procs", type=int, default=1, help="processes of FAKE daemons (default: %(default)s)")
    ap.add_argument("--coord-cpu", default="0", help="core of the coordinator (default: %(default)s)")
    ap.add_argument("--client-cpu", default="1", help="core of the FAKE daemons and this script (default: %(default)s)")
    ap.add_argument("--profile", action="store_true", help="one more run at the largest size under py-spy")
    ap.add_argument("--py-spy-venv", type=Path, default=REPO / "benchmarks" / ".venvs" / "py-spy")
    ap.add_argument("--max-run-s", type=float, default=120.0,
                    help="stop a sweep not finished this long after the fleet started (default: %(default)s)")
    ap.add_argument("--min-batches-per-daemon", type=int, default=2,
                    help="grid: at least this many batches per daemon (default: %(default)s)")
    ap.add_argument("--profile-sizes", default=None,
                    help="with --profile: the fleet sizes profiled (default: the largest of --sizes)")
    ap.add_argument("--profile-s", type=float, default=30.0, help="seconds py-spy samples (default: %(default)s)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 10 daemons, 400 trials, heartbeat 0.5 s, TTL 2 s, grace 0.5 s, no profile")
    ap.add_argument("--max-busy", type=float, default=0.15,
                    help="before each run, wait until other processes use less than this share of the cores")
    ap.add_argument("--quiet-wait-s", type=float, default=600.0, help="give up waiting for it after this (then run)")
    ap.add_argument("--keep", action="store_true", help="keep each run's results root (the coordinator's store)")
    ap.add_argument("--out-dir", type=Path, default=REPO / "benchmarks" / "out" / "coordinator")
    ap.add_argument("--json", type=Path, default=None, help="write every figure here")
    ap.add_argument("--results", type=Path, default=None,
                    help="write the benchmark's section into this file (benchmarks/RESULTS.md)")
    args = ap.parse_args(argv)
    if args.quick:
        args.sizes, args.repeats, args.trials = "10", 1, 400
        args.heartbeat, args.ttl, args.grace, args.probe_after_s = 0.5, 2.0, 0.5, 1.0
        args.max_run_s = 60.0
        args.profile = False
    args.size_list = [int(s) for s in args.sizes.split(",")]
    args.profile_list = ([int(s) for s in args.profile_sizes.split(",")] if args.profile_sizes
                         else [max(args.size_list)])
    if any(n < 2 for n in args.size_list):
        ap.error("--sizes: at least 2 daemons (one is frozen by the probe)")
    if args.client_procs < 1:
        ap.error("--client-procs must be at least 1")
    return args


def _cpu_busy(window_s: float) -> float:
    """Fraction of all cores busy over ``window_s`` (``/proc/stat``): this benchmark is idle while it
    looks, so this is everyone else."""
    def read() -> tuple[int, int]:
        with open("/proc/stat", encoding="ascii") as f:
            vals = [int(x) for x in f.readline().split()[1:]]
        idle = vals[3] + vals[4]  # idle + iowait
        return sum(vals), idle

    t0, i0 = read()
    time.sleep(window_s)
    t1, i1 = read()
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def wait_for_idle_cores(max_busy: float, timeout_s: float, window_s: float = 5.0) -> tuple[float, bool]:
    """Wait until the other processes on the machine use less than ``max_busy`` of its cores
    (measured over ``window_s``), at most ``timeout_s``; returns the last reading and whether it
    was below. (The 1-min load average is no use between runs: the previous run's two busy
    processes keep it near 2 for minutes.)"""
    deadline = time.monotonic() + timeout_s
    while True:
        busy = _cpu_busy(window_s)
        if busy < max_busy:
            say(f"  other processes use {busy:.0%} of the cores (< {max_busy:.0%}): starting")
            return busy, True
        left = deadline - time.monotonic()
        if left <= 0:
            say(f"  other processes still use {busy:.0%} of the cores after {timeout_s:.0f} s: running anyway "
                "(it goes on the record)")
            return busy, False
        say(f"  other processes use {busy:.0%} of the cores; waiting for < {max_busy:.0%} ({left:.0f} s left)")
        time.sleep(min(10.0, max(left, 0.1)))


def fsync_probe(folder: Path, n: int = 50) -> tuple[float, float]:
    """p50 and p90 (ms) of writing and fsyncing a 3 KB file in ``folder``, as the store does per result."""
    times = []
    for i in range(n):
        path = folder / f".fsync-probe-{i}"
        t = time.perf_counter()
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"x" * 3000)
            os.fsync(fd)
        finally:
            os.close(fd)
        times.append(time.perf_counter() - t)
        path.unlink()
    return 1000 * figures.quantile(times, 0.5), 1000 * figures.quantile(times, 0.9)


def _store_check(root: Path, name: str) -> dict[str, Any]:
    """What the coordinator's store holds after the run: attempts by status, result files."""
    folder = root / name
    con = sqlite3.connect(f"file:{folder / 'experiment.sqlite'}?mode=ro", uri=True, timeout=30)
    try:
        rows = con.execute("SELECT status, failure_kind, COUNT(*) FROM attempts GROUP BY status, failure_kind").fetchall()
        missing = con.execute("SELECT COUNT(*) FROM attempts WHERE status='ok' AND result_path IS NULL").fetchone()[0]
        holes = con.execute("SELECT COUNT(*) FROM spec_trials s WHERE NOT EXISTS (SELECT 1 FROM attempts a"
                            " WHERE a.trial_id=s.trial_id AND a.status='ok')").fetchone()[0]
    finally:
        con.close()
    files = sum(1 for _ in (folder / "results").glob("*/attempt-*.json"))
    return {"attempts": {f"{s}/{k}" if k else s: n for s, k, n in rows}, "ok_without_file": missing, "holes": holes,
            "result_files": files, "results_nc": (folder / "results.nc").exists()}


def _echo(fleets: list[tuple[Child, Path]], tail_: LogTail, victim_seen: dict[str, int]) -> None:
    """Progress: the fleets' lines, and what the coordinator's log said since the last call
    (counted: at 1,000 daemons it can log thousands of warnings a second)."""
    for c, _ in fleets:
        for line in c.progress_lines():
            say(f"  [{c.name}] {line}")
    counts: dict[str, int] = {}
    for e in tail_.new_events():
        if e.level not in ("WARNING", "ERROR"):
            continue
        kind = ("suspected" if " suspected: " in e.text else "lease expired" if "queued again (lease expired" in e.text
                else "left as a hole" if "left as a hole" in e.text else "cannot send" if "cannot send" in e.text
                else None)
        if kind is None and "transport failure" in e.text:
            continue
        if kind is None or victim_seen.get(kind, 0) < 2:
            victim_seen[kind or "other"] = victim_seen.get(kind or "other", 0) + 1
            say(f"  [coordinator] {e.level}: {e.text[:170]}")
        else:
            counts[kind] = counts.get(kind, 0) + 1
    if counts:
        say("  [coordinator] and " + ", ".join(f"{n} more '{k}'" for k, n in counts.items()))


def run_once(args: argparse.Namespace, n: int, repeat: int, out_dir: Path, profile: bool = False) -> dict[str, Any]:
    """One sweep of the real coordinator served by ``n`` FAKE daemons; returns its figures.

    A sweep that has not finished ``--max-run-s`` after the fleet started is stopped (the fleet
    first, so that it writes its record, then the coordinator, by SIGTERM, as a user's Ctrl-C) and
    its figures are of what was recorded, marked ``finished: False``."""
    work = workload.sized(args.shape, n, args.trials, args.load_points, args.min_batches_per_daemon)
    timings = FleetTimings(args.heartbeat, args.ttl, args.grace, daemon_wait_s=60.0)
    tag = f"n{n}-r{repeat}" + ("-profile" if profile else "")
    run_dir = out_dir / tag
    run_dir.mkdir(parents=True, exist_ok=True)
    name = f"bench-coord-{tag}"
    spec_path = run_dir / "spec.yaml"
    spec_path.write_text(work.spec_yaml(name), encoding="utf-8")
    say(f"== {n} FAKE daemons, run {repeat}{' (py-spy attached)' if profile else ''}: {work.describe()}; "
        f"{timings.describe()}")
    others_busy, quiet = wait_for_idle_cores(args.max_busy, args.quiet_wait_s)
    load_start = os.getloadavg()[0]
    root = Path(tempfile.mkdtemp(prefix=f"servetune-bench-coord-{tag}-"))
    try:
        return _run_in(args, n, repeat, profile, work, timings, run_dir, root, name, spec_path,
                       {"others_cores_at_start": others_busy * (os.cpu_count() or 1), "quiet_at_start": quiet, "load_start": load_start})
    finally:
        if args.keep:
            say(f"  results root kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def _run_in(args: argparse.Namespace, n: int, repeat: int, profile: bool, work: workload.Workload,
            timings: FleetTimings, run_dir: Path, root: Path, name: str, spec_path: Path,
            start_facts: dict[str, Any]) -> dict[str, Any]:
    fsync_p50, fsync_p90 = fsync_probe(root)
    say(f"  fsync of a 3 KB file in the results root: p50 {fsync_p50:.2f} ms, p90 {fsync_p90:.2f} ms")
    port = free_port()
    finished = True
    # CURVE on: the coordinator's keys and the one daemon key its allow-list admits, shared by the fake fleets
    env = {**os.environ, HOME_ENV: str(fleet_home(run_dir / "home"))}
    with Children() as children:
        coord = children.start(coordinator_child(spec_path, root, port, timings, run_dir / "coordinator.log",
                                                 args.coord_cpu, REPO, env=env))
        # the tree: the coordinator and its results.nc writer (a child process, started with the loop)
        coord_cpu = TreeCPU(coord.pid, tick_s=0.1, refresh_every=10).start()
        coord_mem = ProcSampler(coord.pid).start()
        machine_cpu = MachineCPU().start()
        t0 = time.monotonic()
        while bound_address(coord.log_path) is None:
            if coord.poll() is not None:
                raise BenchmarkError(f"the coordinator exited with {coord.returncode} before binding",
                                     tail(coord.log_path))
            if time.monotonic() - t0 > BIND_TIMEOUT_S:
                raise BenchmarkError(f"the coordinator did not bind within {BIND_TIMEOUT_S:.0f} s", tail(coord.log_path))
            time.sleep(0.05)
        say(f"  coordinator pid {coord.pid} bound tcp://127.0.0.1:{port} after {time.monotonic() - t0:.1f} s")
        spy = None
        if profile:
            pyspy = ensure_pyspy(args.py_spy_venv, say)
            spy = children.start(Child("py-spy", [str(pyspy), "record", "--pid", str(coord.pid),
                                                  "--idle", "--rate", str(SAMPLE_HZ), "--format", "raw",
                                                  "--duration", f"{args.profile_s:.0f}",
                                                  "--output", str(run_dir / "pyspy.txt")],
                                       run_dir / "pyspy.log", cpus=args.client_cpu))
        fleets: list[tuple[Child, Path]] = []
        per = -(-n // args.client_procs)
        for i in range(args.client_procs):
            count = min(per, n - i * per)
            if count <= 0:
                break
            out = run_dir / f"fleet-{i}.json"
            argv = [sys.executable, "-m", "benchmarks.coordinator.clients",
                    "--address", f"tcp://127.0.0.1:{port}", "--count", str(count), "--first-index", str(i * per),
                    "--deadline-s", f"{args.max_run_s + 60:.0f}", "--out", str(out)]
            if i == 0 and not args.no_probe and not profile:  # a profiled run has no probe (no idle tail)
                argv += ["--probe-after-s", f"{args.probe_after_s:g}"]
            fleets.append((children.start(Child(f"fake fleet {i}", argv, run_dir / f"fleet-{i}.log",
                                                cpus=args.client_cpu, cwd=REPO, env=env)), out))
        fleet_started = time.monotonic()
        client_cpu = TreeCPU(fleets[0][0].pid, tick_s=0.1, refresh_every=1000).start()
        others = [TreeCPU(c.pid, tick_s=0.1, refresh_every=1000).start() for c, _ in fleets[1:]]
        log_tail = LogTail(coord.log_path)
        seen: dict[str, int] = {}
        fleet_done_at: float | None = None
        coord_done_at: float | None = None
        while True:
            _echo(fleets, log_tail, seen)
            now = time.monotonic()
            coord_done = coord.poll() is not None
            fleet_done = all(c.poll() is not None for c, _ in fleets)
            if fleet_done and fleet_done_at is None:
                fleet_done_at = now
            if coord_done and coord_done_at is None:
                coord_done_at = now
            if coord_done and fleet_done:
                break
            if coord_done_at is not None and now - coord_done_at > 15:
                say(f"  the coordinator exited ({coord.returncode}) 15 s ago and the fleet is still running: stopping it")
                for c, _ in fleets:
                    c.stop(grace_s=30.0)
            if fleet_done_at is not None and now - fleet_done_at > COORD_EXIT_TIMEOUT_S:
                raise BenchmarkError(f"the coordinator did not exit {COORD_EXIT_TIMEOUT_S:.0f} s after the fleet ended",
                                     tail(coord.log_path))
            if now - fleet_started > args.max_run_s and not fleet_done:
                finished = False
                say(f"  the sweep has not finished {args.max_run_s:.0f} s after the fleet started: stopping the fleet, "
                    "then the coordinator (SIGTERM); the figures are of what was recorded")
                for c, _ in fleets:
                    c.stop(grace_s=30.0)
                coord.stop(grace_s=COORD_EXIT_TIMEOUT_S)
                _echo(fleets, log_tail, seen)
                break
            time.sleep(0.25)
        for cpu in (coord_cpu, client_cpu, *others):
            cpu.stop()
        coord_mem.stop()
        machine_cpu.stop()
        if spy is not None:
            spy.wait(args.profile_s + 30.0)
    for c, out in fleets:
        if not out.exists():
            raise BenchmarkError(f"{c.name} wrote no record (exit code {c.returncode})", tail(c.log_path))
    fleet = figures.merge_fleets([json.loads(out.read_text()) for _, out in fleets])
    logsum = summarize_log(parse_log(coord.log_path))
    figs = figures.run_figures(fleet, logsum, timings, coord_cpu, client_cpu, coord_mem, n, work.trials)
    span_start, span_end, _ = figures.steady_window(fleet["ack_mono"])
    if figs["steady_s"] and figs["steady_s"] > 0:
        ours = sum(t.between(span_start, span_end, "mono") for t in (coord_cpu, client_cpu, *others))
        figs["others_cores_busy"] = (machine_cpu.between(span_start, span_end) - ours) / figs["steady_s"]
    figs.update(repeat=repeat, finished=finished, **start_facts, load_end=os.getloadavg()[0],
                fsync_ms_p50=fsync_p50, fsync_ms_p90=fsync_p90, workload=work.describe(), timings=timings.describe(),
                coord_exit=coord.returncode, coord_cpu_total_s=coord.cpu_s,
                coord_threads_cpu_s=coord_mem.threads_cpu_s, coord_children_hwm_mib=coord_mem.children_hwm_mib,
                client_cpu_total_s=fleet["cpu_s"],
                store=_store_check(root, name), profile=profile)
    if profile and (run_dir / "pyspy.txt").exists():
        prof = summarize_raw((run_dir / "pyspy.txt").read_text(), REPO)
        figs["pyspy"] = {"samples": prof.samples, "by_part": prof.by_part, "top_self": prof.top_self,
                         "top_inclusive": prof.top_inclusive, "seconds": args.profile_s}
    (run_dir / "figures.json").write_text(json.dumps(figs, indent=1, default=str))
    say("  " + report.one_line(figs))
    return figs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    install_sigterm_as_interrupt()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(c) for c in args.client_cpu.split(",")})
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out_dir = args.out_dir / stamp
    out_dir.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    started = time.time()
    runs: list[dict[str, Any]] = []
    try:
        for n in args.size_list:
            for r in range(1, args.repeats + 1):
                runs.append(run_once(args, n, r, out_dir))
        if args.profile:
            for n in args.profile_list:
                runs.append(run_once(args, n, 1, out_dir, profile=True))
    except KeyboardInterrupt:
        say("interrupted: everything started was stopped")
        return 130
    except BenchmarkError as exc:
        say(f"benchmark failed: {exc}")
        return 1
    result = {
        "command": "python -m benchmarks.coordinator " + " ".join(argv if argv is not None else sys.argv[1:]),
        "started_utc": dt.datetime.fromtimestamp(started, dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "wall_s": time.time() - started,
        "machine": {**common.host(), "servetune (git)": common.git_revision(["coordinator", "servetune"]),
                    "pinning": f"coordinator on core {args.coord_cpu}, FAKE daemons and this script on core "
                               f"{args.client_cpu}", "1-min load average at start": f"{load:.2f}",
                    "1-min load average at end": f"{os.getloadavg()[0]:.2f}"},
        "settings": {"shape": args.shape, "trials": args.trials, "load_points": args.load_points,
                     "heartbeat_s": args.heartbeat, "ttl_s": args.ttl, "grace_s": args.grace,
                     "probe_after_s": None if args.no_probe else args.probe_after_s, "client_procs": args.client_procs,
                     "repeats": args.repeats},
        "runs": runs,
    }
    (out_dir / "summary.json").write_text(json.dumps(result, indent=1, default=str))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    print(report.table(result))
    if args.results is not None:
        report.write_section(args.results, result)
        say(f"wrote the coordinator section of {args.results}")
    say(f"raw output: {out_dir}")
    return 0
