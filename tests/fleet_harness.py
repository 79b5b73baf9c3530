"""A fleet on loopback for the fault suite and the chaos runner: a real coordinator process
(``sweep --no-local-daemon``), real ``daemon start`` processes, the ``openai`` backend against the
FAKE endpoint of :mod:`tests.fakes.openai_server` (or, for scenarios that need no trial in flight
when their fault lands, the SIMULATED ``sim`` backend: the same protocol with no HTTP load per
trial), and an optional :class:`~tests.fakes.faultproxy.
FaultProxy` between a daemon and the coordinator. Every wait has a deadline; :meth:`Fleet.close`
kills whatever is left and says so.

:func:`check_invariants` reads the experiment's store and result files and lists every broken
promise: at most one accepted result per trial, no result accepted for a revoked attempt, every
planned trial ended ok / failed / hole with a reason, every acknowledged submission stored."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fakes.keys import fleet_home

REPO = Path(__file__).resolve().parents[1]

#: Short timings so a fault scenario takes seconds: suspected after 0.6 s, revoked after 3 s.
FAST = {"--heartbeat-interval": "0.2", "--lease-ttl": "2", "--lease-grace": "1", "--daemon-wait": "30"}

SPEC = textwrap.dedent(
    """
    name: {name}
    model: {{source: tiny}}
    backend: {backend}
    load_points:
      - {{name: c2, max_concurrency: 2, num_requests: {n}, input_len: 8, output_len: 16}}
      - {{name: c4, max_concurrency: 4, num_requests: {n}, input_len: 8, output_len: 16}}
    repeats: {repeats}
    budgets: {{trial_timeout_s: 60}}
    """
)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Fleet:
    """One experiment's fleet in ``tmp``. ``url``: the fake endpoint's base URL (``kind="openai"``);
    ``kind="sim"``: the SIMULATED backend, which finishes a trial in milliseconds (``url`` unused):
    only for scenarios whose faults do not need a trial in flight."""

    tmp: Path
    url: str
    name: str = "fleet"
    repeats: int = 4
    requests: int = 20
    timings: dict[str, str] = field(default_factory=lambda: dict(FAST))
    env: dict[str, str] = field(default_factory=dict)
    #: More keys of the spec's backend, e.g. ``", api_key_env: FLEET_KEY"``.
    backend: str = ""
    kind: str = "openai"

    def __post_init__(self) -> None:
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.root = self.tmp / "runs"
        self.folder = self.root / self.name
        self.spec = self.tmp / f"{self.name}.yaml"
        backend = (f'{{kind: openai, base_url: "{self.url}"{self.backend}}}' if self.kind == "openai"
                   else f"{{kind: {self.kind}{self.backend}}}")
        self.spec.write_text(SPEC.format(name=self.name, n=self.requests, repeats=self.repeats, backend=backend))
        self.port = free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.coordinator: subprocess.Popen[str] | None = None
        self.coordinator_runs: list[tuple[int | None, str]] = []
        self.daemons: dict[str, subprocess.Popen[bytes]] = {}
        self.procs: list[subprocess.Popen[Any]] = []
        self._files: list[Any] = []
        base = dict(os.environ)
        self.home = fleet_home(self.tmp / "home")  # CURVE keys: coordinator pair, one admitted daemon key
        base.update({"PYTHONUNBUFFERED": "1", "SERVETUNE_CACHE": str(self.tmp / "cache"),
                     "SERVETUNE_HOME": str(self.home)})
        base.update(self.env)
        self.env = base

    # ------------------------------------------------------------------ processes

    def start_coordinator(self, *extra: str) -> subprocess.Popen[str]:
        args = [sys.executable, "-m", "coordinator", "-v", "sweep", str(self.spec), "--results-root", str(self.root),
                "--no-local-daemon", "--bind", self.address]
        for k, v in self.timings.items():
            args += [k, v]
        err = open(self.tmp / f"coordinator-{len(self.coordinator_runs)}.log", "w")
        self._files.append(err)
        self.coordinator = subprocess.Popen(args + list(extra), stdout=subprocess.PIPE, stderr=err, text=True,
                                            env=self.env, cwd=self.tmp, start_new_session=True)
        self.coordinator_runs.append((None, err.name))
        self.procs.append(self.coordinator)
        return self.coordinator

    def start_daemon(self, daemon_id: str, address: str | None = None, *extra: str,
                     argv: list[str] | None = None, home: Path | None = None,
                     env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """``daemon start`` dialling the coordinator (or ``address``, e.g. a proxy). ``argv``: run
        another entry point with the same arguments (a daemon with a planted fault). ``home``: its
        ``$SERVETUNE_HOME`` (default the fleet's, whose daemon key is admitted). ``env``: more
        environment variables of its own (e.g. its API key)."""
        cmd = argv or [sys.executable, "-m", "daemon"]
        log = open(self.tmp / f"daemon-{daemon_id}-{len(self.procs)}.log", "wb")
        self._files.append(log)
        proc = subprocess.Popen(
            cmd + ["start", "--coordinator", address or self.address, "--workdir", str(self.tmp / "daemon"),
                   "--daemon-id", daemon_id, "--coordinator-lost", "30", *extra],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO, start_new_session=True,
            env={**self.env, **({} if home is None else {"SERVETUNE_HOME": str(home)}), **(env or {})},
        )
        proc.log_path = log.name  # type: ignore[attr-defined]
        self.daemons[daemon_id] = proc
        self.procs.append(proc)
        return proc

    def wait_coordinator(self, timeout_s: float = 120) -> tuple[int, str, str]:
        """Wait for the coordinator to exit; its exit code, stdout and log (stderr)."""
        assert self.coordinator is not None
        try:
            out, _ = self.coordinator.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.coordinator.kill()
            out, _ = self.coordinator.communicate(timeout=10)
            raise AssertionError(
                f"the coordinator did not finish within {timeout_s} s:\n{self.coordinator_log()[-3000:]}") from None
        code = self.coordinator.returncode
        self.coordinator_runs[-1] = (code, self.coordinator_runs[-1][1])
        return code, out, self.coordinator_log()

    def poll_coordinator(self) -> int | None:
        """The coordinator's exit code once it has exited (its pipe drained and the code recorded
        in :attr:`coordinator_runs`), else None; never blocks more than a few seconds."""
        proc = self.coordinator
        if proc is None or proc.poll() is None:
            return None
        if self.coordinator_runs[-1][0] is None:
            proc.communicate(timeout=10)
            self.coordinator_runs[-1] = (proc.returncode, self.coordinator_runs[-1][1])
        return proc.returncode

    def daemon_log_paths(self) -> list[Path]:
        """The log of every daemon process started, killed and replaced ones included, in order."""
        return [Path(p.log_path) for p in self.procs if hasattr(p, "log_path")]

    def coordinator_log(self, run: int = -1) -> str:
        return Path(self.coordinator_runs[run][1]).read_text(errors="replace")

    def daemon_log(self, daemon_id: str) -> str:
        return Path(self.daemons[daemon_id].log_path).read_text(errors="replace")  # type: ignore[attr-defined]

    def signal(self, proc: subprocess.Popen[Any], sig: int) -> None:
        os.kill(proc.pid, sig)

    def close(self) -> list[str]:
        """Stop every process still running (SIGCONT first, then SIGTERM, then SIGKILL). Returns
        the ones that had to be killed (a test asserting a clean end checks it is empty)."""
        killed = []
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                    os.kill(p.pid, signal.SIGTERM)
                    p.wait(timeout=10)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    p.kill()
                    p.wait(timeout=10)
                killed.append(" ".join(map(str, p.args[:6])))  # type: ignore[index]
        for fh in self._files:
            fh.close()
        return killed

    # ------------------------------------------------------------------ store

    def query(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        db = self.folder / "experiment.sqlite"
        if not db.exists():
            return []
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
        try:
            return list(conn.execute(sql, args).fetchall())
        except sqlite3.OperationalError:
            return []
        finally:
            conn.close()

    def attempts(self) -> list[dict[str, Any]]:
        rows = self.query("SELECT trial_id, attempt, status, failure_kind, error, daemon_id, batch_id, submission_id,"
                          " result_path, daemon_key_id FROM attempts ORDER BY trial_id, attempt")
        keys = ["trial_id", "attempt", "status", "failure_kind", "error", "daemon_id", "batch_id", "submission_id",
                "result_path", "daemon_key_id"]
        return [dict(zip(keys, r)) for r in rows]

    def running_on(self, daemon_id: str) -> list[dict[str, Any]]:
        return [a for a in self.attempts() if a["status"] == "running" and a["daemon_id"] == daemon_id]

    def measuring_on(self, daemon_id: str) -> bool:
        """The daemon holds a running attempt and has said it is measuring it."""
        rows = self.query(
            "SELECT 1 FROM transitions t JOIN attempts a ON a.trial_id=t.trial_id AND a.attempt=t.attempt"
            " WHERE a.status='running' AND a.daemon_id=? AND t.phase='measuring' LIMIT 1", (daemon_id,))
        return bool(rows)

    def ok_count(self) -> int:
        rows = self.query("SELECT COUNT(*) FROM attempts WHERE status='ok'")
        return int(rows[0][0]) if rows else 0


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def acked_submissions(log_text: str) -> set[str]:
    """Submission ids a daemon's log says the coordinator acknowledged."""
    return set(re.findall(r"acknowledged[^\n]*?submission ([0-9a-f]{8,})", log_text))


