"""Who may talk to the coordinator: a ZAP handler that fails closed, over an allow-list of daemon keys.

The ROUTER is a CURVE server with ``ZAP_ENFORCE_DOMAIN=1`` (:func:`servetune.wire.configure_router`),
so libzmq asks the ZAP handler bound on ``inproc://zeromq.zap.01`` of the socket's context about
every handshake (RFC 27) and refuses it unless the handler answers 200. :class:`ZapHandler` is
that handler: one thread, owning its two sockets (the ZAP REP-like ROUTER and the ROUTER's
monitor), answering from a :class:`KeyGate`.

:class:`KeyGate` holds the admitted keys (the allow-list file under ``$SERVETUNE_HOME``, re-read
when its mtime changes, at most every :data:`RELOAD_S`; plus keys the coordinator admits in memory,
e.g. a local sweep's throwaway child key) and counts every refusal by kind, with a log line each:

=================  ==========================================================================
kind               what was refused
=================  ==========================================================================
``plaintext``      a client without CURVE, refused by libzmq before ZAP and seen by the socket
                   monitor: a mechanism mismatch, or (usually: the client sees the CURVE
                   greeting first) the client hanging up mid-handshake, which is also what a
                   bare TCP connection that closes looks like
``bad_handshake``  another CURVE handshake failure (e.g. a client that pinned another server
                   key), seen by the socket monitor
``unknown_key``    a CURVE client whose public key is not in the allow-list (ZAP answers 400)
``removed_key``    a message on a live connection whose key was removed from the allow-list
                   since it connected (dropped by :class:`~coordinator.transport.RouterEndpoint`)
``identity``       a message whose CURVE key is not the key its session was opened with (the
                   control core refuses it)
=================  ==========================================================================

The gate is shared by the ZAP thread and the sweep's thread: its state changes under a lock.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import zmq
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from servetune.keys import KeyFileError, allow_path, key_id, read_allow_list
from servetune.wire import ZAP_DOMAIN

log = logging.getLogger(__name__)

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
#: How often the allow-list file's mtime is checked while a sweep runs (seconds).
RELOAD_S = 1.0
#: Refusals kept for inspection (tests, ``KeyGate.recent``).
RECENT = 200
_POLL_MS = 100
_MONITOR_EVENTS = (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                   | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


@dataclass(frozen=True)
class Refusal:
    kind: str
    detail: str


class KeyGate:
    """The admitted daemon keys and the refusal counters. ``home``: ``$SERVETUNE_HOME`` whose
    allow-list is read (None: none); ``extra``: key -> name admitted in memory."""

    def __init__(self, home: Path | None, extra: Mapping[str, str] | None = None):
        self.home = home
        self._extra = dict(extra or {})
        self._lock = threading.Lock()
        self._names: dict[str, str] = dict(self._extra)
        self._stamp: tuple[int, int] | None = None
        self._removed: list[str] = []
        self.counts: Counter[str] = Counter()
        self.recent: deque[Refusal] = deque(maxlen=RECENT)
        self._told: set[tuple[str, str]] = set()
        self.reload(strict=True)

    def name(self, key: str) -> str | None:
        """The allow-list's name for ``key``, or None if it is not admitted."""
        return self._names.get(key)

    def admitted(self) -> dict[str, str]:
        return dict(self._names)

    def reload(self, strict: bool = False) -> bool:
        """Re-read the allow-list if its file changed; True if it did. Keys no longer listed are
        queued for :meth:`take_removed`. A malformed file keeps the previous list (logged), or with
        ``strict`` (the first read, before a sweep starts) raises :class:`KeyFileError`."""
        if self.home is None:
            return False
        path = allow_path(self.home)
        try:
            st = path.stat()
            stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        if stamp == self._stamp and self._stamp is not None:
            return False
        try:
            entries = read_allow_list(self.home)
        except KeyFileError as exc:
            if strict:
                raise
            log.error("allow-list not reloaded (the previous one stays in force): %s", exc)
            self._stamp = stamp
            return False
        names = {e.public_key: e.name for e in entries}
        names.update(self._extra)
        with self._lock:
            removed = [k for k in self._names if k not in names]
            added = [k for k in names if k not in self._names]
            self._names = names
            self._stamp = stamp
            self._removed += removed
        for k in removed:
            log.warning("key %s (%s) removed from the allow-list: its sessions are cut", key_id(k), k)
        if added and self._stamp is not None:
            log.info("allow-list %s: %d key(s) admitted (%d new)", path, len(names), len(added))
        return bool(removed or added)

    def take_removed(self) -> list[str]:
        """Keys removed from the allow-list since the last call (the sweep cuts their sessions)."""
        with self._lock:
            out, self._removed = self._removed, []
        return out

    def refuse(self, kind: str, detail: str, *, once_per: str | None = None) -> None:
        """Count a refusal of ``kind`` and log it (with ``once_per``, a warning only the first time
        for that key, then debug: a removed daemon that keeps heartbeating does not flood the log)."""
        with self._lock:
            self.counts[kind] += 1
            self.recent.append(Refusal(kind, detail))
            first = once_per is None or (kind, once_per) not in self._told
            if once_per is not None:
                self._told.add((kind, once_per))
        log.log(logging.WARNING if first else logging.DEBUG, "refused (%s): %s", kind, detail)

    def check(self, address: str, mechanism: bytes, credentials: list[bytes], domain: bytes) -> tuple[bool, str, str]:
        """The ZAP decision: (allowed, reason, user id). The user id of an admitted daemon is its Z85
        public key (what ``frame.get("User-Id")`` then returns for its messages)."""
        if domain != ZAP_DOMAIN.encode("ascii"):
            self.refuse("bad_handshake", f"{address}: unexpected ZAP domain {domain!r}")
            return False, "unknown domain", ""
        if mechanism != b"CURVE" or len(credentials) != 1 or len(credentials[0]) != 32:
            self.refuse("plaintext", f"{address}: mechanism {mechanism.decode('ascii', 'replace')} is not CURVE")
            return False, "CURVE required", ""
        key = z85.encode(credentials[0]).decode("ascii")
        if self.name(key) is None:
            self.refuse("unknown_key", f"{address}: key {key_id(key)} ({key}) is not in the allow-list")
            return False, "key not allowed", ""
        return True, "OK", key


