"""Every wire field is bounded (servetune/bounds.py), and ``decode`` lets only ProtocolError out,
whatever the frame (hypothesis-fuzzed bytes, JSON and near-valid messages)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servetune.bounds import INT64_MAX, INT64_MIN
from servetune.errors import ProtocolError
from servetune.messages import (
    Hello,
    Result,
    State,
    decode,
    encode,
)
from servetune.result import Fingerprint, RequestSample, TrialOutcome

FP = Fingerprint(hostname="h", cpu_model="c", cpu_count=1, cpu_isa="none", ram_gib=1.0, os="linux", kernel="k",
                 python="3", servetune_version="0", hardware_class="cpu-test")
SAMPLE = RequestSample(index=0, scheduled_ns=0, send_ns=0, first_token_ns=5, end_ns=9, token_ns=[5, 9],
                       prompt_tokens=8, output_tokens=2)
OUTCOME = TrialOutcome(status="ok", samples=[SAMPLE], window_s=1.0, fingerprint=FP, started_at_us=1, finished_at_us=2)
RESULT = Result(session_nonce="n", batch_id="b", trial_id="t", epoch=1, submission_id="s", outcome=OUTCOME)
STATE = State(session_nonce="n", batch_id="b", trial_id="t", epoch=1, phase="measuring")
HELLO = Hello(daemon_id="d", session_nonce="n", pid=1, capabilities={"fingerprint": FP})


def _frame(msg: Any) -> dict[str, Any]:
    return json.loads(encode(msg))


def _set(doc: dict[str, Any], path: str, value: Any) -> bytes:
    node: Any = doc
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    last = keys[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return json.dumps(doc).encode()


@pytest.mark.parametrize(("msg", "path", "value"), [
    (STATE, "epoch", 2**70),  # raised OverflowError in SQLite and took the coordinator down
    (STATE, "epoch", INT64_MAX + 1),
    (STATE, "epoch", 0),
    (RESULT, "epoch", -1),
    (HELLO, "pid", -5),
    (HELLO, "seq", 2**64),
    (RESULT, "outcome.started_at_us", 2**63),
    (RESULT, "outcome.samples.0.end_ns", 2**80),
    (RESULT, "outcome.samples.0.output_tokens", INT64_MIN - 1),
    (RESULT, "outcome.samples.0.token_ns.0", 10**30),
    (RESULT, "outcome.fingerprint.cpu_count", -1),
    (RESULT, "outcome.fingerprint.hostname", "h" * 1001),
    (RESULT, "outcome.samples.0.error", "e" * (64 * 1024 + 1)),
    (RESULT, "outcome.server_counters", {"k" * 1001: 1.0}),
    (RESULT, "submission_id", "s" * 201),
    (RESULT, "submission_id", "bad id"),
    (STATE, "detail", "d" * (64 * 1024 + 1)),
])
def test_out_of_range_fields_are_refused_at_decode(msg: Any, path: str, value: Any) -> None:
    with pytest.raises(ProtocolError, match=path.split(".")[-1] if not path[-1].isdigit() else path.split(".")[-2]):
        decode(_set(_frame(msg), path, value))


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"])
@pytest.mark.parametrize("path", ["outcome.window_s", "outcome.offered_rate", "outcome.fingerprint.ram_gib",
                                  "outcome.server_counters.x", "outcome.server_series.0.t_ns"])
def test_floats_on_the_wire_are_finite(literal: str, path: str) -> None:
    doc = _frame(RESULT)
    doc["outcome"]["server_series"] = [{"t_ns": 1.0}]
    raw = _set(doc, path, "@@").replace(b'"@@"', literal.encode())
    with pytest.raises(ProtocolError, match="finite|inf|nan|number"):
        decode(raw)


def test_limits_themselves_decode() -> None:
    """The bounds are inclusive: the largest allowed values still go through."""
    doc = _frame(STATE)
    assert decode(_set(doc, "epoch", INT64_MAX)).epoch == INT64_MAX  # type: ignore[union-attr]
    doc = _frame(RESULT)
    assert decode(_set(doc, "outcome.samples.0.end_ns", INT64_MAX)).type == "RESULT"
    # a negative token count is a *plausibility* question (kept as a parse failure), not a wire one
    assert decode(_set(_frame(RESULT), "outcome.samples.0.output_tokens", -3)).type == "RESULT"


def test_deeply_nested_json_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        decode(b"[" * 200_000)
    with pytest.raises(ProtocolError):
        decode(b'{"type":"STATE","detail":' + b"[" * 50_000 + b"]" * 50_000 + b"}")


def test_a_daemon_cannot_build_an_out_of_range_message() -> None:
    """Both sides use the same models: a value outside the bounds fails where it is made."""
    with pytest.raises(ValueError):
        State(session_nonce="n", batch_id="b", epoch=2**70, phase="done")
    with pytest.raises(ValueError):
        TrialOutcome(status="ok", window_s=math.nan, started_at_us=1, finished_at_us=2)


# ---------------------------------------------------------------------- fuzzing decode

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=30,
)
_TYPES = ["HELLO", "WELCOME", "REJOIN", "READY", "GRANT", "NO_WORK", "SHUTDOWN", "STATE", "RESULT", "BATCH_ERROR",
          "ACK", "STALE", "CONFLICT", "HEARTBEAT", "RENEWED", "REVOKED", "BYE"]


def _mutate(doc: Any, draw: Any) -> Any:
    """Replace one value somewhere in ``doc`` by an arbitrary JSON value."""
    if isinstance(doc, dict) and doc:
        key = draw(st.sampled_from(sorted(doc)))
        if draw(st.booleans()):
            return {**doc, key: _mutate(doc[key], draw)}
        return {**doc, key: draw(_json)}
    if isinstance(doc, list) and doc:
        i = draw(st.integers(0, len(doc) - 1))
        return doc[:i] + [_mutate(doc[i], draw)] + doc[i + 1:]
    return draw(_json)


@st.composite
def near_valid(draw: Any) -> bytes:
    base = draw(st.sampled_from([RESULT, STATE, HELLO]))
    doc = _mutate(_frame(base), draw)
    return json.dumps(doc, allow_nan=True).encode()


def _only_protocol_errors(frame: bytes) -> None:
    try:
        decode(frame)
    except ProtocolError:
        pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(st.binary(max_size=512))
def test_decode_of_random_bytes_raises_only_protocol_error(frame: bytes) -> None:
    _only_protocol_errors(frame)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(st.builds(lambda t, rest: {"type": t, **rest}, st.sampled_from(_TYPES),
                 st.dictionaries(st.text(max_size=15), _json, max_size=6)))
def test_decode_of_random_json_messages_raises_only_protocol_error(doc: dict[str, Any]) -> None:
    _only_protocol_errors(json.dumps(doc, allow_nan=True).encode())


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(near_valid())
def test_decode_of_near_valid_messages_raises_only_protocol_error(frame: bytes) -> None:
    _only_protocol_errors(frame)


# ---------------------------------------------------------------------- out-of-bounds RESULTs are judged, not dropped


def test_a_result_whose_outcome_alone_is_out_of_bounds_decodes_as_a_parse_failure_keeping_the_raw_payload() -> None:
    from servetune.messages import OutOfBoundsResult
    frame = _set(_frame(RESULT), "outcome.samples.0.end_ns", 2**80)
    with pytest.raises(OutOfBoundsResult) as err:
        decode(frame)
    kept = err.value.result
    assert (kept.trial_id, kept.epoch, kept.submission_id, kept.batch_id, kept.session_nonce) == ("t", 1, "s", "b", "n")
    assert kept.outcome.status == "failed" and kept.outcome.failure_kind == "parse"
    assert "outcome.samples.0.end_ns" in (kept.outcome.error or "") and "refused at decode" in (kept.outcome.error or "")
    assert kept.outcome.log_tail == frame.decode()
    assert not kept.outcome.samples  # nothing of it can be ranked


@pytest.mark.parametrize(("path", "value"), [
    ("epoch", 2**70),  # the envelope itself out of bounds: no attempt to judge it against
    ("submission_id", "x" * 10_000),
    ("outcome.failure_kind", "transport"),  # a forbidden claim, not a bound
    ("outcome.bogus", 1),  # a wrong shape
])
def test_other_invalid_results_stay_plain_protocol_errors(path: str, value: Any) -> None:
    from servetune.messages import OutOfBoundsResult
    doc = _frame(RESULT)
    if path == "outcome.failure_kind":
        doc["outcome"]["status"] = "failed"
    with pytest.raises(ProtocolError) as err:
        decode(_set(doc, path, value))
    assert not isinstance(err.value, OutOfBoundsResult)


def test_a_huge_out_of_bounds_result_keeps_the_first_mebibyte_of_its_payload() -> None:
    from servetune.messages import RAW_KEPT_CHARS, OutOfBoundsResult
    doc = _frame(RESULT)
    doc["outcome"]["samples"][0]["error"] = "e" * (2 * RAW_KEPT_CHARS)
    frame = json.dumps(doc).encode()
    with pytest.raises(OutOfBoundsResult) as err:
        decode(frame)
    out = err.value.result.outcome
    assert out.log_tail == frame.decode()[:RAW_KEPT_CHARS] and f"its first {RAW_KEPT_CHARS} characters" in (out.error or "")
