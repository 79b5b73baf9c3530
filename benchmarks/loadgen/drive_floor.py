"""The floor of the timing check: the simplest possible client, to show what the machine itself adds.

``python -m benchmarks.loadgen.drive_floor --base-url URL --rate R --requests N --out FILE``:
one blocking keep-alive socket, no event loop, no HTTP library. Each request is stamped
(``time.monotonic_ns()``) right before ``sendall`` and again when the first ``recv`` that holds a
token event returns; then the rest of the response is read to its Content-Length. Arrivals are
Poisson at ``R`` (a request whose arrival passed while the previous one ran goes at once). Its
TTFT error against :mod:`.timing_target` is the part of our client's error that any client on
this machine would see: the kernel's loopback, and each side's wake-up from idle.

Writes the same ``samples`` JSON as :mod:`.drive_ours` (``send_ns``, ``first_token_ns``,
``end_ns``, ``error`` per request).
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from benchmarks.loadgen.procs import progress, write_json

_BODY = json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 32, "stream": True}).encode()


def _request(host: str, port: int) -> bytes:
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(_BODY)}\r\n\r\n"
    )
    return head.encode() + _BODY


def one(sock: socket.socket, request: bytes) -> tuple[int, int | None, int, str | None]:
    """Send one request and read its response: (send_ns, first_token_ns, end_ns, error)."""
    send_ns = time.monotonic_ns()
    sock.sendall(request)
    buf = b""
    first_ns: int | None = None
    while b"\r\n\r\n" not in buf or first_ns is None:
        data = sock.recv(65536)
        now = time.monotonic_ns()
        if not data:
            return send_ns, first_ns, now, "connection closed"
        buf += data
        head_end = buf.find(b"\r\n\r\n")
        if head_end >= 0 and first_ns is None and b'"choices":[{' in buf[head_end:]:
            first_ns = now
    head_end = buf.find(b"\r\n\r\n")
    length = 0
    for line in buf[:head_end].decode("latin-1").split("\r\n")[1:]:
        key, _, value = line.partition(":")
        if key.strip().lower() == "content-length":
            length = int(value.strip())
    while len(buf) < head_end + 4 + length:
        data = sock.recv(65536)
        if not data:
            return send_ns, first_ns, time.monotonic_ns(), "connection closed"
        buf += data
    return send_ns, first_ns, time.monotonic_ns(), None


def run(base_url: str, rate: float, n: int, warmup: int, seed: int, clear_url: str | None) -> dict[str, Any]:
    parts = urlsplit(base_url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    request = _request(host, port)
    rng = random.Random(seed)
    out: dict[str, Any] = {"offered": rate, "repeat": 0, "send_ns": [], "first_token_ns": [], "end_ns": [], "error": []}
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(warmup):
            one(sock, request)
        if clear_url:
            with urllib.request.urlopen(clear_url, timeout=10) as resp:
                resp.read()
        arrival = time.monotonic_ns()
        for _ in range(n):
            arrival += int(rng.expovariate(rate) * 1e9)
            wait = (arrival - time.monotonic_ns()) / 1e9
            if wait > 0:
                time.sleep(wait)
            send_ns, first_ns, end_ns, error = one(sock, request)
            out["send_ns"].append(send_ns)
            out["first_token_ns"].append(first_ns)
            out["end_ns"].append(end_ns)
            out["error"].append(error)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--rate", type=float, required=True)
    ap.add_argument("--requests", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--clear-url", help="GET this URL between warm-up and measurement")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    samples = run(args.base_url, args.rate, args.requests, args.warmup, args.seed, args.clear_url)
    write_json(Path(args.out), {"client": "raw socket", "points": [], "samples": [samples]})
    progress(f"raw socket {args.rate:g} req/s: {args.requests} requests done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
