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

Authentication: every connection is CURVE, loopback included (:func:`configure_router` makes the
ROUTER a CURVE server, :func:`configure_dealer` pins the coordinator's public key on the DEALER).
The ROUTER also sets ``ZAP_DOMAIN`` and ``ZAP_ENFORCE_DOMAIN=1``: libzmq then refuses every
handshake that no ZAP handler approved (without them CURVE admits any client that knows the
server key, DESIGN.md), so the coordinator's ZAP handler (``coordinator/zap.py``) decides alone,
from the allow-list of daemon keys. Keys are Z85 text (:mod:`servetune.keys`).
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
#: The ZAP domain of the coordinator's ROUTER (what its ZAP handler is asked about).
ZAP_DOMAIN = "servetune"


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


def configure_router(sock: Any, zmq: Any, *, secret_key: str) -> None:
    """Settings of the coordinator's ROUTER (call before ``bind``); ``zmq``: the pyzmq module;
    ``secret_key``: the coordinator's CURVE secret key (Z85). A ZAP handler must be bound on the
    socket's context, or every daemon is refused."""
    _apply(sock, ROUTER_OPTIONS, zmq)
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, secret_key.encode("ascii"))
    sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode("ascii"))
    sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)


def configure_dealer(sock: Any, identity: str, zmq: Any, *, public_key: str, secret_key: str,
                     server_key: str) -> None:
    """Settings of a daemon's DEALER (call before ``connect``); ``identity`` is its routing id,
    ``public_key``/``secret_key`` its own CURVE pair and ``server_key`` the coordinator's public key
    it pins: a server without that key's secret cannot complete the handshake."""
    _apply(sock, DEALER_OPTIONS, zmq)
    sock.setsockopt(zmq.IDENTITY, identity.encode("utf-8"))
    sock.setsockopt(zmq.CURVE_SERVERKEY, server_key.encode("ascii"))
    sock.setsockopt(zmq.CURVE_PUBLICKEY, public_key.encode("ascii"))
    sock.setsockopt(zmq.CURVE_SECRETKEY, secret_key.encode("ascii"))


#: The name libzmq gives its I/O threads (``ZMQbg/IO/0``, ``ZMQbg/IO/1``, ...; Linux ``comm``).
IO_THREAD_PREFIX = "ZMQbg/IO/"


def thread_ids(task_dir: str = "/proc/self/task") -> set[int]:
    """This process's thread ids (Linux ``/proc``; empty where there is none)."""
    import os

    try:
        return {int(t) for t in os.listdir(task_dir) if t.isdigit()}
    except OSError:
        return set()


def wait_for_io_threads(before: set[int], n: int, timeout_s: float = 1.0,
                        task_dir: str = "/proc/self/task") -> set[int]:
    """The libzmq I/O threads started since ``before`` (thread ids taken before the context was
    made), once ``n`` of them are named, or whatever is named when ``timeout_s`` runs out.

    libzmq starts a context's I/O threads with its first socket, and each thread names itself
    (``ZMQbg/IO/N``) when it first runs: right after ``ctx.socket()`` it may still carry the
    process's name, so a caller looking for it by name must wait for it."""
    import os
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        named: set[int] = set()
        for tid in thread_ids(task_dir) - before:
            try:
                with open(os.path.join(task_dir, str(tid), "comm"), encoding="utf-8", errors="replace") as fh:
                    if fh.read().startswith(IO_THREAD_PREFIX):
                        named.add(tid)
            except OSError:
                continue
        if len(named) >= n or time.monotonic() >= deadline:
            return named
        time.sleep(0.001)


def batch_io_threads(task_dir: str = "/proc/self/task") -> list[int]:
    """Put this process's libzmq I/O threads under ``SCHED_BATCH`` (Linux); returns their thread ids.

    Each send on a socket wakes the context's I/O thread (it encrypts the frame for CURVE and writes
    it to the connection). Under the default policy a woken thread preempts the running one, so
    where the coordinator's loop and its I/O thread share one core (a coordinator host with one
    core free, or the fleet benchmark, which pins the coordinator to one core), every ACK and GRANT
    it sends costs two context switches. ``SCHED_BATCH`` keeps the I/O thread's fair share of the CPU
    but no wakeup preemption: the loop goes on handling its pass, and the I/O thread writes the
    queued frames together when the loop blocks (``poll``, a COMMIT's fsync) or its time slice
    ends, a few milliseconds at most, where leases and heartbeats are counted in seconds. With a
    free core the thread runs there at once, as before. Measured in ``benchmarks/RESULTS.md``
    ("Coordinator hot path, round 3"). Nothing is changed (and ``[]`` returned) where the policy or
    ``/proc`` is not available; a thread that ends meanwhile is skipped. Only named threads are
    found: call :func:`wait_for_io_threads` first for a context just made."""
    import os

    setter = getattr(os, "sched_setscheduler", None)
    policy = getattr(os, "SCHED_BATCH", None)
    if setter is None or policy is None:
        return []
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return []
    done: list[int] = []
    for tid in tids:
        try:
            with open(os.path.join(task_dir, tid, "comm"), encoding="utf-8", errors="replace") as fh:
                name = fh.read().strip()
            if name.startswith(IO_THREAD_PREFIX):
                setter(int(tid), policy, os.sched_param(0))
                done.append(int(tid))
        except (OSError, ValueError):
            continue
    return done
