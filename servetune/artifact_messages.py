"""Wire messages of the artifact upload (daemon -> coordinator), members of the protocol's ``Message`` union.

They follow the rules of :mod:`servetune.messages` (one JSON frame, validated, bounded, never
pickled; ``extra="forbid"``), which decodes and encodes them with every other message (protocol
version 3). Flow, per artifact of one attempt::

    daemon                                          coordinator
    ARTIFACT_OFFER(trial, epoch, manifest)       ->
                                                 <- ARTIFACT_MISSING(manifest digest, chunk digests it lacks)
                                                    | ARTIFACT_STORED (it has all: nothing to send)
                                                    | ARTIFACT_REFUSED(reason, final=True)
    ARTIFACT_CHUNK(manifest digest, sha256, data) ->  only chunks named by the last MISSING, paced
                                                 <- ARTIFACT_REFUSED(chunk, reason, final=False)  a bad chunk
                                                 <- ARTIFACT_STORED  when the last chunk completes the file
    ARTIFACT_OFFER again                          ->  after a reconnect, a REJOIN, or a silence: asks again

The manifest's digest is computed by the coordinator from the offered manifest, never taken on
trust; ``manifest_sha256`` on later messages names that offer. A chunk's ``data`` is base64 in JSON
(:data:`CHUNK_MESSAGE_BYTES` bounds one chunk message, far under ``MAX_MESSAGE_BYTES``).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Literal, Union

from pydantic import Field, field_serializer, field_validator

from servetune.artifacts import MAX_CHUNK_SIZE, MAX_CHUNKS, ArtifactManifest, Digest
from servetune.bounds import Id, Text
from servetune.bounds import WireModel as _Msg

_MAX_B64 = 4 * -(-MAX_CHUNK_SIZE // 3)
#: The largest ARTIFACT_CHUNK frame: base64 of the largest chunk plus its envelope (ids, digests).
CHUNK_MESSAGE_BYTES = _MAX_B64 + 2048

RefusalReason = Literal[
    "unknown_attempt",  # not an attempt of this daemon's (the control core decides)
    "over_budget",      # the attempt's artifacts would exceed the coordinator's byte or count bound
    "not_requested",    # a chunk no open MISSING asked for (e.g. from before a coordinator restart)
    "bad_chunk",        # a chunk whose bytes do not hash to its digest or are not its manifest's length
    "bad_file",         # all chunks arrived but they do not make the manifest's file
    "store_failed",     # the coordinator could not write it (disk full, I/O error): offer again later
]


class _OfAttempt(_Msg):
    """An artifact of one attempt: the trial and the epoch (attempt number) it ran under."""

    trial_id: Id
    epoch: int = Field(ge=1, le=2**62)


class _FromDaemon(_OfAttempt):
    session_nonce: Id


class _AboutUpload(_OfAttempt):
    manifest_sha256: Digest


class ArtifactOffer(_FromDaemon):
    type: Literal["ARTIFACT_OFFER"] = "ARTIFACT_OFFER"
    manifest: ArtifactManifest


class ArtifactChunk(_FromDaemon):
    type: Literal["ARTIFACT_CHUNK"] = "ARTIFACT_CHUNK"
    manifest_sha256: Digest
    sha256: Digest
    data: bytes = Field(max_length=MAX_CHUNK_SIZE)

    @field_validator("data", mode="before")
    @classmethod
    def _from_base64(cls, value: Any) -> Any:
        if isinstance(value, str):
            if len(value) > _MAX_B64:
                raise ValueError(f"chunk data over {MAX_CHUNK_SIZE} bytes")
            try:
                return base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise ValueError("chunk data is not base64") from None
        return value

    @field_serializer("data")
    def _to_base64(self, value: bytes) -> str:
        return base64.b64encode(value).decode("ascii")


class ArtifactMissing(_AboutUpload):
    type: Literal["ARTIFACT_MISSING"] = "ARTIFACT_MISSING"
    missing: list[Digest] = Field(max_length=MAX_CHUNKS)


class ArtifactStored(_AboutUpload):
    """The whole artifact is stored and its file digest verified: the daemon may forget it."""

    type: Literal["ARTIFACT_STORED"] = "ARTIFACT_STORED"


class ArtifactRefused(_AboutUpload):
    """``final``: the coordinator will never take this artifact (the daemon stops offering it);
    otherwise one chunk was dropped and the next MISSING asks for it again."""

    type: Literal["ARTIFACT_REFUSED"] = "ARTIFACT_REFUSED"
    chunk_sha256: Digest | None = None
    reason: RefusalReason
    detail: Text = ""
    final: bool


ToCoordinator = Union[ArtifactOffer, ArtifactChunk]
ToDaemon = Union[ArtifactMissing, ArtifactStored, ArtifactRefused]
