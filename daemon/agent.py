"""The daemon's connection to a coordinator: a ZeroMQ DEALER and a long-lived worker thread.

The socket is owned by the main thread (ZeroMQ sockets are not thread-safe); the worker thread
runs batches and hands outgoing messages back through a queue. This keeps the messaging loop
free while a load point runs, so heartbeats and lease renewals (a later issue) fit without a
rewrite. Every wait has a deadline.

Stopping (SHUTDOWN, SIGINT, SIGTERM, or the parent dying with ``--exit-with-parent``) sets the
stop event: the running trial is abandoned (nothing is submitted for it), the vLLM server's
process group is killed, and the daemon says BYE.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import zmq

from daemon.batch import BatchContext, BatchRunner
from daemon.fingerprint import collect_fingerprint
from servetune.errors import ProtocolError, ServetuneError
from servetune.messages import (
    Ack,
    Bye,
    Capabilities,
    Conflict,
    Grant,
    Heartbeat,
    Hello,
    NoWork,
    Ready,
    Renewed,
    Result,
    Revoked,
    Shutdown,
    Stale,
    Welcome,
    decode,
    encode,
)

log = logging.getLogger(__name__)

WELCOME_TIMEOUT_S = 60.0
HELLO_RESEND_S = 5.0
HEARTBEAT_S = 1.0


@dataclass
class DaemonOptions:
    coordinator: str
    workdir: Path
    server_cpus: list[int] | None = None
    client_cpus: list[int] | None = None
    vllm_python: str | None = None
    daemon_id: str | None = None


def split_cpus(available: list[int]) -> tuple[list[int] | None, list[int] | None]:
    """vLLM gets every core but the last; the daemon and its load generator get the last one.

    With one core there is nothing to split: (None, None) means no pinning.
    """
    cores = sorted(available)
    if len(cores) < 2:
        return None, None
    return cores[:-1], cores[-1:]


class DaemonAgent:
    def __init__(self, opts: DaemonOptions):
        self.opts = opts
        self.daemon_id = opts.daemon_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.stop = threading.Event()
        self._outbox: queue.Queue[object] = queue.Queue()
        self._grants: queue.Queue[Grant | None] = queue.Queue()
        self._busy = threading.Event()
        self._batch_done = threading.Event()
        self._unacked: dict[str, Result] = {}
        self.stop_reason = ""

    # ------------------------------------------------------------------ signals

    def install_signal_handlers(self) -> None:
        def handler(signum: int, frame: FrameType | None) -> None:
            self.stop_reason = f"signal {signal.Signals(signum).name}"
            self.stop.set()

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)

    # ------------------------------------------------------------------ worker

    def _worker(self, runner: BatchRunner) -> None:
        while True:
            grant = self._grants.get()
            if grant is None:
                return
            try:
                runner.run(grant)
            except Exception:
                log.exception("batch %s crashed", grant.batch_id)
            finally:
                self._busy.clear()
                self._batch_done.set()

    # ------------------------------------------------------------------ main loop

    def run(self) -> int:
        server_cpus, client_cpus = self.opts.server_cpus, self.opts.client_cpus
        if server_cpus is None and client_cpus is None and hasattr(os, "sched_getaffinity"):
            server_cpus, client_cpus = split_cpus(sorted(os.sched_getaffinity(0)))
        if client_cpus and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, client_cpus)  # before any thread starts, so all inherit it
        fingerprint = collect_fingerprint(self.opts.vllm_python)
        log.info("daemon %s on %s; vLLM cores %s, daemon cores %s", self.daemon_id, fingerprint.hardware_class,
                 server_cpus, client_cpus)
        ctx = BatchContext(workdir=self.opts.workdir, fingerprint=fingerprint, server_cpus=server_cpus,
                           vllm_python=self.opts.vllm_python)
        runner = BatchRunner(ctx, self._outbox.put, self.stop)
        worker = threading.Thread(target=self._worker, args=(runner,), name="batch-worker", daemon=True)
        worker.start()
        zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        sock = zctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IDENTITY, self.daemon_id.encode("utf-8"))
        sock.setsockopt(zmq.MAXMSGSIZE, 80 * 1024 * 1024)
        sock.connect(self.opts.coordinator)
        code = 0
        try:
            code = self._loop(sock, fingerprint)
        finally:
            self.stop.set()
            runner.abort()
            self._grants.put(None)
            worker.join(timeout=120)
            if worker.is_alive():
                log.error("batch worker did not stop within 120 s")
            # Flush what the worker queued while stopping (never results of abandoned trials).
            self._flush(sock)
            try:
                sock.send(encode(Bye(reason=self.stop_reason or "stopping")), zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
            sock.close(linger=0)
        return code

    def _send(self, sock: zmq.Socket[bytes], msg: object) -> None:
        try:
            sock.send(encode(msg), zmq.NOBLOCK)  # type: ignore[arg-type]
        except zmq.ZMQError as exc:
            log.warning("cannot send %s: %s", type(msg).__name__, exc)

    def _flush(self, sock: zmq.Socket[bytes]) -> None:
        while True:
            try:
                msg = self._outbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(msg, Result):
                self._unacked[msg.submission_id] = msg
            self._send(sock, msg)

    def _loop(self, sock: zmq.Socket[bytes], fingerprint: object) -> int:
        from servetune.result import Fingerprint

        assert isinstance(fingerprint, Fingerprint)
        nonce = uuid.uuid4().hex
        hello = Hello(daemon_id=self.daemon_id, session_nonce=nonce, pid=os.getpid(),
                      capabilities=Capabilities(fingerprint=fingerprint))
        welcomed = False
        start = time.monotonic()
        last_hello = 0.0
        ready_at: float | None = None
        last_beat = time.monotonic()
        while not self.stop.is_set():
            now = time.monotonic()
            if not welcomed:
                if now - start > WELCOME_TIMEOUT_S:
                    raise ServetuneError(f"no WELCOME from {self.opts.coordinator} within {WELCOME_TIMEOUT_S:.0f} s")
                if now - last_hello > HELLO_RESEND_S:
                    self._send(sock, hello)
                    last_hello = now
            if ready_at is not None and now >= ready_at and not self._busy.is_set():
                self._send(sock, Ready(free_slots=1))
                ready_at = None
            if self._batch_done.is_set():
                self._batch_done.clear()
                self._flush(sock)
                ready_at = time.monotonic()
            self._flush(sock)
            if self._busy.is_set() and now - last_beat > HEARTBEAT_S:
                self._send(sock, Heartbeat())
                last_beat = now
            if not sock.poll(100, zmq.POLLIN):
                continue
            try:
                msg = decode(sock.recv(zmq.NOBLOCK))
            except ProtocolError as exc:
                log.warning("dropping malformed message from the coordinator: %s", exc)
                continue
            if isinstance(msg, Welcome):
                if msg.session_nonce == nonce and not welcomed:
                    welcomed = True
                    ready_at = time.monotonic()
                    log.info("welcomed by %s", msg.coordinator_id)
            elif isinstance(msg, Grant):
                if self._busy.is_set():
                    log.error("GRANT %s while busy; ignoring it", msg.batch_id)
                    continue
                self._busy.set()
                self._grants.put(msg)
            elif isinstance(msg, (Ack, Stale, Conflict)):
                self._unacked.pop(msg.submission_id, None)
                if not isinstance(msg, Ack):
                    log.warning("result for %s refused: %s", msg.trial_id[:12], msg.reason)
            elif isinstance(msg, NoWork):
                ready_at = time.monotonic() + msg.retry_after_s
            elif isinstance(msg, Shutdown):
                self.stop_reason = f"coordinator: {msg.reason}"
                log.info("shutdown requested: %s", msg.reason)
                self.stop.set()
            elif isinstance(msg, (Renewed, Revoked)):
                pass
            else:
                log.warning("unexpected %s from the coordinator", type(msg).__name__)
        return 0