class ZapHandler:
    """The ZAP thread of one ROUTER: :meth:`start` before the ROUTER binds, :meth:`stop` after it closes."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], gate: KeyGate, router: zmq.Socket[bytes]):
        self.ctx = ctx
        self.gate = gate
        self._monitor_addr = f"inproc://servetune-monitor-{os.getpid()}-{id(self):x}"
        router.monitor(self._monitor_addr, _MONITOR_EVENTS)
        self._router = router
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="zap-handler", daemon=True)

    def start(self, timeout_s: float = 10.0) -> None:
        self._thread.start()
        if not self._ready.wait(timeout_s) or self._error is not None:
            raise RuntimeError(f"the ZAP handler did not start: {self._error}")

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout_s)

    def _main(self) -> None:
        try:
            zap = self.ctx.socket(zmq.ROUTER)
            zap.setsockopt(zmq.LINGER, 0)
            zap.bind(ZAP_ENDPOINT)
            mon = self.ctx.socket(zmq.PAIR)
            mon.setsockopt(zmq.LINGER, 0)
            mon.connect(self._monitor_addr)
        except zmq.ZMQError as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        poller = zmq.Poller()
        poller.register(zap, zmq.POLLIN)
        poller.register(mon, zmq.POLLIN)
        next_reload = 0.0
        try:
            while not self._stop.is_set():
                events = dict(poller.poll(_POLL_MS))
                if zap in events:
                    self._answer(zap)
                if mon in events:
                    self._observe(mon)
                now = time.monotonic()
                if now >= next_reload:
                    next_reload = now + RELOAD_S
                    self.gate.reload()
        finally:
            zap.close(linger=0)
            mon.close(linger=0)

    def _answer(self, zap: zmq.Socket[bytes]) -> None:
        frames = zap.recv_multipart()
        # ROUTER envelope: peer id, empty delimiter, then the ZAP request (RFC 27).
        try:
            sep = frames.index(b"")
        except ValueError:
            return
        envelope, req = frames[: sep + 1], frames[sep + 1:]
        if len(req) < 6:
            return
        version, request_id, domain, address, _identity, mechanism, *credentials = req
        if version != b"1.0":
            ok, reason, user = False, "bad ZAP version", ""
        else:
            ok, reason, user = self.gate.check(address.decode("ascii", "replace"), mechanism, credentials, domain)
        zap.send_multipart([*envelope, b"1.0", request_id, b"200" if ok else b"400", reason.encode(),
                            user.encode("ascii"), b""])

    def _observe(self, mon: zmq.Socket[bytes]) -> None:
        try:
            event = recv_monitor_message(mon, zmq.NOBLOCK)
        except zmq.Again:
            return
        kind, value, where = event["event"], event["value"], event.get("endpoint", b"")
        where_s = where.decode("ascii", "replace") if isinstance(where, bytes) else str(where)
        if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            log.debug("handshake refused by ZAP (status %s) on %s", value, where_s)
        elif kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            self.gate.refuse("plaintext", f"{where_s}: a client without CURVE (mechanism mismatch)")
        elif kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            # A NULL client reads the CURVE greeting, sees the mismatch first and hangs up.
            self.gate.refuse("plaintext", f"{where_s}: the client hung up during the handshake (error {value:#x}): "
                                          "a client without CURVE, or not a ZeroMQ peer")
        else:
            self.gate.refuse("bad_handshake", f"{where_s}: CURVE handshake failed (event {kind:#x}, "
                                              f"error {value:#x}; a client that pinned another coordinator key?)")
