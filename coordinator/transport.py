"""The coordinator's ZeroMQ ROUTER socket: a thin adapter around :mod:`servetune.messages`.

Options follow DESIGN.md's verified facts: ``ROUTER_MANDATORY`` turns silent drops into errors,
``ROUTER_HANDOVER`` lets a reconnecting daemon that reuses its routing id take over, and
``LINGER=0`` keeps ``close()`` from hanging. Every receive has a deadline (``poll``).
"""

from __future__ import annotations

import logging

import zmq

from servetune.errors import ProtocolError
from servetune.messages import Message, decode, encode

log = logging.getLogger(__name__)


class RouterEndpoint:
    """Bind a ROUTER on ``bind`` (e.g. ``tcp://127.0.0.1:0`` for a random loopback port)."""

    def __init__(self, bind: str = "tcp://127.0.0.1:0"):
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self._sock.setsockopt(zmq.MAXMSGSIZE, 80 * 1024 * 1024)
        if bind.endswith(":0"):
            base = bind.rsplit(":", 1)[0]
            port = self._sock.bind_to_random_port(base)
            self.address = f"{base}:{port}"
        else:
            self._sock.bind(bind)
            self.address = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)

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
