"""A FAKE OpenAI-compatible streaming server, so fleet tests can sweep with the ``openai`` backend
without a GPU or vLLM. It generates nothing: it streams canned token chunks at a set pace.

Fake: it stands in for a vLLM server (which needs a GPU, or 45 s of CPU start-up) and only for
what the daemon's load generator (:mod:`daemon.loadgen`, :mod:`daemon.stream`) and the
``openai`` backend use of one:

- ``POST /v1/completions`` and ``POST /v1/chat/completions`` with ``stream: true``: after
  ``ttft_ms`` the first token chunk, then one chunk every ``token_delay_ms``, ``max_tokens`` in
  all (``max_completion_tokens`` for chat; 16 when neither is given), the last with
  ``finish_reason: "length"``; then, when the request asks for ``stream_options.include_usage``, a
  usage chunk (empty ``choices``), then ``data: [DONE]``. Chat streams open with vLLM's role-only
  chunk. Compact JSON, like vLLM. ``prompt_tokens`` is the length of a token-id prompt, or a word
  count for text (this fake has no tokenizer). Other bodies get a 400 with an OpenAI error object.
- ``GET /health`` (200, empty body), ``GET /v1/models`` (one model: the last ``model`` asked for,
  ``tiny`` before any request), ``GET /fake/stats`` (this fake's counters as JSON, for a test that
  runs it as a process), ``GET /fake/requests`` (the request log below, as JSON). No ``/metrics``:
  specs that use it need ``scrape_metrics: false``.
- The endpoint's own request log (:attr:`FakeOpenAI.request_log`, at most
  :data:`REQUEST_LOG_LIMIT` entries, the oldest dropped first): one :class:`LoggedRequest` per
  completions or chat request, with who sent it (the bearer token of its ``Authorization``
  header, else the peer address), when it arrived and when its stream ended (``time.monotonic()``,
  which is machine-wide on Linux), and its status. Fleet tests give each daemon its own API key
  to tell their requests apart, as a shared endpoint's own log would.

It listens on 127.0.0.1 only. Three ways to run it:

- ``python -m tests.fakes.openai_server --port 0 --port-file PATH`` from the repo root: a process
  that writes its port to ``PATH`` (atomically) once listening and exits 0 within 2 s of SIGTERM
  or SIGINT; :func:`start_fake_openai_process` starts one and waits for the port file.
- :class:`FakeOpenAIServer`: in-process, on its own event loop in a background thread, with the
  request counters; :func:`fake_openai` is the same as a context manager that yields the base URL.

Thread-safety: :class:`FakeOpenAIServer`'s counters are written on its loop's thread and may be
read from any thread (plain ints).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
#: ``max_tokens`` when a request gives none (vLLM's completions default).
DEFAULT_MAX_TOKENS = 16
#: The most tokens one request may ask for (a fake has no use for more; a typo should not stream forever).
MAX_TOKENS_LIMIT = 100_000
#: How long in-flight streams get when the server stops (seconds).
SHUTDOWN_GRACE_S = 0.25
#: How long the helpers wait for the server to listen or to stop (seconds).
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 5.0

#: The most requests :attr:`FakeOpenAI.request_log` keeps (a long-lived fake must not grow without bound).
REQUEST_LOG_LIMIT = 100_000

_TOKEN_TEXT = " tok"
_REPO = Path(__file__).resolve().parents[2]


class BadRequest(ValueError):
    """A request body this fake refuses (the 400 answer's message)."""


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _words(value: object) -> int:
    """A text's word count; for chat content parts, the words of their ``text``."""
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        return sum(_words(part.get("text") if isinstance(part, dict) else part) for part in value)
    return 0


def prompt_tokens(body: dict[str, Any], chat: bool) -> int:
    """The ``prompt_tokens`` to report: token ids counted exactly, text by words (no tokenizer)."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        return sum(_words(m.get("content")) for m in messages if isinstance(m, dict))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    if isinstance(prompt, (str, list)):
        return _words(prompt)
    raise BadRequest("prompt must be a string or a list of token ids")


def output_tokens(body: dict[str, Any], chat: bool) -> int:
    """How many token chunks to stream: ``max_tokens`` (chat: or ``max_completion_tokens``)."""
    value = body.get("max_tokens")
    if value is None and chat:
        value = body.get("max_completion_tokens")
    if value is None:
        return DEFAULT_MAX_TOKENS
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_TOKENS_LIMIT:
        raise BadRequest(f"max_tokens must be an integer in [0, {MAX_TOKENS_LIMIT}], got {value!r}")
    return value


class StreamShape:
    """The chunks of one streamed answer (pure): a completions or a chat stream of one model."""

    def __init__(self, chat: bool, model: str, request_no: int) -> None:
        self.chat = chat
        kind = "chatcmpl" if chat else "cmpl"
        self._base: dict[str, Any] = {
            "id": f"{kind}-fake-{request_no}",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": model,
        }

    def role(self) -> bytes:
        """vLLM's first chat chunk: it announces the role and is not a token."""
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        return _event(self._base | {"choices": [choice]})

    def token(self, last: bool) -> bytes:
        content: dict[str, Any] = {"delta": {"content": _TOKEN_TEXT}} if self.chat else {"text": _TOKEN_TEXT}
        choice = {"index": 0, **content, "logprobs": None, "finish_reason": "length" if last else None}
        return _event(self._base | {"choices": [choice]})

    def usage(self, n_prompt: int, n_output: int) -> bytes:
        usage = {"prompt_tokens": n_prompt, "total_tokens": n_prompt + n_output, "completion_tokens": n_output}
        return _event(self._base | {"choices": [], "usage": usage})

    @staticmethod
    def done() -> bytes:
        return b"data: [DONE]\n\n"


@dataclass(frozen=True)
class LoggedRequest:
    """One request as the endpoint saw it: ``client`` (bearer token or peer), ``start`` / ``end``
    (``time.monotonic()`` seconds; ``end`` when the stream ended or was cut), ``status``."""

    client: str
    start: float
    end: float
    status: int


class FakeOpenAI:
    """The request handlers and counters (no sockets of its own; :func:`serve` runs it).

    Args:
        token_delay_ms: time between two token chunks of one stream.
        ttft_ms: time from the request to its first token chunk.
    """

    def __init__(self, token_delay_ms: float = 1.0, ttft_ms: float = 2.0) -> None:
        if token_delay_ms < 0 or ttft_ms < 0:
            raise ValueError("token_delay_ms and ttft_ms must not be negative")
        self.token_delay_s = token_delay_ms / 1000.0
        self.ttft_s = ttft_ms / 1000.0
        #: completions and chat requests received, and those streamed to ``[DONE]`` (counted just
        #: before ``[DONE]`` is written, so a client that read it sees it counted).
        self.requests_received = 0
        self.requests_served = 0
        self.model = "tiny"
        #: The endpoint's own request log (written on the loop's thread; copy it to read elsewhere).
        self.request_log: deque[LoggedRequest] = deque(maxlen=REQUEST_LOG_LIMIT)

    def stats(self) -> dict[str, int]:
        return {"requests_received": self.requests_received, "requests_served": self.requests_served}

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/fake/stats", self._stats)
        app.router.add_get("/fake/requests", self._requests)
        return app

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _models(self, request: web.Request) -> web.Response:
        model = {"id": self.model, "object": "model", "created": 0, "owned_by": "servetune-fake"}
        return web.json_response({"object": "list", "data": [model]})

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats())

    async def _requests(self, request: web.Request) -> web.Response:
        return web.json_response([asdict(r) for r in list(self.request_log)])

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._logged(request, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._logged(request, chat=True)

    async def _logged(self, request: web.Request, chat: bool) -> web.StreamResponse:
        start = time.monotonic()
        auth = request.headers.get("Authorization", "")
        client = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else str(request.remote)
        status = 499  # the client went away mid-stream (nginx's word for it)
        try:
            resp = await self._stream(request, chat)
            status = resp.status
            return resp
        finally:
            self.request_log.append(LoggedRequest(client, start, time.monotonic(), status))

    async def _stream(self, request: web.Request, chat: bool) -> web.StreamResponse:
        self.requests_received += 1
        request_no = self.requests_received
        try:
            try:
                body = await request.json()
            except ValueError as exc:
                raise BadRequest(f"the body is not JSON: {exc}") from None
            if not isinstance(body, dict):
                raise BadRequest("the body must be a JSON object")
            if body.get("stream") is not True:
                raise BadRequest("this fake only streams: send stream: true")
            n_prompt = prompt_tokens(body, chat)
            n_output = output_tokens(body, chat)
        except BadRequest as exc:
            error = {"message": str(exc), "type": "BadRequestError", "code": 400}
            return web.json_response({"object": "error", "error": error}, status=400)
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        model = str(body.get("model") or self.model)
        self.model = model
        shape = StreamShape(chat, model, request_no)

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        await asyncio.sleep(self.ttft_s)
        if chat:
            await resp.write(shape.role())
        for i in range(n_output):
            if i:
                await asyncio.sleep(self.token_delay_s)
            await resp.write(shape.token(last=i == n_output - 1))
        if include_usage:
            await resp.write(shape.usage(n_prompt, n_output))
        # counted before [DONE] goes out, so a client that has read it sees the count include it
        self.requests_served += 1
        try:
            await resp.write(shape.done())
            await resp.write_eof()
        except BaseException:
            self.requests_served -= 1
            raise
        return resp


async def serve(fake: FakeOpenAI, port: int, stop: asyncio.Event, on_listening: Callable[[int], None]) -> None:
    """Serve ``fake`` on 127.0.0.1:``port`` (0: any free port) until ``stop`` is set.

    ``on_listening(port)`` is called once the socket listens. Streams still running when ``stop``
    is set get :data:`SHUTDOWN_GRACE_S` to end, then their connections are closed.
    """
    runner = web.AppRunner(fake.app(), access_log=None, shutdown_timeout=SHUTDOWN_GRACE_S)
    await runner.setup()
    try:
        site = web.TCPSite(runner, HOST, port)
        await site.start()
        server = site._server  # aiohttp has no public accessor for the bound port
        assert isinstance(server, asyncio.Server)
        bound = int(server.sockets[0].getsockname()[1])
        log.info("fake OpenAI server listening on http://%s:%d", HOST, bound)
        on_listening(bound)
        await stop.wait()
    finally:
        await runner.cleanup()


class FakeOpenAIServer:
    """:class:`FakeOpenAI` served on its own event loop in a background (daemon) thread.

    ``with FakeOpenAIServer() as fake:`` starts it (waits until it listens, at most
    :data:`START_TIMEOUT_S`) and stops it at the end (at most :data:`STOP_TIMEOUT_S`).
    ``fake.base_url`` is ``http://127.0.0.1:PORT``; ``fake.requests_served`` counts the streams
    sent to ``[DONE]``, ``fake.requests_received`` every completions or chat request.
    """

    def __init__(self, token_delay_ms: float = 1.0, ttft_ms: float = 2.0, port: int = 0) -> None:
        self.fake = FakeOpenAI(token_delay_ms=token_delay_ms, ttft_ms=ttft_ms)
        self._want_port = port
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._listening = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        if not self.port:
            raise RuntimeError("the fake OpenAI server is not running")
        return f"http://{HOST}:{self.port}"

    @property
    def requests_served(self) -> int:
        return self.fake.requests_served

    @property
    def requests_received(self) -> int:
        return self.fake.requests_received

    def start(self) -> None:
        """Start serving; returns once it listens. Raises RuntimeError when it did not in time."""
        if self._thread is not None:
            raise RuntimeError("already started")
        self._thread = threading.Thread(target=self._run, name="fake-openai", daemon=True)
        self._thread.start()
        if not self._listening.wait(START_TIMEOUT_S) or self._error is not None:
            self.stop()
            raise RuntimeError(f"the fake OpenAI server did not start: {self._error!r}")

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._stop = asyncio.Event()

        def listening(port: int) -> None:
            self.port = port
            self._listening.set()

        try:
            loop.run_until_complete(serve(self.fake, self._want_port, self._stop, listening))
        except BaseException as exc:  # reported to start(); a thread has no one else to tell
            self._error = exc
            self._listening.set()
        finally:
            loop.close()

    def stop(self) -> None:
        """Stop serving and join the thread (idempotent). Raises RuntimeError if it would not stop."""
        thread, loop, stop = self._thread, self._loop, self._stop
        if thread is None:
            return
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(stop.set)
        thread.join(STOP_TIMEOUT_S)
        if thread.is_alive():
            raise RuntimeError(f"the fake OpenAI server did not stop within {STOP_TIMEOUT_S} s")
        self._thread = None
        self.port = 0

    def __enter__(self) -> FakeOpenAIServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def fake_openai(token_delay_ms: float = 1.0, ttft_ms: float = 2.0) -> Iterator[str]:
    """A :class:`FakeOpenAIServer` for the block; yields its base URL ``http://127.0.0.1:PORT``.
    (Use the class itself to read the request counters.)"""
    with FakeOpenAIServer(token_delay_ms=token_delay_ms, ttft_ms=ttft_ms) as server:
        yield server.base_url


def start_fake_openai_process(
    tmp_dir: str | os.PathLike[str],
    *,
    token_delay_ms: float = 1.0,
    ttft_ms: float = 2.0,
    timeout_s: float = START_TIMEOUT_S,
) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``python -m tests.fakes.openai_server`` and wait for its port file in ``tmp_dir``.

    Its output goes to ``tmp_dir/fake-openai-*.log``. The caller owns the process: send it
    SIGTERM and wait (it exits within 2 s).

    Returns:
        the process and its base URL ``http://127.0.0.1:PORT``.

    Raises:
        RuntimeError: it exited, or wrote no port file within ``timeout_s`` (it is killed then);
            the message carries its exit code and the tail of its log.
    """
    folder = Path(tmp_dir)
    folder.mkdir(parents=True, exist_ok=True)
    tag = f"{os.getpid()}-{time.monotonic_ns()}"
    port_file = folder / f"fake-openai-{tag}.port"
    log_path = folder / f"fake-openai-{tag}.log"
    cmd = [sys.executable, "-m", "tests.fakes.openai_server", "--port", "0", "--port-file", str(port_file),
           "--token-delay-ms", str(token_delay_ms), "--ttft-ms", str(ttft_ms)]
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(cmd, cwd=_REPO, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if port_file.exists():
            return proc, f"http://{HOST}:{int(port_file.read_text(encoding='utf-8'))}"
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    if proc.poll() is None:
        proc.kill()
        proc.wait(STOP_TIMEOUT_S)
    tail = log_path.read_text(encoding="utf-8", errors="replace")[-2000:]
    raise RuntimeError(f"the fake OpenAI server process wrote no port file within {timeout_s:g} s "
                       f"(exit code {proc.returncode}); its log ends:\n{tail}")


def write_port_file(path: Path, port: int) -> None:
    """Write ``port`` to ``path`` atomically (a temporary file in the same folder, then a rename)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(f"{port}\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


async def _main_async(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    fake = FakeOpenAI(token_delay_ms=args.token_delay_ms, ttft_ms=args.ttft_ms)

    def listening(port: int) -> None:
        if args.port_file is not None:
            write_port_file(Path(args.port_file), port)

    await serve(fake, args.port, stop, listening)
    log.info("fake OpenAI server stopped: %s", fake.stats())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fakes.openai_server",
                                     description="A fake OpenAI-compatible streaming server on 127.0.0.1 (tests only).")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0: pick a free one)")
    parser.add_argument("--port-file", default=None, help="write the port here once listening")
    parser.add_argument("--token-delay-ms", type=float, default=1.0, help="time between token chunks")
    parser.add_argument("--ttft-ms", type=float, default=2.0, help="time to the first token chunk")
    args = parser.parse_args(argv)
    if args.token_delay_ms < 0 or args.ttft_ms < 0 or not 0 <= args.port <= 65535:
        parser.error("--token-delay-ms and --ttft-ms must not be negative; --port must be in [0, 65535]")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(_main_async(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
