"""The load generator: streams completions from the vLLM server next to it and times every chunk.

One :class:`LoadGenerator` talks to one OpenAI-compatible server (``POST {base_url}/v1/completions``
or, for ``endpoint: chat``, ``/v1/chat/completions``, with ``stream: true``). For a
:class:`~servetune.spec.LoadPoint` it sends the requests :mod:`daemon.workload` plans (random
token ids, shared-prefix prompts, or a file dataset's text loaded by :mod:`daemon.datasets`) and
asks for exactly each request's output length (``max_tokens`` = ``min_tokens``, ``ignore_eos``),
and records one :class:`~servetune.result.RequestSample` per request. A single request never
raises: whatever went wrong is written in ``RequestSample.error``.

Arrivals (measurement):

- ``request_rate`` set: Poisson (seeded exponential gaps), constant, or gamma gaps (``burstiness``)
  per ``arrival``; the
  first request goes at the start of the window, request *k* at the sum of the first *k* gaps, so
  a client that fell behind catches up instead of drifting.
- ``max_concurrency`` set: at most that many requests in flight. Alone it is a closed loop (one
  worker per slot sends its next request as soon as its previous one ended); with a rate a request
  waits for both its arrival and a free slot.
- Sending stops at ``num_requests`` sent or ``duration_s`` elapsed, whichever comes first. After a
  duration stop, requests still in flight get ``drain_timeout_s`` to finish and are then cancelled
  with the error ``"cancelled at end of window"``.
- The trial deadline and the daemon's stop event cancel every outstanding request at once
  (error ``"cancelled: <reason>"``) and :attr:`LoadResult.stopped_early` names the reason.
- The load point's stop conditions (``lp.stop``: error budget, over-saturation; see
  :mod:`daemon.stopping` and :mod:`daemon.saturation`) end the measurement the same way, with the
  error ``"cancelled: stopped early (<kind>)"``; ``stopped_early`` holds the full reason. Such a
  load point is a result: metrics are taken over what ran, and cancelled requests are counted
  apart (``servetune.metrics``), never as errors.

Times are ``time.monotonic_ns()`` on this process. ``scheduled_ns`` is when the arrival process
meant to send the request: its arrival time, or the moment its concurrency slot freed (the end of
the request that held it) if that is later; ``send_ns - scheduled_ns`` is therefore the client's
own lag, never the wait for a slot. ``token_ns`` holds the arrival of every streamed chunk that
carries a token (:func:`daemon.stream.choice_carries_token`: its text may be empty for a partial
UTF-8 character, but an empty chunk that finishes the stream is no token), ``end_ns`` the arrival of
``data: [DONE]``.

Requests are deterministic under ``lp.seed`` (request *i* gets the *i*-th planned request; see
:mod:`daemon.workload`); warm-up and arrivals use seeds derived from it, so warm-up prompts differ
from the measured ones (and leave nothing useful in the prefix cache). Up to :data:`BODIES_AHEAD`
request bodies are made before a run starts and the rest one at a time right after each send, so
a send never waits for its body.

Threading: a :class:`LoadGenerator` is used from one event loop at a time. :func:`run_load_point`
is the synchronous entry point for the daemon: one fresh event loop (``asyncio.run``) on the
calling thread, which must not already run a loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aiohttp

from daemon.datasets import HFTokenizer, WorkloadError, load_prompts, load_tokenizer
from daemon.looplag import LoopProbe
from daemon.stopping import StopMonitor, cancel_error
from daemon.stream import RequestRecord, stream_completion
from daemon.workload import MIN_TOKEN_ID, DatasetPrompt, PlannedRequest, arrival_gaps, iter_requests, needs_tokenizer
from servetune.result import LoopLag, RequestSample
from servetune.spec import FileDataset, LoadPoint

log = logging.getLogger(__name__)

#: How often the daemon's ``threading.Event`` is polled (seconds).
STOP_POLL_S = 0.05
#: How long cancelled requests get to unwind their connections (seconds).
CANCEL_GRACE_S = 5.0
#: Request bodies made before a warm-up or measurement starts (the rest are made as it runs).
BODIES_AHEAD = 1024

REASON_DEADLINE = "trial deadline reached"
REASON_STOPPED = "stopped by daemon"
ERROR_END_OF_WINDOW = "cancelled at end of window"



class _Abort:
    """The first reason to stop everything now (trial deadline, the daemon's stop event, or a stop
    condition of the load point) and the error its cancelled requests get."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.reason: str | None = None
        self.error: str | None = None

    def trigger(self, reason: str, error: str | None = None) -> None:
        if self.reason is None:
            self.reason = reason
            self.error = error or f"cancelled: {reason}"
            log.info("load generator: %s, cancelling outstanding requests", reason)
        self.event.set()

    async def sleep_until(self, t_ns: int) -> bool:
        """Sleep until monotonic ``t_ns``; True when aborted first."""
        timeout = (t_ns - time.monotonic_ns()) / 1e9
        if self.event.is_set() or timeout <= 0:
            return self.event.is_set()
        try:
            await asyncio.wait_for(self.event.wait(), timeout)
        except TimeoutError:
            return False
        return True


