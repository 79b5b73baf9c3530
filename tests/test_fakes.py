"""The test fakes themselves: the fake OpenAI server (measured by the real load generator) and the
TCP fault proxy (between a real ZeroMQ DEALER and ROUTER), all on loopback with deadlines."""

from __future__ import annotations

import asyncio
import http.client
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest
import zmq

from daemon.loadgen import run_load_point
from daemon.models import resolve_model
from servetune.spec import LoadPoint, ModelSpec
from tests.fakes.faultproxy import CHUNK_BYTES, FaultProxy
from tests.fakes.openai_server import FakeOpenAIServer, fake_openai, start_fake_openai_process
from tests.fleet_harness import free_port

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- fake OpenAI server


@pytest.fixture
def tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """The tiny model's vocabulary size and tokenizer.json, generated offline into a tmp cache."""
    monkeypatch.setenv("SERVETUNE_CACHE", str(tmp_path / "cache"))
    model = resolve_model(ModelSpec(source="tiny"))
    assert model.tokenizer_path is not None
    return model.vocab_size, model.tokenizer_path


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_fake_server_streams_what_the_load_generator_measures(
    endpoint: Literal["completions", "chat"], tiny: tuple[int, str]
) -> None:
    vocab_size, tokenizer_path = tiny
    lp = LoadPoint(name="fake", max_concurrency=3, num_requests=6, input_len=16, output_len=8,
                   warmup_requests=1, endpoint=endpoint)
    with FakeOpenAIServer(token_delay_ms=1.0, ttft_ms=5.0) as fake:
        warm, result = run_load_point(fake.base_url, "tiny", vocab_size, lp, deadline_s=20.0,
                                      request_timeout_s=10.0, tokenizer_path=tokenizer_path)
        served = fake.requests_served
    assert len(warm) == 1 and len(result.samples) == 6 and result.stopped_early is None
    for s in [*warm, *result.samples]:
        assert s.error is None, s.error
        assert s.output_tokens == 8 and len(s.token_ns) == 8  # chat's role-only chunk is not a token
        assert s.first_token_ns is not None and s.first_token_ns - s.send_ns >= 5_000_000  # ttft_ms
        assert s.prompt_tokens is not None and s.prompt_tokens > 0
        if endpoint == "completions":
            assert s.prompt_tokens == 16  # token ids are counted exactly
    assert served == 7


def _post(base_url: str, path: str, body: dict[str, object]) -> tuple[int, bytes]:
    host, port = base_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _payloads(raw: bytes) -> list[bytes]:
    return [line[5:].strip() for line in raw.split(b"\n") if line.startswith(b"data:")]


def test_usage_chunk_only_when_asked_and_bad_bodies_refused() -> None:
    with fake_openai(token_delay_ms=0, ttft_ms=0) as url:
        status, raw = _post(url, "/v1/completions", {"model": "m", "prompt": "a b c", "max_tokens": 3, "stream": True})
        assert status == 200
        payloads = _payloads(raw)
        assert payloads[-1] == b"[DONE]" and len(payloads) == 4  # 3 tokens, no usage
        assert all(b'"usage"' not in p for p in payloads)
        status, raw = _post(url, "/v1/completions", {"model": "m", "prompt": "a b c", "max_tokens": 2, "stream": True,
                                                     "stream_options": {"include_usage": True}})
        usage = json.loads(_payloads(raw)[-2])["usage"]
        assert usage == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
        status, raw = _post(url, "/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 2})
        assert status == 400 and b"only streams" in raw
        status, _ = _post(url, "/v1/chat/completions", {"model": "m", "messages": [], "stream": True})
        assert status == 400


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_fake_server_process_writes_its_port_and_stops_on_signal(sig: signal.Signals, tmp_path: Path) -> None:
    proc, url = start_fake_openai_process(tmp_path, token_delay_ms=200.0)
    try:
        host, port = url.removeprefix("http://").split(":")
        assert host == "127.0.0.1"
        conn = http.client.HTTPConnection(host, int(port), timeout=5)
        try:
            conn.request("GET", "/health")
            health = conn.getresponse()
            assert health.status == 200 and health.read() == b""
            conn.request("GET", "/v1/models")
            assert json.loads(conn.getresponse().read())["data"][0]["id"] == "tiny"
        finally:
            conn.close()
        status, raw = _post(url, "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                          "max_tokens": 2, "stream": True})
        assert status == 200 and _payloads(raw)[-1] == b"[DONE]"
        conn = http.client.HTTPConnection(host, int(port), timeout=5)
        try:
            conn.request("GET", "/fake/stats")
            assert json.loads(conn.getresponse().read()) == {"requests_received": 1, "requests_served": 1}
        finally:
            conn.close()
        with socket.create_connection((host, int(port)), timeout=5) as streaming:  # a 20 s stream in flight
            body = json.dumps({"model": "m", "prompt": [11, 12], "max_tokens": 100, "stream": True}).encode()
            streaming.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                              b"Content-Length: %d\r\n\r\n" % len(body) + body)
            assert streaming.recv(4096).startswith(b"HTTP/1.1 200")
            proc.send_signal(sig)
            t0 = time.monotonic()
            assert proc.wait(timeout=5) == 0
        assert time.monotonic() - t0 < 2.0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_fake_server_process_fails_on_a_busy_port(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "tests.fakes.openai_server", "--port", str(port),
                               "--port-file", str(tmp_path / "port")],
                              cwd=REPO, capture_output=True, text=True, timeout=20)
    assert proc.returncode != 0 and "address already in use" in proc.stderr.lower()
    assert not (tmp_path / "port").exists()


