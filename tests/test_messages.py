"""Wire messages: JSON round trips, validation, size bound, version check."""

from __future__ import annotations

import json

import pytest

from servetune.errors import ProtocolError
from servetune.messages import MAX_MESSAGE_BYTES, Ack, Ready, State, decode, encode


def test_round_trip() -> None:
    msg = State(session_nonce="n", batch_id="b1", trial_id="t", epoch=2, phase="measuring", detail="x")
    assert decode(encode(msg)) == msg
    assert decode(encode(Ready(session_nonce="n", free_slots=1))) == Ready(session_nonce="n", free_slots=1)


def test_refuses_unknown_type_extra_fields_and_garbage() -> None:
    with pytest.raises(ProtocolError, match="type"):
        decode(json.dumps({"type": "PICKLE", "x": 1}).encode())
    with pytest.raises(ProtocolError):
        decode(json.dumps({"type": "ACK", "trial_id": "t", "submission_id": "s", "extra": 1}).encode())
    with pytest.raises(ProtocolError):
        decode(b"\x80\x04not json")
    assert decode(encode(Ack(trial_id="t", submission_id="s"))).type == "ACK"


def test_size_bound() -> None:
    with pytest.raises(ProtocolError, match="bound"):
        decode(b" " * (MAX_MESSAGE_BYTES + 1))


def test_protocol_version_checked() -> None:
    frame = json.loads(encode(State(session_nonce="n", batch_id="b", epoch=1, phase="done")))
    hello_like = {"type": "WELCOME", "protocol_version": 1, "session_nonce": "n", "coordinator_id": "c"}
    with pytest.raises(ProtocolError, match="version 1 "):
        decode(json.dumps(hello_like).encode())
    assert frame["type"] == "STATE"


def test_ids_and_text_on_the_wire_are_bounded() -> None:
    with pytest.raises(ProtocolError, match="trial_id"):
        decode(json.dumps({"type": "ACK", "trial_id": "x" * 201, "submission_id": "s"}).encode())
    with pytest.raises(ProtocolError, match="submission_id"):
        decode(json.dumps({"type": "ACK", "trial_id": "t", "submission_id": "a b"}).encode())
    with pytest.raises(ProtocolError, match="reason"):
        decode(json.dumps({"type": "SHUTDOWN", "reason": "x" * (64 * 1024 + 1)}).encode())
