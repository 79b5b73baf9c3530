"""Wire messages between the coordinator (ZeroMQ ROUTER) and daemons (DEALER).

Every message is one JSON frame (never pickled), at most :data:`MAX_MESSAGE_BYTES`
(:mod:`servetune.wire`), validated into one of the models below by its ``type``. Unknown types,
versions, or fields are refused, and every field is bounded (:mod:`servetune.bounds`: integers in
SQLite's signed 64-bit range, finite floats, bounded strings and lists), on both sides: the
coordinator decodes daemon messages and the daemon decodes coordinator messages with the same models.
What a RESULT claims is judged after decoding (:mod:`servetune.plausibility`).

Flow (protocol version 6; version 5's GRANT had no ``co_tenancy``, version 4 had no
TIME_PROBE/TIME_REPLY, version 3's RESULT had no ``client_loop_lag`` in its outcome, version 2 had
no ARTIFACT_* messages, and a peer of one version refuses another's HELLO/WELCOME)::

    daemon                                   coordinator
    HELLO(daemon_id, session, seq, held)  ->
                                          <- WELCOME(session, heartbeat_interval_s, lease_ttl_s)
                                          <- RENEWED(seq, held leases still its own) / REVOKED(the rest)
    READY(session, seq, held)             ->
                                          <- GRANT(seq, batch: config + ordered trials, epoch, ttl_s)
                                             | NO_WORK(retry_after_s) | SHUTDOWN(reason)
    HEARTBEAT(session, seq, leases)       ->   every heartbeat_interval_s, busy or idle
                                          <- RENEWED(seq, leases, ttl_s) / REVOKED(seq, leases, reason)
    STATE(session, trial, epoch, phase)   ->
    RESULT(session, trial, epoch, submission_id, outcome) ->
                                          <- ACK | STALE | CONFLICT
    BATCH_ERROR(session, batch, epoch, error, traceback_tail) ->   our daemon code crashed
    BYE(session, reason)                  ->
                                          <- REJOIN(session, reason)   to a message of an unknown session
    ARTIFACT_OFFER(session, trial, epoch, manifest) ->   after the RESULT, per artifact of the attempt
                                          <- ARTIFACT_MISSING(chunk digests) | ARTIFACT_STORED | ARTIFACT_REFUSED
    ARTIFACT_CHUNK(session, trial, epoch, manifest digest, sha256, data) ->   only chunks MISSING named, paced
                                          <- ARTIFACT_STORED (file whole and verified) | ARTIFACT_REFUSED
                                          <- TIME_PROBE(probe_id, sent_at_ns)   on join, then every few minutes
    TIME_REPLY(session, probe_id, received_at_ns, replied_at_ns) ->   at once, the daemon's wall clock

Rules both sides keep:

- **Sessions.** A daemon process picks a new ``session`` nonce on every HELLO (start, reconnect,
  REJOIN) and puts it on every message. The coordinator answers a message whose session it does
  not know (it restarted, or the daemon was declared dead) with REJOIN; the daemon then says HELLO
  again, listing in ``held`` the leases it still holds. A HELLO with a new session from a known
  ``daemon_id`` means a new process or a reconnect: leases in ``held`` that are still that daemon's
  are RENEWED, every other lease of that id is revoked at once (a new process with an old id
  never keeps a dead lease alive).
- **Leases.** A lease is named per trial: ``LeaseRef(trial_id, epoch)``; the epoch is the
  attempt number the trial was granted with. The daemon lists every lease it holds (trials
  granted and not yet answered with ACK/STALE/CONFLICT) in each HEARTBEAT. RENEWED and REVOKED
  echo the ``seq`` of the HEARTBEAT (or HELLO) they answer; a lease renewed by the answer to the
  message sent at local time ``t`` is valid on the daemon until ``t + ttl_s`` (a GRANT: from when
  the READY whose ``seq`` it echoes was sent). A READY or a RESULT that gets no answer is sent
  again after a few heartbeat intervals (a message can be lost when a connection drops). A daemon whose lease runs out stops that trial (vLLM and
  load) and submits nothing for it: it fences itself. The coordinator revokes a lease only after
  ``ttl_s`` + its grace without renewal, so a fenced daemon is always stopped first.
- **Results** are idempotent on (trial, epoch, submission_id): a replay gets the same ACK, another
  submission for an attempt already accepted gets CONFLICT, an attempt that is no longer current
  (revoked, re-granted, never granted to this daemon) gets STALE. A daemon re-sends results not
  yet answered after every WELCOME. Only the coordinator decides that an attempt failed as
  ``transport``: a RESULT claiming it is refused at validation. A RESULT whose outcome alone is
  out of bounds is not dropped (its daemon would re-send it forever): it is judged as a ``parse``
  failure that keeps its raw payload (:class:`OutOfBoundsResult`), ACKed if it is the current attempt.
- **Artifacts** (:mod:`servetune.artifact_messages` has the models and the per-artifact flow): a
  finished attempt's server log, raw samples and metric series, content-addressed in sha256
  chunks. An offer or chunk is judged like a RESULT (a live session, under its own key); the
  coordinator takes it only for an attempt granted to that daemon's key, running or finished,
  asks for the chunks its store lacks, verifies each on write and the whole file at the end, and
  never lets a chunk it did not ask for in. The daemon keeps the artifact (its spool) until
  ARTIFACT_STORED, offers everything again after every WELCOME (so an upload cut by a reconnect,
  a daemon restart or a coordinator restart resumes with the missing chunks only), and paces
  chunks to at most a configured number of bytes per heartbeat interval, so they never stall
  heartbeats. Raw samples also still travel inside RESULT.
- **Clocks** (:mod:`coordinator.clock`): a TIME_REPLY stamps, on the daemon's wall clock in
  integer nanoseconds, when its handling of the TIME_PROBE began and ended, so the coordinator's
  Cristian estimate of the offset subtracts the daemon's own work and bounds the rest (transport)
  as its uncertainty. A reply counts only for a probe the coordinator sent to that daemon's live
  session under its own key. Leases never use these clocks: every lease time is monotonic and local.
- A GRANT is work for the daemon's own configured vLLM: it carries engine args and environment,
  never a command line to run (``BackendSpec`` has no such field; one named in a GRANT is refused
  at decode) and never a secret (for the ``openai`` backend, the *name* of the node's environment
  variable with the API key, which the daemon uses only if its operator allowed it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import ErrorDetails, from_json

from servetune.artifact_messages import (
    ArtifactChunk,
    ArtifactMissing,
    ArtifactOffer,
    ArtifactRefused,
    ArtifactStored,
)
from servetune.bounds import (
    ID_MAX_CHARS,
    MAX_LEASES,
    WIRE_CONFIG,
    Count,
    Epoch,
    Id,
    Label,
    LongText,
    PosFinite,
    Text,
    WireModel,
    spec_tree_problem,
)
from servetune.errors import ProtocolError
from servetune.manifest import EngineConfig, TrialManifest
from servetune.result import Fingerprint, TrialOutcome
from servetune.spec import BackendSpec, Budgets, ModelSpec
from servetune.vllm_args import AcceptedArgs
from servetune.wire import MAX_MESSAGE_BYTES

PROTOCOL_VERSION = 6
#: Re-exported: MAX_MESSAGE_BYTES from servetune.wire; the bounded types from servetune.bounds.
__all__ = ["ID_MAX_CHARS", "MAX_MESSAGE_BYTES", "PROTOCOL_VERSION", "Id", "Text", "valid_id"]

Phase = Literal[
    "server_starting", "server_ready", "server_failed", "warmup", "measuring", "draining", "done", "failed"
]


_Msg = WireModel  # every field bounded (servetune.bounds); unknown fields refused


_ID_ADAPTER: TypeAdapter[str] = TypeAdapter(Id)


def valid_id(value: str) -> bool:
    """True when ``value`` is a wire id (a daemon's routing id must be one)."""
    try:
        _ID_ADAPTER.validate_python(value)
    except ValidationError:
        return False
    return True


class Capabilities(_Msg):
    """What a daemon offers. ``max_concurrency``: batches it runs at once (the coordinator's
    :mod:`coordinator.policy` never grants it more); ``group`` / ``group_max_concurrency``: the
    resource group it shares hardware or an endpoint with, and the limit it declares for it (the
    tightest declaration wins). ``slots`` is read by nothing (kept so a HELLO that sends it decodes).
    ``engine_args``: the long options the daemon's vLLM accepts (:mod:`servetune.vllm_args`), which
    the coordinator checks a ``vllm`` batch's engine flags against before granting it; None: not
    known (not asked, or the daemon could not ask), and the check is skipped for this daemon. Added
    after protocol 6 was first released: it is left out of the JSON while None, so a HELLO of this
    daemon decodes on a coordinator that predates it (and one that lacks it decodes here)."""

    fingerprint: Fingerprint
    slots: int = Field(1, ge=1, le=1024)
    max_concurrency: int = Field(1, ge=1, le=1024)
    group: Label | None = None
    group_max_concurrency: int | None = Field(None, ge=1, le=1024)
    backends: list[Label] = Field(default_factory=lambda: ["vllm"], max_length=16)
    out_of_service: LongText | None = Field(None, description="why this daemon asks for no work (its failed "
                                                             "preflight, daemon.preflight); None: in service")
    engine_args: AcceptedArgs | None = None

    @model_serializer(mode="wrap")
    def _leave_out_unknown_args(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        data: dict[str, object] = handler(self)
        if data.get("engine_args") is None:
            data.pop("engine_args", None)
        return data


class LeaseRef(_Msg):
    """One trial's lease: the trial and the epoch (attempt number) it was granted with."""

    trial_id: Id
    epoch: Epoch


class Hello(_Msg):
    type: Literal["HELLO"] = "HELLO"
    protocol_version: Count = PROTOCOL_VERSION
    daemon_id: Id
    session_nonce: Id
    pid: Count
    capabilities: Capabilities
    seq: Count = Field(0, description="echoed by the RENEWED/REVOKED that answer `held`")
    held: list[LeaseRef] = Field(default_factory=list, max_length=MAX_LEASES,
                                 description="leases this process still holds (after a reconnect)")


class Welcome(_Msg):
    type: Literal["WELCOME"] = "WELCOME"
    protocol_version: Count = PROTOCOL_VERSION
    session_nonce: Id
    coordinator_id: Id
    heartbeat_interval_s: float = Field(1.0, gt=0, le=3600)
    lease_ttl_s: float = Field(30.0, gt=0, le=86_400)


class Rejoin(_Msg):
    """To a message whose session the coordinator does not know: say HELLO again."""

    type: Literal["REJOIN"] = "REJOIN"
    session_nonce: Id | None = Field(None, description="the session of the message refused")
    reason: Text


class Ready(_Msg):
    type: Literal["READY"] = "READY"
    session_nonce: Id
    seq: Count = Field(0, description="echoed by the GRANT that answers it")
    answered_seq: Count = Field(0, description="the seq of the last READY of this session a GRANT answered")
    free_slots: int = Field(1, ge=0, le=1024)
    held: list[LeaseRef] = Field(default_factory=list, max_length=MAX_LEASES,
                                 description="leases still held (results not yet answered)")


class GrantedTrial(_Msg):
    trial_id: Id
    attempt: Epoch
    manifest: TrialManifest


class Grant(_Msg):
    """One batch: one engine config and its trials in order, so one server start serves them all."""

    type: Literal["GRANT"] = "GRANT"
    batch_id: Id
    epoch: Epoch = Field(description="the highest attempt number among the trials (each trial carries its own)")
    ttl_s: PosFinite = Field(le=86_400, description="lease TTL: valid from when the READY that asked for it was sent")
    seq: Count = Field(0, description="the seq of the READY this GRANT answers")
    model: ModelSpec = Field(description="where to load the model from (not part of trial identity)")
    backend: BackendSpec
    budgets: Budgets
    config: EngineConfig
    trials: list[GrantedTrial] = Field(min_length=1, max_length=MAX_LEASES)
    #: The spec declares co-tenancy (``hardware.co_tenancy``): this batch may share a device with
    #: another of the daemon's batches, where its owner allows that too (``daemon start --co-tenancy``).
    co_tenancy: bool = False

    @model_validator(mode="before")
    @classmethod
    def _spec_sections_bounded(cls, data: object) -> object:
        """The spec sections' own models bound few of their strings (paths, URLs, environment):
        on the wire every string, list and dict in them is bounded (:func:`spec_tree_problem`).
        Sections that arrive as models were built here, from a spec the control core checked
        against the same bounds when the sweep started (:func:`grant_bounds_problem`)."""
        if not isinstance(data, dict):
            return data
        sections: list[tuple[str, object]] = [(n, data.get(n)) for n in ("model", "backend", "budgets", "config")]
        trials = data.get("trials")
        if isinstance(trials, list):
            sections += [(f"trials.{i}", t) for i, t in enumerate(trials)]
        for name, value in sections:
            if not isinstance(value, BaseModel):
                problem = spec_tree_problem(value, name)
                if problem:
                    raise ValueError(f"out of bounds: {problem}")
        return data


def grant_bounds_problem(model: object, backend: object, budgets: object, work: Iterable[tuple[object, Iterable[object]]]) -> str | None:
    """Where the GRANTs of a sweep would break the wire's spec-section bounds (a spec's model path,
    base URL or environment too long), as ``"PATH: what"``, or None. ``work``: (engine config,
    trial manifests) per batch. The control core asks once at start, so it never builds a GRANT
    its daemons would refuse."""
    for name, value in (("model", model), ("backend", backend), ("budgets", budgets)):
        problem = spec_tree_problem(value, name)
        if problem:
            return problem
    for config, manifests in work:
        problem = spec_tree_problem(config, "engine config")
        for m in manifests:
            problem = problem or spec_tree_problem(m, "trial manifest")
        if problem:
            return problem
    return None


class NoWork(_Msg):
    type: Literal["NO_WORK"] = "NO_WORK"
    retry_after_s: float = Field(1.0, ge=0, le=3600)


class Shutdown(_Msg):
    type: Literal["SHUTDOWN"] = "SHUTDOWN"
    reason: Text


class State(_Msg):
    type: Literal["STATE"] = "STATE"
    session_nonce: Id
    batch_id: Id
    trial_id: Id | None = None
    epoch: Epoch
    phase: Phase
    detail: Text = ""


class Result(_Msg):
    type: Literal["RESULT"] = "RESULT"
    session_nonce: Id
    batch_id: Id
    trial_id: Id
    epoch: Epoch
    submission_id: Id
    outcome: TrialOutcome

    @field_validator("outcome")
    @classmethod
    def _not_transport(cls, outcome: TrialOutcome) -> TrialOutcome:
        if outcome.failure_kind == "transport":
            raise ValueError("only the coordinator decides that an attempt failed as transport")
        return outcome


class BatchError(_Msg):
    """The daemon's own code crashed inside a batch: a daemon error, never blamed on the config."""

    type: Literal["BATCH_ERROR"] = "BATCH_ERROR"
    session_nonce: Id
    batch_id: Id
    epoch: Epoch
    error: LongText
    traceback_tail: LongText = ""


class Ack(_Msg):
    type: Literal["ACK"] = "ACK"
    trial_id: Id
    submission_id: Id


class Stale(_Msg):
    type: Literal["STALE"] = "STALE"
    trial_id: Id
    submission_id: Id
    reason: Text


class Conflict(_Msg):
    type: Literal["CONFLICT"] = "CONFLICT"
    trial_id: Id
    submission_id: Id
    reason: Text


class Heartbeat(_Msg):
    type: Literal["HEARTBEAT"] = "HEARTBEAT"
    session_nonce: Id
    seq: Count
    leases: list[LeaseRef] = Field(default_factory=list, max_length=MAX_LEASES)


class Renewed(_Msg):
    type: Literal["RENEWED"] = "RENEWED"
    seq: Count
    leases: list[LeaseRef] = Field(max_length=MAX_LEASES)
    ttl_s: PosFinite = Field(le=86_400)


class Revoked(_Msg):
    type: Literal["REVOKED"] = "REVOKED"
    seq: Count
    leases: list[LeaseRef] = Field(max_length=MAX_LEASES)
    reason: Text


class TimeProbe(_Msg):
    """Coordinator -> daemon: answer at once with a :class:`TimeReply` (:mod:`coordinator.clock`)."""

    type: Literal["TIME_PROBE"] = "TIME_PROBE"
    probe_id: Id
    sent_at_ns: Count = Field(description="the coordinator's wall clock when sent, ns since the epoch (for "
                                          "reading the wire only: the coordinator keeps its own stamps)")


class TimeReply(_Msg):
    """Daemon -> coordinator: its wall clock (ns since the epoch) when its handling of the probe
    began and ended, so its own handling time cancels out of the coordinator's estimate."""

    type: Literal["TIME_REPLY"] = "TIME_REPLY"
    session_nonce: Id
    probe_id: Id
    received_at_ns: Count
    replied_at_ns: Count

    @model_validator(mode="after")
    def _ordered(self) -> TimeReply:
        if self.replied_at_ns < self.received_at_ns:
            raise ValueError(f"replied_at_ns ({self.replied_at_ns}) is before received_at_ns ({self.received_at_ns})")
        return self


class Bye(_Msg):
    type: Literal["BYE"] = "BYE"
    session_nonce: Id
    reason: Text


Message = Annotated[
    Union[
        Hello, Welcome, Rejoin, Ready, Grant, NoWork, Shutdown, State, Result, BatchError, Ack, Stale, Conflict,
        Heartbeat, Renewed, Revoked, Bye, TimeProbe, TimeReply, ArtifactOffer, ArtifactChunk, ArtifactMissing,
        ArtifactStored, ArtifactRefused,
    ],
    Field(discriminator="type"),
]
_ADAPTER: TypeAdapter[Message] = TypeAdapter(Message)


def encode(msg: WireModel) -> bytes:
    """Serialize a message to one JSON frame; refuses frames over the size bound."""
    data = msg.model_dump_json().encode("utf-8")
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"{type(msg).__name__} is {len(data)} bytes, over the {MAX_MESSAGE_BYTES}-byte bound")
    return data


class OutOfBoundsResult(ProtocolError):
    """A RESULT whose envelope (session, batch, trial, epoch, submission) is sound but whose outcome
    breaks a bound (a time over int64, NaN, a string too long). ``result`` is that submission with its
    outcome replaced by a ``parse`` failure that gives the reason and keeps the raw payload (its
    first :data:`RAW_KEPT_CHARS` characters, in ``log_tail``): the coordinator judges it like any
    RESULT, so the lease holder's submission is kept and ACKed (never ranked) instead of dropped
    and re-sent forever, and anyone else's is STALE or refused as usual."""

    def __init__(self, reason: str, result: Result):
        super().__init__(reason)
        self.result = result


#: How much of an out-of-bounds RESULT's raw payload is kept (LongText's bound).
RAW_KEPT_CHARS = 1024 * 1024
#: Validation errors that are a value out of its bound (not a wrong shape or a forbidden claim).
_BOUND_ERRORS = frozenset({
    "string_too_long", "string_too_short", "too_long", "too_short", "greater_than", "greater_than_equal",
    "less_than", "less_than_equal", "finite_number",
})


class _ResultEnvelope(WireModel):
    """A RESULT without its outcome (read from a RESULT whose outcome failed validation)."""

    model_config = ConfigDict(**{**WIRE_CONFIG, "extra": "ignore"}, frozen=True)
    type: Literal["RESULT"]
    session_nonce: Id
    batch_id: Id
    trial_id: Id
    epoch: Epoch
    submission_id: Id


def _salvage_result(frame: bytes, errors: list[ErrorDetails], reason: str) -> Result | None:
    """The RESULT in ``frame`` as a parse failure (see :class:`OutOfBoundsResult`), or None when
    the frame is not a RESULT whose only faults are outcome values out of bounds."""
    if not all(e["type"] in _BOUND_ERRORS and e["loc"][:2] == ("RESULT", "outcome") for e in errors):
        return None
    try:
        env = _ResultEnvelope.model_validate(from_json(frame))
    except (ValueError, ValidationError):
        return None
    text = frame.decode("utf-8", "replace")
    kept = text[:RAW_KEPT_CHARS]
    cut = f", its first {len(kept)} characters" if len(kept) < len(text) else ""
    outcome = TrialOutcome(
        status="failed", failure_kind="parse", started_at_us=0, finished_at_us=0, log_tail=kept,
        error=f"result refused at decode: {reason}; the raw RESULT ({len(frame)} bytes{cut}) is kept in log_tail",
    )
    return Result(session_nonce=env.session_nonce, batch_id=env.batch_id, trial_id=env.trial_id, epoch=env.epoch,
                  submission_id=env.submission_id, outcome=outcome)


def decode(frame: bytes) -> Message:
    """Parse and validate one frame. Raises :class:`ProtocolError` with the reason
    (:class:`OutOfBoundsResult`, with the submission as a parse failure, for a RESULT whose
    outcome alone is out of bounds)."""
    if len(frame) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"frame of {len(frame)} bytes is over the {MAX_MESSAGE_BYTES}-byte bound")
    try:
        msg = _ADAPTER.validate_json(frame)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        first = errors[0]
        where = ".".join(str(p) for p in first["loc"])
        reason = f"invalid message at {where or '<root>'}: {first['msg']}"
        salvaged = _salvage_result(frame, errors, reason)
        if salvaged is not None:
            raise OutOfBoundsResult(reason, salvaged) from None
        raise ProtocolError(reason) from None
    # only HELLO and WELCOME carry it (a getattr that misses costs a pydantic __getattr__ and an exception)
    version = msg.protocol_version if isinstance(msg, (Hello, Welcome)) else PROTOCOL_VERSION
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {version} is not supported (this side speaks {PROTOCOL_VERSION})")
    return msg
