"""A self-timing target: streams the canned completion after a known delay and logs its own times.

``python -m benchmarks.loadgen.timing_target --port P --delay-ms D``. For every
``POST /v1/completions`` it records, with ``time.monotonic_ns()`` (CLOCK_MONOTONIC, the clock our
client stamps its samples with), ``recv_ns``: when the first byte of the request arrived, and
``first_byte_ns``: just before it writes the response head together with the first token event,
``D`` ms after the request was complete. The other events follow at once. The server's own TTFT
is ``first_byte_ns - recv_ns``; comparing it with the client's TTFT of the same request shows
how much the client adds (its send path before the request reaches the socket, and its receive
path until it stamps the first token).

``GET /_log`` returns the records so far, in arrival order, as JSON ``[[recv_ns, first_byte_ns],
...]`` and forgets them; ``GET /health`` answers 200. HTTP/1.1 with keep-alive and a
Content-Length request body (what aiohttp sends); no pipelining. One asyncio event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time

from benchmarks.loadgen.sse import completion_events

_EVENTS = completion_events()
_BODY_LEN = sum(len(e) for e in _EVENTS)
_HEAD = (
    "HTTP/1.1 200 OK\r\n"
    "Content-Type: text/event-stream\r\n"
    f"Content-Length: {_BODY_LEN}\r\n"
    "Connection: keep-alive\r\n\r\n"
).encode()
_FIRST = _HEAD + _EVENTS[0]
_REST = b"".join(_EVENTS[1:])


def _plain(status: str, body: bytes, ctype: str = "application/json") -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\nConnection: keep-alive\r\n\r\n"
    )
    return head.encode() + body


class _Log:
    def __init__(self) -> None:
        self.records: list[list[int]] = []

    def take(self) -> list[list[int]]:
        out, self.records = self.records, []
        return out


class _Conn(asyncio.Protocol):
    def __init__(self, log: _Log, delay_s: float) -> None:
        self.log = log
        self.delay_s = delay_s
        self.buf = b""
        self.recv_ns: int | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        if not self.buf:
            self.recv_ns = now  # the first byte of a new request
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = self.buf[:end].decode("latin-1").split("\r\n")
            method, path = (lines[0].split(" ") + ["", ""])[:2]
            length = 0
            for line in lines[1:]:
                key, _, value = line.partition(":")
                if key.strip().lower() == "content-length":
                    length = int(value.strip())
            total = end + 4 + length
            if len(self.buf) < total:
                return
            self.buf = self.buf[total:]
            recv_ns = self.recv_ns if self.recv_ns is not None else now
            self.recv_ns = now if self.buf else None
            self._handle(method, path, recv_ns)

    def _handle(self, method: str, path: str, recv_ns: int) -> None:
        assert self.transport is not None
        if method == "POST" and path == "/v1/completions":
            asyncio.get_running_loop().call_later(self.delay_s, self._respond, recv_ns)
        elif method == "GET" and path == "/_log":
            self.transport.write(_plain("200 OK", json.dumps(self.log.take()).encode()))
        elif method == "GET" and path == "/health":
            self.transport.write(_plain("200 OK", b""))
        else:
            self.transport.write(_plain("404 Not Found", b""))

    def _respond(self, recv_ns: int) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        first_byte_ns = time.monotonic_ns()
        self.transport.write(_FIRST)
        self.transport.write(_REST)
        self.log.records.append([recv_ns, first_byte_ns])


async def serve(port: int, delay_s: float) -> None:
    loop = asyncio.get_running_loop()
    log = _Log()
    server = await loop.create_server(lambda: _Conn(log, delay_s), "127.0.0.1", port, backlog=1024)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"timing target listening on 127.0.0.1:{port}, first byte {delay_s * 1e3:g} ms after the request", flush=True)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--delay-ms", type=float, default=5.0)
    args = ap.parse_args(argv)
    asyncio.run(serve(args.port, args.delay_ms / 1e3))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