# --------------------------------------------------------------------------- fault proxy


@dataclass
class Zmq:
    ctx: zmq.Context[zmq.Socket[bytes]]
    router: zmq.Socket[bytes]
    dealer: zmq.Socket[bytes]
    proxy: FaultProxy

    def send(self, payload: bytes) -> None:
        self.dealer.send(payload, zmq.NOBLOCK)

    def arrives(self, timeout_s: float) -> bytes | None:
        """The next message at the ROUTER within ``timeout_s`` (answered with an echo), or None."""
        if not self.router.poll(int(timeout_s * 1000)):
            return None
        ident, payload = self.router.recv_multipart()
        self.router.send_multipart([ident, b"echo:" + payload])
        return payload

    def round_trip(self, payload: bytes, timeout_s: float = 5.0) -> float:
        """Seconds from DEALER send to the echo's arrival back at the DEALER."""
        t0 = time.monotonic()
        self.send(payload)
        assert self.arrives(timeout_s) == payload
        assert self.dealer.poll(int(max(0.0, timeout_s - (time.monotonic() - t0)) * 1000)), "no echo in time"
        assert self.dealer.recv() == b"echo:" + payload
        return time.monotonic() - t0


@pytest.fixture
def zq() -> Iterator[Zmq]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.ROUTER_HANDOVER, 1)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    proxy = FaultProxy("127.0.0.1", port)
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.IDENTITY, b"daemon-1")
    dealer.setsockopt(zmq.RECONNECT_IVL, 100)
    dealer.connect(proxy.address)
    try:
        yield Zmq(ctx, router, dealer, proxy)
    finally:
        dealer.close(0)
        router.close(0)
        t0 = time.monotonic()
        proxy.close()
        assert time.monotonic() - t0 < 2.0
        ctx.term()


