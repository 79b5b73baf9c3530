"""The coordinator's ZeroMQ ROUTER socket: a thin adapter around :mod:`servetune.messages`.

Socket options live in :mod:`servetune.wire` (one home for both sides). The ROUTER is a CURVE
server; its ZAP handler (:mod:`coordinator.zap`) admits only allow-listed daemon keys. Every
message is returned with the CURVE public key ZAP reported for its connection (``User-Id``): the
daemon's identity, never its routing id. A message from a key removed from the allow-list since
its connection opened is refused (counted ``removed_key``) and dropped.

Every receive has a deadline (``poll``); a frame that does not decode, or whose routing id is not a
daemon id, is logged, counted (:attr:`RouterEndpoint.dropped`) and dropped, never raised. A RESULT
whose outcome alone is out of bounds is not dropped (its daemon would re-send it forever): it is
passed on as a ``parse`` failure keeping its raw payload (:class:`~servetune.messages.OutOfBoundsResult`),
which the control core judges like any RESULT (counted :attr:`RouterEndpoint.out_of_bounds_results`).
"""

from __future__ import annotations

import logging
from collections import Counter

import zmq

from coordinator.zap import KeyGate, ZapHandler
from servetune.errors import ProtocolError, ServetuneError
from servetune.keys import KeyPair, key_id
from servetune.messages import ID_MAX_CHARS, Message, OutOfBoundsResult, decode, encode, valid_id
from servetune.wire import batch_io_threads, configure_router, thread_ids, wait_for_io_threads

log = logging.getLogger(__name__)


class BindError(ServetuneError):
    """The ROUTER cannot bind the address it was given (in use, not an address of this host)."""


