"""Wire messages between the coordinator (ZeroMQ ROUTER) and daemons (DEALER).

Every message is one JSON frame (never pickled), at most :data:`MAX_MESSAGE_BYTES`, validated
into one of the models below by its ``type``. Unknown types, versions, or fields are refused.

Flow (DESIGN.md's protocol sketch)::

    daemon                          coordinator
    HELLO(capabilities, nonce) ->
                                 <- WELCOME(session)
    READY(free_slots)          ->
                                 <- GRANT(batch: config + ordered trials, epoch, ttl) | NO_WORK | SHUTDOWN
    STATE(trial, epoch, phase) ->
    RESULT(trial, epoch, submission_id, outcome) ->
                                 <- ACK | STALE | CONFLICT
    HEARTBEAT([(trial, epoch)]) ->   (shaped now; leases and renewals come with fault handling)
                                 <- RENEWED | REVOKED
    BYE(reason)                ->

The epoch of a grant is the attempt number of its trials; a RESULT whose epoch is not the
trial's current attempt is STALE, a second different RESULT for the same attempt is a CONFLICT.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from servetune.errors import ProtocolError
from servetune.manifest import EngineConfig, TrialManifest
from servetune.result import Fingerprint, TrialOutcome
from servetune.spec import BackendSpec, Budgets, ModelSpec

PROTOCOL_VERSION = 1
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

Phase = Literal[
    "server_starting", "server_ready", "server_failed", "warmup", "measuring", "draining", "done", "failed"
]


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Capabilities(_Msg):
    fingerprint: Fingerprint
    slots: int = Field(1, ge=1)
    backends: list[str] = Field(default_factory=lambda: ["vllm"])


class Hello(_Msg):
    type: Literal["HELLO"] = "HELLO"
    protocol_version: int = PROTOCOL_VERSION
    daemon_id: str
    session_nonce: str
    pid: int
    capabilities: Capabilities


class Welcome(_Msg):
    type: Literal["WELCOME"] = "WELCOME"
    protocol_version: int = PROTOCOL_VERSION
    session_nonce: str
    coordinator_id: str
    heartbeat_interval_s: float = 1.0


class Ready(_Msg):
    type: Literal["READY"] = "READY"
    free_slots: int = Field(1, ge=0)


class GrantedTrial(_Msg):
    trial_id: str
    attempt: int = Field(ge=1)
    manifest: TrialManifest


class Grant(_Msg):
    """One batch: one engine config and its trials in order, so one server start serves them all."""

    type: Literal["GRANT"] = "GRANT"
    batch_id: str
    epoch: int = Field(ge=1, description="lease epoch; equals the attempt number of the trials")
    ttl_s: float = Field(gt=0)
    model: ModelSpec = Field(description="where to load the model from (not part of trial identity)")
    backend: BackendSpec
    budgets: Budgets
    config: EngineConfig
    trials: list[GrantedTrial] = Field(min_length=1)


class NoWork(_Msg):
    type: Literal["NO_WORK"] = "NO_WORK"
    retry_after_s: float = 1.0


class Shutdown(_Msg):
    type: Literal["SHUTDOWN"] = "SHUTDOWN"
    reason: str


class State(_Msg):
    type: Literal["STATE"] = "STATE"
    batch_id: str
    trial_id: str | None = None
    epoch: int
    phase: Phase
    detail: str = ""


class Result(_Msg):
    type: Literal["RESULT"] = "RESULT"
    batch_id: str
    trial_id: str
    epoch: int
    submission_id: str
    outcome: TrialOutcome


class Ack(_Msg):
    type: Literal["ACK"] = "ACK"
    trial_id: str
    submission_id: str


class Stale(_Msg):
    type: Literal["STALE"] = "STALE"
    trial_id: str
    submission_id: str
    reason: str


class Conflict(_Msg):
    type: Literal["CONFLICT"] = "CONFLICT"
    trial_id: str
    submission_id: str
    reason: str


class LeaseRef(_Msg):
    trial_id: str
    epoch: int


class Heartbeat(_Msg):
    type: Literal["HEARTBEAT"] = "HEARTBEAT"
    leases: list[LeaseRef] = Field(default_factory=list)


class Renewed(_Msg):
    type: Literal["RENEWED"] = "RENEWED"
    leases: list[LeaseRef]
    ttl_s: float


class Revoked(_Msg):
    type: Literal["REVOKED"] = "REVOKED"
    leases: list[LeaseRef]
    reason: str


class Bye(_Msg):
    type: Literal["BYE"] = "BYE"
    reason: str


Message = Annotated[
    Union[
        Hello, Welcome, Ready, Grant, NoWork, Shutdown, State, Result, Ack, Stale, Conflict,
        Heartbeat, Renewed, Revoked, Bye,
    ],
    Field(discriminator="type"),
]
_ADAPTER: TypeAdapter[Message] = TypeAdapter(Message)


def encode(msg: _Msg) -> bytes:
    """Serialize a message to one JSON frame; refuses frames over the size bound."""
    data = msg.model_dump_json().encode("utf-8")
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"{type(msg).__name__} is {len(data)} bytes, over the {MAX_MESSAGE_BYTES}-byte bound")
    return data


def decode(frame: bytes) -> Message:
    """Parse and validate one frame. Raises :class:`ProtocolError` with the reason."""
    if len(frame) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"frame of {len(frame)} bytes is over the {MAX_MESSAGE_BYTES}-byte bound")
    try:
        msg = _ADAPTER.validate_json(frame)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ProtocolError(f"invalid message at {where or '<root>'}: {first['msg']}") from None
    version = getattr(msg, "protocol_version", PROTOCOL_VERSION)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {version} is not supported (this side speaks {PROTOCOL_VERSION})")
    return msg