def _wait_for(cond: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return bool(cond())


def test_proxy_forwards_then_blackholes_then_recovers(zq: Zmq) -> None:
    zq.round_trip(b"hello")
    s = zq.proxy.stats()
    assert s["connections_accepted"] == 1 and s["bytes_forwarded_to_target"] > 0 and s["bytes_forwarded_to_client"] > 0
    assert s["bytes_dropped"] == 0

    zq.proxy.blackhole()
    zq.send(b"into the void")
    assert zq.arrives(0.5) is None
    s = zq.proxy.stats()
    assert s["bytes_dropped"] > 0 and s["connections_open"] == 1 and s["connections_reset"] == 0

    zq.proxy.pass_through()
    zq.send(b"after")
    assert zq.arrives(5.0) == b"after"  # the blackholed message is lost, never late


def test_proxy_delays_each_direction_in_order(zq: Zmq) -> None:
    zq.round_trip(b"warm")
    zq.proxy.delay(0.3)
    assert zq.round_trip(b"slow") >= 0.55  # 0.3 s each way (timers may fire a hair early)
    t0 = time.monotonic()
    for i in range(20):
        zq.send(b"m%d" % i)
    got = [zq.arrives(3.0) for _ in range(20)]
    assert got == [b"m%d" % i for i in range(20)]
    assert time.monotonic() - t0 >= 0.25
    echoes: list[bytes] = []
    while len(echoes) < 20 and zq.dealer.poll(3000):
        echoes.append(zq.dealer.recv())
    assert echoes == [b"echo:m%d" % i for i in range(20)]
    assert zq.proxy.stats()["chunks_delayed"] >= 3
    zq.proxy.pass_through()
    assert zq.round_trip(b"fast") < 0.25


def test_proxy_reset_sends_rst_and_the_dealer_reconnects(zq: Zmq) -> None:
    zq.round_trip(b"before")
    assert zq.proxy.reset() == 1
    s = zq.proxy.stats()
    assert s["connections_reset"] >= 1 and s["connections_open"] == 0
    t0 = time.monotonic()
    zq.send(b"after reset")
    assert zq.arrives(5.0) == b"after reset"
    assert time.monotonic() - t0 < 3.0
    assert zq.proxy.stats()["connections_accepted"] == 2


def test_proxy_refuses_new_connections_while_asked(zq: Zmq) -> None:
    zq.round_trip(b"before")
    zq.proxy.refuse(True)
    zq.proxy.reset()
    assert _wait_for(lambda: zq.proxy.stats()["connections_refused"] >= 1, 3.0)
    zq.send(b"queued")
    assert zq.arrives(0.5) is None
    zq.proxy.refuse(False)
    assert zq.arrives(5.0) == b"queued"  # the DEALER kept it queued and reconnected


def _target_listener() -> tuple[socket.socket, list[bytes], threading.Thread]:
    """A raw TCP target on loopback that reads one connection to its end."""
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(5)
    got: list[bytes] = []

    def serve() -> None:
        try:
            conn, _ = srv.accept()
        except OSError:
            return
        conn.settimeout(5)
        with conn:
            try:
                while chunk := conn.recv(1 << 16):
                    got.append(chunk)
            except OSError:
                got.append(b"<reset>")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return srv, got, thread


def test_proxy_bounds_what_it_queues() -> None:
    payload = b"x" * (8 * CHUNK_BYTES)
    # pass-through: a queue at the bound waits for the writer (backpressure); everything arrives
    srv, got, thread = _target_listener()
    with srv, FaultProxy("127.0.0.1", srv.getsockname()[1], max_buffer_bytes=CHUNK_BYTES) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as client:
            client.sendall(payload)
        thread.join(5)
        assert b"".join(got) == payload
        assert proxy.stats()["connections_overflowed"] == 0
    # delay: over the bound, the connection is dropped and counted
    srv, got, thread = _target_listener()
    with srv, FaultProxy("127.0.0.1", srv.getsockname()[1], max_buffer_bytes=CHUNK_BYTES) as proxy:
        proxy.delay(5.0)
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as client:
            with pytest.raises(OSError):
                for _ in range(64):  # until the proxy's RST reaches us
                    client.sendall(payload)
                    time.sleep(0.01)
        assert _wait_for(lambda: proxy.stats()["connections_overflowed"] == 1, 3.0)
        thread.join(5)
        assert sum(len(c) for c in got if c != b"<reset>") < len(payload)


def test_proxy_reset_is_an_rst_on_both_legs_and_new_connections_are_blackholed() -> None:
    srv, got, thread = _target_listener()
    with srv, FaultProxy("127.0.0.1", srv.getsockname()[1]) as proxy:
        proxy.blackhole()
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as client:
            assert _wait_for(lambda: proxy.stats()["connections_accepted"] == 1, 3.0)
            client.sendall(b"dropped")
            client.settimeout(0.3)
            with pytest.raises(TimeoutError):
                client.recv(16)  # open, and silent
            assert _wait_for(lambda: proxy.stats()["bytes_dropped"] == 7, 3.0)
            assert proxy.reset() == 1
            client.settimeout(5)
            with pytest.raises(ConnectionResetError):  # an RST, not a FIN (which reads as b"")
                client.recv(16)
        thread.join(5)
        assert got == [b"<reset>"]  # the target's leg was reset too, and saw no byte
        assert proxy.stats()["connections_reset"] == 1


def test_proxy_only_forwards_to_loopback() -> None:
    with pytest.raises(ValueError, match="loopback"):
        FaultProxy("192.0.2.1", 5555)
    with pytest.raises(ValueError, match="loopback"):
        FaultProxy("example.com", 5555)


def test_proxy_never_listens_on_the_port_its_target_is_about_to_take(monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness picks the coordinator's port with ``free_port()`` and the coordinator binds it
    seconds later; a proxy made in between may be given that very port by the kernel. It must take
    another: proxying to itself, each connection would open another until file descriptors ran out
    (CI stop 32: ``OSError: [Errno 24] Too many open files`` in test_fleet_breaker)."""
    from tests.fakes import faultproxy

    target = free_port()
    real = asyncio.start_server
    calls: list[int] = []

    async def kernel_hands_out_the_target_port(cb, host, port, **kw):  # type: ignore[no-untyped-def]
        calls.append(port)
        return await real(cb, host, target if len(calls) == 1 else port, **kw)

    monkeypatch.setattr(faultproxy.asyncio, "start_server", kernel_hands_out_the_target_port)
    with FaultProxy("127.0.0.1", target) as proxy:
        assert len(calls) == 2 and proxy.port != target
        srv = socket.create_server(("127.0.0.1", target))  # the target binds its port at last
        with srv, socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as client:
            conn, _ = srv.accept()
            with conn:
                client.sendall(b"ping")
                conn.settimeout(5)
                assert conn.recv(16) == b"ping"
        assert proxy.stats()["connections_accepted"] == 1
