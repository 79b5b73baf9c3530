"""A FAKE network between a ZeroMQ DEALER (daemon) and ROUTER (coordinator): a TCP fault proxy on
loopback whose faults can be switched while connections are open.

Fake: it stands in for a network that loses, delays or breaks connections, which loopback never
does. The daemon connects to :attr:`FaultProxy.address` instead of the coordinator; the proxy
opens one connection to the target (the coordinator's ROUTER) per accepted connection and
forwards bytes both ways. It is protocol-blind: ZeroMQ sees whatever TCP would show it.

Modes (switch any time, from any thread; they apply to every connection, open or new):

- :meth:`~FaultProxy.pass_through`: forward every chunk as it arrives.
- :meth:`~FaultProxy.blackhole`: keep connections open, drop every byte both ways (and hold back
  FINs: a peer that closes is not seen to close until the blackhole ends). New connections are
  accepted and blackholed as well. Chunks queued by a delay are dropped too.
- :meth:`~FaultProxy.delay`: forward each chunk ``seconds`` after it was read, in order. The delay
  is fixed when a chunk is read; changing the mode does not reorder or hurry queued chunks.
- :meth:`~FaultProxy.reset`: abort every open connection with a TCP RST on both legs (SO_LINGER on
  with timeout 0, then close) and go on accepting new ones in the current mode.
- :meth:`~FaultProxy.refuse`: while on, new connections are closed at once with an RST (the
  listening socket stays open, so the port is never lost to another process).

Memory is bounded: one direction of one connection queues at most ``max_buffer_bytes``. Under
:meth:`delay` a chunk beyond that aborts the connection (counted as ``connections_overflowed``);
otherwise the proxy stops reading that direction until its queue drains, as TCP would.

Counters (:meth:`FaultProxy.stats`): ``bytes_forwarded`` (and per direction,
``bytes_forwarded_to_target`` and ``bytes_forwarded_to_client``), ``bytes_dropped``,
``chunks_delayed``, ``connections_accepted``, ``connections_refused``, ``connections_failed`` (the
target did not accept), ``connections_reset``, ``connections_overflowed``, ``connections_open``.
A test that expects a fault asserts its counter moved, so a scenario that never hit it fails.

Threading: the proxy runs an asyncio loop in its own daemon thread, started by the constructor.
Every public method may be called from any thread; each waits at most :data:`CALL_TIMEOUT_S`.
Only loopback addresses are used: the proxy listens on 127.0.0.1 and refuses other targets.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import struct
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
#: Default bound on what one direction of one connection may queue.
MAX_BUFFER_BYTES = 64 * 1024 * 1024
#: Largest chunk read at once.
CHUNK_BYTES = 256 * 1024
#: How long a connection to the target may take.
CONNECT_TIMEOUT_S = 5.0
#: Ports tried before giving up on one other than the target's (:meth:`FaultProxy._listen`).
LISTEN_TRIES = 5
#: How long a public method waits for the proxy's loop (close() included).
CALL_TIMEOUT_S = 2.0

Mode = Literal["pass_through", "blackhole", "delay"]
Direction = Literal["to_target", "to_client"]
T = TypeVar("T")

_COUNTERS = (
    "bytes_forwarded_to_target", "bytes_forwarded_to_client", "bytes_dropped", "chunks_delayed",
    "connections_accepted", "connections_refused", "connections_failed", "connections_reset",
    "connections_overflowed",
)
_LINGER_RST = struct.pack("ii", 1, 0)


class FaultProxyError(RuntimeError):
    """The proxy could not start, or its loop did not answer within :data:`CALL_TIMEOUT_S`."""


def _loopback(host: str) -> str:
    if host == "localhost":
        return HOST
    try:
        if ipaddress.ip_address(host).is_loopback:
            return host
    except ValueError:
        pass
    raise ValueError(f"the fault proxy only forwards to loopback addresses, not {host!r}")


def _abort(writer: asyncio.StreamWriter, rst: bool) -> None:
    """Close a connection now; with ``rst`` the kernel sends an RST instead of a FIN."""
    if rst:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
    writer.transport.abort()


@dataclass(eq=False)
class _Pipe:
    """One direction of one connection: chunks read from one side, queued, written to the other."""

    name: Direction
    queue: asyncio.Queue[tuple[float, bool, bytes | None]] = field(default_factory=asyncio.Queue)
    queued_bytes: int = 0
    space: asyncio.Event = field(default_factory=asyncio.Event)
    finished: bool = False


@dataclass(eq=False)
class _Link:
    """One proxied connection: the client leg, the target leg and the four tasks that move bytes."""

    client: asyncio.StreamWriter
    target: asyncio.StreamWriter
    pipes: tuple[_Pipe, _Pipe] = field(default_factory=lambda: (_Pipe("to_target"), _Pipe("to_client")))
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    closed: bool = False

    def abort(self, rst: bool) -> None:
        if self.closed:
            return
        self.closed = True
        _abort(self.client, rst)
        _abort(self.target, rst)
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()


class FaultProxy:
    """A TCP proxy from 127.0.0.1:``port`` to ``target_host:target_port`` with switchable faults.

    Starts listening in the constructor (raises :class:`FaultProxyError` if it cannot within
    :data:`CALL_TIMEOUT_S`) in pass-through mode. Use it as a context manager, or call
    :meth:`close`.

    Args:
        target_host: a loopback address (``127.0.0.1``, ``::1`` or ``localhost``); others raise ValueError.
        target_port: the port of the target (e.g. the coordinator's ROUTER).
        max_buffer_bytes: most bytes one direction of one connection may queue.
    """

    def __init__(self, target_host: str, target_port: int, *, max_buffer_bytes: int = MAX_BUFFER_BYTES) -> None:
        if not 0 < target_port <= 65535:
            raise ValueError(f"target_port must be in [1, 65535], got {target_port}")
        if max_buffer_bytes < CHUNK_BYTES:
            raise ValueError(f"max_buffer_bytes must be at least {CHUNK_BYTES}")
        self.target_host = _loopback(target_host)
        self.target_port = target_port
        self.max_buffer_bytes = max_buffer_bytes
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(_COUNTERS, 0)
        self._mode: Mode = "pass_through"
        self._delay_s = 0.0
        self._refusing = False
        self._links: set[_Link] = set()
        self._server: asyncio.Server | None = None
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._not_blackholed = asyncio.Event()
        self._thread = threading.Thread(target=self._run_loop, name="fault-proxy", daemon=True)
        self._thread.start()
        try:
            self._server = self._call(self._listen())
        except BaseException:
            self._stop_loop()
            raise
        self.port: int = int(self._server.sockets[0].getsockname()[1])

    @property
    def address(self) -> str:
        """The ZeroMQ endpoint to connect to instead of the target: ``tcp://127.0.0.1:PORT``."""
        return f"tcp://{HOST}:{self.port}"

    # ------------------------------------------------------------------ controls (any thread)

    def pass_through(self) -> None:
        """Forward everything as it arrives."""
        self._set_mode("pass_through", 0.0)

    def blackhole(self) -> None:
        """Drop every byte both ways, keeping connections (and their FINs) held open."""
        self._set_mode("blackhole", 0.0)

    def delay(self, seconds: float) -> None:
        """Forward each chunk read from now on ``seconds`` after it was read, in order."""
        if seconds < 0:
            raise ValueError(f"a delay must not be negative, got {seconds}")
        self._set_mode("delay", seconds)

    def refuse(self, on: bool = True) -> None:
        """While on, close new connections at once with an RST; open ones are left alone."""
        with self._lock:
            self._refusing = on

    def reset(self) -> int:
        """Abort every open connection with an RST on both legs; returns how many were reset.
        The RSTs have been sent when it returns."""
        return self._call(self._reset_all())

    def stats(self) -> dict[str, int]:
        """A snapshot of the counters (see the module docstring)."""
        with self._lock:
            out = dict(self._counts)
            out["connections_open"] = len(self._links)
        out["bytes_forwarded"] = out["bytes_forwarded_to_target"] + out["bytes_forwarded_to_client"]
        return out

    @property
    def mode(self) -> Mode:
        return self._mode

    def close(self) -> None:
        """Stop listening, close every connection and stop the thread (idempotent; at most about
        :data:`CALL_TIMEOUT_S`). Raises :class:`FaultProxyError` if the thread would not stop."""
        if self._closed:
            return
        self._closed = True
        try:
            self._call(self._shutdown())
        finally:
            self._stop_loop()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ plumbing

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    def _stop_loop(self) -> None:
        if not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CALL_TIMEOUT_S)
        if self._thread.is_alive():
            raise FaultProxyError(f"the fault proxy's thread did not stop within {CALL_TIMEOUT_S} s")

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the proxy's loop and wait for it, at most :data:`CALL_TIMEOUT_S`."""
        if self._loop.is_closed() or not self._thread.is_alive():
            coro.close()
            raise FaultProxyError("the fault proxy is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(CALL_TIMEOUT_S)
        except TimeoutError:
            future.cancel()
            raise FaultProxyError(f"the fault proxy's loop did not answer within {CALL_TIMEOUT_S} s") from None

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def _set_mode(self, mode: Mode, delay_s: float) -> None:
        with self._lock:
            self._mode, self._delay_s = mode, delay_s
        if not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._apply_mode)
        log.info("fault proxy :%d -> %s%s", self.port, mode, f" ({delay_s:g} s)" if mode == "delay" else "")

    # ------------------------------------------------------------------ on the loop

    def _apply_mode(self) -> None:
        if self._mode == "blackhole":
            self._not_blackholed.clear()
        else:
            self._not_blackholed.set()

    async def _listen(self) -> asyncio.Server:
        """Listen on a free port that is not the target's. A target that is not bound yet (a
        coordinator still starting on a port the harness picked with ``free_port()``) leaves its
        port free, and the kernel may give it to the proxy: every connection would then open
        another to the proxy itself until the process runs out of file descriptors."""
        self._apply_mode()
        for _ in range(LISTEN_TRIES):
            server = await asyncio.start_server(self._on_client, HOST, 0, limit=CHUNK_BYTES)
            if int(server.sockets[0].getsockname()[1]) != self.target_port:
                return server
            log.info("fault proxy: given the target's own port %d to listen on; taking another", self.target_port)
            server.close()
            await server.wait_closed()
        raise FaultProxyError(f"no free port other than the target's {self.target_port} in {LISTEN_TRIES} tries")

    async def _reset_all(self) -> int:
        links = list(self._links)
        for link in links:
            link.abort(rst=True)
            self._forget(link)
        self._count("connections_reset", len(links))
        if links:
            log.info("fault proxy :%d reset %d connections", self.port, len(links))
        return len(links)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        links = list(self._links)
        for link in links:
            link.abort(rst=False)
            self._forget(link)
        tasks = [t for link in links for t in link.tasks if not t.done()]
        if tasks:  # let the cancelled tasks unwind before the loop stops
            await asyncio.wait(tasks, timeout=CALL_TIMEOUT_S / 2)
        await asyncio.sleep(0)  # and the aborted transports call connection_lost

    def _forget(self, link: _Link) -> None:
        with self._lock:
            self._links.discard(link)

    async def _on_client(self, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        if self._refusing or self._closed:
            self._count("connections_refused")
            _abort(client, rst=True)
            return
        try:
            target_reader, target = await asyncio.wait_for(
                asyncio.open_connection(self.target_host, self.target_port, limit=CHUNK_BYTES), CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            log.debug("fault proxy :%d: target %s:%d not reachable: %s", self.port, self.target_host,
                      self.target_port, exc)
            self._count("connections_failed")
            _abort(client, rst=True)
            return
        if self._closed:
            _abort(client, rst=False)
            _abort(target, rst=False)
            return
        link = _Link(client, target)
        with self._lock:
            self._links.add(link)
            self._counts["connections_accepted"] += 1
        up, down = link.pipes
        link.tasks = [
            asyncio.ensure_future(self._read(link, up, client_reader)),
            asyncio.ensure_future(self._write(link, up, target)),
            asyncio.ensure_future(self._read(link, down, target_reader)),
            asyncio.ensure_future(self._write(link, down, client)),
        ]

    async def _read(self, link: _Link, pipe: _Pipe, reader: asyncio.StreamReader) -> None:
        """Read one side into ``pipe`` until EOF; an error aborts the whole connection."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                chunk = await reader.read(CHUNK_BYTES)
                if not chunk:
                    break
                mode, delay_s = self._mode, self._delay_s
                if mode == "blackhole":
                    self._count("bytes_dropped", len(chunk))
                    continue
                if pipe.queued_bytes + len(chunk) > self.max_buffer_bytes:
                    if mode == "delay":
                        log.warning("fault proxy :%d: %s queue over %d bytes, connection dropped", self.port,
                                    pipe.name, self.max_buffer_bytes)
                        self._count("connections_overflowed")
                        self._count("bytes_dropped", len(chunk) + pipe.queued_bytes)
                        link.abort(rst=True)
                        self._forget(link)
                        return
                    while pipe.queued_bytes + len(chunk) > self.max_buffer_bytes:  # backpressure, as TCP
                        pipe.space.clear()
                        await pipe.space.wait()
                delayed = mode == "delay" and delay_s > 0
                pipe.queued_bytes += len(chunk)
                pipe.queue.put_nowait((loop.time() + (delay_s if delayed else 0.0), delayed, chunk))
        except OSError as exc:  # the peer reset its leg: break the other one too
            log.debug("fault proxy :%d: %s leg failed: %s", self.port, pipe.name, exc)
            link.abort(rst=True)
            self._forget(link)
            return
        pipe.queue.put_nowait((loop.time(), False, None))

    async def _write(self, link: _Link, pipe: _Pipe, writer: asyncio.StreamWriter) -> None:
        """Write ``pipe``'s chunks to the other side when due; drop them while blackholed."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                due, delayed, chunk = await pipe.queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if chunk is None:
                    await self._not_blackholed.wait()  # a blackhole swallows the FIN as well
                    if writer.can_write_eof():
                        writer.write_eof()
                    pipe.finished = True
                    if all(p.finished for p in link.pipes):
                        link.abort(rst=False)
                        self._forget(link)
                    return
                pipe.queued_bytes -= len(chunk)
                pipe.space.set()
                if self._mode == "blackhole":
                    self._count("bytes_dropped", len(chunk))
                    continue
                writer.write(chunk)
                await writer.drain()
                with self._lock:
                    self._counts[f"bytes_forwarded_{pipe.name}"] += len(chunk)
                    if delayed:
                        self._counts["chunks_delayed"] += 1
        except OSError as exc:
            log.debug("fault proxy :%d: writing %s failed: %s", self.port, pipe.name, exc)
            link.abort(rst=True)
            self._forget(link)
