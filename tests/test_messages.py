"""Wire messages: JSON round trips, validation, size bound, version check."""

from __future__ import annotations

import json

import pytest

from servetune.errors import ProtocolError
from servetune.messages import MAX_MESSAGE_BYTES, Ack, Ready, State, decode, encode


def test_round_trip() -> None:
    msg = State(batch_id="b1", trial_id="t", epoch=2, phase="measuring", detail="x")
    assert decode(encode(msg)) == msg
    assert decode(encode(Ready(free_slots=1))) == Ready(free_slots=1)


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
    frame = json.loads(encode(State(batch_id="b", epoch=1, phase="done")))
    hello_like = {"type": "WELCOME", "protocol_version": 99, "session_nonce": "n", "coordinator_id": "c"}
    with pytest.raises(ProtocolError, match="version 99"):
        decode(json.dumps(hello_like).encode())
    assert frame["type"] == "STATE"