class _Slots:
    """A concurrency cap for one acquirer (the open-loop sender) that knows when each slot freed."""

    def __init__(self, n: int, start_ns: int) -> None:
        self._free: deque[int] = deque([start_ns] * n)
        self._changed = asyncio.Event()

    def release(self, freed_ns: int) -> None:
        self._free.append(freed_ns)
        self._changed.set()

    async def acquire(self, until_ns: int | None, abort: _Abort) -> int | None:
        """When the acquired slot was freed; None when ``until_ns`` passed or aborted first."""
        while not self._free:
            timeout = None if until_ns is None else (until_ns - time.monotonic_ns()) / 1e9
            if abort.event.is_set() or (timeout is not None and timeout <= 0):
                return None
            self._changed.clear()
            waiters = [asyncio.ensure_future(self._changed.wait()), asyncio.ensure_future(abort.event.wait())]
            try:
                await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()
        return None if abort.event.is_set() else self._free.popleft()


class _Bodies:
    """Request bodies in send order: ``ahead`` made now, then the next one prepared after each
    take, so a send never waits for its body."""

    def __init__(self, requests: Iterator[PlannedRequest], make: Callable[[PlannedRequest], bytes],
                 ahead: int = 1) -> None:
        self._requests = requests
        self._make = make
        self._ready: deque[bytes] = deque(make(next(requests)) for _ in range(max(1, ahead)))
        self._loop = asyncio.get_running_loop()

    def take(self) -> bytes:
        body = self._ready.popleft() if self._ready else self._make(next(self._requests))
        if not self._ready:
            self._loop.call_soon(self._prepare)  # after the caller's send went out
        return body

    def _prepare(self) -> None:
        if not self._ready:
            self._ready.append(self._make(next(self._requests)))


def _bodies_ahead(lp: LoadPoint, warmup: bool) -> int:
    """How many bodies to make before a run: all it sends when that is known, at most BODIES_AHEAD."""
    if warmup:
        return min(BODIES_AHEAD, max(1, lp.warmup_requests))
    expected = lp.num_requests
    if lp.request_rate is not None and lp.duration_s is not None:
        by_time = int(lp.request_rate * lp.duration_s) + 1
        expected = by_time if expected is None else min(expected, by_time)
    return min(BODIES_AHEAD, expected or BODIES_AHEAD)


async def _watch_stop(stop: threading.Event, abort: _Abort) -> None:
    while not stop.is_set():
        await asyncio.sleep(STOP_POLL_S)
    abort.trigger(REASON_STOPPED)


