"""The daemon's connection to a coordinator: the socket adapter around :class:`~daemon.session.DaemonSession`.

:class:`DaemonAgent` owns three things and no protocol state:

- the ZeroMQ DEALER (settings from :func:`servetune.wire.configure_dealer`, applied with pyzmq), used by the main
  thread only (ZeroMQ sockets are not thread-safe). It is a CURVE client with this daemon's key
  pair that pins the coordinator's public key: a coordinator without that key's secret completes no
  handshake and gets nothing. A handshake the coordinator refuses (this daemon's key not in its
  allow-list) or that fails is logged from the socket's monitor, once per kind;
- one :class:`BatchWorker` thread per slot (:mod:`daemon.slots`: ``--max-concurrency``, at most one
  batch per GPU unless ``--co-tenancy`` is declared), each running one grant at a time with its own
  :class:`~daemon.batch.BatchRunner` on the GPU set the session claimed for it, and handing its
  messages back through one outbox queue, so the loop stays free while load points run;
- the loop. Each iteration: ``on_tick(now)`` first (a lease past its deadline is fenced before
  anything stale could be sent, e.g. after SIGSTOP), then the worker's outbox through
  ``on_outgoing``/``on_batch_done``, then a stop request if one came, then at most 100 ms of
  polling the socket, each decoded message fed to ``on_message``. The session's instructions are
  executed in order as they come back. Every wait has a deadline.

A crash of the daemon's own code inside a batch (an exception escaping ``BatchRunner.run``)
becomes a BATCH_ERROR carrying the error and the last lines of its traceback; the worker then
reports the batch done and the daemon asks for new work. A :class:`~daemon.session.Reconnect`
closes the socket at once (linger 0) and opens a new DEALER with the same routing id after the
delay, ticking meanwhile so leases still fence on time.

Preflight (:mod:`daemon.preflight`, when the options carry one) runs when the daemon joins and
before each batch. A failed one takes the daemon out of service: HELLO carries the reason, no READY
is sent, a batch it was granted is answered with a BATCH_ERROR (a daemon error: the coordinator
queues its trials again; never a result), and the worker re-checks every
:data:`PREFLIGHT_RECHECK_S` until it passes, then the daemon asks for work again.

Artifacts: a :class:`~daemon.artifact_sender.SpoolSender` runs beside the session: the batch
runner spools each finished attempt's artifacts (:mod:`daemon.artifact_spool`), the loop offers
and sends them paced (one step per iteration, after the session's own sends), ARTIFACT_* replies go
to it, never to the session. A SHUTDOWN that comes while uploads are in flight is held (the session
goes on heartbeating; every upload offers again at once) until they finish, for at most
:data:`UPLOAD_FINISH_S`, or until the coordinator has not answered them for :data:`UPLOAD_QUIET_S`.

Stopping (SHUTDOWN, SIGINT, SIGTERM, the parent dying with ``--exit-with-parent``, the
coordinator lost) aborts the running batch (its vLLM's process group is killed, nothing more is
submitted for it), says BYE, and :meth:`DaemonAgent.run` returns the exit code.

Engine args: with ``engine_args`` set (``daemon start --check-engine-args``, the default), the
daemon reads which flags its vLLM accepts (:mod:`daemon.vllm_args`: from its cache in milliseconds,
else 12-20 s of asking vLLM's parser, once per vLLM version) before its first HELLO, which reports
them; nothing else runs meanwhile, so asking never competes with a measurement for the cores.

Clocks: a TIME_PROBE is answered at once, beside the session, with a TIME_REPLY stamping this
node's wall clock when the frame was read and when the reply was made (:mod:`coordinator.clock`
estimates the offset from it). :data:`TEST_CLOCK_OFFSET_ENV` is a TEST-ONLY hook that shifts those
stamps, so tests on one machine can plant an offset.
"""

from __future__ import annotations

import logging
import os
import queue
import re
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import zmq
from zmq.utils.monitor import recv_monitor_message

