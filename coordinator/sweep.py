"""Run an experiment: plan, hand batches to daemons over ZeroMQ, store what comes back.

A local sweep is the distributed protocol on loopback: the coordinator binds a ROUTER on
127.0.0.1 and starts one daemon as a child process (``daemon start --coordinator tcp://...``),
exactly as a user starts one on a GPU node. Every connection is CURVE (:mod:`coordinator.trust`
chooses the keys: the coordinator's from ``$SERVETUNE_HOME`` or throwaway ones for a local sweep,
whose child daemon gets its own throwaway pair through a private ``$SERVETUNE_HOME``).

Resume is the default: a trial whose latest attempt is ``ok`` is not run again, nor one that
failed as a ``measurement`` (unless ``retry_failed``); holes and ``transport`` failures are run.
Every attempt is a new record; nothing is overwritten.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any

import pydantic_core
from rich.console import Console

from coordinator.adaptive_loop import AdaptiveLoop
from coordinator.artifact_sink import ArtifactSink, SinkPolicy
from coordinator.breaker import BreakerChanged, Drained
from coordinator.clock import ClockSchedule, ClockStep, write_clock_file
from coordinator.control import (
    Accept,
    BeginAttempts,
    CloseAttempts,
    ControlCore,
    DaemonJoined,
    DaemonLeft,
    FailedOver,
    Instruction,
    NoDaemon,
    Notice,
    ReceiveArtifact,
    Refused,
    Send,
    Transition,
    check_grant_bounds,
    orphans_from,
)
from coordinator.dataset_writer import DatasetWriter, rewrite_wait_s, write_final
from coordinator.fleet import LOCAL_BIND, FleetSettings
from coordinator.leases import BatchWork
from coordinator.planning import needs_run, plan_experiment, planner_class
from coordinator.progress import SweepProgress
from coordinator.retries import RetryEvent, RetryLog
from coordinator.schedule import ScheduleBook
from coordinator.sla_search import expand_sla_searches, print_sla
from coordinator.store import Store
from coordinator.summary import output_console, print_plan, print_pruned, print_ranking, spec_changes
from coordinator.targets import prior_bindings
from coordinator.transport import RouterEndpoint
from coordinator.trust import SweepKeys, sweep_keys
from servetune.canonical import canonical_json
from servetune.errors import ServetuneError
from servetune.exitcodes import ExitCode
from servetune.keys import HOME_ENV, key_id, servetune_home
from servetune.manifest import (
    Plan,
    PlannedBatch,
    TrialManifest,
    rate_sweep_next,
    sweep_parent,
    swept_names,
)
from servetune.messages import Grant, Heartbeat, Message, TimeReply
from servetune.metrics import TrialMetrics, server_summary, summarize, summary_dict
from servetune.paths import experiment_dir
from servetune.plausibility import implausible
from servetune.result import TrialOutcome
from servetune.spec import DERIVED_MARK, ExperimentSpec, LoadPoint
from servetune.vllm_args import cache_dir as engine_args_cache_dir

log = logging.getLogger(__name__)

#: results.nc is rewritten at most this often while results arrive (and at least ten times its own
#: last write time apart, so a large experiment's rewrite never hogs the loop), and once at the end.
DATASET_DEBOUNCE_S = 2.0
#: From this many planned trials on, the interim results.nc rewrites run in a child process
#: (:mod:`coordinator.dataset_writer`): they take long enough to delay heartbeat answers.
DATASET_BACKGROUND_TRIALS = 500
#: The control core's clock is ticked at most this often (and four times per heartbeat interval).
TICK_S = 0.1
#: clock.json (and schedule.json's clock offsets) are rewritten at most this often while estimates come in.
CLOCK_WRITE_S = 2.0
#: One pass of the loop reads at most this many messages already queued on the socket (or for
#: this long), hands them all to the core, commits their store writes in one transaction, then
#: sends what they answered (see :meth:`SweepRunner._pass`).
DRAIN_MAX = 500
DRAIN_MAX_S = 0.1
#: Admission control: a pass (or tick) that found the socket's queue emptied may make this many
#: GRANTs; one that left messages queued (the loop is behind) only GRANTS_WHEN_BEHIND. A GRANT
#: brings back a RESULT per trial and a READY, so granting while behind only lengthens the queue
#: that every HEARTBEAT waits in; READYs left over wait, and the next tick with budget grants them
#: oldest first (a READY read in a pass with budget left is granted at once, ahead of them).
GRANTS_PER_PASS = 64
GRANTS_WHEN_BEHIND = 2


class SweepInterrupted(ServetuneError):
    """The sweep was stopped by a signal (Ctrl-C or SIGTERM)."""


@dataclass
class SweepOptions:
    results_root: Path | None = None
    dry_run: bool = False
    retry_failed: bool = False
    bind: str = LOCAL_BIND
    local_daemon: bool = True
    fleet: FleetSettings | None = None
    daemon_command: list[str] | None = None
    daemon_args: list[str] = field(default_factory=list)
    console: Console | None = None
    #: ``$SERVETUNE_HOME`` override: the coordinator's keys and the allow-list (servetune.keys).
    home: Path | None = None


@dataclass
class SweepReport:
    exit_code: int
    experiment_dir: Path | None
    dataset_path: Path | None
    ran: int = 0
    ok: int = 0
    failed: int = 0
    holes: int = 0


def write_dataset(store: Store) -> Path:
    """:func:`coordinator.dataset.write_dataset`, imported on first use: xarray, pandas and netCDF
    (~55 MB resident) stay out of a fleet coordinator, whose dataset rewrites are its children's."""
    from coordinator.dataset import write_dataset as write

    return write(store)


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
            if needs_run(att, retry_failed):
                todo.append(m)
            elif att is not None:
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
                          concurrency_capped=lp.max_concurrency is not None, loop_lag=outcome.client_loop_lag)
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
        if parent not in plan.sweeps_adding_followups(batches[index]):  # @max one request at a time, as @sync
            continue
        a, b = latest.get(sync.trial_id), latest.get(top.trial_id)
        if a is None or b is None or a.status != "ok" or b.status != "ok" or not a.metrics or not b.metrics:
            continue
        followups = rate_sweep_next(sweeps[parent], float(a.metrics["request_throughput"]),
                                    float(b.metrics["request_throughput"]))
        manifests = [top.model_copy(update={"load_point": lp}) for lp in followups]
        if not manifests:
            log.warning("rate sweep %s of batch %d: max throughput is not above synchronous; no follow-ups",
                        parent, index)
            continue
        batch_index = FOLLOWUP_BATCH_OFFSET + index
        store.add_trials(spec_hash, manifests, batch_index)
        todo = []
        for m in manifests:
            if needs_run(latest.get(m.trial_id), retry_failed):
                todo.append(m)
        if todo:
            planned = PlannedBatch(index=batch_index, config=batches[index].config, trials=tuple(manifests),
                                   is_baseline=batches[index].is_baseline)
            work.append(BatchWork(batch=planned, trials=tuple(todo)))
    return work


