"""The coordinator's ZeroMQ ROUTER socket: a thin adapter around :mod:`servetune.messages`.

Socket options live in :mod:`servetune.wire` (one home for both sides). Every receive has a
deadline (``poll``); a frame that does not decode is logged and dropped, never raised.
"""

from __future__ import annotations

import logging

import zmq

from servetune.errors import ProtocolError, ServetuneError
from servetune.messages import Message, decode, encode
from servetune.wire import configure_router

log = logging.getLogger(__name__)


class BindError(ServetuneError):
    """The ROUTER cannot bind the address it was given (in use, not an address of this host)."""


class RouterEndpoint:
    """Bind a ROUTER on ``bind`` (e.g. ``tcp://127.0.0.1:0`` for a random loopback port)."""

    def __init__(self, bind: str = "tcp://127.0.0.1:0"):
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.ROUTER)
        configure_router(self._sock, zmq)
        try:
            if bind.endswith(":0"):
                base = bind.rsplit(":", 1)[0]
                port = self._sock.bind_to_random_port(base)
                self.address = f"{base}:{port}"
            else:
                self._sock.bind(bind)
                self.address = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        except zmq.ZMQError as exc:
            self._sock.close(linger=0)
            raise BindError(f"cannot bind --bind {bind}: {exc}") from None

    def recv(self, timeout_ms: int) -> tuple[str, Message] | None:
        """One message within ``timeout_ms``, or None. Malformed frames are logged and dropped."""
        if not self._sock.poll(timeout_ms, zmq.POLLIN):
            return None
        frames = self._sock.recv_multipart(zmq.NOBLOCK)
        if len(frames) != 2:
            log.warning("dropping message with %d frames (expected 2)", len(frames))
            return None
        ident, payload = frames
        try:
            return ident.decode("utf-8", "replace"), decode(payload)
        except ProtocolError as exc:
            log.warning("dropping malformed message from %r: %s", ident, exc)
            return None

    def send(self, daemon_id: str, msg: object) -> bool:
        """Send to one daemon; False when it is not connected (EHOSTUNREACH)."""
        try:
            self._sock.send_multipart([daemon_id.encode("utf-8"), encode(msg)], zmq.NOBLOCK)  # type: ignore[arg-type]
        except zmq.ZMQError as exc:
            log.warning("cannot send %s to daemon %s: %s", type(msg).__name__, daemon_id, exc)
            return False
        return True

    def close(self) -> None:
        self._sock.close(linger=0)