from daemon.artifact_sender import SpoolSender
from daemon.artifact_spool import ArtifactSpool
from daemon.artifact_upload import PacingPolicy
from daemon.batch import UNSTAMPED, BatchContext, BatchRunner, Emit
from daemon.fingerprint import collect_fingerprint
from daemon.gpusets import GPUSet
from daemon.preflight import Preflight, PreflightFailed, PreflightResult, batch_preflight
from daemon.session import (
    AbortBatch,
    DaemonSession,
    Exit,
    Instruction,
    Log,
    Outgoing,
    OutMessage,
    Reconnect,
    Send,
    StartBatch,
)
from daemon.slots import SlotPool
from daemon.vllm_args import EngineArgsProbe
from servetune.artifact_messages import ArtifactMissing, ArtifactRefused, ArtifactStored, ToCoordinator
from servetune.artifacts import CHUNK_SIZE
from servetune.errors import ProtocolError, ServetuneError
from servetune.exitcodes import ExitCode
from servetune.keys import KeyPair
from servetune.messages import BatchError, Capabilities, Grant, Shutdown, TimeProbe, TimeReply, decode, encode
from servetune.wire import configure_dealer

log = logging.getLogger(__name__)
session_log = logging.getLogger("daemon.session")

#: Longest wait on the socket per loop iteration (milliseconds).
POLL_MS = 100
#: Lines of a crashed batch's traceback sent in its BATCH_ERROR.
TRACEBACK_LINES = 40
#: How long stopping waits for the batch worker (a vLLM server gets 20 s to stop, then SIGKILL).
WORKER_JOIN_S = 60.0
#: How long a SHUTDOWN waits while this daemon's artifact uploads finish (the session goes on meanwhile)...
UPLOAD_FINISH_S = 30.0
#: ... and how long without an answer to them or a chunk sent (at least; four heartbeat intervals if
#: longer) ends it sooner.
UPLOAD_QUIET_S = 2.0
#: How often a daemon out of service re-runs its failed preflight.
PREFLIGHT_RECHECK_S = 30.0
#: How long the last close waits to deliver the BYE (milliseconds; the socket's own LINGER is 0).
FINAL_LINGER_MS = 500
_ERROR_CHARS = 4000
_TRACEBACK_CHARS = 60_000
#: TEST-ONLY: seconds added to this daemon's wall-clock stamps in its TIME_REPLYs (and nowhere
#: else), so the clock-offset tests can plant an offset between processes of one machine. Never
#: set it on a real node: the coordinator would report that node's clock as off by this much.
TEST_CLOCK_OFFSET_ENV = "SERVETUNE_TEST_CLOCK_OFFSET_S"
_MAX_TEST_OFFSET_S = 86_400.0


def planted_clock_offset_ns(environ: dict[str, str] | None = None) -> int:
    """The TEST-ONLY planted offset (:data:`TEST_CLOCK_OFFSET_ENV`) in ns; 0 when unset."""
    raw = (os.environ if environ is None else environ).get(TEST_CLOCK_OFFSET_ENV, "").strip()
    if not raw:
        return 0
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not abs(value) <= _MAX_TEST_OFFSET_S:  # NaN fails too
        raise ServetuneError(f"{TEST_CLOCK_OFFSET_ENV}={raw!r} (test-only): expected seconds within "
                             f"±{_MAX_TEST_OFFSET_S:g}")
    return round(value * 1e9)


def time_reply(probe: TimeProbe, session_nonce: str, read_at_ns: int, read_mono_ns: int, offset_ns: int = 0) -> TimeReply:
    """The answer to ``probe``, read at wall clock ``read_at_ns`` (monotonic ``read_mono_ns``):
    handling ends now, measured on the monotonic clock so a wall-clock step cannot make it negative."""
    received = max(0, read_at_ns + offset_ns)
    return TimeReply(session_nonce=session_nonce, probe_id=probe.probe_id, received_at_ns=received,
                     replied_at_ns=received + max(0, time.monotonic_ns() - read_mono_ns))