class SweepRunner:
    """One sweep of one experiment: the socket and store adapter around :class:`ControlCore`.

    It feeds the core every message and a tick each loop, and carries out what the core returns
    (persist attempts and results, send, log, show progress). Not reusable: one runner per sweep."""

    def __init__(self, spec: ExperimentSpec, source_text: str | None, options: SweepOptions):
        self.spec = spec
        self.source_text = source_text
        self.opts = options
        self.fleet = options.fleet or FleetSettings()
        # Piped output (CI logs, tests) is never wrapped, so every message stays one greppable line.
        self.console = options.console or Console(stderr=True, soft_wrap=not sys.stderr.isatty())
        self.plan = plan_experiment(spec)  # an adaptive planner's: its first batch, until the store is read
        self.spec_hash = spec.spec_hash()
        #: the ask/tell loop of an adaptive planner (None: a design fixed in advance)
        self.adaptive = (AdaptiveLoop(spec, self.spec_hash, options.retry_failed)
                         if planner_class(spec.planner.kind).adaptive else None)
        self.coordinator_id = f"coord-{uuid.uuid4().hex[:8]}"
        self.store: Store | None = None
        self.child: subprocess.Popen[bytes] | None = None
        self.child_daemon_id: str | None = None
        self.core: ControlCore | None = None
        self.progress: SweepProgress | None = None
        self.counts = {"ok": 0, "failed": 0}
        self.no_daemon = False
        self._dataset_dirty = False
        self._dataset_next = 0.0
        self.keys: SweepKeys | None = None
        self.artifacts: ArtifactSink | None = None
        self._dataset_writer: DatasetWriter | None = None
        self._clock_dirty, self._clock_next = False, 0.0  # clock.json: estimates not yet written, next write
        #: Daemon clock offsets (coordinator.clock): probed on join and every clock_probe_every_s.
        self.clocks: ClockSchedule | None = None
        self.schedule: ScheduleBook | None = None  # breakers, retries, drains (coordinator.schedule)
        self.retry_log: RetryLog | None = None
        self.drained: dict[str, str] = {}  # trial -> why it was drained to a hole
        swept = swept_names(self.plan.configs().values()) or None
        self._labels = {
            m.trial_id: f"{m.engine.label(swept) if m.backend != 'openai' else m.target} @ {m.load_point.name}"
            for m in self.plan.trials()
        }

    # ------------------------------------------------------------------ entry

    def run(self) -> SweepReport:
        if self.opts.dry_run:
            print_plan(self.plan, self.spec, output_console())
            return SweepReport(exit_code=ExitCode.OK, experiment_dir=None, dataset_path=None)
        check_grant_bounds(self.spec, [(b.config, b.trials) for b in self.plan.batches])  # before anything is written
        folder = experiment_dir(self.spec.name, self.opts.results_root)
        existed = (folder / "experiment.sqlite").exists()
        # first: missing keys or a bad --bind leave nothing written
        self.keys = keys = sweep_keys(servetune_home(self.opts.home), self.opts.local_daemon)
        try:
            endpoint = RouterEndpoint(self.opts.bind, server=keys.server, gate=keys.gate)
            try:
                self.store = store = Store.open(folder)
                try:
                    self.artifacts = ArtifactSink(folder, store, SinkPolicy(
                        quiet_s=max(1.0, 2 * self.fleet.heartbeat_interval_s), drain_max_s=self.fleet.artifact_drain_s))
                    return self._run_with_store(store, folder, existed, endpoint)
                finally:
                    if self.artifacts is not None:
                        self.artifacts.close()
                    store.close()
            finally:
                endpoint.close()
        finally:
            keys.cleanup()

    def _run_with_store(self, store: Store, folder: Path, existed: bool, endpoint: RouterEndpoint) -> SweepReport:
        running: list[tuple[str, int, str, str]] = []
        if existed:
            store.close_stale_sweeps()
            running = store.running_attempts()
            if running and self.opts.local_daemon:
                # A local sweep's daemon died with its coordinator (--exit-with-parent), and nobody
                # else knew that coordinator's random loopback port: nothing can come back for them.
                store.close_attempts([(t, a) for t, a, _, _ in running],
                                     "abandoned: the coordinator that granted it stopped without a result")
                self.console.print(f"[yellow]previous sweep did not finish: {len(running)} running attempt(s) "
                                   "recorded as transport failures; they will be run again")
                running = []
            elif running:
                self.console.print(
                    f"[yellow]previous sweep did not finish: {len(running)} attempt(s) were running; each is "
                    f"renewed if its daemon rejoins within {self.fleet.lease_ttl_s:g} s, else run again"
                )
            previous = store.latest_spec()
            if previous is not None and previous[0] != self.spec_hash:
                changes = spec_changes(previous[1], self.spec.model_dump(mode="json"))
                self.console.print("[yellow]the spec changed since the last sweep of this experiment "
                                   "(earlier results are kept, tagged by spec hash):")
                for line in changes:
                    self.console.print(f"  {line}")
        if self.adaptive is not None:  # the plan so far, from the store when resuming
            self.plan = self.adaptive.start(store)
            if self.adaptive.restored:
                self.console.print(f"resuming: the {self.spec.planner.kind} planner's history rebuilt from "
                                   f"{self.adaptive.restored} engine config(s) planned before")
        store.record_plan(self.spec_hash, self.spec.model_dump(mode="json"), self.source_text, self.plan)
        print_pruned(self.plan, self.console, notes=False)
        if self.adaptive is not None:
            self.plan = replace(self.plan, batches=self.plan.batches + tuple(self.adaptive.settle(store)))
            self._note_labels([BatchWork(batch=b, trials=b.trials) for b in self.plan.batches])
        refreshed = refresh_slo_metrics(store, self.spec)
        if refreshed:
            self.console.print(f"SLOs changed: recomputed SLO attainment and goodput of {refreshed} trial(s) "
                               "from their raw samples")
        work, skipped = select_work(self.plan, store, self.opts.retry_failed)
        followups = expand_rate_sweeps(store, self.spec, self.plan, self.spec_hash, self.opts.retry_failed)
        followups += expand_sla_searches(store, self.spec, self.plan, self.spec_hash, self.opts.retry_failed)
        self._note_labels(followups)
        work += followups
        orphans, work, unmatched = orphans_from(running, work)
        owners = store.running_key_ids()  # only the key an orphan was granted to may adopt it
        orphans = [replace(o, key_id=next((owners[(t, a)] for t, a in o.attempts.items() if (t, a) in owners), None))
                   for o in orphans]
        if unmatched:
            store.close_attempts(unmatched, "abandoned: the coordinator that granted it stopped, and the trial is "
                                            "not in this plan")
        n_todo = sum(len(w.trials) for w in work) + sum(len(o.work.trials) for o in orphans)
        total = len(self.plan.trials())
        if skipped:
            n_failed_skip = sum(1 for v in skipped.values() if v != "ok")
            self.console.print(
                f"resuming: {len(skipped)} of {total} trials already have results"
                + (f" ({n_failed_skip} measurement failures kept; --retry-failed re-runs them)" if n_failed_skip else "")
            )
        dataset_path = self._rewrite_dataset(store)
        if not work and not orphans:
            self.console.print("nothing to run: every planned trial has a result")
            if not self.opts.local_daemon and self.artifacts is not None and self.fleet.artifact_drain_s > 0:
                have = self.artifacts.index.attempts_with_artifacts()
                lacking = [t for t, a in store.latest_finished().items() if a.status == "ok" and (t, a.attempt) not in have]
                if lacking:  # their artifacts may still be spooled on a daemon's node
                    self._collect_leftover_artifacts(endpoint, store, len(lacking))
            print_ranking(store, self.spec, output_console(), dataset_path)
            print_sla(store, self.spec, self.plan, self.spec_hash, output_console(), self.opts.retry_failed, folder)
            return SweepReport(exit_code=ExitCode.OK, experiment_dir=folder, dataset_path=dataset_path)
        sweep_id = store.begin_sweep(self.spec_hash, canonical_json(sys.argv))
        wall = self.plan.wall_estimate_seconds(self.spec.backend.kind)
        estimate = None if wall is None else wall * n_todo / max(1, total)
        self.clocks = ClockSchedule(self.fleet.clock_probe_every_s)
        hw = self.spec.hardware
        preferred = prior_bindings({m.trial_id: m.hardware_target for m in self.plan.trials()},
                                   ((a.trial_id, a.hardware_class, a.started_at_us) for a in store.all_attempts())
                                   ) if hw is not None and any(t.is_filter for t in hw.targets) else {}
        for label, cls in sorted(preferred.items()):  # a resumed sweep prefers last time's class (coordinator.targets)
            self.console.print(f"resuming: hardware target {label} ran on {cls} before; it binds to {cls} again if a "
                               f"daemon of it joins within {self.fleet.recovery_after_s:g} s")
        self.core = ControlCore(
            spec=self.spec, work=work, settings=self.fleet, coordinator_id=self.coordinator_id,
            attempts=store.max_attempts(), accepted=store.accepted_submissions(), orphans=orphans,
            preferred_bindings=preferred,
        )
        self.schedule = schedule = ScheduleBook(store, self.spec.name, self.fleet, clock=self.core.clock)
        self.retry_log = RetryLog(folder)
        status = "finished"
        exit_code: int = ExitCode.OK
        old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            self.console.print(
                f"sweep [bold]{self.spec.name}[/]: {n_todo} trial(s) in {len(work) + len(orphans)} batch(es); "
                f"coordinator on {endpoint.address}; results in {folder}"
            )
            if not self.opts.local_daemon:
                self.console.print(f"waiting for daemons (up to {self.fleet.daemon_wait_s:g} s with none); on each "
                                   f"node run:\n  {join_command(endpoint.address)}")
            with SweepProgress(n_todo, estimate, self.console) as progress:
                self.progress = progress
                if self.opts.local_daemon:
                    self._start_local_daemon(endpoint.address, folder)
                try:
                    self._loop(endpoint)
                except (KeyboardInterrupt, SweepInterrupted):
                    status, exit_code = "interrupted", ExitCode.INTERRUPTED
                    self.console.print("[yellow]interrupted: stopping the daemons; finished results are kept")
                    self._execute(endpoint, self.core.abort("interrupted by user (Ctrl-C or SIGTERM)"))
                except ServetuneError as exc:
                    status, exit_code = "failed", ExitCode.ERROR
                    self.console.print(f"[red]sweep failed: {exc}")
                    self._execute(endpoint, self.core.abort(f"sweep failed: {exc}"))
                self._execute(endpoint, self.core.shutdown_all("sweep " + status))
        finally:
            signal.signal(signal.SIGTERM, old_term)
            self._stop_child()
            store.end_sweep(sweep_id, status)
            schedule.finished(status, self.core.breaker)
        dataset_path = self._rewrite_dataset(store)
        print_ranking(store, self.spec, output_console(), dataset_path)
        print_sla(store, self.spec, self.plan, self.spec_hash, output_console(), self.opts.retry_failed, folder)
        holes = self._holes(store)
        if holes:
            self._print_holes(holes)
            if exit_code == ExitCode.OK:
                exit_code = ExitCode.NO_DAEMON if self.no_daemon else ExitCode.HOLES
        return SweepReport(
            exit_code=exit_code, experiment_dir=folder, dataset_path=dataset_path,
            ran=self.counts["ok"] + self.counts["failed"], ok=self.counts["ok"], failed=self.counts["failed"],
            holes=len(holes),
        )

    def _rewrite_dataset(self, store: Store) -> Path:
        """results.nc rewritten whole, now: for a sweep of at least DATASET_BACKGROUND_TRIALS trials
        by a ``--once`` writer child (:func:`write_final`; this process never imports xarray), else,
        or if that child fails, here."""
        big = len(self.plan.trials()) >= DATASET_BACKGROUND_TRIALS
        return (write_final(store.folder) if big else None) or write_dataset(store)

    def _collect_leftover_artifacts(self, endpoint: RouterEndpoint, store: Store, lacking: int) -> None:
        """A fleet sweep with nothing to run, where ``lacking`` measured attempts have no artifact
        in the store, still takes the artifact uploads its daemons left spooled (a sweep that
        ended before they were through): for up to ``artifact_drain_s`` it
        welcomes daemons, tells each READY there is no more work (SHUTDOWN: the daemon finishes its
        uploads, then leaves) and takes their uploads; it ends sooner once a daemon has joined and
        uploads have gone quiet (:meth:`ArtifactSink.draining`, counted from the first join).
        Ctrl-C ends the wait; nothing is lost (what did not arrive stays spooled)."""
        assert self.artifacts is not None
        wait_s = self.fleet.artifact_drain_s
        log.info("nothing to run: taking leftover artifact uploads for up to %g s", wait_s)
        self.console.print(f"{lacking} measured trial(s) have no artifacts in the store yet: taking leftover "
                           f"artifact uploads for up to {wait_s:g} s (Ctrl-C ends it); daemons "
                           f"with uploads left can join with:\n  {join_command(endpoint.address)}")
        self.core = core = ControlCore(spec=self.spec, work=[], settings=self.fleet, coordinator_id=self.coordinator_id,
                                       attempts=store.max_attempts(), accepted=store.accepted_submissions())
        deadline = time.monotonic() + wait_s
        tick_s = min(TICK_S, self.fleet.heartbeat_interval_s / 4)
        joined_at: float | None = None
        try:
            with SweepProgress(0, 0.0, self.console) as progress:
                self.progress = progress
                while time.monotonic() < deadline:
                    got = endpoint.recv(int(tick_s * 1000))
                    if got is not None:
                        self._pass(endpoint, got)
                    self._grouped(endpoint, lambda deferred: self._tick(endpoint, deferred))
                    now = time.monotonic()
                    if joined_at is None and core.daemons:
                        joined_at = now
                    if joined_at is not None and not self.artifacts.draining(now, joined_at):
                        break
                self._execute(endpoint, core.shutdown_all("nothing to run"))
        except (KeyboardInterrupt, SweepInterrupted):
            self.console.print("[yellow]interrupted: leftover uploads stay spooled on their daemons")
        stored = self.artifacts.receiver.counters.get("artifacts_stored", 0)
        said = f"{stored} leftover artifact(s) stored" if joined_at is not None else f"no daemon joined within {wait_s:g} s"
        log.info("%s", said)
        self.console.print(said)

    def _holes(self, store: Store) -> dict[str, str]:
        """Planned trials with no result (never run, or last lost to transport), with why."""
        latest = store.latest_finished()
        holes: dict[str, str] = {}
        for t in store.planned_trial_ids(self.spec_hash):
            att = latest.get(t)
            lost = (att is not None and att.status == "failed" and att.failure_kind == "transport")
            if att is not None and lost and t in self.drained:  # drained after a lost attempt
                holes[t] = f"{self.drained[t]} (attempt {att.attempt} was lost: " \
                           f"{(att.error or 'transport failure').splitlines()[0]})"
            elif att is None:
                holes[t] = self.drained.get(t, "never granted (the sweep stopped first)")
            elif lost:
                holes[t] = f"attempt {att.attempt} lost: {(att.error or 'transport failure').splitlines()[0]}"
        return holes

    def _print_holes(self, holes: dict[str, str]) -> None:
        self.console.print(f"[yellow]{len(holes)} trial(s) were not measured (holes); run the sweep again to fill them:")
        for i, (trial_id, why) in enumerate(holes.items()):
            if i == 20:
                self.console.print(f"  ... and {len(holes) - 20} more")
                break
            self.console.print(f"  {self._labels.get(trial_id, trial_id[:12])}: {why}")

    def _note_labels(self, work: list[BatchWork]) -> None:
        swept = swept_names(self.plan.configs().values()) or None
        for w in work:
            for m in w.trials:
                label = m.engine.label(swept) if m.backend != "openai" else m.target
                self._labels[m.trial_id] = f"{label} @ {m.load_point.name}"

    # ------------------------------------------------------------------ local daemon

    def _start_local_daemon(self, address: str, folder: Path) -> None:
        cmd = (self.opts.daemon_command or default_daemon_command()) + [
            "start", "--coordinator", address, "--workdir", str((folder / "daemon").resolve()), "--exit-with-parent",
        ] + self._engine_args_flags() + self.opts.daemon_args
        if self.spec.backend.api_key_env:  # this user's own daemon may use the spec's API-key variable
            cmd += ["--api-key-env", self.spec.backend.api_key_env]
        logs = folder / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / f"daemon-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
        self._daemon_log = log_path
        assert self.keys is not None and self.keys.child_home is not None
        env = {**os.environ, HOME_ENV: str(self.keys.child_home)}  # its throwaway keys (coordinator.trust)
        with open(log_path, "ab") as fh:
            self.child = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        log.info("local daemon pid %d: %s (log %s)", self.child.pid, " ".join(cmd), log_path)
        assert self.progress is not None
        self.progress.phase("starting the local daemon")

    def _engine_args_flags(self) -> list[str]:
        """The local daemon asks its vLLM which engine flags it accepts only for a ``vllm`` sweep, and
        caches the answer in this user's servetune home (the child's own is a throwaway one)."""
        if self.spec.backend.kind != "vllm":
            return ["--no-check-engine-args"]
        return ["--engine-args-cache", str(engine_args_cache_dir(servetune_home()).resolve())]

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
        core = self.core
        assert core is not None
        started = time.monotonic()
        budget = self.spec.budgets.sweep_timeout_s
        tick_every = min(TICK_S, self.fleet.heartbeat_interval_s / 4)
        core.check_every_s = tick_every  # suspicion by suspect_after_s of silence, not a tick after
        last_tick = 0.0
        if len(self.plan.trials()) >= DATASET_BACKGROUND_TRIALS and self.store is not None:
            self._dataset_writer = DatasetWriter(self.store.folder, debounce_s=DATASET_DEBOUNCE_S)
            self.store.defer_result_files = True  # the writer writes them; the store's close any left
        finished_at: float | None = None
        try:
            while not core.finished or self._draining_artifacts(finished_at):
                if core.finished and finished_at is None:
                    finished_at = time.monotonic()
                got = endpoint.recv(int(tick_every * 1000))
                drained = True
                if got is not None:
                    drained = self._pass(endpoint, got)
                now = time.monotonic()
                # Silence is judged on an empty queue (a backlog is not the daemons' silence), or
                # at the latest every heartbeat interval while the loop is behind.
                if now - last_tick >= (tick_every if drained else self.fleet.heartbeat_interval_s):
                    last_tick = now
                    core.grant_budget = GRANTS_PER_PASS if drained else GRANTS_WHEN_BEHIND
                    self._grouped(endpoint, lambda deferred: self._tick(endpoint, deferred))
                    self._flush_dataset()
                if self.child is not None and self.child.poll() is not None:
                    if core.finished:
                        break  # told there is no more work, it finished its uploads and left: nothing more comes
                    code = self.child.returncode
                    if self.child_daemon_id:
                        self._execute(endpoint, core.daemon_lost(self.child_daemon_id,
                                                                 f"local daemon exited with code {code}"))
                    raise ServetuneError(f"the local daemon exited with code {code}; its log: {self._daemon_log}")
                if budget is not None and not core.stopping and time.monotonic() - started > budget:
                    left = core.stop()
                    self.console.print(f"[yellow]sweep budget of {budget:.0f} s spent: {left} batch(es) left as holes")
        finally:
            self._write_clocks(force=True)
            if self._dataset_writer is not None:
                self._dataset_writer.close()  # before the final rewrite, which the caller does itself
                self._dataset_writer = None
                if self.store is not None:
                    self.store.defer_result_files = False
                    self.store.settle_result_files()  # the files it did not get to, before anyone reads them

    def _draining_artifacts(self, finished_at: float | None) -> bool:
        """Every result is in: go on while artifacts are still arriving (:mod:`coordinator.artifact_sink`)."""
        if self.artifacts is None or (self.core is not None and self.core.stopping):
            return False
        now = time.monotonic()
        return self.artifacts.draining(now, now if finished_at is None else finished_at)

    def _tick(self, endpoint: RouterEndpoint, deferred: list[Instruction]) -> None:
        """The periodic step: keys removed from the allow-list cut their daemons' sessions (their
        leases fenced), then the core's tick (silence, expiry, waiting READYs)."""
        core = self.core
        assert core is not None
        for key in endpoint.gate.take_removed():
            self._execute(endpoint, core.revoke_key(key, f"key {key_id(key)} removed from the allow-list"), deferred)
        self._execute(endpoint, core.tick(), deferred)
        if self.artifacts is not None:
            self.artifacts.expire(time.monotonic())
        if self.clocks is not None:
            self._clock_report(endpoint, self.clocks.step(core.daemons))
            self._write_clocks()
        if self.schedule is not None:
            self.schedule.flush()  # joins and departures since the last rewrite

    def _clock_reply(self, endpoint: RouterEndpoint, got: tuple[str, Message, str]) -> bool:
        """A TIME_REPLY is taken the moment it is read (its arrival is a clock stamp), never queued
        behind the pass: counted only from the daemon's live session under its own key. True: it was
        one and is done with; False: for the pass, like any message (one from a session the core does
        not know is answered REJOIN, one under another key refused)."""
        daemon_id, msg, key = got
        if not isinstance(msg, TimeReply):
            return False
        core, clocks = self.core, self.clocks
        if core is None or not core.knows(daemon_id, msg.session_nonce) or core.key_of(daemon_id) != key:
            return False
        if clocks is not None:
            self._clock_report(endpoint, clocks.reply(daemon_id, msg))
            self._clock_report(endpoint, clocks.step_one(daemon_id))  # its next probe, at once
        return True

    def _clock_report(self, endpoint: RouterEndpoint, step: ClockStep) -> None:
        """Send the probes of ``step``; print and keep (``clock.json``) the estimates it finished."""
        for daemon_id, probe in step.probes:
            endpoint.send(daemon_id, probe)
        for est in step.estimates:  # on the console (the coordinator's log, -v, would repeat it)
            log.debug("%s", est.line())
            self.console.print(est.line(), markup=False, highlight=False)
        for daemon_id in step.silent:
            log.warning("clock: daemon %s answered none of its time probes; its offset is unknown", daemon_id)
        if step.estimates:
            self._clock_dirty = True  # written by the next tick due (_write_clocks), not per estimate

    def _write_clocks(self, *, force: bool = False) -> None:
        """Write clock.json and schedule.json's offsets when estimates changed, at most every
        :data:`CLOCK_WRITE_S` (each write holds every daemon's estimate: per estimate, that was
        O(daemons) work per daemon on the loop); ``force``: now (the loop's end)."""
        if not self._clock_dirty or self.store is None or self.clocks is None:
            return
        now = time.monotonic()
        if not force and now < self._clock_next:
            return
        self._clock_dirty, self._clock_next = False, now + CLOCK_WRITE_S
        offsets = self.clocks.offsets()
        try:
            write_clock_file(self.store.folder, offsets, self.fleet.clock_probe_every_s)
        except OSError as exc:
            log.warning("cannot write %s: %s", self.store.folder / "clock.json", exc)
        if self.schedule is not None:  # schedule.json carries them too
            self.schedule.clock_offsets(offsets)

    def _pass(self, endpoint: RouterEndpoint, first: tuple[str, Message, str]) -> bool:
        """One pass over the messages already queued (``first`` and up to :data:`DRAIN_MAX` more).

        Group commit: every store write the core asks for in the pass (results, attempts of
        GRANTs, transitions, closed attempts) goes into one transaction, one fsync; only after it
        has committed are the pass's answers sent (ACKs, GRANTs and the rest, in the order the
        core gave them), then the result files written. HEARTBEATs of known sessions are handled
        first and answered at once: renewing writes nothing, and a busy pass must not delay
        RENEWED. Returns True when the queue was emptied."""
        core, store = self.core, self.store
        assert core is not None and store is not None
        batch = [] if self._clock_reply(endpoint, first) else [first]
        t_end = time.monotonic() + DRAIN_MAX_S
        drained = False
        while len(batch) < DRAIN_MAX and time.monotonic() < t_end:
            got = endpoint.recv(0)
            if got is None:
                drained = True
                break
            if not self._clock_reply(endpoint, got):
                batch.append(got)
        if not batch:
            return drained
        core.grant_budget = GRANTS_PER_PASS if drained else GRANTS_WHEN_BEHIND
        first_pass = {i for i, (d, m, _) in enumerate(batch)
                      if isinstance(m, Heartbeat) and core.knows(d, m.session_nonce)}
        for i in sorted(first_pass):
            self._execute(endpoint, core.handle(*batch[i]))

        def rest(deferred: list[Instruction]) -> None:
            for i, (daemon_id, msg, key) in enumerate(batch):
                if i not in first_pass:
                    self._execute(endpoint, core.handle(daemon_id, msg, key), deferred)

        self._grouped(endpoint, rest)
        return drained

    def _grouped(self, endpoint: RouterEndpoint, run: Callable[[list[Instruction]], None]) -> None:
        """``run(deferred)`` inside one store transaction, collecting its sends in ``deferred``;
        after the COMMIT (every result of it durable), send them in order and write the result files;
        then the artifact messages of the group are queued and a few queued ones carried out
        (:meth:`ArtifactSink.pump`: chunk writes and their fsyncs never hold up the group's commit
        or its ACKs, and a burst of them is spread over passes).
        An exception from ``run`` (the local daemon left, Ctrl-C, a store refusal) comes after what
        the core already handled: that is committed and answered, then the exception goes on."""
        store = self.store
        assert store is not None
        deferred: list[Instruction] = []
        stopped: BaseException | None = None
        with store.group():
            try:
                run(deferred)
            except BaseException as exc:
                stopped = exc
        self._execute(endpoint, [ins for ins in deferred if not isinstance(ins, ReceiveArtifact)])
        store.write_result_files()
        self._execute(endpoint, [ins for ins in deferred if isinstance(ins, ReceiveArtifact)])
        if self.artifacts is not None:
            for daemon_id, reply in self.artifacts.pump(time.monotonic()):
                endpoint.send(daemon_id, reply)
        if stopped is not None:
            raise stopped

    def _flush_dataset(self) -> None:
        """Rewrite results.nc at most every DATASET_DEBOUNCE_S while results arrive (each result is
        durable in the store before its ACK; the dataset is a view of it): in the background
        writer's process when there is one, else here. The final rewrite is the caller's."""
        if not self._dataset_dirty or self.store is None:
            return
        if time.monotonic() >= self._dataset_next:
            writer = self._dataset_writer
            if writer is not None and writer.alive and writer.request():
                self._dataset_dirty = False
                self._dataset_next = time.monotonic() + DATASET_DEBOUNCE_S
                return
            if writer is not None:  # it died: this loop writes the files and results.nc again
                log.warning("the results.nc writer process is gone; rewriting in the coordinator")
                self._dataset_writer = None
                writer.close(timeout_s=1.0)
                self.store.defer_result_files = False
                self.store.materialize_result_files(0)
            t0 = time.monotonic()
            write_dataset(self.store)
            self._dataset_dirty = False
            took = time.monotonic() - t0
            self._dataset_next = time.monotonic() + rewrite_wait_s(DATASET_DEBOUNCE_S, took)

    def _execute(self, endpoint: RouterEndpoint, instructions: list[Instruction],
                 deferred: list[Instruction] | None = None) -> None:
        """Carry out the core's instructions in order. With ``deferred`` (inside a store group),
        sends are appended there instead, to go out once the group has committed."""
        store, progress, core = self.store, self.progress, self.core
        assert store is not None and progress is not None and core is not None
        for ins in instructions:
            if isinstance(ins, (Send, ReceiveArtifact)) and deferred is not None:
                deferred.append(ins)
            elif isinstance(ins, ReceiveArtifact):
                if self.artifacts is not None:  # carried out by _grouped's pump, a few per pass
                    for reply in self.artifacts.enqueue(ins, time.monotonic()):
                        endpoint.send(ins.daemon_id, reply)
            elif isinstance(ins, Send):
                if not endpoint.send(ins.daemon_id, ins.msg) and isinstance(ins.msg, Grant):
                    self._execute(endpoint, core.daemon_lost(ins.daemon_id, f"could not reach daemon {ins.daemon_id}"))
            elif isinstance(ins, BeginAttempts):
                store.begin_attempts(ins.attempts, daemon_id=ins.daemon_id, batch_id=ins.batch_id,
                                     spec_hash=self.spec_hash, daemon_key_id=_key_id_or_none(core.key_of(ins.daemon_id)))
            elif isinstance(ins, Accept):
                self._accept(endpoint, ins)
            elif isinstance(ins, CloseAttempts):
                for trial_id, attempt in store.close_attempts(ins.pairs, ins.reason):
                    log.warning("trial %s attempt %d: transport failure: %s", trial_id[:12], attempt, ins.reason)
                self._dataset_dirty = True
            elif isinstance(ins, Transition):
                store.record_transition(ins.trial_id, ins.epoch, ins.batch_id, ins.phase, ins.detail)
                label = self._labels.get(ins.trial_id or "", ins.batch_id)
                progress.phase(f"{label}: {ins.phase.replace('_', ' ')}" + (f" ({ins.detail})" if ins.detail else ""))
            elif isinstance(ins, Notice):
                log.log(ins.level, "%s", ins.text)
                if ins.level >= logging.WARNING:
                    progress.note(ins.text.splitlines()[0])
                else:
                    progress.phase(ins.text)
            elif isinstance(ins, DaemonJoined):
                if self.child is not None and ins.pid == self.child.pid:
                    self.child_daemon_id = ins.daemon_id
                log.info("daemon %s joined: %s (%s)", ins.daemon_id, ins.hardware_class, ins.hostname)
                if self.clocks is not None:
                    self.clocks.join(ins.daemon_id)  # its clock is probed before its first batch measures
                if self.schedule is not None:
                    self.schedule.joined(ins.daemon_id, ins.hardware_class, ins.hostname, core.breaker)
                progress.phase(f"daemon {ins.daemon_id} joined ({ins.hardware_class})")
            elif isinstance(ins, DaemonLeft):
                if self.clocks is not None:
                    self.clocks.leave(ins.daemon_id)
                if self.schedule is not None:
                    self.schedule.left(ins.daemon_id, ins.reason, core.breaker)
                if ins.daemon_id == self.child_daemon_id and not core.finished:
                    if ins.reason.startswith("signal "):
                        raise SweepInterrupted(f"the local daemon stopped on {ins.reason}")
                    raise ServetuneError(f"the local daemon left: {ins.reason}")
            elif isinstance(ins, Refused):
                endpoint.gate.refuse("identity", f"{ins.reason} (key {key_id(ins.key)})", once_per=ins.key)
            elif isinstance(ins, (BreakerChanged, Drained, RetryEvent)):
                self._schedule_change(ins)
            elif isinstance(ins, FailedOver):
                self._failed_over(ins)
            elif isinstance(ins, NoDaemon):
                self.no_daemon = True
                self.console.print(f"[red]no daemon connected for {ins.waited_s:.0f} s: ending the sweep")

    def _schedule_change(self, ins: BreakerChanged | Drained | RetryEvent) -> None:
        """A breaker moved (DOWN / UP on the console), a class was drained to holes, or a trial
        was retried (a line of retries.jsonl): kept in the store's schedule state and schedule.json."""
        core = self.core
        assert core is not None
        if isinstance(ins, RetryEvent):
            if self.retry_log is not None:
                self.retry_log.append([ins])
            if self.schedule is not None:
                self.schedule.retried([ins], core.breaker)
            return
        if isinstance(ins, BreakerChanged):
            line = ins.line
            if self.schedule is not None:
                self.schedule.breaker(core.breaker, {ins.daemon_id})
        else:
            for t in ins.trial_ids:
                self.drained[t] = ins.reason
            line = f"DRAINED {len(ins.trial_ids)} trial(s) to holes: {ins.reason}"
            if self.schedule is not None:
                self.schedule.drained(ins)
            self._dataset_dirty = True
        log.warning("%s", line)
        self.console.print(line, markup=False, highlight=False)  # its own plain line: DOWN / UP / PROBE / DRAINED

    def _failed_over(self, ins: FailedOver) -> None:
        """A drained batch moved to an interchangeable class: its trials (new ids, tagged
        ``failover-from:``) are recorded and queued; each original stays a hole naming its stand-in,
        and each move is a ``failover`` line of retries.jsonl."""
        store, core, progress = self.store, self.core, self.progress
        assert store is not None and core is not None and progress is not None
        fo = ins.failover
        store.add_trials(self.spec_hash, list(fo.moved.trials), fo.moved.batch.index)
        self.drained.update(fo.holes)
        self._note_labels([fo.moved])
        progress.add_total(len(fo.moved.trials))
        events = [RetryEvent("failover", old, 0, "", why, self.fleet.max_transport_retries)
                  for old, why in fo.holes.items()]
        if self.retry_log is not None:
            self.retry_log.append(events)
        if self.schedule is not None:
            self.schedule.retried(events, core.breaker)
        self._dataset_dirty = True
        line = (f"FAILOVER {len(fo.holes)} trial(s) from {fo.source} to {fo.to_class} "
                f"(new trial ids, tagged failover-from:{fo.source}); the originals stay holes")
        log.warning("%s", line)
        self.console.print(line, markup=False, highlight=False)

    def _accept(self, endpoint: RouterEndpoint, ins: Accept) -> None:
        store, progress, core = self.store, self.progress, self.core
        assert store is not None and progress is not None and core is not None
        msg, manifest = ins.result, ins.manifest
        outcome = msg.outcome
        status, kind, error = outcome.status, outcome.failure_kind, outcome.error
        metrics: dict[str, Any] | None = None
        problem = implausible(outcome)  # kept as a parse failure with its payload (record["outcome"])
        if problem:
            status, kind, error = "failed", "parse", f"implausible result: {problem}"
        elif status == "ok":
            try:
                metrics = self._metrics(outcome, manifest.load_point)
            except ValueError as exc:
                status, kind, error = "failed", "parse", f"cannot summarize the samples: {exc}"
        elif kind is None:
            kind = "measurement"
        if metrics is None:
            metrics = self._extras(outcome)
        warning = core.retry_warning(msg.trial_id)  # attempts of it lost in this sweep: said on the record
        if warning:
            metrics["retry_warning"] = warning
        head = _json({
            "trial_id": msg.trial_id,
            "attempt": msg.epoch,
            "submission_id": msg.submission_id,
            "daemon_id": ins.daemon_id,
            "daemon_key_id": _key_id_or_none(core.key_of(ins.daemon_id)),
            "daemon_name": endpoint.gate.name(core.key_of(ins.daemon_id)),
            "batch_id": msg.batch_id,
            "spec_hash": self.spec_hash,
            "status": status,
            "failure_kind": kind,
        })
        metrics_json = _json(metrics)  # once: for the record and for the attempt's row
        # the record, serialized once: pydantic writes the two models' JSON itself (as model_dump(mode="json"))
        record = (f'{head[:-1]},"metrics":{metrics_json},"manifest":{manifest.model_dump_json()},'
                  f'"outcome":{outcome.model_dump_json()}}}')
        hw = outcome.fingerprint.hardware_class if outcome.fingerprint else None
        store.finish_attempt(
            msg.trial_id, msg.epoch, status=status, failure_kind=kind if status != "ok" else None, error=error,
            submission_id=msg.submission_id, record=record, metrics=metrics_json, hardware_class=hw,
        )
        self._dataset_dirty = True
        self.counts["ok" if status == "ok" else "failed"] += 1
        if status == "ok" and DERIVED_MARK in manifest.load_point.name:
            added = expand_rate_sweeps(store, self.spec, self.plan, self.spec_hash, self.opts.retry_failed,
                                       only={msg.trial_id})
            self._note_labels(added)
            for work in added:
                if core.add(work):
                    progress.add_total(len(work.trials))
                    rates = ", ".join(m.load_point.name.rsplit(DERIVED_MARK, 1)[1] for m in work.trials)
                    progress.phase(f"rate sweep: queued {len(work.trials)} follow-up rate(s): {rates}")
        if DERIVED_MARK in manifest.load_point.name and (status == "ok" or kind != "transport"):
            for work in expand_sla_searches(store, self.spec, self.plan, self.spec_hash, self.opts.retry_failed,
                                            only={msg.trial_id}):
                self._note_labels([work])
                if core.add(work):
                    progress.add_total(len(work.trials))
                    rates = ", ".join(m.load_point.name.rsplit(DERIVED_MARK, 1)[1] for m in work.trials)
                    progress.phase(f"SLA search: queued round {work.batch.index // 1_000_000 + 1}: {rates}")
        if self.adaptive is not None and not manifest.is_baseline and not core.stopping:
            self._ask_planner(store, core, progress)
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

    def _ask_planner(self, store: Store, core: ControlCore, progress: SweepProgress) -> None:
        """A result came in: tell the adaptive planner the configs it finished, queue what it asks next."""
        assert self.adaptive is not None
        batches = self.adaptive.settle(store)
        if not batches:
            return
        self.plan = replace(self.plan, batches=self.plan.batches + tuple(batches))
        queued = 0
        for b in batches:
            latest = store.latest_finished_of([m.trial_id for m in b.trials])
            todo = tuple(m for m in b.trials if needs_run(latest.get(m.trial_id), self.opts.retry_failed))
            if not todo:
                continue
            work = BatchWork(batch=b, trials=todo)
            self._note_labels([work])
            if core.add(work):
                progress.add_total(len(todo))
                queued += 1
        if queued:
            progress.phase(f"{self.spec.planner.kind} planner: queued {queued} more engine config batch(es)")

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
        m = summary_dict(outcome.samples, outcome.window_s, self.spec.slos, offered_rate=outcome.offered_rate,
                         concurrency_capped=lp.max_concurrency is not None, loop_lag=outcome.client_loop_lag)
        return {**m, **self._extras(outcome)}  # summarize()'s model_dump(mode="json"), without the model


def join_command(address: str) -> str:
    """The exact ``daemon start`` command a node runs to join a coordinator bound at ``address``
    (a wildcard interface is replaced by this host's name, which the node must be able to resolve)."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    if host in ("0.0.0.0", "*", "::", "[::]"):
        host = socket.getfqdn()
    return f"daemon start --coordinator tcp://{host}:{port}"


def _json(value: Any) -> str:
    """JSON text of plain data, as ``json.dumps`` reads it back (NaN and infinity as its constants),
    compact and in UTF-8: pydantic-core's encoder, three times as fast on a result's metrics."""
    return pydantic_core.to_json(value, inf_nan_mode="constants").decode()


@functools.lru_cache(maxsize=4096)  # a SHA-256 per result and per GRANT, of a few keys (one a daemon)
def _key_id_or_none(key: str) -> str | None:
    return key_id(key) if key else None


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise SweepInterrupted(f"received signal {signum}")