class RouterEndpoint:
    """Bind a CURVE ROUTER on ``bind`` (e.g. ``tcp://127.0.0.1:0`` for a random loopback port) with
    the coordinator's key pair ``server``, admitting the daemon keys of ``gate``.

    The endpoint has its own ZeroMQ context (one ZAP handler per context)."""

    def __init__(self, bind: str = "tcp://127.0.0.1:0", *, server: KeyPair, gate: KeyGate):
        #: Frames dropped by :meth:`recv`, by why: ``routing_id`` (not a daemon id: not UTF-8, not
        #: a wire id, or a ZeroMQ-generated one), ``handover`` (still queued on the old connection
        #: of a daemon that reconnected under the same id: :func:`routing_id_drop`),
        #: ``malformed`` (did not decode), ``frames``.
        self.dropped: Counter[str] = Counter()
        #: RESULTs whose outcome alone was out of bounds, passed on as parse failures (not dropped).
        self.out_of_bounds_results = 0
        self.gate = gate
        self.server_key = server.public
        before = thread_ids()
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        configure_router(self._sock, zmq, secret_key=server.secret)
        self._zap = ZapHandler(self._ctx, gate, self._sock)
        try:
            self._zap.start()
            # no wakeup preemption of the loop by its own sends (servetune.wire), once libzmq's
            # I/O threads have named themselves (they may not have yet, right after the socket)
            wait_for_io_threads(before, self._ctx.get(zmq.IO_THREADS))
            batch_io_threads()
            if bind.endswith(":0"):
                base = bind.rsplit(":", 1)[0]
                port = self._sock.bind_to_random_port(base)
                self.address = f"{base}:{port}"
            else:
                self._sock.bind(bind)
                self.address = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        except (zmq.ZMQError, RuntimeError) as exc:
            self.close()
            raise BindError(f"cannot bind --bind {bind}: {exc}") from None

    def recv(self, timeout_ms: int) -> tuple[str, Message, str] | None:
        """One message within ``timeout_ms`` as (routing id, message, CURVE public key), or None.
        Malformed frames and messages from keys no longer admitted are logged and dropped."""
        if timeout_ms != 0 and not self._sock.poll(timeout_ms, zmq.POLLIN):
            return None
        try:  # no poll first for a pass's recv(0): one call per message, not two
            frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return None
        if len(frames) != 2:
            self.dropped["frames"] += 1
            log.warning("dropping message with %d frames (expected 2)", len(frames))
            return None
        ident, payload = frames[0].bytes, frames[1]
        daemon_id = _routing_id(ident)
        if daemon_id is None:
            self._drop_routing_id(ident, _announced(payload) if ident[:1] == b"\x00" else "")
            return None
        key = str(payload.get("User-Id") or "")
        if self.gate.name(key) is None:
            self.gate.refuse("removed_key", f"message from key {key_id(key)} ({key}), no longer in the allow-list",
                             once_per=key)
            return None
        try:
            return daemon_id, decode(payload.bytes), key
        except OutOfBoundsResult as exc:
            self.out_of_bounds_results += 1
            log.warning("RESULT from %s for trial %s attempt %d is out of bounds (%s): judged as a parse failure "
                        "with its raw payload", daemon_id, exc.result.trial_id[:12], exc.result.epoch, exc)
            return daemon_id, exc.result, key
        except ProtocolError as exc:
            self.dropped["malformed"] += 1
            log.warning("dropping malformed message from %s: %s", daemon_id, exc)
            return None

    def _drop_routing_id(self, ident: bytes, announced: str) -> None:
        """Count and log a message whose routing id is not a daemon id, saying which case it is."""
        why = routing_id_drop(ident, announced)
        self.dropped[why] += 1
        if why == "handover":
            log.warning("dropping a message still queued on daemon %s's old connection: it reconnected under the "
                        "same routing id, and libzmq (ROUTER_HANDOVER) renamed the old connection %r; the daemon "
                        "re-sends what is still unanswered (%d such dropped so far)",
                        announced, ident, self.dropped[why])
        else:
            log.warning("dropping a message whose routing id %r is not a daemon id (%d dropped so far)",
                        ident[:ID_MAX_CHARS], self.dropped[why])

    def send(self, daemon_id: str, msg: object) -> bool:
        """Send to one daemon; False when it is not connected (EHOSTUNREACH)."""
        try:
            self._sock.send_multipart([daemon_id.encode("utf-8"), encode(msg)], zmq.NOBLOCK)  # type: ignore[arg-type]
        except zmq.ZMQError as exc:
            log.warning("cannot send %s to daemon %s: %s", type(msg).__name__, daemon_id, exc)
            return False
        return True

    def close(self) -> None:
        self._sock.disable_monitor()
        self._sock.close(linger=0)
        self._zap.stop()
        self._ctx.term()


def _routing_id(ident: bytes) -> str | None:
    """The daemon id a routing id names, or None when it is not one: a daemon sets its routing id
    to its id (UTF-8 text that :func:`~servetune.messages.valid_id` accepts); a peer that set none
    gets a ZeroMQ-generated binary one, and a non-UTF-8 one must never be "replaced" into text that
    collides with another daemon's."""
    try:
        text = ident.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if valid_id(text) else None


def _announced(payload: zmq.Frame) -> str:
    """The routing id the peer announced in its handshake (ZMTP's ``Identity`` property; "" if none
    or not text)."""
    try:
        return str(payload.get("Identity") or "")
    except (zmq.ZMQError, UnicodeDecodeError):
        return ""


def routing_id_drop(ident: bytes, announced: str) -> str:
    """Why a routing id that is not a daemon id is dropped: ``handover`` when libzmq generated it
    (its first byte is 0) for a connection whose peer announced a daemon id (``announced``): the old
    connection of a daemon that reconnected under the same id, renamed by ROUTER_HANDOVER, whose
    queued messages are still delivered; ``routing_id`` otherwise (a peer that set no routing id, or
    one that is not a daemon id)."""
    return "handover" if ident[:1] == b"\x00" and valid_id(announced) else "routing_id"
