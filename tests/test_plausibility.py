"""servetune.plausibility: what a result claims must be physically possible (pure, no I/O)."""

from __future__ import annotations

from typing import Any

import pytest

from servetune.plausibility import MAX_TOKEN_THROUGHPUT, implausible
from servetune.result import RequestSample, TrialOutcome

MS = 1_000_000


def _sample(i: int, **kw: Any) -> RequestSample:
    send = 10 * MS + i * 100 * MS
    base: dict[str, Any] = dict(index=i, scheduled_ns=send, send_ns=send, first_token_ns=send + 5 * MS,
                                end_ns=send + 50 * MS, token_ns=[send + 5 * MS, send + 20 * MS, send + 50 * MS],
                                prompt_tokens=16, output_tokens=3)
    base.update(kw)
    return RequestSample(**base)


def _outcome(samples: list[RequestSample] | None = None, **kw: Any) -> TrialOutcome:
    samples = [_sample(i) for i in range(4)] if samples is None else samples
    base: dict[str, Any] = dict(status="ok", samples=samples, window_s=0.36, started_at_us=1, finished_at_us=2)
    base.update(kw)
    return TrialOutcome(**base)


def test_a_real_looking_result_is_plausible() -> None:
    assert implausible(_outcome()) is None
    # a window longer than the requests' span (idle time counted) only understates throughput
    assert implausible(_outcome(window_s=5.0)) is None
    # a cancelled request that never went out has its send after its end (metrics.py leaves it out)
    never_sent = _sample(9, send_ns=500 * MS, end_ns=400 * MS, first_token_ns=None, token_ns=[],
                         output_tokens=None, error="cancelled: end of window")
    assert implausible(_outcome([*[_sample(i) for i in range(4)], never_sent])) is None
    # warm-up requests before the window are not part of its span
    warm = _sample(0, warmup=True, send_ns=0, scheduled_ns=0, first_token_ns=1, end_ns=2, token_ns=[1, 2])
    assert implausible(_outcome([warm, *[_sample(i) for i in range(4)]])) is None
    # a failed measurement with no samples and no window
    assert implausible(TrialOutcome(status="failed", failure_kind="measurement", error="OOM",
                                    started_at_us=1, finished_at_us=2)) is None


# The examples (end before send, negative token counts, 5e300 tok/s) and their neighbours:
# each names the offending field and value.
@pytest.mark.parametrize(("outcome", "needle"), [
    (_outcome([_sample(0, end_ns=1 * MS)]), "end_ns 1000000 is before send_ns 10000000"),
    (_outcome([_sample(0, output_tokens=-5)]), "output_tokens -5"),
    (_outcome([_sample(0, prompt_tokens=-1)]), "prompt_tokens -1"),
    (_outcome(window_s=1e-300), "window_s 1e-300 is shorter than"),  # 5e300 tok/s
    (_outcome([_sample(i, output_tokens=10**18) for i in range(2)], window_s=1.0), "output_tokens 1000000000000000000"),
    (_outcome([_sample(0, send_ns=0, scheduled_ns=0, first_token_ns=0, end_ns=1000, token_ns=[0, 1000],
                       output_tokens=50_000_000)], window_s=1e-6), "tokens/s, over"),
    (_outcome([_sample(0, first_token_ns=200 * MS)]), "first_token_ns 200000000 is outside"),
    (_outcome([_sample(0, first_token_ns=1 * MS)]), "first_token_ns 1000000 is outside"),
    (_outcome([_sample(0, token_ns=[20 * MS, 15 * MS])]), "token_ns[1] 15000000 is before"),
    (_outcome([_sample(0, token_ns=[20 * MS, 90 * MS])]), "token_ns[1] 90000000 is after end_ns"),
    (_outcome([_sample(0, send_ns=-5, scheduled_ns=-5)]), "is negative"),
    (_outcome(window_s=0.0), "window_s 0.0 is not a duration"),
    (_outcome(window_s=-1.0), "window_s -1.0 is not a duration"),
    (_outcome(window_s=None), "window_s is missing"),
    (_outcome(offered_rate=-2.0), "offered_rate -2.0"),
    (_outcome(started_at_us=10, finished_at_us=5), "finished_at_us 5 is before started_at_us 10"),
    (_outcome(server_counters={"generation_tokens_total": -100.0}), "server_counters['generation_tokens_total']"),
    (_outcome(server_series=[{"t_ns": 1.0, "num_requests_running": -3.0}]), "num_requests_running"),
    (_outcome([_sample(0, send_ns=5 * MS, end_ns=1 * MS, first_token_ns=None, token_ns=[],
                       error="cancelled: end of window", output_tokens=9)], window_s=1.0), None),
])
def test_impossible_results_are_named(outcome: TrialOutcome, needle: str | None) -> None:
    reason = implausible(outcome)
    if needle is None:  # cancelled and never sent: tokens counted on it are not looked at (it is left out)
        assert reason is None
        return
    assert reason is not None and needle in reason, reason


def test_a_cancelled_request_that_streamed_cannot_end_before_it_was_sent() -> None:
    bad = _sample(0, send_ns=60 * MS, end_ns=10 * MS, first_token_ns=None, token_ns=[20 * MS],
                  error="cancelled: end of window")
    assert "end_ns" in (implausible(_outcome([bad], window_s=1.0)) or "")


def test_throughput_bound_is_what_the_docs_say() -> None:
    n = int(MAX_TOKEN_THROUGHPUT) // 1000  # tokens in 1 ms: exactly at the bound, then over it
    at = _sample(0, send_ns=0, scheduled_ns=0, first_token_ns=0, end_ns=MS, token_ns=[0, MS], prompt_tokens=0,
                 output_tokens=n)
    assert implausible(_outcome([at], window_s=0.001)) is None
    over = at.model_copy(update={"output_tokens": n + 1})
    assert "tokens/s" in (implausible(_outcome([over], window_s=0.001)) or "")