@dataclass
class DaemonOptions:
    coordinator: str
    workdir: Path
    #: This daemon's CURVE key pair and the coordinator public key it pins (Z85, servetune.keys).
    keys: KeyPair
    coordinator_key: str
    server_cpus: list[int] | None = None
    client_cpus: list[int] | None = None
    vllm_python: str | None = None
    vllm_launch: list[str] | None = None
    api_key_envs: tuple[str, ...] = ()
    daemon_id: str | None = None
    coordinator_lost_s: float = 300.0
    #: Artifact upload pacing: raw chunk bytes per heartbeat interval (``--upload-bytes-per-interval``).
    upload_bytes_per_interval: int = PacingPolicy.bytes_per_interval
    #: Chunk size of the artifacts this daemon spools (``--artifact-chunk-size``).
    artifact_chunk_size: int = CHUNK_SIZE
    #: Checks run when joining and before each batch (:mod:`daemon.preflight`); None: none.
    preflight: Preflight | None = None
    #: Batches at once asked for (``--max-concurrency``); :mod:`daemon.slots` caps it at one per GPU
    #: (one on a CPU-only node) unless ``co_tenancy`` (``--co-tenancy``) allows sharing a device, which
    #: it then does only for batches whose GRANT declares it too (the spec's ``hardware.co_tenancy``).
    max_concurrency: int = 1
    co_tenancy: bool = False
    #: Asks (once per vLLM version; cached) which engine flags this node's vLLM accepts, reported
    #: in HELLO (``--check-engine-args``, :mod:`daemon.vllm_args`); None: not asked, not reported.
    engine_args: EngineArgsProbe | None = None


def split_cpus(available: list[int]) -> tuple[list[int] | None, list[int] | None]:
    """vLLM gets every core but the last; the daemon and its load generator get the last one.

    With one core there is nothing to split: (None, None) means no pinning.
    """
    cores = sorted(available)
    if len(cores) < 2:
        return None, None
    return cores[:-1], cores[-1:]


def default_daemon_id() -> str:
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:100] or "host"
    return f"{host}-{os.getpid()}-{os.urandom(3).hex()}"


def batch_error(grant: Grant, exc: BaseException) -> BatchError:
    """The BATCH_ERROR for ``exc`` escaping ``grant``'s run: the error and its traceback's last lines."""
    lines = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).splitlines()
    tail = "\n".join(lines[-TRACEBACK_LINES:])[-_TRACEBACK_CHARS:]
    return BatchError(session_nonce=UNSTAMPED, batch_id=grant.batch_id, epoch=grant.epoch,
                      error=f"{type(exc).__name__}: {exc}"[:_ERROR_CHARS], traceback_tail=tail)


@dataclass(frozen=True)
class ServiceChange:
    """Put in the outbox when a preflight took the daemon out of service (``reason``) or passed again (None)."""

    reason: str | None


@dataclass(frozen=True)
class BatchDone:
    """Put in the outbox after the last message of a batch."""

    batch_id: str


RunnerFactory = Callable[[BatchContext, Emit, threading.Event], BatchRunner]


