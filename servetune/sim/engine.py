"""A discrete-event model of vLLM's continuous-batching scheduler (SIMULATED: no server runs).

:func:`start` checks an engine config against a profile and shape the way vLLM does at start-up
(argument checks, weights and KV cache in memory) and returns a :class:`SimServer`, or raises
:class:`SimStartError` carrying the message vLLM itself logs. :meth:`SimServer.run` plays one
load against it and returns a :class:`SimRun`: when each request was sent, when each of its
tokens came back, and the server's counters.

The model, step by step:

- **KV cache**: ``num_blocks`` blocks of ``block_size`` tokens (from memory: see :func:`kv_capacity`).
  A sequence holds ``ceil(tokens / block_size)`` blocks, allocated as it grows.
- **Scheduling, chunked prefill on** (vLLM V1's policy): every running sequence that is decoding
  gets one token first; the rest of the ``max_num_batched_tokens`` budget goes to prefills in
  arrival order (partial prefills of running sequences, then waiting requests while fewer than
  ``max_num_seqs`` run), the last one chunked to fit. A prefill chunk that completes the prompt
  samples the first token in that step.
- **Chunked prefill off**: the policy vLLM's docs give for the scheduler without chunked prefill:
  prefills first and never batched with decodes. A step is either whole prompts (as many waiting
  requests as fit the budget, the seats and the free blocks) or one token for every running
  sequence; decodes wait while prompts are admitted.
- **Prefix caching** (``shared_prefix`` datasets): once a request computed its group's prefix, the
  prefix's full blocks stay cached (shared, reference counted, evicted least recently used when
  blocks run out); a later request of the group starts its prefill after them (at least one token
  is always computed). Counters follow vLLM's ``prefix_cache_queries`` / ``prefix_cache_hits`` (tokens).
  Repeats of a whole prompt are not modelled beyond their prefix.
- **Preemption** (recompute, as vLLM V1): a running sequence that needs a block when none is
  free (after evicting unused cached prefixes) preempts the most recently admitted running
  sequence, which frees all its blocks, returns to the front of the queue and later recomputes
  its prompt plus the tokens it had produced (those are not streamed again).
- **Time**: each step takes :class:`~servetune.sim.steptime.StepModel` time. A run of pure decode
  steps with nothing else to do (no admissible waiting request, no arrival, no finish, enough
  free blocks) is summed in closed form; idle time between arrivals is skipped.
- **Noise** (documented, seeded): every step's time is multiplied by ``w x e_s``: ``w``, the
  server's warm state for the whole trial, lognormal with sigma :attr:`NoiseModel.warm_sigma`
  and ``e_s`` independent per step, lognormal with sigma :attr:`NoiseModel.step_sigma`; both have
  mean 1 (log-mean ``-sigma^2 / 2``), so the noiseless run (``noise=None``) is the noise's expected
  step time. The client is ideal: a request is sent exactly when its arrival (or free concurrency
  slot) allows, and a token reaches it at the end of the step that made it plus the profile's
  ``request_overhead_s`` (the API server's fixed per-request work outside the engine core's steps:
  HTTP, tokenization, detokenization, streaming; 0 unless a profile or calibration sets it), so it
  adds once to TTFT and end-to-end latency, not to TPOT, and a concurrency slot frees that much later.

Requests whose prompt plus output exceed ``max_model_len`` are refused at once, as vLLM answers
HTTP 400. Pure: no I/O, no clock, no sockets; deterministic under the seed.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from servetune.errors import ServetuneError
from servetune.memfit import (  # noqa: F401 - DEFAULT_*, resolve_config: the engine's names for them too
    DEFAULT_BLOCK_SIZE,
    DEFAULT_GPU_MEMORY_UTILIZATION,
    SimEngineConfig,
    memory_need,
    resolve_config,
)
from servetune.sim.profiles import GIB, HardwareProfile, ModelShape
from servetune.sim.steptime import DecodeLine, StepModel

#: why a request ended without finishing (the adapter turns them into the load generator's wording)
CANCEL_WINDOW = "window"
CANCEL_DEADLINE = "deadline"
REFUSED_TOO_LONG = "too_long"
#: seconds between two points of a run's server series (the daemon's scrape period)
SERIES_PERIOD_S = 0.5


class SimStartError(ServetuneError):
    """The simulated server would not start: ``log_line`` is what vLLM logs for the same cause."""

    def __init__(self, log_line: str):
        super().__init__(log_line)
        self.log_line = log_line


@dataclass(frozen=True)
class NoiseModel:
    """Multiplicative lognormal noise on step times; see the module docstring."""

    seed: int
    step_sigma: float = 0.05
    warm_sigma: float = 0.03


def _gib(n: float) -> str:
    return f"{n / GIB:.2f}"


def kv_capacity(cfg: SimEngineConfig, profile: HardwareProfile, shape: ModelShape) -> int:
    """KV-cache blocks the server gets, or :class:`SimStartError` with vLLM's wording.

    GPU: ``gpu_memory_utilization x memory`` minus the weights, the peak activations and the
    profile's reserve (:func:`servetune.memfit.memory_need`, the estimate planning prunes by).
    CPU: ``VLLM_CPU_KVCACHE_SPACE`` GiB (the profile's default when unset).
    """
    tp = cfg.tensor_parallel_size
    if cfg.max_num_batched_tokens < cfg.max_model_len and not cfg.chunked_prefill:
        raise SimStartError(
            f"ValueError: max_num_batched_tokens ({cfg.max_num_batched_tokens}) is smaller than max_model_len "
            f"({cfg.max_model_len}). This effectively limits the maximum sequence length to max_num_batched_tokens "
            "and makes vLLM reject longer sequences. Please increase max_num_batched_tokens or decrease max_model_len.")
    if cfg.max_num_batched_tokens < cfg.max_num_seqs:
        raise SimStartError(
            f"ValueError: max_num_batched_tokens ({cfg.max_num_batched_tokens}) must be greater than or equal to "
            f"max_num_seqs ({cfg.max_num_seqs}).")
    if shape.num_attention_heads % tp != 0:
        raise SimStartError(
            f"ValueError: Total number of attention heads ({shape.num_attention_heads}) must be divisible by "
            f"tensor parallel size ({tp}).")
    if tp > profile.max_devices:
        raise SimStartError(
            f"ValueError: The number of required GPUs ({tp}) exceeds the total number of available GPUs "
            f"({profile.max_devices}) of profile {profile.name}.")
    kv_token = shape.kv_bytes_per_token(tp)
    need = memory_need(cfg, profile, shape)
    if profile.kv_cache_bytes is not None:
        available = (cfg.cpu_kvcache_space_gib * GIB) if cfg.cpu_kvcache_space_gib else profile.kv_cache_bytes
    else:
        available = need.kv_available
    if available <= 0:
        raise SimStartError(
            "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
            "initializing the engine (this flag also controls CPU memory reservation on the CPU backend, despite "
            "its name). See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.")
    bs = cfg.block_size
    num_blocks = int(available // (kv_token * bs))
    needed = need.kv_one_sequence
    if needed > available:
        estimated = num_blocks * bs
        est = (f"Based on the available memory, the estimated maximum model length is {estimated}. "
               if estimated > 0 else "")
        raise SimStartError(
            f"ValueError: To serve at least one request with the model's max seq len ({cfg.max_model_len}), "
            f"({_gib(needed)} GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({_gib(available)} GiB). {est}Try increasing `gpu_memory_utilization` (which also controls CPU "
            "memory on the CPU backend) or decreasing `max_model_len` when initializing the engine. See "
            "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.")
    return num_blocks


@dataclass(frozen=True)
class SimRequest:
    prompt_len: int
    output_len: int
    group: int = -1  # shared prefix group, -1 for none


@dataclass
class SimLoad:
    """One load against the server. ``arrivals``: absolute arrival times (seconds; all 0 for a
    closed loop); ``max_concurrency`` caps requests in flight (a request is sent at
    ``max(arrival, a slot freed)``); sending stops at ``send_until_s``; requests still in flight
    ``drain_timeout_s`` after it are cancelled; everything stops at ``deadline_s``."""

    requests: Iterator[SimRequest]
    arrivals: Iterator[float]
    max_concurrency: int | None = None
    send_until_s: float | None = None
    drain_timeout_s: float = 60.0
    deadline_s: float = math.inf
    prefix_len: int = 0


@dataclass
class SimRun:
    """What one load saw (times in seconds from the start of the load)."""

    send_t: list[float] = field(default_factory=list)
    first_t: list[float | None] = field(default_factory=list)
    end_t: list[float] = field(default_factory=list)
    prompt_len: list[int] = field(default_factory=list)
    output_len: list[int] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)
    ended: list[str | None] = field(default_factory=list)
    #: per request: one (time of the token its (re)prefill sampled, first decode step, decode tokens) per run
    segments: list[list[tuple[float, int, int]]] = field(default_factory=list)
    stopped: str | None = None
    counters: dict[str, float] = field(default_factory=dict)
    decode_end_t: np.ndarray = field(default_factory=lambda: np.zeros(0))
    steps: int = 0
    #: the server's gauges and cumulative counters at step boundaries at least :data:`SERIES_PERIOD_S`
    #: apart (``t`` in seconds), as a /metrics scrape would read them; a run of decode steps summed in
    #: closed form has none inside it
    series: list[dict[str, float]] = field(default_factory=list)
    #: the profile's ``request_overhead_s``: how long after the step that made it a token reaches the client
    client_latency_s: float = 0.0

    def token_times(self, i: int) -> list[float]:
        """When request ``i``'s tokens reached the client, in order: the end of the step that made
        each, plus :attr:`client_latency_s`."""
        out: list[float] = []
        for t_first, d0, n in self.segments[i]:
            out.append(t_first)
            if n:
                out.extend(self.decode_end_t[d0:d0 + n].tolist())
        d = self.client_latency_s
        return [t + d for t in out] if d else out


class _Noise:
    """Per-step factors with prefix sums, so a run of steps is summed in O(1)."""

    def __init__(self, noise: NoiseModel | None):
        self._rng = np.random.default_rng(noise.seed) if noise else None
        self._sigma = noise.step_sigma if noise else 0.0
        self.warm = 1.0
        if noise is not None and self._rng is not None and noise.warm_sigma > 0:
            s = noise.warm_sigma
            self.warm = float(np.exp(self._rng.normal(-s * s / 2, s)))
        self._eps = np.zeros(0)
        self.e1: list[float] = [0.0]
        self.e2: list[float] = [0.0]
        self.ensure(4096)

    def ensure(self, n: int) -> None:
        have = len(self._eps)
        if n <= have:
            return
        grow = max(n, 2 * have) - have
        if self._rng is not None and self._sigma > 0:
            s = self._sigma
            new = np.exp(self._rng.normal(-s * s / 2, s, grow))
        else:
            new = np.ones(grow)
        self._eps = np.concatenate([self._eps, new])
        idx = np.arange(len(self._eps), dtype=float)
        self.e1 = np.concatenate([[0.0], np.cumsum(self._eps)]).tolist()
        self.e2 = np.concatenate([[0.0], np.cumsum(self._eps * idx)]).tolist()

    def factor(self, s: int) -> float:
        return self.e1[s + 1] - self.e1[s]

    def lin(self, s: int, j1: int, j2: int, alpha: float, beta: float) -> float:
        """sum over j in [j1, j2) of (alpha + beta j) x eps[s + j]."""
        if j2 <= j1:
            return 0.0
        a, b = s + j1, s + j2
        return (alpha - beta * s) * (self.e1[b] - self.e1[a]) + beta * (self.e2[b] - self.e2[a])

    def run_time(self, s: int, k: int, line: DecodeLine) -> float:
        """Noisy time of ``k`` decode steps starting at global step ``s`` (before the warm factor):
        the larger of the two lines dominates up to their crossing, the other after it."""
        ac, bc, am, bm, kk = line.ac, line.bc, line.am, line.bm, line.k
        if ac >= am and bc >= bm:
            return self.lin(s, 0, k, ac + kk, bc)
        if am >= ac and bm >= bc:
            return self.lin(s, 0, k, am + kk, bm)
        cross = min(k, max(0, math.ceil((am - ac) / (bc - bm))))
        (a1, b1), (a2, b2) = ((am, bm), (ac, bc)) if am > ac else ((ac, bc), (am, bm))
        return self.lin(s, 0, cross, a1 + kk, b1) + self.lin(s, cross, k, a2 + kk, b2)


class _Seq:
    __slots__ = ("i", "prompt", "out", "group", "known", "computed", "generated", "own", "shared", "decoding",
                 "d0", "c0", "g0", "epoch", "admitted")

    def __init__(self, i: int, req: SimRequest):
        self.i, self.prompt, self.out, self.group = i, req.prompt_len, req.output_len, req.group
        self.known = req.prompt_len
        self.computed = 0
        self.generated = 0
        self.own = 0  # blocks this sequence holds alone
        self.shared = 0  # cached prefix blocks it references (its group's entry)
        self.decoding = False
        self.d0 = self.c0 = self.g0 = 0
        self.epoch = 0
        self.admitted = 0


class SimServer:
    """One started simulated vLLM server. Not thread-safe; each :meth:`run` starts from an empty cache."""

    def __init__(self, cfg: SimEngineConfig, profile: HardwareProfile, shape: ModelShape, num_blocks: int):
        self.cfg, self.profile, self.shape, self.num_blocks = cfg, profile, shape, num_blocks
        self.steps = StepModel(profile, shape, cfg.tensor_parallel_size, cfg.enforce_eager)

    @property
    def kv_cache_tokens(self) -> int:
        return self.num_blocks * self.cfg.block_size

    def run(self, load: SimLoad, noise: NoiseModel | None = None) -> SimRun:
        return _Engine(self, load, noise).run()


def start(args: Mapping[str, object], env: Mapping[str, str], profile: HardwareProfile,
          shape: ModelShape) -> SimServer:
    """A simulated server for ``args`` (engine args without Nones), or :class:`SimStartError`."""
    cfg = resolve_config(args, env, profile, shape)
    return SimServer(cfg, profile, shape, kv_capacity(cfg, profile, shape))


class _Engine:
    """One load played against one server (see the module docstring for the model)."""

    def __init__(self, server: SimServer, load: SimLoad, noise: NoiseModel | None):
        self.srv, self.cfg, self.load = server, server.cfg, load
        self.sm = server.steps
        self.noise = _Noise(noise)
        self.bs = self.cfg.block_size
        self.free = server.num_blocks
        self.out = SimRun(client_latency_s=server.profile.request_overhead_s)
        #: seconds from a step's end to the client seeing its token (see :attr:`SimRun.client_latency_s`)
        self.lat = server.profile.request_overhead_s
        self.t = 0.0
        self.s = 0  # global step index
        self.D = 0  # decode steps so far
        self.decode_times: list[tuple[int, int, int, float, DecodeLine | None, float]] = []
        self.running: OrderedDict[int, _Seq] = OrderedDict()
        self.prefilling: OrderedDict[int, _Seq] = OrderedDict()  # running, prompt not yet computed
        self.waiting: deque[_Seq] = deque()
        self.dec_count = 0
        self.dec_ctx = 0  # sum of contexts of decoding sequences at D (kept with D)
        self.residue = [0] * self.bs  # decoding sequences needing a block at step D when D % bs == r
        self.finish_heap: list[tuple[int, int, int]] = []
        self.cache: OrderedDict[int, list[int]] = OrderedDict()  # group -> [blocks, refs]
        self.prefix_blocks = load.prefix_len // self.bs if self.cfg.prefix_caching else 0
        cap = load.max_concurrency
        #: when each free concurrency slot freed (the load generator's ``_Slots``)
        self.slots: deque[float] = deque([0.0] * cap) if cap is not None else deque()
        self.inflight = 0
        self.sends_open = True
        self.next_arrival: float | None = None
        self.n_sent = 0
        self.window_closed = False
        self.c = {"request_success_total": 0.0, "generation_tokens_total": 0.0, "prompt_tokens_total": 0.0,
                  "num_preemptions_total": 0.0, "prefix_cache_hits_total": 0.0, "prefix_cache_queries_total": 0.0}
        self._pull_arrival()

    # ------------------------------------------------------------------ client side

    def _pull_arrival(self) -> None:
        a = next(self.load.arrivals, None)
        until = self.load.send_until_s
        if a is None or (until is not None and a >= until):
            self.next_arrival = None
            self.sends_open = False
            self.window_closed = a is not None
        else:
            self.next_arrival = a

    def _client(self) -> None:
        """Send every request whose time came, as the load generator's sender does: the next arrival
        goes at its arrival time, or, under a concurrency cap, at ``max(arrival, when the oldest
        free slot freed)``; with no slot free it is held until one frees (slots free at step ends)."""
        while True:
            at = self._ready_time()
            if at is None or at > self.t:
                return
            if self.load.max_concurrency is not None:
                self.slots.popleft()
            self._pull_arrival()
            self._send_next(at)

    def _ready_time(self) -> float | None:
        """When the client may send its next request (None: not before a slot frees, or never):
        its arrival, or under a concurrency cap ``max(arrival, when the oldest free slot freed)``
        (a slot frees when the client has seen the request's last token, ``request_overhead_s``
        after the step that made it)."""
        if not self.sends_open or self.next_arrival is None:
            return None
        if self.load.max_concurrency is None:
            return self.next_arrival
        return max(self.next_arrival, self.slots[0]) if self.slots else None

    def _send_next(self, at: float) -> None:
        until = self.load.send_until_s
        req = None if (until is not None and at >= until) else next(self.load.requests, None)
        if req is None:
            self.sends_open = False
            self.next_arrival = None
            self.window_closed = until is not None and at >= until
            return
        self._send(req, at)

    def _send(self, req: SimRequest, at: float) -> None:
        i = self.n_sent
        self.n_sent += 1
        o = self.out
        o.send_t.append(at)
        o.first_t.append(None)
        o.end_t.append(at)
        o.prompt_len.append(req.prompt_len)
        o.output_len.append(req.output_len)
        o.generated.append(0)
        o.ended.append(None)
        o.segments.append([])
        if req.prompt_len + req.output_len > self.cfg.max_model_len:
            o.ended[i] = REFUSED_TOO_LONG
            if self.load.max_concurrency is not None:
                self.slots.append(at)
            return
        self.inflight += 1
        self.waiting.append(_Seq(i, req))

    def _next_client_time(self) -> float | None:
        """When the client sends next with the server idle (None: never)."""
        at = self._ready_time()
        return None if at is None else max(self.t, at)

    # ------------------------------------------------------------------ blocks and the prefix cache

    def _evict(self, need: int) -> None:
        for g in list(self.cache):
            if self.free >= need:
                return
            blocks, refs = self.cache[g]
            if refs == 0:
                del self.cache[g]
                self.free += blocks

    def _release(self, q: _Seq) -> None:
        if q.decoding:
            self._materialize(q)
        self.free += q.own
        q.own = 0
        if q.shared:
            entry = self.cache.get(q.group)
            if entry is not None:
                entry[1] -= 1
                self.cache.move_to_end(q.group)
            q.shared = 0

    def _materialize(self, q: _Seq) -> None:
        """Bring a decoding sequence's counts up to decode step D and take it out of the decode set."""
        n = self.D - q.d0
        q.computed = q.c0 + n
        q.generated = q.g0 + n
        q.known = q.prompt + q.generated
        q.own = -(-q.computed // self.bs) - q.shared
        q.decoding = False
        self.dec_count -= 1
        self.dec_ctx -= q.computed
        self.residue[(q.d0 - q.c0) % self.bs] -= 1
        q.epoch += 1
        if n:
            seg = self.out.segments[q.i]
            t_first, d_first, _ = seg[-1]
            seg[-1] = (t_first, d_first, n)

    def _start_decoding(self, q: _Seq) -> None:
        self.prefilling.pop(q.i, None)
        q.decoding = True
        q.d0, q.c0, q.g0 = self.D, q.computed, q.generated
        self.dec_count += 1
        self.dec_ctx += q.computed
        self.residue[(q.d0 - q.c0) % self.bs] += 1
        q.epoch += 1
        heapq.heappush(self.finish_heap, (q.d0 + q.out - q.g0, q.i, q.epoch))
        self.out.segments[q.i].append((self.t, self.D, 0))

    def _preempt_last(self) -> _Seq:
        i, victim = self.running.popitem(last=True)
        self.prefilling.pop(i, None)
        self._release(victim)
        victim.computed = 0
        victim.known = victim.prompt + victim.generated
        self.waiting.appendleft(victim)
        self.c["num_preemptions_total"] += 1
        return victim

    def _alloc(self, q: _Seq, tokens_after: int) -> bool:
        """Blocks for ``q`` to hold ``tokens_after`` tokens; evicts unused cache entries first."""
        need = -(-tokens_after // self.bs) - q.shared - q.own
        if need <= 0:
            return True
        if need > self.free:
            self._evict(need)
            if need > self.free:
                return False
        self.free -= need
        q.own += need
        return True

    # ------------------------------------------------------------------ the loop

    def run(self) -> SimRun:
        load = self.load
        drain_end = math.inf
        next_point = 0.0
        while True:
            if self.t >= next_point:
                self._point()
                next_point = self.t + SERIES_PERIOD_S
            self._client()
            if self.window_closed and drain_end == math.inf:
                assert load.send_until_s is not None
                drain_end = load.send_until_s + load.drain_timeout_s
            limit = min(load.deadline_s, drain_end)
            if self.t >= limit:
                self._cancel_all(CANCEL_DEADLINE if self.t >= load.deadline_s else CANCEL_WINDOW)
                break
            if not self.running and not self.waiting:
                nxt = self._next_client_time()
                if nxt is None:
                    break
                if nxt > self.t:
                    self.t = min(nxt, limit)
                continue
            if not self._decode_run(limit):
                self._one_step()
        self._point()
        self._finish()
        return self.out

    def _point(self) -> None:
        point = {"t": self.t, "num_requests_running": float(len(self.running)),
                 "num_requests_waiting": float(len(self.waiting)),
                 "kv_cache_usage_perc": 1.0 - self.free / self.srv.num_blocks if self.srv.num_blocks else 0.0}
        point.update(self.c)
        self.out.series.append(point)

    def _admissible(self) -> bool:
        return bool(self.waiting) and len(self.running) < self.cfg.max_num_seqs

    def _decode_run(self, limit: float) -> bool:
        """Advance a run of pure decode steps in closed form; False when the next step is not one."""
        if self.dec_count == 0 or self.dec_count != len(self.running) or self._admissible():
            return False
        k = self.finish_heap[0][0] - self.D
        while self.finish_heap and self._stale(self.finish_heap[0]):
            heapq.heappop(self.finish_heap)
            k = self.finish_heap[0][0] - self.D
        k = self._block_steps(k)
        if k <= 0:
            return False
        line = self.sm.decode_line(self.dec_count, self.dec_ctx)
        self.noise.ensure(self.s + k + 1)
        w = self.noise.warm
        total = self.noise.run_time(self.s, k, line) * w
        nxt = self._next_event_time()
        stop = min(limit, nxt) if nxt is not None else limit
        if self.t + total > stop:
            k = self._steps_until(stop - self.t, k, line)
            total = self.noise.run_time(self.s, k, line) * w
        self._advance_decode(k, line, total)
        return True

    def _next_event_time(self) -> float | None:
        """When the client may send a request the running batch would take in (None: not before a finish)."""
        if len(self.running) >= self.cfg.max_num_seqs:
            return None
        return self._ready_time()

    def _steps_until(self, span: float, kmax: int, line: DecodeLine) -> int:
        """Smallest k in [1, kmax] whose steps end at or after ``span`` seconds."""
        lo, hi = 1, kmax
        w = self.noise.warm
        while lo < hi:
            mid = (lo + hi) // 2
            if self.noise.run_time(self.s, mid, line) * w >= span:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _block_steps(self, kmax: int) -> int:
        """How many of the next ``kmax`` decode steps the free blocks cover (without eviction)."""
        bs, B, free = self.bs, self.dec_count, self.free
        if B * (kmax // bs + 1) <= free:
            return kmax
        full = min(kmax // bs, free // B) if B else kmax // bs
        k = full * bs
        free -= full * B
        while k < kmax:
            need = self.residue[(self.D + k) % bs]
            if need > free:
                break
            free -= need
            k += 1
        return k

    def _blocks_needed(self, k: int) -> int:
        bs = self.bs
        full, rem = divmod(k, bs)
        need = full * self.dec_count
        d = self.D
        for j in range(rem):
            need += self.residue[(d + full * bs + j) % bs]
        return need

    def _advance_decode(self, k: int, line: DecodeLine, total: float) -> None:
        self.free -= self._blocks_needed(k)
        self.decode_times.append((self.s, k, self.D, self.t, line, 0.0))
        self.t += total
        self.s += k
        self.D += k
        self.dec_ctx += k * self.dec_count
        self._finish_due()

    def _stale(self, entry: tuple[int, int, int]) -> bool:
        _, i, epoch = entry
        q = self.running.get(i)
        return q is None or not q.decoding or q.epoch != epoch

    def _finish_due(self) -> None:
        while self.finish_heap and self.finish_heap[0][0] <= self.D:
            entry = heapq.heappop(self.finish_heap)
            if self._stale(entry):
                continue
            q = self.running[entry[1]]
            self._materialize(q)
            self._complete(q)

    def _complete(self, q: _Seq) -> None:
        self._release(q)
        del self.running[q.i]
        self.prefilling.pop(q.i, None)
        o = self.out
        o.end_t[q.i] = self.t + self.lat
        o.generated[q.i] = q.generated
        self.c["request_success_total"] += 1
        self.c["generation_tokens_total"] += q.generated
        self.c["prompt_tokens_total"] += q.prompt
        self.inflight -= 1
        if self.load.max_concurrency is not None:
            self.slots.append(self.t + self.lat)

    def _one_step(self) -> None:
        """One scheduled step, sequence by sequence (mixed prefill and decode, or a preemption)."""
        cfg = self.cfg
        budget = cfg.max_num_batched_tokens
        sched: list[tuple[_Seq, int]] = []
        decode_step = True
        if not cfg.chunked_prefill and self._admissible():
            sched = self._admit(budget, whole=True)
            decode_step = not sched
        if decode_step:
            budget -= self._schedule_decodes()
            for q in list(self.prefilling.values()):
                if budget <= 0:
                    break
                n = min(q.known - q.computed, budget)
                if not self._alloc(q, q.computed + n):
                    continue
                sched.append((q, n))
                budget -= n
            if cfg.chunked_prefill and budget > 0 and self._admissible():
                sched += self._admit(budget, whole=False)
        tokens = seqs = sampling = 0
        attn = ctx = 0.0
        for q, n in sched:
            tokens += n
            seqs += 1
            attn += n * (q.computed + (n + 1) / 2)
            ctx += q.computed
            if q.computed + n == q.known:
                sampling += 1
        B = self.dec_count if decode_step else 0
        tokens += B
        seqs += B
        sampling += B
        attn += self.dec_ctx + B if B else 0
        ctx += self.dec_ctx if B else 0
        if tokens == 0:
            # nothing could be scheduled (every block held by sequences that must wait): wait for time to pass
            self._stall()
            return
        self.noise.ensure(self.s + 2)
        dt = self.sm.step(tokens, seqs, sampling, attn, ctx) * self.noise.factor(self.s) * self.noise.warm
        if B:
            self.decode_times.append((self.s, 1, self.D, self.t, None, dt))
        self.t += dt
        self.s += 1
        if B:
            self.D += 1
            self.dec_ctx += B
        for q, n in sched:
            q.computed += n
            if self.prefix_blocks and q.group >= 0 and not q.shared and q.computed >= self.prefix_blocks * self.bs:
                self._register_prefix(q)
            if q.computed == q.known:
                q.generated += 1
                q.known += 1
                if self.out.first_t[q.i] is None:
                    self.out.first_t[q.i] = self.t
                if q.generated >= q.out:
                    self.out.segments[q.i].append((self.t, self.D, 0))
                    self._complete(q)
                else:
                    self._start_decoding(q)
        self._finish_due()

    def _stall(self) -> None:
        """No step possible: preempt the last running sequence so the others can go on."""
        if self.running:
            self._preempt_last()
        else:  # a waiting request that cannot get blocks with nothing running: cannot happen (max_model_len fits)
            q = self.waiting.popleft()
            self.out.ended[q.i] = CANCEL_DEADLINE
            self.inflight -= 1

    def _schedule_decodes(self) -> int:
        """Blocks for one token of every decoding sequence this step, preempting the most recent
        sequences while they are short; returns the tokens scheduled."""
        need = self.residue[self.D % self.bs]
        while need > self.free:
            self._evict(need)
            if need <= self.free or not self.running:
                break
            self._preempt_last()
            need = self.residue[self.D % self.bs]
        take = min(need, self.free)
        self.free -= take
        return self.dec_count

    def _register_prefix(self, q: _Seq) -> None:
        pb = self.prefix_blocks
        if q.group in self.cache:
            return
        self.cache[q.group] = [pb, 1]
        q.own -= pb
        q.shared = pb

    def _admit(self, budget: int, whole: bool) -> list[tuple[_Seq, int]]:
        out: list[tuple[_Seq, int]] = []
        while self.waiting and budget > 0 and len(self.running) < self.cfg.max_num_seqs:
            q = self.waiting[0]
            hit = 0
            if q.computed == 0:
                if self.prefix_blocks and q.group >= 0 and q.group in self.cache:
                    hit = min(self.prefix_blocks * self.bs, ((q.known - 1) // self.bs) * self.bs)
                self.c["prefix_cache_queries_total"] += q.known
            remaining = q.known - hit
            n = min(remaining, budget)
            if whole and n < remaining:
                break
            if hit:
                entry = self.cache[q.group]
                entry[1] += 1
                self.cache.move_to_end(q.group)
                q.shared = hit // self.bs
                q.computed = hit
            if not self._alloc(q, q.computed + n):
                if hit:
                    entry[1] -= 1
                    q.shared = 0
                    q.computed = 0
                if q.computed == 0:
                    self.c["prefix_cache_queries_total"] -= q.known
                break
            self.c["prefix_cache_hits_total"] += hit
            self.waiting.popleft()
            self.running[q.i] = q
            self.prefilling[q.i] = q
            out.append((q, n))
            budget -= n
        return out

    def _cancel_all(self, why: str) -> None:
        for q in list(self.running.values()) + list(self.waiting):
            if q.decoding:
                self._materialize(q)
            self.out.ended[q.i] = why
            self.out.end_t[q.i] = self.t
            self.out.generated[q.i] = q.generated
        self.running.clear()
        self.prefilling.clear()
        self.waiting.clear()
        self.out.stopped = why if why == CANCEL_DEADLINE else None

    def _finish(self) -> None:
        """Expand the decode steps' end times (for token timestamps) and copy the counters."""
        ends = np.zeros(self.D)
        for s0, k, d0, t0, line, dt in self.decode_times:
            if line is None:
                ends[d0] = t0 + dt
                continue
            j = np.arange(k, dtype=float)
            base = np.maximum(line.ac + line.bc * j, line.am + line.bm * j) + line.k
            eps = np.diff(np.asarray(self.noise.e1[s0:s0 + k + 1]))
            ends[d0:d0 + k] = t0 + np.cumsum(base * eps) * self.noise.warm
        self.out.decode_end_t = ends
        self.out.counters = dict(self.c)
        self.out.steps = self.s
