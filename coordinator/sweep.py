"""Run an experiment: plan, hand batches to daemons over ZeroMQ, store what comes back.

A local sweep is the distributed protocol on loopback: the coordinator binds a ROUTER on
127.0.0.1 and starts one daemon as a child process (``daemon start --coordinator tcp://...``),
exactly as a user starts one on a GPU node.

Resume is the default: a trial whose latest attempt is ``ok`` is not run again, nor one that
failed as a ``measurement`` (unless ``retry_failed``); holes and ``transport`` failures are run.
Every attempt is a new record; nothing is overwritten.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console

from coordinator.dataset import write_dataset
from coordinator.planning import plan_experiment
from coordinator.progress import SweepProgress
from coordinator.scheduler import BatchWork, Scheduler
from coordinator.store import Store
from coordinator.summary import output_console, print_plan, print_ranking, spec_changes
from coordinator.transport import RouterEndpoint
from servetune.canonical import canonical_json
from servetune.errors import ServetuneError
from servetune.manifest import (
    Plan,
    PlannedBatch,
    TrialManifest,
    rate_sweep_followups,
    rate_sweep_rates,
    sweep_parent,
    swept_names,
)
from servetune.messages import (
    Ack,
    Bye,
    Conflict,
    Grant,
    GrantedTrial,
    Heartbeat,
    Hello,
    Message,
    NoWork,
    Ready,
    Renewed,
    Result,
    Shutdown,
    Stale,
    State,
    Welcome,
)
from servetune.metrics import TrialMetrics, server_summary, summarize
from servetune.paths import experiment_dir
from servetune.result import TrialOutcome
from servetune.spec import DERIVED_MARK, ExperimentSpec, LoadPoint

log = logging.getLogger(__name__)

DAEMON_CONNECT_TIMEOUT_S = 180.0
LEASE_SLACK_S = 120.0


class SweepInterrupted(ServetuneError):
    """The sweep was stopped by a signal (Ctrl-C or SIGTERM)."""


@dataclass
class SweepOptions:
    results_root: Path | None = None
    dry_run: bool = False
    retry_failed: bool = False
    bind: str = "tcp://127.0.0.1:0"
    local_daemon: bool = True
    daemon_command: list[str] | None = None
    daemon_args: list[str] = field(default_factory=list)
    console: Console | None = None


@dataclass
class SweepReport:
    exit_code: int
    experiment_dir: Path | None
    dataset_path: Path | None
    ran: int = 0
    ok: int = 0
    failed: int = 0
    holes: int = 0


def default_daemon_command() -> list[str]:
    """The ``daemon`` console script next to this interpreter, else ``python -m daemon``."""
    script = Path(sys.executable).parent / "daemon"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "daemon"]


def select_work(plan: Plan, store: Store, retry_failed: bool) -> tuple[list[BatchWork], dict[str, str]]:
    """Which planned trials still need running, grouped into their batches, and why each is skipped."""
    latest: dict[str, Any] = store.latest_finished()
    skipped: dict[str, str] = {}
    work: list[BatchWork] = []
    for batch in plan.batches:
        todo = []
        for m in batch.trials:
            att = latest.get(m.trial_id)
            if att is None or (att.status == "failed" and att.failure_kind == "transport"):
                todo.append(m)
            elif att.status == "failed" and retry_failed:
                todo.append(m)
            else:
                skipped[m.trial_id] = att.status if att.status == "ok" else f"failed ({att.failure_kind})"
        if todo:
            work.append(BatchWork(batch=batch, trials=tuple(todo)))
    return work, skipped


def _slo_key(slos: list[dict[str, Any]]) -> list[tuple[str, float, float]]:
    return sorted((str(s["metric"]), float(s["percentile"]), float(s["max_ms"])) for s in slos)


def refresh_slo_metrics(store: Store, spec: ExperimentSpec) -> int:
    """Recompute the derived metrics of ok attempts measured under other SLOs, from their raw
    samples (kept in each attempt's result file, which is left as it is). Returns how many changed."""
    wanted = _slo_key([s.model_dump() for s in spec.slos])
    changed = 0
    for att in store.latest_finished().values():
        if att.status != "ok" or not att.metrics or not att.result_path:
            continue
        if _slo_key(att.metrics.get("slos") or []) == wanted:
            continue
        record = json.loads((store.folder / att.result_path).read_text(encoding="utf-8"))
        outcome = TrialOutcome.model_validate(record["outcome"])
        if not outcome.window_s or not outcome.samples:
            continue
        lp = LoadPoint.model_validate(record["manifest"]["load_point"])
        fresh = summarize(outcome.samples, outcome.window_s, spec.slos, offered_rate=outcome.offered_rate,
                          concurrency_capped=lp.max_concurrency is not None)
        extras = {k: v for k, v in att.metrics.items() if k not in TrialMetrics.model_fields}
        store.update_metrics(att.trial_id, att.attempt, {**fresh.model_dump(mode="json"), **extras})
        changed += 1
    return changed


FOLLOWUP_BATCH_OFFSET = 10_000


def expand_rate_sweeps(
    store: Store, spec: ExperimentSpec, plan: Plan, spec_hash: str, retry_failed: bool = False,
    only: set[str] | None = None,
) -> list[BatchWork]:
    """Follow-up batches of every rate sweep whose ``@sync`` and ``@max`` trials both have ok
    results: ``num_rates`` rates evenly spaced between their request throughputs, as new trials
    (recorded in the store under ``spec_hash``; their manifests are made now and never change).
    Returns the batches that still have something to run. ``only``: just the seed pairs that
    contain one of these trial ids."""
    sweeps = {lp.name: lp for lp in spec.load_points if lp.rate_sweep is not None}
    if not sweeps:
        return []
    latest = store.latest_finished()
    pairs: dict[tuple[int, str], dict[str, TrialManifest]] = {}
    batches: dict[int, PlannedBatch] = {}
    for batch in plan.batches:
        for m in batch.trials:
            parent = sweep_parent(m.load_point.name)
            if parent in sweeps:
                pairs.setdefault((batch.index, parent), {})[m.load_point.name.rsplit(DERIVED_MARK, 1)[1]] = m
                batches[batch.index] = batch
    work: list[BatchWork] = []
    for (index, parent), seeds in sorted(pairs.items()):
        sync, top = seeds.get("sync"), seeds.get("max")
        if sync is None or top is None:
            continue
        if only is not None and not ({sync.trial_id, top.trial_id} & only):
            continue
        a, b = latest.get(sync.trial_id), latest.get(top.trial_id)
        if a is None or b is None or a.status != "ok" or b.status != "ok" or not a.metrics or not b.metrics:
            continue
        sweep = sweeps[parent].rate_sweep
        assert sweep is not None
        rates = rate_sweep_rates(float(a.metrics["request_throughput"]), float(b.metrics["request_throughput"]),
                                 sweep.num_rates)
        manifests = [top.model_copy(update={"load_point": lp}) for lp in rate_sweep_followups(sweeps[parent], rates)]
        if not manifests:
            log.warning("rate sweep %s of batch %d: max throughput is not above synchronous; no follow-ups",
                        parent, index)
            continue
        batch_index = FOLLOWUP_BATCH_OFFSET + index
        store.add_trials(spec_hash, manifests, batch_index)
        todo = []
        for m in manifests:
            att = latest.get(m.trial_id)
            if att is None or (att.status == "failed" and (att.failure_kind == "transport" or retry_failed)):
                todo.append(m)
        if todo:
            planned = PlannedBatch(index=batch_index, config=batches[index].config, trials=tuple(manifests),
                                   is_baseline=batches[index].is_baseline)
            work.append(BatchWork(batch=planned, trials=tuple(todo)))
    return work


class SweepRunner:
    """One sweep of one experiment. Not reusable: make a new runner per sweep."""

    def __init__(self, spec: ExperimentSpec, source_text: str | None, options: SweepOptions):
        self.spec = spec
        self.source_text = source_text
        self.opts = options
        # Piped output (CI logs, tests) is never wrapped, so every message stays one greppable line.
        self.console = options.console or Console(stderr=True, soft_wrap=not sys.stderr.isatty())
        self.plan = plan_experiment(spec)
        self.spec_hash = spec.spec_hash()
        self.coordinator_id = f"coord-{uuid.uuid4().hex[:8]}"
        self.store: Store | None = None
        self.child: subprocess.Popen[bytes] | None = None
        self.child_daemon_id: str | None = None
        self.sched: Scheduler | None = None
        self.progress: SweepProgress | None = None
        self.counts = {"ok": 0, "failed": 0}
        swept = swept_names(self.plan.configs().values()) or None
        self._labels = {
            m.trial_id: f"{m.engine.label(swept) if m.backend == 'vllm' else m.target} @ {m.load_point.name}"
            for m in self.plan.trials()
        }

    # ------------------------------------------------------------------ entry

    def run(self) -> SweepReport:
        if self.opts.dry_run:
            print_plan(self.plan, self.spec, output_console())
            return SweepReport(exit_code=0, experiment_dir=None, dataset_path=None)
        folder = experiment_dir(self.spec.name, self.opts.results_root)
        existed = (folder / "experiment.sqlite").exists()
        self.store = store = Store.open(folder)
        try:
            return self._run_with_store(store, folder, existed)
        finally:
            store.close()

    def _run_with_store(self, store: Store, folder: Path, existed: bool) -> SweepReport:
        if existed:
            stale = store.close_stale_sweeps()
            abandoned = store.close_abandoned("abandoned: the coordinator that granted it stopped without a result")
            if stale or abandoned:
                self.console.print(
                    f"[yellow]previous sweep did not finish: {len(abandoned)} running attempt(s) recorded as "
                    "transport failures; they will be run again"
                )
            previous = store.latest_spec()
            if previous is not None and previous[0] != self.spec_hash:
                changes = spec_changes(previous[1], self.spec.model_dump(mode="json"))
                self.console.print("[yellow]the spec changed since the last sweep of this experiment "
                                   "(earlier results are kept, tagged by spec hash):")
                for line in changes:
                    self.console.print(f"  {line}")
        store.record_plan(self.spec_hash, self.spec.model_dump(mode="json"), self.source_text, self.plan)
        refreshed = refresh_slo_metrics(store, self.spec)
        if refreshed:
            self.console.print(f"SLOs changed: recomputed SLO attainment and goodput of {refreshed} trial(s) "
                               "from their raw samples")
        work, skipped = select_work(self.plan, store, self.opts.retry_failed)
        followups = expand_rate_sweeps(store, self.spec, self.plan, self.spec_hash, self.opts.retry_failed)
        self._note_labels(followups)
        work += followups
        n_todo = sum(len(w.trials) for w in work)
        total = len(self.plan.trials())
        if skipped:
            n_failed_skip = sum(1 for s in skipped.values() if s != "ok")
            self.console.print(
                f"resuming: {len(skipped)} of {total} trials already have results"
                + (f" ({n_failed_skip} measurement failures kept; --retry-failed re-runs them)" if n_failed_skip else "")
            )
        dataset_path = write_dataset(store)
        if not work:
            self.console.print("nothing to run: every planned trial has a result")
            print_ranking(store, self.spec, output_console(), dataset_path)
            return SweepReport(exit_code=0, experiment_dir=folder, dataset_path=dataset_path)
        sweep_id = store.begin_sweep(self.spec_hash, canonical_json(sys.argv))
        estimate = self.plan.estimate_seconds() * n_todo / max(1, total)
        self.sched = Scheduler(work)
        status = "finished"
        exit_code = 0
        old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
        endpoint = RouterEndpoint(self.opts.bind)
        try:
            self.console.print(
                f"sweep [bold]{self.spec.name}[/]: {n_todo} trial(s) in {len(work)} batch(es); coordinator on "
                f"{endpoint.address}; results in {folder}"
            )
            with SweepProgress(n_todo, estimate, self.console) as progress:
                self.progress = progress
                if self.opts.local_daemon:
                    self._start_local_daemon(endpoint.address, folder)
                try:
                    self._loop(endpoint)
                except (KeyboardInterrupt, SweepInterrupted):
                    status, exit_code = "interrupted", 130
                    self.console.print("[yellow]interrupted: stopping the daemon; finished results are kept")
                    self._abort("interrupted by user (Ctrl-C or SIGTERM)")
                except ServetuneError as exc:
                    status, exit_code = "failed", 1
                    self.console.print(f"[red]sweep failed: {exc}")
                    self._abort(f"sweep failed: {exc}")
                self._shutdown_daemons(endpoint, "sweep " + status)
        finally:
            signal.signal(signal.SIGTERM, old_term)
            endpoint.close()
            self._stop_child()
            store.end_sweep(sweep_id, status)
        dataset_path = write_dataset(store)
        print_ranking(store, self.spec, output_console(), dataset_path)
        holes = self._count_holes(store)
        if holes and exit_code == 0:
            self.console.print(f"[yellow]{holes} trial(s) were not measured (holes); run the sweep again to fill them")
        return SweepReport(
            exit_code=exit_code, experiment_dir=folder, dataset_path=dataset_path, ran=self.counts["ok"] + self.counts["failed"],
            ok=self.counts["ok"], failed=self.counts["failed"], holes=holes,
        )

    def _count_holes(self, store: Store) -> int:
        latest = store.latest_finished()
        return sum(1 for t in store.planned_trial_ids(self.spec_hash) if t not in latest)

    def _note_labels(self, work: list[BatchWork]) -> None:
        swept = swept_names(self.plan.configs().values()) or None
        for w in work:
            for m in w.trials:
                label = m.engine.label(swept) if m.backend == "vllm" else m.target
                self._labels[m.trial_id] = f"{label} @ {m.load_point.name}"

    # ------------------------------------------------------------------ local daemon

    def _start_local_daemon(self, address: str, folder: Path) -> None:
        cmd = (self.opts.daemon_command or default_daemon_command()) + [
            "start", "--coordinator", address, "--workdir", str((folder / "daemon").resolve()), "--exit-with-parent",
        ] + self.opts.daemon_args
        logs = folder / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / f"daemon-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
        self._daemon_log = log_path
        with open(log_path, "ab") as fh:
            self.child = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.info("local daemon pid %d: %s (log %s)", self.child.pid, " ".join(cmd), log_path)
        assert self.progress is not None
        self.progress.phase("starting the local daemon")

    def _stop_child(self, timeout_s: float = 60.0) -> None:
        child = self.child
        if child is None or child.poll() is not None:
            return
        try:
            child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("local daemon did not exit within %.0f s; terminating it", timeout_s)
            child.terminate()
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(timeout=10)

    # ------------------------------------------------------------------ loop

    def _loop(self, endpoint: RouterEndpoint) -> None:
        sched = self.sched
        assert sched is not None
        started = time.monotonic()
        budget = self.spec.budgets.sweep_timeout_s
        lease_timeout = self.spec.budgets.server_start_timeout_s + self.spec.budgets.trial_timeout_s + LEASE_SLACK_S
        while not sched.finished:
            got = endpoint.recv(200)
            if got is not None:
                self._handle(endpoint, *got)
            if self.child is not None and self.child.poll() is not None:
                code = self.child.returncode
                lost = sched.remove_daemon(self.child_daemon_id) if self.child_daemon_id else []
                self._close_lost(lost, f"local daemon exited with code {code}")
                raise ServetuneError(f"the local daemon exited with code {code}; its log: {self._daemon_log}")
            if not sched.daemons and time.monotonic() - started > DAEMON_CONNECT_TIMEOUT_S:
                raise ServetuneError(f"no daemon connected within {DAEMON_CONNECT_TIMEOUT_S:.0f} s")
            for lease in sched.expired(lease_timeout):
                self._close_lost(sched.revoke(lease.batch_id), f"lease expired: no word from daemon {lease.daemon_id}")
            if budget is not None and not sched.stopping and time.monotonic() - started > budget:
                left = sched.stop()
                self.console.print(f"[yellow]sweep budget of {budget:.0f} s spent: {left} batch(es) left as holes")

    def _handle(self, endpoint: RouterEndpoint, daemon_id: str, msg: Message) -> None:
        sched = self.sched
        store = self.store
        assert sched is not None and store is not None and self.progress is not None
        sched.touch(daemon_id)
        if isinstance(msg, Hello):
            sched.add_daemon(daemon_id)
            if self.child is not None and msg.pid == self.child.pid:
                self.child_daemon_id = daemon_id
            fp = msg.capabilities.fingerprint
            log.info("daemon %s joined: %s (%s)", daemon_id, fp.hardware_class, fp.hostname)
            endpoint.send(daemon_id, Welcome(session_nonce=msg.session_nonce, coordinator_id=self.coordinator_id))
            self.progress.phase(f"daemon {daemon_id} joined ({fp.hardware_class})")
        elif daemon_id not in sched.daemons:
            endpoint.send(daemon_id, Shutdown(reason="unknown daemon: say HELLO first"))
        elif isinstance(msg, Ready):
            self._on_ready(endpoint, daemon_id)
        elif isinstance(msg, State):
            store.record_transition(msg.trial_id, msg.epoch if msg.trial_id else None, msg.batch_id, msg.phase, msg.detail)
            label = self._labels.get(msg.trial_id or "", msg.batch_id)
            self.progress.phase(f"{label}: {msg.phase.replace('_', ' ')}" + (f" ({msg.detail})" if msg.detail else ""))
        elif isinstance(msg, Result):
            self._on_result(endpoint, daemon_id, msg)
        elif isinstance(msg, Heartbeat):
            endpoint.send(daemon_id, Renewed(leases=msg.leases, ttl_s=3600.0))
        elif isinstance(msg, Bye):
            by_signal = msg.reason.startswith("signal ")
            lost = sched.remove_daemon(daemon_id)
            prefix = "interrupted: " if by_signal else ""
            self._close_lost(lost, f"{prefix}daemon {daemon_id} left: {msg.reason}")
            if daemon_id == self.child_daemon_id and not sched.finished:
                if by_signal:
                    raise SweepInterrupted(f"the local daemon stopped on {msg.reason}")
                raise ServetuneError(f"the local daemon left: {msg.reason}")
        else:
            log.warning("unexpected %s from daemon %s", type(msg).__name__, daemon_id)

    def _on_ready(self, endpoint: RouterEndpoint, daemon_id: str) -> None:
        sched, store = self.sched, self.store
        assert sched is not None and store is not None
        work = sched.take(daemon_id)
        if work is None:
            endpoint.send(daemon_id, Shutdown(reason="no more work") if sched.finished or sched.stopping else NoWork())
            return
        attempts = {
            m.trial_id: store.begin_attempt(m.trial_id, daemon_id=daemon_id, batch_id=work.batch_id, spec_hash=self.spec_hash)
            for m in work.trials
        }
        sched.grant(daemon_id, work, attempts)
        grant = Grant(
            batch_id=work.batch_id,
            epoch=max(attempts.values()),
            ttl_s=self.spec.budgets.server_start_timeout_s + self.spec.budgets.trial_timeout_s * len(work.trials),
            model=self.spec.model,
            backend=self.spec.backend,
            budgets=self.spec.budgets,
            config=work.batch.config,
            trials=[GrantedTrial(trial_id=m.trial_id, attempt=attempts[m.trial_id], manifest=m) for m in work.trials],
        )
        if not endpoint.send(daemon_id, grant):
            self._close_lost(sched.revoke(work.batch_id), f"could not reach daemon {daemon_id}")

    def _on_result(self, endpoint: RouterEndpoint, daemon_id: str, msg: Result) -> None:
        sched, store, progress = self.sched, self.store, self.progress
        assert sched is not None and store is not None and progress is not None
        verdict = sched.classify_result(daemon_id, msg.batch_id, msg.trial_id, msg.epoch, msg.submission_id)
        if verdict == "stale":
            endpoint.send(daemon_id, Stale(trial_id=msg.trial_id, submission_id=msg.submission_id,
                                           reason="not the current attempt of a trial leased to this daemon"))
            return
        if verdict == "conflict":
            endpoint.send(daemon_id, Conflict(trial_id=msg.trial_id, submission_id=msg.submission_id,
                                              reason="a different result was already accepted for this attempt"))
            return
        if verdict == "duplicate":
            endpoint.send(daemon_id, Ack(trial_id=msg.trial_id, submission_id=msg.submission_id))
            return
        lease = sched.leases[msg.batch_id]
        manifest = next(m for m in lease.work.trials if m.trial_id == msg.trial_id)
        outcome = msg.outcome
        status, kind, error = outcome.status, outcome.failure_kind, outcome.error
        metrics: dict[str, Any] | None = None
        if status == "ok":
            try:
                metrics = self._metrics(outcome, manifest.load_point)
            except ValueError as exc:
                status, kind, error = "failed", "parse", f"cannot summarize the samples: {exc}"
        elif kind is None:
            kind = "measurement"
        if metrics is None:
            metrics = self._extras(outcome)
        record = {
            "trial_id": msg.trial_id,
            "attempt": msg.epoch,
            "submission_id": msg.submission_id,
            "daemon_id": daemon_id,
            "batch_id": msg.batch_id,
            "spec_hash": self.spec_hash,
            "status": status,
            "failure_kind": kind,
            "manifest": manifest.model_dump(mode="json"),
            "metrics": metrics,
            "outcome": outcome.model_dump(mode="json"),
        }
        hw = outcome.fingerprint.hardware_class if outcome.fingerprint else None
        store.finish_attempt(
            msg.trial_id, msg.epoch, status=status, failure_kind=kind if status != "ok" else None, error=error,
            submission_id=msg.submission_id, record=record, metrics=metrics, hardware_class=hw,
        )
        sched.resolve(msg.batch_id, msg.trial_id, msg.submission_id)
        write_dataset(store)
        endpoint.send(daemon_id, Ack(trial_id=msg.trial_id, submission_id=msg.submission_id))
        self.counts["ok" if status == "ok" else "failed"] += 1
        if status == "ok" and DERIVED_MARK in manifest.load_point.name:
            added = expand_rate_sweeps(store, self.spec, self.plan, self.spec_hash, self.opts.retry_failed,
                                       only={msg.trial_id})
            self._note_labels(added)
            for work in added:
                if sched.add(work):
                    progress.add_total(len(work.trials))
                    rates = ", ".join(m.load_point.name.rsplit(DERIVED_MARK, 1)[1] for m in work.trials)
                    progress.phase(f"rate sweep: queued {len(work.trials)} follow-up rate(s): {rates}")
        label = self._labels.get(msg.trial_id, msg.trial_id[:12])
        if status == "ok":
            text = f"{label}: ok, {metrics.get('output_throughput', 0):.0f} output tok/s"
            if metrics.get("stopped_early"):
                text += f", stopped early: {metrics['stopped_early']}"
            if metrics.get("client_fell_behind"):
                text += ", client fell behind"
        else:
            text = f"{label}: FAILED ({kind}): {(error or '').splitlines()[0][:120] if error else ''}"
        progress.trial_done(status == "ok", text)

    def _extras(self, outcome: TrialOutcome) -> dict[str, Any]:
        server = outcome.server
        counters = outcome.server_counters
        fp = outcome.fingerprint
        return {
            "server_requests_delta": counters.get("request_success_ok"),
            "server_generation_tokens_delta": counters.get("generation_tokens_total"),
            "kv_cache_tokens": server.kv_cache_tokens if server else None,
            "server_startup_s": server.startup_s if server else None,
            "stopped_early": outcome.stopped_early,
            "vllm_version": fp.vllm_version if fp else None,
            "hardware_class": fp.hardware_class if fp else None,
            # peaks of the server's queues and KV cache, preemptions, prefix-cache hit rate
            **server_summary(outcome.server_series, counters),
        }

    def _metrics(self, outcome: TrialOutcome, lp: LoadPoint) -> dict[str, Any]:
        if not outcome.window_s or not outcome.samples:
            raise ValueError("an ok outcome must carry samples and a positive measurement window")
        m = summarize(outcome.samples, outcome.window_s, self.spec.slos, offered_rate=outcome.offered_rate,
                      concurrency_capped=lp.max_concurrency is not None)
        return {**m.model_dump(mode="json"), **self._extras(outcome)}

    # ------------------------------------------------------------------ endings

    def _close_lost(self, lost: list[tuple[str, int]], reason: str) -> None:
        store = self.store
        assert store is not None
        for trial_id, attempt in lost:
            status = store.attempt_status(trial_id, attempt)
            if status is not None and status[0] == "running":
                store.finish_attempt(
                    trial_id, attempt, status="failed", failure_kind="transport", error=reason,
                    submission_id=None, record=None, metrics=None, hardware_class=None,
                )
                log.warning("trial %s attempt %d: transport failure: %s", trial_id[:12], attempt, reason)

    def _abort(self, reason: str) -> None:
        sched = self.sched
        assert sched is not None
        sched.stop()
        for batch_id in list(sched.leases):
            self._close_lost(sched.revoke(batch_id), reason)

    def _shutdown_daemons(self, endpoint: RouterEndpoint, reason: str) -> None:
        sched = self.sched
        assert sched is not None
        for daemon_id in list(sched.daemons):
            endpoint.send(daemon_id, Shutdown(reason=reason))


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise SweepInterrupted(f"received signal {signum}")
