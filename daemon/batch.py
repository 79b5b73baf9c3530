"""Run one granted batch: start vLLM for its engine config, drive each load point, report results.

One server serves every trial of the batch. Between load points the runner waits until vLLM
reports no running or waiting request and resets the prefix cache, so one measurement does not
leak into the next. A server that will not start, dies, or runs past the trial budget yields a
``measurement`` failure carrying its exit code and log tail; the batch goes on where it can.
When the daemon is told to stop mid-trial (its stop event, or :meth:`BatchRunner.abort` of the
batch: a fence when its lease ran out or was revoked), that trial is abandoned and nothing more is
submitted for the batch (the coordinator records the attempt as a transport failure and re-runs
it); the runner returns at once and is ready for the next grant.
A load point its stop conditions ended early (error budget, over-saturation) is a result, status
ok with ``stopped_early`` set; only the trial deadline makes a stop a failure. During each
measurement a :class:`~daemon.scrape.MetricsScraper` reads the server's ``/metrics`` every 0.5 s
until the server drained; the series goes with the result (``TrialOutcome.server_series``). Over
the same span a :class:`~daemon.telemetry.TelemetrySampler` reads the trial's GPUs through NVML
(power, temperature, SM clock, memory used): its summary is ``TrialOutcome.gpu_telemetry`` (on a
node without NVML it says that nothing was sampled), its readings the ``gpu_telemetry.json``
artifact. The GPU topology rides on the fingerprint of every result.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from daemon.artifact_spool import ArtifactSpool
from daemon.endpoint import Endpoint, ServerRequestError
from daemon.gpusets import GPUSet, batch_gpu_set, server_env
from daemon.loadgen import REASON_DEADLINE, run_load_point
from daemon.models import ModelResolutionError, resolve_model
from daemon.preflight import Preflight, PreflightFailed, PreflightResult, batch_preflight
from daemon.scrape import MetricsScraper
from daemon.server import ServerStartError, VLLMServer, vllm_command
from daemon.serverlog import classify_failure
from daemon.sim_backend import server_info, sim_fingerprint, sim_server, simulate_trial, trial_seed
from daemon.telemetry import Telemetry, TelemetrySampler
from servetune.errors import ServetuneError
from servetune.messages import BatchError, Grant, GrantedTrial, Phase, Result, State
from servetune.result import FailureKind, Fingerprint, RequestSample, ServerInfo, TrialOutcome
from servetune.sim.engine import SimStartError
from servetune.spec import refused_server_env, refused_server_env_text

log = logging.getLogger(__name__)

#: Where a runner's messages go (the daemon's outbox, drained by its socket thread).
Emit = Callable[[State | Result | BatchError], None]
#: The session nonce on the messages a runner emits; the daemon's session stamps the current one
#: on each message it sends (:class:`daemon.session.DaemonSession`).
UNSTAMPED = "unstamped"


def now_us() -> int:
    return time.time_ns() // 1000


class _Unset:
    """No GPU set assigned (:attr:`BatchRunner.gpu_set`)."""


UNSET = _Unset()


class _Cancel(threading.Event):
    """One batch's cancel event; it also reads as set once the daemon-wide ``stop`` is set (the
    load generator polls ``is_set``)."""

    def __init__(self, stop: threading.Event):
        super().__init__()
        self._daemon_stop = stop

    def is_set(self) -> bool:
        return super().is_set() or self._daemon_stop.is_set()


class BatchLog(logging.Handler):
    """The daemon's log lines of one batch (records of the ``daemon`` loggers from the thread that
    runs it, at most :attr:`MAX_CHARS`, then the rest dropped): spooled with each attempt as its
    ``client_log`` artifact ``batch.log``."""

    MAX_CHARS = 1024 * 1024

    def __init__(self) -> None:
        super().__init__()
        self._thread = threading.get_ident()
        self._parts: list[str] = []
        self._chars = 0
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread != self._thread or self._chars >= self.MAX_CHARS:
            return
        line = self.format(record) + "\n"
        self._parts.append(line)
        self._chars += len(line)

    @property
    def text(self) -> str:
        return "".join(self._parts)


@dataclass
class BatchContext:
    workdir: Path
    fingerprint: Fingerprint
    server_cpus: list[int] | None
    #: How this node starts vLLM, as its operator set it (``daemon start --vllm-python`` /
    #: ``--vllm-launch``); a GRANT never says.
    vllm_python: str | None = None
    #: where finished attempts' artifacts are kept for upload (:mod:`daemon.artifact_spool`); None: not kept
    spool: ArtifactSpool | None = None
    vllm_launch: list[str] | None = None
    #: Environment variables a GRANT's ``backend.api_key_env`` may name (``daemon start
    #: --api-key-env``): a key is sent only to the endpoint of a variable the operator allowed.
    api_key_envs: frozenset[str] = frozenset()
    #: This node's preflight (:mod:`daemon.preflight`), run before each batch; None: none.
    preflight: Preflight | None = None


class BatchRunner:
    """Runs grants one at a time, on one worker thread. ``emit`` queues a message for the daemon's
    socket thread; ``stop`` is the daemon-wide stop event (checked between steps).

    :meth:`abort` may be called from any thread: it cancels the batch running now (each
    :meth:`run` has its own cancel event, which the load generator watches) and kills its server
    without waiting, so the caller's loop stays free.
    """

    def __init__(self, ctx: BatchContext, emit: Emit, stop: threading.Event):
        self.ctx = ctx
        self.emit = emit
        self.stop = stop
        self._server: VLLMServer | None = None
        self._lock = threading.Lock()
        self._cancel: threading.Event = _Cancel(stop)  # of the batch running now
        self._batch_id: str | None = None
        self._batch_log = BatchLog()
        #: The GPU set the daemon's slots (:mod:`daemon.slots`) gave the next batch; unset: the best
        #: set of the batch's ``tensor_parallel_size`` (a runner used on its own, one batch at a time).
        self.gpu_set: GPUSet | None | _Unset = UNSET
        #: GPUs of that set another batch of this daemon uses (declared co-tenancy): preflight skips them.
        self.co_tenanted: tuple[int, ...] = ()

    def _gpus(self, grant: Grant) -> GPUSet | None:
        if not isinstance(self.gpu_set, _Unset):
            return self.gpu_set
        return batch_gpu_set(self.ctx.fingerprint, grant.config.args.tensor_parallel_size)

    def abort(self, batch_id: str | None = None) -> None:
        """Cancel batch ``batch_id`` (any batch when None) if it is the one running: its load stops,
        its server is killed in the background, nothing more of it is emitted but what was on its
        way. A batch that is not running is left alone."""
        with self._lock:
            if self._batch_id is None or (batch_id is not None and batch_id != self._batch_id):
                return
            self._cancel.set()
            server = self._server
        if server is not None:
            threading.Thread(target=server.stop, name="abort-server", daemon=True).start()

    def _stopped(self) -> bool:
        return self._cancel.is_set()

    def _state(self, grant: Grant, trial: GrantedTrial | None, phase: Phase, detail: str = "") -> None:
        self.emit(
            State(session_nonce=UNSTAMPED, batch_id=grant.batch_id, trial_id=trial.trial_id if trial else None,
                  epoch=trial.attempt if trial else grant.epoch, phase=phase, detail=detail)
        )

    def _result(self, grant: Grant, trial: GrantedTrial, outcome: TrialOutcome) -> None:
        self.emit(
            Result(session_nonce=UNSTAMPED, batch_id=grant.batch_id, trial_id=trial.trial_id, epoch=trial.attempt,
                   submission_id=uuid.uuid4().hex, outcome=outcome)
        )

    def _fail_all(self, grant: Grant, trials: list[GrantedTrial], started_us: int, error: str,
                  server: ServerInfo | None, exit_code: int | None, log_tail: str | None,
                  kind: FailureKind = "measurement", fingerprint: Fingerprint | None = None) -> None:
        for trial in trials:
            self._result(grant, trial, TrialOutcome(
                status="failed", failure_kind=kind, error=error, exit_code=exit_code, log_tail=log_tail,
                server=server, fingerprint=fingerprint or self.ctx.fingerprint, started_at_us=started_us, finished_at_us=now_us(),
            ))
            self._keep_artifacts(trial, server)

    def run(self, grant: Grant) -> None:
        """Run ``grant`` to its end (or until stopped or aborted). An exception escaping it is a
        bug of the daemon's own code; the caller reports it (BATCH_ERROR)."""
        with self._lock:
            self._cancel, self._batch_id = _Cancel(self.stop), grant.batch_id
        self._batch_log = BatchLog()
        owner = logging.getLogger("daemon")
        owner.addHandler(self._batch_log)
        try:
            if self.ctx.preflight is not None:
                checked = batch_preflight(self.ctx.preflight, grant, self.ctx.fingerprint, self._gpus(grant),
                                          self.co_tenanted, defer_vllm_import=True)
                if not checked.ok:  # a daemon error (BATCH_ERROR), never a result: see daemon.agent
                    raise PreflightFailed(checked)
            self._run(grant)
        finally:
            owner.removeHandler(self._batch_log)
            with self._lock:
                self._batch_id = None

    def _run(self, grant: Grant) -> None:
        if grant.backend.kind == "openai":
            self._run_external(grant)
            return
        if grant.backend.kind == "sim":
            self._run_sim(grant)
            return
        started = now_us()
        refused = refused_server_env(grant.config.env)
        if refused:  # never started: the GRANT asked for an environment this node does not take from a spec
            log.error("batch %s refused: %s", grant.batch_id, refused_server_env_text(refused))
            self._fail_all(grant, grant.trials, started, refused_server_env_text(refused), None, None, None, "config")
            return
        try:
            model = resolve_model(grant.model)
        except ModelResolutionError as exc:
            self._fail_all(grant, grant.trials, started, str(exc), None, None, None)
            return
        logs = self.ctx.workdir / "logs"
        gpu_env = server_env(self._gpus(grant), grant.config.env)
        server = VLLMServer(
            model=model.model_arg,
            served_name=grant.model.served_name,
            config=grant.config.model_copy(update={"env": {**gpu_env, **grant.config.env}}) if gpu_env else grant.config,
            command=vllm_command(self.ctx.vllm_python, self.ctx.vllm_launch),
            log_path=logs / f"server-{grant.batch_id}-epoch{grant.epoch}-{uuid.uuid4().hex[:6]}.log",
            load_format=model.load_format,
            server_cpus=self.ctx.server_cpus,
        )
        with self._lock:
            self._server = server
        if self._stopped():
            return
        self._state(grant, None, "server_starting", grant.config.label())
        try:
            try:
                info = server.start(timeout_s=grant.budgets.server_start_timeout_s)
            except ServerStartError as exc:
                self._record_server(server)
                self._state(grant, None, "server_failed", exc.reason)
                if self._stopped():  # stopped while starting: nothing to judge, no import to wait for
                    return
                broken = self.ctx.preflight.vllm.after_failed_start() if self.ctx.preflight is not None else None
                if broken is not None:  # vLLM itself does not import here: a daemon error, never the config's
                    raise PreflightFailed(PreflightResult((broken,))) from exc
                if not self._stopped():
                    self._fail_all(grant, grant.trials, started, f"server would not start: {exc.reason}",
                                   server.info(), exc.exit_code, exc.log_tail)
                return
            self._record_server(server)
            if self.ctx.preflight is not None:
                self.ctx.preflight.vllm.started()
            self._state(grant, None, "server_ready", f"{info.startup_s or 0:.0f} s, KV cache {info.kv_cache_tokens} tokens")
            for i, trial in enumerate(grant.trials):
                if self._stopped():
                    return
                if not server.is_alive():
                    code = server.returncode
                    self._fail_all(grant, grant.trials[i:], now_us(), f"server died (exit code {code})",
                                   server.info(), code, server.log_tail())
                    return
                self._run_trial(grant, trial, server, vocab_size=model.vocab_size,
                                tokenizer_path=model.tokenizer_path)
        finally:
            server.stop()
            self._record_server(server, stopped=True)
            with self._lock:
                self._server = None

    def _run_external(self, grant: Grant) -> None:
        """The ``openai`` backend: measure an endpoint the user already runs; start and stop nothing."""
        started = now_us()
        backend = grant.backend
        assert backend.base_url is not None
        api_key = None
        if backend.api_key_env and backend.api_key_env not in self.ctx.api_key_envs:
            self._fail_all(grant, grant.trials, started,
                           f"backend.api_key_env {backend.api_key_env} is not a variable this node lets a coordinator "
                           f"use as an API key: start the daemon with --api-key-env {backend.api_key_env}",
                           None, None, None)
            return
        if backend.api_key_env:
            api_key = os.environ.get(backend.api_key_env)
            if not api_key:
                self._fail_all(grant, grant.trials, started,
                               f"environment variable {backend.api_key_env} (backend.api_key_env) is not set on this node",
                               None, None, None)
                return
        try:
            model = resolve_model(grant.model)
        except ModelResolutionError as exc:
            self._fail_all(grant, grant.trials, started, str(exc), None, None, None)
            return
        endpoint = Endpoint(backend.base_url, has_metrics=backend.scrape_metrics, api_key=api_key)
        self._state(grant, None, "server_ready", f"external endpoint {backend.base_url}")
        for trial in grant.trials:
            if self._stopped():
                return
            self._run_trial(grant, trial, endpoint, vocab_size=model.vocab_size, api_key=api_key,
                            tokenizer_path=model.tokenizer_path)

    def _run_sim(self, grant: Grant) -> None:
        """The ``sim`` backend (SIMULATED, :mod:`daemon.sim_backend`): no server starts; each load point
        is played against the simulated vLLM and yields the record a real run would."""
        started = now_us()
        fingerprint = sim_fingerprint(self.ctx.fingerprint, grant.backend, grant.config)
        try:
            server = sim_server(grant.backend, grant.config)
        except SimStartError as exc:  # what vLLM logs when it refuses to start, classified as for a real server
            reason = classify_failure(exc.log_line) or exc.log_line
            self._state(grant, None, "server_failed", reason)
            self._fail_all(grant, grant.trials, started, f"server would not start: exited with code 1: {reason}",
                           server_info(grant.backend, grant.config), 1, exc.log_line, fingerprint=fingerprint)
            return
        info = server_info(grant.backend, grant.config, server)
        self._state(grant, None, "server_ready", f"SIMULATED {server.profile.name}, KV cache {info.kv_cache_tokens} tokens")
        tokenizer = resolve_model(grant.model).tokenizer_path if grant.model.source == "tiny" else None
        for trial in grant.trials:
            if self._stopped():
                return
            lp = trial.manifest.load_point
            t_start = now_us()
            self._state(grant, trial, "measuring", lp.name)
            sim = simulate_trial(server, grant.backend, lp, seed=trial_seed(trial.trial_id),
                                 deadline_s=grant.budgets.trial_timeout_s, vocab_size=server.shape.vocab_size,
                                 tokenizer_path=tokenizer, base_ns=time.monotonic_ns(),
                                 drain_timeout_s=grant.budgets.drain_timeout_s)
            failed = sim.stopped_early == REASON_DEADLINE
            self._result(grant, trial, TrialOutcome(
                status="failed" if failed else "ok", failure_kind="measurement" if failed else None,
                error=f"timed out under load: {sim.stopped_early} ({grant.budgets.trial_timeout_s:.0f} s budget)"
                if failed else None,
                samples=sim.samples, window_s=sim.window_s, offered_rate=sim.offered_rate,
                stopped_early=sim.stopped_early, server=info, server_counters=sim.counters, server_series=sim.series,
                fingerprint=fingerprint, started_at_us=t_start, finished_at_us=now_us(),
            ))
            self._keep_artifacts(trial, info, sim.samples, sim.series)
            self._state(grant, trial, "failed" if failed else "done", lp.name)

    def _run_trial(self, grant: Grant, trial: GrantedTrial, server: Endpoint, vocab_size: int,
                   api_key: str | None = None, tokenizer_path: str | None = None) -> None:
        lp = trial.manifest.load_point
        started = now_us()
        before: dict[str, float] = {}
        # /metrics every 0.5 s from the start of the measurement until the server drained
        scraper = MetricsScraper.for_endpoint(server, name=f"scrape-{trial.trial_id[:8]}")
        chosen = self._gpus(grant)
        sampler = TelemetrySampler(list(chosen.gpus) if chosen else None, name=f"gpu-{trial.trial_id[:8]}")

        def on_measure_start() -> None:
            before.update(self._counters(server))
            if scraper is not None:
                scraper.start()
            sampler.start()
            self._state(grant, trial, "measuring", lp.name)

        self._state(grant, trial, "warmup" if lp.warmup_requests else "measuring", lp.name)
        deadline = grant.budgets.trial_timeout_s
        samples: list[RequestSample]
        try:
            warm, result = run_load_point(
                server.base_url, grant.model.served_name, vocab_size, lp, deadline, stop=self._cancel,
                on_measure_start=on_measure_start, api_key=api_key, tokenizer_path=tokenizer_path,
            )
        except Exception as exc:  # the load generator failing is a measurement failure, never a daemon crash
            log.exception("load generator failed on trial %s", trial.trial_id[:12])
            if scraper is not None:
                scraper.stop()
            telemetry = sampler.stop()
            self._result(grant, trial, TrialOutcome(
                status="failed", failure_kind="measurement", error=f"load generator error: {exc}" if isinstance(exc, ServetuneError) else f"load generator error: {exc!r}",
                server=server.info(), fingerprint=self.ctx.fingerprint, gpu_telemetry=telemetry.summary,
                started_at_us=started, finished_at_us=now_us(),
            ))
            self._keep_artifacts(trial, server.info(), telemetry=telemetry)
            return
        if self._stopped():
            log.info("trial %s abandoned: its batch was stopped (daemon stopping, or its lease fenced)", trial.trial_id[:12])
            if scraper is not None:
                scraper.stop()
            sampler.stop()
            return
        samples = list(warm) + list(result.samples)
        self._state(grant, trial, "draining", lp.name)
        idle = server.wait_idle(grant.budgets.drain_timeout_s) if server.is_alive() else False
        series = scraper.stop() if scraper is not None else []
        telemetry = sampler.stop()
        after = self._counters(server) if server.is_alive() else {}
        deltas = {k: after[k] - before[k] for k in after if k in before}
        alive = server.is_alive()
        status = "ok"
        error = None
        if not alive:
            status, error = "failed", f"server died under load (exit code {server.returncode})"
        elif result.stopped_early == REASON_DEADLINE:
            status, error = "failed", f"timed out under load: {result.stopped_early} ({deadline:.0f} s budget)"
        elif not idle:
            log.warning("server did not drain within %.0f s after %s", grant.budgets.drain_timeout_s, lp.name)
        if alive and not server.reset_prefix_cache(timeout_s=30.0):
            log.warning("could not reset the prefix cache after %s", lp.name)
        self._result(grant, trial, TrialOutcome(
            status=status,  # type: ignore[arg-type]
            failure_kind="measurement" if status == "failed" else None,
            error=error,
            exit_code=server.returncode if not alive else None,
            log_tail=server.log_tail() if status == "failed" else None,
            samples=samples,
            window_s=result.window_s,
            offered_rate=result.offered_rate,
            client_loop_lag=result.loop_lag,
            stopped_early=result.stopped_early,
            server=server.info(),
            server_counters=deltas,
            server_series=series,
            fingerprint=self.ctx.fingerprint,
            gpu_telemetry=telemetry.summary,
            started_at_us=started,
            finished_at_us=now_us(),
        ))
        self._keep_artifacts(trial, server.info(), samples, series, telemetry)
        self._state(grant, trial, "done" if status == "ok" else "failed", lp.name)

    def _keep_artifacts(self, trial: GrantedTrial, server: ServerInfo | None,
                        samples: list[RequestSample] | None = None, series: list[dict[str, float]] | None = None,
                        telemetry: Telemetry | None = None) -> None:
        """Snapshot a finished attempt's artifacts (server log and the batch's daemon log lines as
        they stand, raw samples, metric series) into the daemon's spool, when it has one. Never fails the trial: a spool that
        cannot be written is logged."""
        spool = self.ctx.spool
        if spool is None:
            return
        tid, attempt = trial.trial_id, trial.attempt
        try:
            if self._batch_log.text:
                spool.add_bytes(tid, attempt, self._batch_log.text.encode("utf-8"), "client_log", "batch.log")
            if server is not None and server.log_path and Path(server.log_path).is_file():
                spool.add_file(tid, attempt, server.log_path, "server_log", "server.log")
            if samples:
                lines = "".join(s.model_dump_json() + "\n" for s in samples)
                spool.add_bytes(tid, attempt, lines.encode("utf-8"), "samples", "samples.jsonl")
            if series:
                spool.add_bytes(tid, attempt, json.dumps(series).encode("utf-8"), "metric_series", "server_series.json")
            if telemetry is not None and telemetry.samples:
                spool.add_bytes(tid, attempt, json.dumps(telemetry.samples).encode("utf-8"), "metric_series",
                                "gpu_telemetry.json")
        except (ServetuneError, OSError) as exc:
            log.warning("artifacts of trial %s attempt %d not spooled: %s", tid[:12], attempt, exc)

    @staticmethod
    def _counters(server: Endpoint) -> dict[str, float]:
        try:
            return server.counters()
        except ServerRequestError as exc:
            log.warning("cannot read vLLM counters: %s", exc)
            return {}

    def _record_server(self, server: VLLMServer, stopped: bool = False) -> None:
        """Append the server's pid and process group to ``servers.jsonl``: the daemon's own record of
        every vLLM it started, which teardown and the tests check against."""
        info = server.info()
        if info is None or info.pid is None:
            return
        self.ctx.workdir.mkdir(parents=True, exist_ok=True)
        entry = {"pid": info.pid, "pgid": info.pgid, "port": info.port, "log": info.log_path,
                 "event": "stopped" if stopped else "started", "exit_code": info.exit_code, "at_us": now_us()}
        with open(self.ctx.workdir / "servers.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")
