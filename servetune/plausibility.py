"""Is a result physically possible? A pure check of a RESULT's payload before anything ranks it.

The wire (:mod:`servetune.bounds`) only guarantees that a value can be stored: SQLite-range
integers, finite floats, bounded strings. :func:`implausible` judges what the values claim, and the
coordinator keeps a result it refuses as a ``parse`` failure with the whole payload and the reason
(naming the offending field and value), ACKs it like any other result, and never ranks it.

Rules, for every sample (warm-up included) unless said otherwise:

- **Times ordered**: ``send_ns <= first_token_ns <= end_ns``; every ``token_ns`` lies in
  ``[send_ns, end_ns]`` and never goes back; times are not negative (monotonic clocks start at 0).
  The one exception is a cancelled request that never went out (its ``error`` starts with
  ``cancelled`` and ``send_ns > end_ns``, see :mod:`servetune.metrics`), which must carry no tokens.
- **Counts not negative**: ``prompt_tokens`` and ``output_tokens`` (a streamed chunk may carry
  several tokens or none, so chunks and token counts are not compared).
- **Durations positive**: an ``ok`` result has a ``window_s`` above 0 (and at most
  :data:`MAX_WINDOW_S`); no request lasts longer than :data:`MAX_REQUEST_S`.
- **Throughput consistent with counts and duration**: the measurement window cannot be shorter
  than the span of the measured (non-warm-up) requests it summarises (first send to last end),
  within :data:`WINDOW_TOLERANCE` of that span plus :data:`WINDOW_SLACK_S`. The daemon's load
  generator sets the window to exactly that span; a longer window (idle time counted) only
  understates throughput and is allowed. A window shorter than the span would inflate every rate.
- **Physical sanity** (far above any real deployment; they catch forged or corrupted values, not
  fast hardware): per request at most :data:`MAX_TOKENS_PER_REQUEST` prompt or output tokens (10x
  the longest context windows of 2026); per trial at most :data:`MAX_TOKEN_THROUGHPUT` tokens/s
  and :data:`MAX_REQUEST_THROUGHPUT` requests/s over the window; ``offered_rate`` not negative and
  at most :data:`MAX_REQUEST_THROUGHPUT`; server counters and series points not negative where they
  count (``*_total``) and ``t_ns`` not negative.
- Floats are already finite (the wire refuses NaN and infinity).
"""

from __future__ import annotations

from servetune.metrics import is_cancelled
from servetune.result import RequestSample, TrialOutcome

#: A window may be this fraction of the requests' span shorter than the span (rounding of clocks).
WINDOW_TOLERANCE = 0.01
#: ... plus this many seconds.
WINDOW_SLACK_S = 0.001
#: The longest plausible measurement window: a week.
MAX_WINDOW_S = 7 * 86_400.0
#: The longest plausible single request: a day.
MAX_REQUEST_S = 86_400.0
#: Prompt or output tokens of one request.
MAX_TOKENS_PER_REQUEST = 100_000_000
#: Tokens (prompt + output) per second over one trial's window.
MAX_TOKEN_THROUGHPUT = 1e9
#: Requests per second over one trial's window (and the highest plausible offered rate).
MAX_REQUEST_THROUGHPUT = 1e7

_NS = 1e9


def implausible(outcome: TrialOutcome) -> str | None:
    """Why ``outcome`` cannot be a real measurement (naming the field and its value), or None."""
    for i, s in enumerate(outcome.samples):
        problem = _sample_problem(s)
        if problem:
            return f"samples[{i}] (index {s.index}): {problem}"
    if outcome.offered_rate is not None and not 0 <= outcome.offered_rate <= MAX_REQUEST_THROUGHPUT:
        return f"offered_rate {outcome.offered_rate!r} is outside 0..{MAX_REQUEST_THROUGHPUT:g} requests/s"
    if outcome.window_s is not None and not 0 < outcome.window_s <= MAX_WINDOW_S:
        return f"window_s {outcome.window_s!r} is not a duration in (0, {MAX_WINDOW_S:g}] seconds"
    if outcome.status == "ok" and outcome.window_s is None and outcome.samples:
        return "window_s is missing from an ok result with samples"
    if outcome.window_s is not None:
        problem = _window_problem(outcome.samples, outcome.window_s)
        if problem:
            return problem
    if outcome.started_at_us < 0 or outcome.finished_at_us < outcome.started_at_us:
        return (f"finished_at_us {outcome.finished_at_us} is before started_at_us {outcome.started_at_us}"
                if outcome.started_at_us >= 0 else f"started_at_us {outcome.started_at_us} is negative")
    for name, value in outcome.server_counters.items():
        if value < 0 and name.endswith("_total"):
            return f"server_counters[{name!r}] {value!r} is negative (a counter only grows)"
    for j, point in enumerate(outcome.server_series):
        t = point.get("t_ns")
        if t is not None and t < 0:
            return f"server_series[{j}].t_ns {t!r} is negative"
        for name, value in point.items():
            if value < 0 and name != "t_ns":
                return f"server_series[{j}][{name!r}] {value!r} is negative (gauges and counters are not)"
    return None


