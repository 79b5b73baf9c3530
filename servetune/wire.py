"""One home for ZeroMQ socket settings, used by the coordinator's ROUTER and the daemon's DEALER.

DESIGN.md's verified facts, applied in one place:

- ``LINGER=0``: the default of -1 hangs ``close()``/``ctx.term()`` on unsent messages.
- ``MAXMSGSIZE``: a frame larger than :data:`MAX_MESSAGE_BYTES` drops the connection inside libzmq
  before a byte of it is parsed; :func:`servetune.messages.decode` checks the same bound again.
- ``ROUTER_MANDATORY``: a send to a daemon that is not connected raises ``EHOSTUNREACH`` instead of
  being silently dropped.
- ``ROUTER_HANDOVER``: a daemon that reconnects with the same routing id takes over its old id
  (without it the reconnect is silently dropped).
- DEALER reconnects by itself; ``RECONNECT_IVL``/``RECONNECT_IVL_MAX`` bound how fast it retries.
- Send high-water marks are bounded, so a peer that stops reading cannot make the other side's
  queue grow without limit: sends are non-blocking and a full queue is an error the caller logs.

Authentication (CURVE with a ZAP handler that fails closed) is added here by the trust work; until
then the protocol is unauthenticated and belongs on loopback or a trusted network.
"""

from __future__ import annotations

from typing import Any

#: The largest frame either side sends or accepts (one JSON message).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: Messages queued per peer before sends fail (ZeroMQ's high-water mark).
SEND_HWM = 1000
RECEIVE_HWM = 1000
#: DEALER reconnect interval and its exponential back-off ceiling, in milliseconds.
RECONNECT_IVL_MS = 200
RECONNECT_IVL_MAX_MS = 2000


#: Socket options by pyzmq constant name, applied in order by each adapter
#: (:func:`configure_router`, :func:`configure_dealer`, given the pyzmq module) before it binds or connects. The core
#: package names them and never imports zmq.
COMMON_OPTIONS: tuple[tuple[str, int], ...] = (
    ("LINGER", 0),
    ("MAXMSGSIZE", MAX_MESSAGE_BYTES),
    ("SNDHWM", SEND_HWM),
    ("RCVHWM", RECEIVE_HWM),
)
ROUTER_OPTIONS: tuple[tuple[str, int], ...] = COMMON_OPTIONS + (("ROUTER_MANDATORY", 1), ("ROUTER_HANDOVER", 1))
#: The DEALER also sets ``IDENTITY`` to the daemon id (its routing id).
DEALER_OPTIONS: tuple[tuple[str, int], ...] = COMMON_OPTIONS + (
    ("RECONNECT_IVL", RECONNECT_IVL_MS),
    ("RECONNECT_IVL_MAX", RECONNECT_IVL_MAX_MS),
)


def _apply(sock: Any, options: tuple[tuple[str, int], ...], zmq: Any) -> None:
    for name, value in options:
        sock.setsockopt(getattr(zmq, name), value)


def configure_router(sock: Any, zmq: Any) -> None:
    """Settings of the coordinator's ROUTER (call before ``bind``); ``zmq``: the pyzmq module."""
    _apply(sock, ROUTER_OPTIONS, zmq)


def configure_dealer(sock: Any, identity: str, zmq: Any) -> None:
    """Settings of a daemon's DEALER (call before ``connect``); ``identity`` is its routing id."""
    _apply(sock, DEALER_OPTIONS, zmq)
    sock.setsockopt(zmq.IDENTITY, identity.encode("utf-8"))