def check_invariants(fleet: Fleet, acked: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
    """Every broken promise of the store of ``fleet``'s experiment, as text (empty when all hold)."""
    problems: list[str] = []
    attempts = fleet.attempts()
    planned = {r[0] for r in fleet.query("SELECT trial_id FROM spec_trials")}
    by_trial: dict[str, list[dict[str, Any]]] = {}
    for a in attempts:
        by_trial.setdefault(a["trial_id"], []).append(a)
    for trial_id in planned:
        rows = by_trial.get(trial_id, [])
        accepted = [a for a in rows if a["submission_id"] is not None]
        if len(accepted) > 1:
            problems.append(f"trial {trial_id[:12]}: {len(accepted)} accepted results (attempts "
                            f"{[a['attempt'] for a in accepted]})")
        for a in rows:
            if a["status"] == "running":
                problems.append(f"trial {trial_id[:12]} attempt {a['attempt']} is still running")
            if a["failure_kind"] == "transport":
                if a["submission_id"] is not None or a["result_path"] is not None:
                    problems.append(f"trial {trial_id[:12]} attempt {a['attempt']}: a transport failure holds a result")
                if not a["error"]:
                    problems.append(f"trial {trial_id[:12]} attempt {a['attempt']}: transport failure without a reason")
            if a["submission_id"] is not None:
                path = fleet.folder / str(a["result_path"])
                if not path.exists():
                    problems.append(f"trial {trial_id[:12]} attempt {a['attempt']}: result file missing")
                else:
                    record = json.loads(path.read_text())
                    if record["attempt"] != a["attempt"] or record["submission_id"] != a["submission_id"]:
                        problems.append(f"trial {trial_id[:12]}: result file of another attempt")
        if accepted and max(a["attempt"] for a in rows) != accepted[0]["attempt"]:
            problems.append(f"trial {trial_id[:12]}: attempt {accepted[0]['attempt']} was accepted but a later "
                            "attempt exists (a stale epoch accepted, or an accepted trial re-granted)")
    stored = {a["submission_id"] for a in attempts if a["submission_id"]}
    for sub in acked:
        if not any(s.startswith(sub) or sub.startswith(s) for s in stored):
            problems.append(f"acknowledged submission {sub} is not in the store")
    return problems


def activity_windows(log: Iterable[Any], gap_s: float = 0.0) -> dict[str, list[tuple[float, float]]]:
    """Each client's measurement windows as an endpoint's request log shows them: its requests
    (entries with ``client``, ``start``, ``end``) merged into spans wherever one starts before the
    last ended (plus ``gap_s``)."""
    by_client: dict[str, list[tuple[float, float]]] = {}
    for r in sorted(log, key=lambda r: (r.client, r.start)):
        spans = by_client.setdefault(r.client, [])
        if spans and r.start <= spans[-1][1] + gap_s:
            spans[-1] = (spans[-1][0], max(spans[-1][1], r.end))
        else:
            spans.append((r.start, r.end))
    return by_client


def window_overlaps(log: Iterable[Any], gap_s: float = 0.0) -> tuple[int, float]:
    """Pairs of windows of two different clients that overlap in time, and the seconds they overlap
    in all (:func:`activity_windows`)."""
    windows = activity_windows(log, gap_s)
    clients = sorted(windows)
    pairs, seconds = 0, 0.0
    for i, a in enumerate(clients):
        for b in clients[i + 1:]:
            for s0, e0 in windows[a]:
                for s1, e1 in windows[b]:
                    overlap = min(e0, e1) - max(s0, s1)
                    if overlap > 0:
                        pairs += 1
                        seconds += overlap
    return pairs, seconds