class BatchWorker:
    """One thread running grants one at a time; their messages, then :class:`BatchDone`, go to ``outbox``.

    ``recheck(grant)`` re-runs a failed preflight (of that grant, or the join's when None) while the
    daemon is out of service (``out_of_service``: it already is, from the join)."""

    def __init__(self, runner: BatchRunner, outbox: queue.Queue[Outgoing | BatchDone | ServiceChange],
                 recheck: Callable[[Grant | None], PreflightResult] | None = None, out_of_service: bool = False):
        self.runner = runner
        self.outbox = outbox
        self._recheck = recheck
        self._failed: tuple[Grant | None] | None = (None,) if out_of_service else None
        self._grants: queue.Queue[tuple[Grant, GPUSet | None, tuple[int, ...]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._main, name="batch-worker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, grant: Grant, gpu_set: GPUSet | None = None, co_tenanted: tuple[int, ...] = ()) -> None:
        self._grants.put((grant, gpu_set, co_tenanted))

    def close(self, timeout_s: float) -> bool:
        """Abort what runs, stop the thread; False if it did not end within ``timeout_s``."""
        self.runner.abort()
        self._grants.put(None)
        self._thread.join(timeout=timeout_s)
        return not self._thread.is_alive()

    def _main(self) -> None:
        while True:
            waiting = self._failed is not None and self._recheck is not None
            try:
                item = self._grants.get(timeout=PREFLIGHT_RECHECK_S if waiting else None)
            except queue.Empty:
                assert self._recheck is not None and self._failed is not None
                if self._recheck(self._failed[0]).ok:
                    self._failed = None
                    self.outbox.put(ServiceChange(None))
                continue
            if item is None:
                return
            grant, self.runner.gpu_set, self.runner.co_tenanted = item
            try:
                self.runner.run(grant)
                if self._failed is not None:  # a batch passed its preflight: in service again
                    self._failed = None
                    self.outbox.put(ServiceChange(None))
            except PreflightFailed as exc:  # not fit to measure: a daemon error, never a result
                log.error("batch %s not run: %s", grant.batch_id, exc)
                self.outbox.put(BatchError(session_nonce=UNSTAMPED, batch_id=grant.batch_id, epoch=grant.epoch,
                                           error=f"daemon out of service: {exc}"[:_ERROR_CHARS]))
                self._failed = (grant,)
                self.outbox.put(ServiceChange(str(exc)[:_ERROR_CHARS]))
            except Exception as exc:  # our own code crashed: a daemon error, never a measurement
                log.exception("batch %s crashed inside the daemon", grant.batch_id)
                self.outbox.put(batch_error(grant, exc))
            finally:
                self.outbox.put(BatchDone(grant.batch_id))


class DaemonAgent:
    """Runs one daemon: :meth:`run` blocks until it exits and returns the exit code.

    ``runner_factory`` builds the batch runner (tests pass a subclass); ``clock`` is the
    monotonic clock the session sees. :meth:`request_stop` may be called from any thread.
    """

    def __init__(self, opts: DaemonOptions, *, runner_factory: RunnerFactory = BatchRunner,
                 clock: Callable[[], float] = time.monotonic):
        self.opts = opts
        self.daemon_id = opts.daemon_id or default_daemon_id()
        self.stop = threading.Event()
        self.stop_reason = ""
        self._runner_factory = runner_factory
        self._clock = clock
        self._outbox: queue.Queue[Outgoing | BatchDone | ServiceChange] = queue.Queue()
        self._zctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._sock: zmq.Socket[bytes] | None = None
        self._monitor: zmq.Socket[bytes] | None = None
        self._handshake_told: set[int] = set()
        self._reopen_at = 0.0
        self._exit: Exit | None = None
        self._workers: list[BatchWorker] = []
        self._assigned: dict[str, BatchWorker] = {}  # running batch -> its worker
        self._sender: SpoolSender | None = None
        self._shutdown: tuple[Shutdown, float] | None = None  # held while uploads finish
        self._clock_offset_ns = 0  # TEST-ONLY planted offset (TEST_CLOCK_OFFSET_ENV), read by run()

    # ------------------------------------------------------------------ stopping

    def request_stop(self, reason: str) -> None:
        if not self.stop.is_set():
            self.stop_reason = reason
            self.stop.set()

    def install_signal_handlers(self) -> None:
        def handler(signum: int, frame: FrameType | None) -> None:
            self.request_stop(f"signal {signal.Signals(signum).name}")

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)

    # ------------------------------------------------------------------ run

    def run(self) -> ExitCode:
        self._clock_offset_ns = planted_clock_offset_ns()
        if self._clock_offset_ns:
            log.warning("TEST-ONLY: %s plants a clock offset of %+.6f s in this daemon's TIME_REPLYs",
                        TEST_CLOCK_OFFSET_ENV, self._clock_offset_ns / 1e9)
        server_cpus, client_cpus = self.opts.server_cpus, self.opts.client_cpus
        if server_cpus is None and client_cpus is None and hasattr(os, "sched_getaffinity"):
            server_cpus, client_cpus = split_cpus(sorted(os.sched_getaffinity(0)))
        if client_cpus and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, client_cpus)  # before any thread starts, so all inherit it
        fingerprint = collect_fingerprint(self.opts.vllm_python)
        log.info("daemon %s on %s; vLLM cores %s, daemon cores %s", self.daemon_id, fingerprint.hardware_class,
                 server_cpus, client_cpus)
        preflight, out_of_service = self.opts.preflight, None
        if preflight is not None:
            preflight.node_has_gpus = bool(fingerprint.gpus)
            preflight.vllm.advertised = fingerprint.vllm_version
            joined = preflight.run()
            out_of_service = None if joined.ok else joined.summary[:_ERROR_CHARS]
        accepted = self.opts.engine_args.read(fingerprint.vllm_version) if self.opts.engine_args is not None else None
        spool = ArtifactSpool.for_workdir(self.opts.workdir, self.opts.artifact_chunk_size)
        self._sender = SpoolSender(spool, PacingPolicy(bytes_per_interval=self.opts.upload_bytes_per_interval))
        ctx = BatchContext(workdir=self.opts.workdir, fingerprint=fingerprint, server_cpus=server_cpus,
                           vllm_python=self.opts.vllm_python, vllm_launch=self.opts.vllm_launch,
                           api_key_envs=frozenset(self.opts.api_key_envs), spool=spool, preflight=preflight)
        slots = SlotPool.for_fingerprint(fingerprint, self.opts.max_concurrency, self.opts.co_tenancy)
        if slots.capacity < slots.requested:
            log.warning("--max-concurrency %d: this node runs %d batch(es) at once (one per %s; --co-tenancy "
                        "declares sharing a device)", slots.requested, slots.capacity,
                        "GPU" if fingerprint.gpus else "CPU-only node, one device")

        def recheck(grant: Grant | None) -> PreflightResult:
            assert preflight is not None
            return batch_preflight(preflight, grant, fingerprint) if grant is not None else preflight.run()

        self._workers = [BatchWorker(self._runner_factory(ctx, self._outbox.put, self.stop), self._outbox,
                                     recheck if preflight is not None else None,
                                     out_of_service is not None and i == 0)  # one re-checks the join's
                         for i in range(slots.capacity)]
        for worker in self._workers:
            worker.start()
        session = DaemonSession(self.daemon_id, os.getpid(),
                                Capabilities(fingerprint=fingerprint, out_of_service=out_of_service,
                                             max_concurrency=slots.capacity, engine_args=accepted),
                                coordinator_lost_s=self.opts.coordinator_lost_s, slots=slots)
        self._zctx = zmq.Context()
        try:
            self._open()
            self._loop(session)
        finally:
            self.stop.set()
            for worker in self._workers:
                worker.runner.abort()
            until = time.monotonic() + WORKER_JOIN_S
            for worker in self._workers:
                if not worker.close(max(0.0, until - time.monotonic())):
                    log.error("batch worker did not stop within %.0f s", WORKER_JOIN_S)
            self._close(linger_ms=FINAL_LINGER_MS)
            self._zctx.term()
        assert self._exit is not None
        log.info("daemon %s exits with %d (%s): %s", self.daemon_id, self._exit.code, self._exit.code.name,
                 self._exit.reason)
        return self._exit.code

    def _loop(self, session: DaemonSession) -> None:
        self._execute(session.start(self._clock()))
        while self._exit is None:
            self._execute(session.on_tick(self._clock()))
            self._drain_outbox(session)
            if self._exit is None and self.stop.is_set():
                self._execute(session.on_stop_requested(self.stop_reason or "stop requested", self._clock()))
            if self._exit is not None:
                return
            self._upload(session)
            if self._sock is None:
                wait = self._reopen_at - self._clock()
                if wait > 0:
                    self.stop.wait(min(wait, POLL_MS / 1000))
                    continue
                self._open()
                self._execute(session.on_connected(self._clock()))
                continue
            self._receive(session)

    def _drain_outbox(self, session: DaemonSession) -> None:
        while self._exit is None:
            try:
                item = self._outbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, BatchDone):
                self._assigned.pop(item.batch_id, None)
                self._execute(session.on_batch_done(item.batch_id, self._clock()))
            elif isinstance(item, ServiceChange):
                self._execute(session.set_out_of_service(item.reason, self._clock()))
            else:
                self._execute(session.on_outgoing(item, self._clock()))

    def _receive(self, session: DaemonSession) -> None:
        sock = self._sock
        assert sock is not None
        self._watch_handshakes()
        if not sock.poll(POLL_MS, zmq.POLLIN):
            return
        while self._exit is None and self._sock is sock:
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            read_at_ns, read_mono_ns = time.time_ns(), time.monotonic_ns()
            try:
                msg = decode(frame)
            except ProtocolError as exc:
                log.warning("dropping malformed message from the coordinator: %s", exc)
                continue
            if isinstance(msg, TimeProbe):
                if session.nonce:
                    self._send_msg(time_reply(msg, session.nonce, read_at_ns, read_mono_ns, self._clock_offset_ns))
            elif isinstance(msg, (ArtifactMissing, ArtifactStored, ArtifactRefused)):
                assert self._sender is not None
                self._send_all(self._sender.on_message(msg, self._clock()))
            elif isinstance(msg, Shutdown) and self._sender is not None and self._sender.busy:
                if self._shutdown is None:
                    log.info("SHUTDOWN (%s): finishing artifact uploads first (up to %.0f s)", msg.reason,
                             UPLOAD_FINISH_S)
                    self._shutdown = (msg, self._clock())
                    self._send_all(self._sender.reoffer(self._clock()))
            else:
                self._execute(session.on_message(msg, self._clock()))

    def _upload(self, session: DaemonSession) -> None:
        """The artifact uploads beside the session (:mod:`daemon.artifact_sender`): paced chunks, offers."""
        if self._sender is None:
            return
        now = self._clock()
        if self._sock is not None:
            self._send_all(self._sender.step(session.nonce, session.welcomed, session.heartbeat_interval_s, now))
        if self._shutdown is None:
            return
        held = now - self._shutdown[1]
        quiet = now - max(self._shutdown[1], self._sender.last_progress)
        if not self._sender.busy or held > UPLOAD_FINISH_S or quiet > max(UPLOAD_QUIET_S,
                                                                         4 * session.heartbeat_interval_s):
            if self._sender.busy:
                log.warning("artifact uploads unfinished after %.1f s (%.1f s without an answer); they stay "
                            "spooled in %s", held, quiet, self._sender.spool.root)
            msg, self._shutdown = self._shutdown[0], None
            self._execute(session.on_message(msg, now))

    def _send_all(self, msgs: list[ToCoordinator]) -> None:
        for msg in msgs:
            self._send_msg(msg)

    # ------------------------------------------------------------------ instructions

    def _execute(self, instructions: list[Instruction]) -> None:
        for ins in instructions:
            match ins:
                case Send():
                    self._send(ins)
                case StartBatch():
                    busy = set(map(id, self._assigned.values()))
                    worker = next(w for w in self._workers if id(w) not in busy)  # the session keeps one idle
                    self._assigned[ins.grant.batch_id] = worker
                    worker.submit(ins.grant, ins.gpu_set, ins.co_tenanted)
                case AbortBatch():
                    log.warning("aborting batch %s: %s", ins.batch_id, ins.reason)
                    assigned = self._assigned.get(ins.batch_id)
                    for worker in [assigned] if assigned is not None else self._workers:
                        worker.runner.abort(ins.batch_id)
                case Reconnect():
                    self._close()
                    self._reopen_at = self._clock() + ins.delay_s
                case Exit():
                    self._exit = ins
                case Log():
                    session_log.log(ins.level, "%s", ins.text)

    def _send(self, ins: Send) -> None:
        self._send_msg(ins.msg)

    def _send_msg(self, msg: OutMessage | ToCoordinator | TimeReply) -> None:
        if self._sock is None:
            log.debug("not connected: %s not sent", msg.type)
            return
        try:
            self._sock.send(encode(msg), zmq.NOBLOCK)
        except ProtocolError as exc:
            log.error("cannot send %s: %s", msg.type, exc)
        except zmq.ZMQError as exc:
            log.warning("cannot send %s: %s", msg.type, exc)

    # ------------------------------------------------------------------ socket

    def _open(self) -> None:
        assert self._zctx is not None
        sock = self._zctx.socket(zmq.DEALER)
        configure_dealer(sock, self.daemon_id, zmq, public_key=self.opts.keys.public,
                         secret_key=self.opts.keys.secret, server_key=self.opts.coordinator_key)
        address = f"inproc://daemon-monitor-{id(sock):x}"
        sock.monitor(address, zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                     | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_SUCCEEDED)
        monitor = self._zctx.socket(zmq.PAIR)
        monitor.setsockopt(zmq.LINGER, 0)
        monitor.connect(address)
        sock.connect(self.opts.coordinator)
        self._sock, self._monitor = sock, monitor

    def _watch_handshakes(self) -> None:
        """Log CURVE handshake failures (each kind once until a handshake succeeds)."""
        while self._monitor is not None:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            kind = int(event["event"])
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._handshake_told.clear()
                log.info("CURVE handshake with the coordinator at %s succeeded", self.opts.coordinator)
                continue
            if kind in self._handshake_told:
                continue
            self._handshake_told.add(kind)
            if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                log.error("the coordinator at %s refused this daemon's key %s (status %s): add it there with "
                          "`python -m coordinator keys add NAME %s`", self.opts.coordinator,
                          self.opts.keys.key_id, event["value"], self.opts.keys.public)
            else:
                log.error("CURVE handshake with %s failed (event %#x, error %#x): is --coordinator-key the "
                          "coordinator's public key?", self.opts.coordinator, kind, int(event["value"]))

    def _close(self, linger_ms: int = 0) -> None:
        if self._sock is not None:
            self._sock.disable_monitor()
            self._sock.close(linger=linger_ms)
            self._sock = None
        if self._monitor is not None:
            self._monitor.close(linger=0)
            self._monitor = None