def _sample_problem(s: RequestSample) -> str | None:
    # the fields read once each, in the order of the messages (no getattr by name: this runs per
    # sample of every RESULT, on the coordinator's loop)
    prompt, output, first = s.prompt_tokens, s.output_tokens, s.first_token_ns
    if prompt is not None and not 0 <= prompt <= MAX_TOKENS_PER_REQUEST:
        return f"prompt_tokens {prompt} is outside 0..{MAX_TOKENS_PER_REQUEST}"
    if output is not None and not 0 <= output <= MAX_TOKENS_PER_REQUEST:
        return f"output_tokens {output} is outside 0..{MAX_TOKENS_PER_REQUEST}"
    if s.scheduled_ns < 0 or s.send_ns < 0 or s.end_ns < 0 or (first is not None and first < 0):
        for name, value in (("scheduled_ns", s.scheduled_ns), ("send_ns", s.send_ns), ("end_ns", s.end_ns),
                            ("first_token_ns", first)):
            if value is not None and value < 0:
                return f"{name} {value} is negative"
    if s.send_ns > s.end_ns:
        if is_cancelled(s) and s.first_token_ns is None and not s.token_ns:
            return None  # cancelled before it went out (metrics.py leaves it out of everything)
        return f"end_ns {s.end_ns} is before send_ns {s.send_ns}"
    if (s.end_ns - s.send_ns) / _NS > MAX_REQUEST_S:
        return f"lasted {(s.end_ns - s.send_ns) / _NS:g} s (end_ns - send_ns), over {MAX_REQUEST_S:g} s"
    if s.first_token_ns is not None and not s.send_ns <= s.first_token_ns <= s.end_ns:
        return f"first_token_ns {s.first_token_ns} is outside [send_ns {s.send_ns}, end_ns {s.end_ns}]"
    previous = s.send_ns
    for k, t in enumerate(s.token_ns):
        if not previous <= t <= s.end_ns:
            return (f"token_ns[{k}] {t} is before the previous token or send_ns ({previous})" if t < previous
                    else f"token_ns[{k}] {t} is after end_ns {s.end_ns}")
        previous = t
    return None


def _window_problem(samples: list[RequestSample], window_s: float) -> str | None:
    measured = [s for s in samples if not s.warmup and not (is_cancelled(s) and s.send_ns > s.end_ns)]
    if not measured:
        return None
    start = min(s.send_ns for s in measured)
    end = max(s.end_ns for s in measured)
    span_s = (end - start) / _NS
    if window_s < span_s * (1 - WINDOW_TOLERANCE) - WINDOW_SLACK_S:
        return (f"window_s {window_s!r} is shorter than the {span_s:g} s its measured requests span "
                "(first send_ns to last end_ns): every throughput would be inflated")
    ok = [s for s in measured if s.error is None]
    tokens = sum((s.prompt_tokens or 0) + (s.output_tokens or 0) for s in ok)
    if tokens / window_s > MAX_TOKEN_THROUGHPUT:
        return (f"{tokens} tokens in window_s {window_s:g} s is {tokens / window_s:.3g} tokens/s, over "
                f"{MAX_TOKEN_THROUGHPUT:g}")
    if len(ok) / window_s > MAX_REQUEST_THROUGHPUT:
        return (f"{len(ok)} requests in window_s {window_s:g} s is {len(ok) / window_s:.3g} requests/s, over "
                f"{MAX_REQUEST_THROUGHPUT:g}")
    return None