class _Run:
    """One warm-up or measurement: arrivals, requests in flight, deadline and stop, drain.

    Closed loop (no rate): one worker task per concurrency slot sends its next request as soon as
    its previous one ended. Open loop (a rate): one sender task follows the arrival schedule and
    spawns a task per request, waiting for a free slot first when a cap is set.
    """

    def __init__(
        self,
        gen: LoadGenerator,
        session: aiohttp.ClientSession,
        lp: LoadPoint,
        *,
        warmup: bool,
        deadline_ns: int | None,
        stop: threading.Event | None,
    ) -> None:
        self.gen = gen
        self.session = session
        self.lp = lp
        self.warmup = warmup
        self.deadline_ns = deadline_ns
        self.stop = stop
        self.abort = _Abort()
        self.url = gen.chat_url if lp.endpoint == "chat" else gen.url
        self.bodies = _Bodies(gen.planned_requests(lp, warmup=warmup),
                              lambda req: gen.request_body(req, lp.endpoint), _bodies_ahead(lp, warmup))
        self.start_ns = time.monotonic_ns()
        self.records: list[RequestRecord] = []
        self.inflight: set[RequestRecord] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.closed = False
        if warmup:
            self.limit: int | None = lp.warmup_requests
            self.concurrency: int | None = lp.max_concurrency or 1
            self.gaps: Iterator[float] | None = None
            self.send_until_ns: int | None = None
        else:
            self.limit = lp.num_requests
            self.concurrency = lp.max_concurrency
            self.gaps = arrival_gaps(lp) if lp.request_rate is not None else None
            self.send_until_ns = None if lp.duration_s is None else self.start_ns + int(lp.duration_s * 1e9)
        # stop conditions (measurement only); held_since_ns: an arrival waiting for a free slot
        self.held_since_ns: int | None = None
        self.monitor = None if warmup else StopMonitor.for_load_point(
            lp, self.start_ns, self.inflight, self._held_back, lambda r: self.abort.trigger(r, cancel_error(r)))
        self.probe = None if warmup else LoopProbe()  # the client's own event-loop lag while it measures

    async def execute(self) -> None:
        loop = asyncio.get_running_loop()
        watcher: asyncio.Task[None] | None = None
        deadline_handle: asyncio.TimerHandle | None = None
        if self.stop is not None:
            if self.stop.is_set():
                self.abort.trigger(REASON_STOPPED)
            watcher = asyncio.ensure_future(_watch_stop(self.stop, self.abort))
        monitor = asyncio.ensure_future(self.monitor.run()) if self.monitor is not None else None
        probe = asyncio.ensure_future(self.probe.run()) if self.probe is not None else None
        if self.deadline_ns is not None:
            remaining = (self.deadline_ns - time.monotonic_ns()) / 1e9
            if remaining <= 0:
                self.abort.trigger(REASON_DEADLINE)
            else:
                deadline_handle = loop.call_later(remaining, self.abort.trigger, REASON_DEADLINE)
        try:
            if self.abort.reason is None:
                if self.gaps is None:
                    assert self.concurrency is not None  # LoadPoint guarantees a rate or a cap
                    for _ in range(self.concurrency):
                        self._spawn(self._worker())
                else:
                    self._spawn(self._open_loop())
                await self._wait(self.send_until_ns)
                if self.abort.reason is None and self._pending():
                    if self.limit is None or len(self.records) < self.limit:  # the window ended sending
                        assert self.send_until_ns is not None
                        await self._wait(self.send_until_ns + int(self.gen.drain_timeout_s * 1e9))
                        if self.abort.reason is None and self._pending():
                            n = await self._cancel(ERROR_END_OF_WINDOW)
                            log.info("load point %s: %d requests cancelled at end of window", self.lp.name, n)
                    else:
                        await self._wait(None)
            if self.abort.reason is not None:
                await self._cancel(self.abort.error or f"cancelled: {self.abort.reason}")
            for task in self.tasks:  # requests never raise: an exception here is a bug, say so
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise RuntimeError(f"load generator task failed: {task.exception()!r}") from task.exception()
        finally:
            self.closed = True
            if deadline_handle is not None:
                deadline_handle.cancel()
            if watcher is not None:
                watcher.cancel()
            if monitor is not None:
                monitor.cancel()
            if probe is not None:
                probe.cancel()
            await self._cancel("cancelled: load generator interrupted")  # a no-op unless interrupted

    def _may_send(self) -> bool:
        if self.closed or self.abort.reason is not None:
            return False
        if self.limit is not None and len(self.records) >= self.limit:
            return False
        return self.send_until_ns is None or time.monotonic_ns() < self.send_until_ns

    def _new_record(self, scheduled_ns: int) -> tuple[RequestRecord, bytes]:
        body = self.bodies.take()
        rec = RequestRecord(index=len(self.records), warmup=self.warmup, scheduled_ns=scheduled_ns)
        self.records.append(rec)
        self.inflight.add(rec)
        return rec, body

    async def _request(self, rec: RequestRecord, body: bytes) -> None:
        await stream_completion(self.session, self.url, body, rec, self.gen.request_timeout_s)
        self.inflight.discard(rec)  # not reached when cancelled: _cancel marks what is left
        if self.monitor is not None:
            self.monitor.on_finished(rec)

    def _held_back(self, now_ns: int) -> float:
        """Arrivals already due that a concurrency cap keeps in the client (about rate x wait)."""
        if self.held_since_ns is None or self.lp.request_rate is None:
            return 0.0
        return max(0.0, (now_ns - self.held_since_ns) / 1e9 * self.lp.request_rate)

    async def _worker(self) -> None:
        freed_ns = self.start_ns
        while self._may_send():
            rec, body = self._new_record(freed_ns)
            await self._request(rec, body)
            freed_ns = rec.end_ns if rec.end_ns is not None else time.monotonic_ns()

    async def _open_loop(self) -> None:
        assert self.gaps is not None
        slots = _Slots(self.concurrency, self.start_ns) if self.concurrency is not None else None
        arrival_ns = self.start_ns
        while self._may_send():
            if self.records:
                arrival_ns += int(next(self.gaps) * 1e9)
            if self.send_until_ns is not None and arrival_ns >= self.send_until_ns:
                return
            if await self.abort.sleep_until(arrival_ns):
                return
            scheduled_ns = arrival_ns
            if slots is not None:
                self.held_since_ns = arrival_ns
                freed_ns = await slots.acquire(self.send_until_ns, self.abort)
                self.held_since_ns = None
                if freed_ns is None:
                    return
                if not self._may_send():
                    slots.release(freed_ns)
                    return
                scheduled_ns = max(arrival_ns, freed_ns)
            rec, body = self._new_record(scheduled_ns)
            self._spawn(self._request_in_slot(rec, body, slots))

    async def _request_in_slot(self, rec: RequestRecord, body: bytes, slots: _Slots | None) -> None:
        try:
            await self._request(rec, body)
        finally:
            if slots is not None:
                slots.release(rec.end_ns if rec.end_ns is not None else time.monotonic_ns())

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self.tasks.add(asyncio.ensure_future(coro))

    def _pending(self) -> set[asyncio.Task[None]]:
        return {t for t in self.tasks if not t.done()}

    async def _wait(self, until_ns: int | None) -> None:
        """Until every task is done (tasks spawned meanwhile included), ``until_ns``, or the abort."""
        while not self.abort.event.is_set():
            pending = self._pending()
            if not pending:
                return
            timeout = None if until_ns is None else (until_ns - time.monotonic_ns()) / 1e9
            if timeout is not None and timeout <= 0:
                return
            aborted = asyncio.ensure_future(self.abort.event.wait())
            try:
                await asyncio.wait([*pending, aborted], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                aborted.cancel()

    async def _cancel(self, error: str) -> int:
        """Cancel every task; requests in flight get ``error`` and end now. Returns how many."""
        self.closed = True
        now = time.monotonic_ns()
        victims = list(self.inflight)
        for rec in victims:
            rec.error = error
            rec.end_ns = now
        pending = self._pending()
        for task in pending:
            task.cancel()
        if pending:
            _, stuck = await asyncio.wait(pending, timeout=CANCEL_GRACE_S)
            if stuck:
                log.warning("%d cancelled tasks did not unwind within %.0f s", len(stuck), CANCEL_GRACE_S)
        for rec in victims:  # a request that swallowed its cancellation is still a cancelled one
            rec.error = error
            rec.end_ns = now
        self.inflight.clear()
        return len(victims)


# --------------------------------------------------------------------------- the generator


@dataclass
class LoadResult:
    """The measured part of one load point.

    ``window_s`` runs from the first send to the last end of the measured requests (errors and
    cancellations included) and is always positive (1 ns when nothing was sent).
    ``stopped_early`` is ``"trial deadline reached"``, ``"stopped by daemon"``, a stop condition's
    reason (``"over-saturation: ..."``, ``"error budget: ..."``) or None.
    ``offered_rate`` is the load point's ``request_rate`` (None for a closed loop).
    ``loop_lag`` is the client's own event-loop lag over the measurement (:mod:`daemon.looplag`;
    None when it ended before the first probe reading).
    """

    samples: list[RequestSample]
    window_s: float
    window_start_ns: int
    window_end_ns: int
    stopped_early: str | None = None
    offered_rate: float | None = None
    loop_lag: LoopLag | None = None


class LoadGenerator:
    """A streaming completions and chat client of one server, driven by load points.

    Use it as ``async with LoadGenerator(...) as gen:`` to share one HTTP session (and its
    keep-alive connections) between :meth:`warmup` and :meth:`measure`; outside such a block each
    call opens and closes its own session. One event loop at a time.

    Args:
        base_url: the server root, e.g. ``http://127.0.0.1:8000`` (``/v1/completions`` or
            ``/v1/chat/completions`` is appended).
        served_name: the ``model`` field of every request (vLLM's ``--served-model-name``).
        vocab_size: prompts draw token ids from ``[10, vocab_size)``.
        tokenizer_path: the model's ``tokenizer.json``, for load points that need it (see
            :func:`daemon.workload.needs_tokenizer`); without it those raise :class:`WorkloadError`.
        request_timeout_s: limit on one request, send to end of stream.
        drain_timeout_s: after a ``duration_s`` window ends, how long requests in flight may still
            finish before they are cancelled.
    """

    def __init__(
        self,
        base_url: str,
        served_name: str,
        vocab_size: int,
        request_timeout_s: float = 600.0,
        *,
        drain_timeout_s: float = 60.0,
        api_key: str | None = None,
        tokenizer_path: str | None = None,
    ) -> None:
        if vocab_size <= MIN_TOKEN_ID:
            raise ValueError(f"vocab_size must exceed {MIN_TOKEN_ID}, got {vocab_size}")
        if request_timeout_s <= 0 or drain_timeout_s < 0:
            raise ValueError("request_timeout_s must be positive and drain_timeout_s not negative")
        self.url = base_url.rstrip("/") + "/v1/completions"
        self.chat_url = base_url.rstrip("/") + "/v1/chat/completions"
        self.tokenizer_path = tokenizer_path
        self.served_name = served_name
        self.vocab_size = vocab_size
        self.request_timeout_s = request_timeout_s
        self.drain_timeout_s = drain_timeout_s
        # Sent as "Authorization: Bearer ..." on every request (an endpoint servetune did not start).
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> LoadGenerator:
        if self._session is None:
            self._session = self._new_session()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the shared session (idempotent)."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def _new_session(self) -> aiohttp.ClientSession:
        # limit=0: the load point's concurrency is the only cap; the pool must never queue requests.
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=60)
        timeout = aiohttp.ClientTimeout(total=self.request_timeout_s, sock_connect=min(30.0, self.request_timeout_s))
        return aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False, headers=self._auth)

    @asynccontextmanager
    async def _session_scope(self) -> AsyncIterator[aiohttp.ClientSession]:
        if self._session is not None:
            yield self._session
            return
        session = self._new_session()
        try:
            yield session
        finally:
            await session.close()

    def planned_requests(self, lp: LoadPoint, *, warmup: bool = False) -> Iterator[PlannedRequest]:
        """``lp``'s requests in send order (:func:`daemon.workload.iter_requests`), loading the
        tokenizer and the file dataset it needs. Raises :class:`WorkloadError` (a
        :class:`~daemon.datasets.DatasetError` for the file: missing, changed, unparsable)."""
        tokenizer: HFTokenizer | None = None
        if needs_tokenizer(lp):
            if self.tokenizer_path is None:
                raise WorkloadError(f"load point {lp.name!r} needs the model's tokenizer.json; none on this node")
            tokenizer = load_tokenizer(self.tokenizer_path)
        prompts: list[DatasetPrompt] | None = None
        if isinstance(lp.dataset, FileDataset):
            prompts = load_prompts(lp.dataset, tokenizer)
        return iter_requests(lp, self.vocab_size, tokenizer, warmup=warmup, prompts=prompts)

    def request_body(self, req: PlannedRequest, endpoint: str = "completions") -> bytes:
        """The JSON body of one planned request: exactly ``req.output_len`` tokens, streamed, greedy,
        usage in the last chunk. Chat sends the prompt text as the one user message."""
        body: dict[str, Any] = {"model": self.served_name}
        if endpoint == "chat":
            body["messages"] = [{"role": "user", "content": req.prompt_text}]
        else:
            body["prompt"] = req.prompt_ids if req.prompt_ids is not None else req.prompt_text
        body.update(max_tokens=req.output_len, min_tokens=req.output_len, ignore_eos=True, temperature=0,
                    stream=True, stream_options={"include_usage": True})
        return json.dumps(body, separators=(",", ":")).encode()

    def body(self, prompt: list[int], output_len: int) -> bytes:
        """The JSON request body for one prompt: exactly ``output_len`` tokens, streamed, greedy."""
        return json.dumps(
            {
                "model": self.served_name,
                "prompt": prompt,
                "max_tokens": output_len,
                "min_tokens": output_len,
                "ignore_eos": True,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
            separators=(",", ":"),
        ).encode()

    async def warmup(
        self, lp: LoadPoint, deadline_s: float | None = None, stop: threading.Event | None = None
    ) -> list[RequestSample]:
        """Send ``lp.warmup_requests`` requests (closed loop at ``lp.max_concurrency``, or one at a
        time when only a rate is given) and wait for all of them. Samples have ``warmup=True``.

        ``deadline_s`` (seconds from now) and ``stop`` cancel outstanding warm-up requests.
        """
        if lp.warmup_requests == 0:
            return []
        deadline_ns = None if deadline_s is None else time.monotonic_ns() + int(deadline_s * 1e9)
        async with self._session_scope() as session:
            run = _Run(self, session, lp, warmup=True, deadline_ns=deadline_ns, stop=stop)
            await run.execute()
        samples = [rec.sample() for rec in run.records]
        n_err = sum(1 for s in samples if s.error is not None)
        log.info("load point %s: warm-up of %d requests done, %d errors", lp.name, len(samples), n_err)
        return samples

    async def measure(self, lp: LoadPoint, deadline_s: float, stop: threading.Event | None = None) -> LoadResult:
        """Run the measured part of ``lp`` and return its samples and window.

        ``deadline_s`` (seconds from now) bounds everything: when it passes, outstanding requests
        are cancelled and ``stopped_early`` is ``"trial deadline reached"``; ``stop`` being set does
        the same with ``"stopped by daemon"``. Never raises for a failed request.
        """
        deadline_ns = time.monotonic_ns() + int(deadline_s * 1e9)
        async with self._session_scope() as session:
            run = _Run(self, session, lp, warmup=False, deadline_ns=deadline_ns, stop=stop)
            await run.execute()
        samples = [rec.sample() for rec in run.records]
        if samples:
            start = min(s.send_ns for s in samples)
            end = max(max(s.end_ns for s in samples), start + 1)
        else:
            start = end = run.start_ns
        result = LoadResult(
            samples=samples,
            window_s=max(end - start, 1) / 1e9,
            window_start_ns=start,
            window_end_ns=end,
            stopped_early=run.abort.reason,
            offered_rate=lp.request_rate,
            loop_lag=run.probe.summary() if run.probe is not None else None,
        )
        n_err = sum(1 for s in samples if s.error is not None)
        log.info(
            "load point %s: %d requests, %d errors in %.3f s%s",
            lp.name,
            len(samples),
            n_err,
            result.window_s,
            f" (stopped early: {run.abort.reason})" if run.abort.reason else "",
        )
        return result


def run_load_point(
    base_url: str,
    served_name: str,
    vocab_size: int,
    lp: LoadPoint,
    deadline_s: float,
    stop: threading.Event | None = None,
    on_measure_start: Callable[[], None] | None = None,
    *,
    request_timeout_s: float = 600.0,
    drain_timeout_s: float = 60.0,
    api_key: str | None = None,
    tokenizer_path: str | None = None,
) -> tuple[list[RequestSample], LoadResult]:
    """Warm up, call ``on_measure_start()``, measure: one fresh event loop on the calling thread.

    ``deadline_s`` (seconds from now) covers the warm-up and the measurement. ``on_measure_start``
    runs on this thread between the two, while nothing is in flight (the daemon scrapes the
    server's counters there); it is called even when the deadline or stop already ended the run,
    in which case the measurement returns at once with no samples and ``stopped_early`` set.
    Exceptions of ``on_measure_start`` propagate.

    Returns:
        the warm-up samples and the measurement.
    """
    deadline_ns = time.monotonic_ns() + int(deadline_s * 1e9)

    def remaining_s() -> float:
        return (deadline_ns - time.monotonic_ns()) / 1e9

    async def main() -> tuple[list[RequestSample], LoadResult]:
        gen = LoadGenerator(
            base_url, served_name, vocab_size, request_timeout_s=request_timeout_s, drain_timeout_s=drain_timeout_s,
            api_key=api_key, tokenizer_path=tokenizer_path,
        )
        async with gen:
            warm = await gen.warmup(lp, deadline_s=remaining_s(), stop=stop)
            if on_measure_start is not None:
                on_measure_start()
            result = await gen.measure(lp, remaining_s(), stop)
        return warm, result

    return asyncio.run(main())
