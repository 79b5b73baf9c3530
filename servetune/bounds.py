"""Bounded value types for everything that crosses the wire (one set, used by every message model).

A message that arrives is untrusted: each field holds only what the coordinator can store and
compare without failing. These types say so in one place:

- integers fit SQLite's signed 64-bit INTEGER (:data:`Int64`); counters, sequence numbers, pids
  and epochs are never negative (:data:`Count`); epochs and attempt numbers start at 1 (:data:`Epoch`);
- floats are finite (no NaN, no infinity: :data:`Finite`, :data:`NonNegFinite`, :data:`PosFinite`);
  models that hold floats also set ``allow_inf_nan=False`` (:data:`WIRE_CONFIG`), so floats inside
  dicts and lists are finite too;
- strings and lists have a maximum length (:data:`Id`, :data:`Label`, :data:`Text`, :data:`LongText`
  and the ``MAX_*`` list bounds).

What a measurement *means* (times ordered, counts non-negative, throughput possible) is judged
after decoding by :mod:`servetune.plausibility`, so an impossible result is kept as a ``parse``
failure with its payload rather than dropped at the door. A daemon builds its messages from the
same models, so a value outside these bounds fails where it is made, not silently on the wire.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

#: SQLite's INTEGER range (signed 64-bit).
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

#: Any integer SQLite can store.
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
#: A count, sequence number, pid, index or timestamp: 0 .. 2**63 - 1.
Count = Annotated[int, Field(ge=0, le=INT64_MAX)]
#: An epoch or attempt number: 1 .. 2**63 - 1.
Epoch = Annotated[int, Field(ge=1, le=INT64_MAX)]

#: A finite float (NaN and infinity refused).
Finite = Annotated[float, Field(allow_inf_nan=False)]
#: A finite float >= 0.
NonNegFinite = Annotated[float, Field(ge=0, allow_inf_nan=False)]
#: A finite float > 0.
PosFinite = Annotated[float, Field(gt=0, allow_inf_nan=False)]

#: Ids on the wire (daemon ids, session nonces, trial ids, submission ids): short printable text.
ID_PATTERN = r"^[A-Za-z0-9._:@+-]+$"
ID_MAX_CHARS = 200
Id = Annotated[str, Field(min_length=1, max_length=ID_MAX_CHARS, pattern=ID_PATTERN)]
#: A short name or label (a hostname, a metric name, a version): at most 1,000 characters.
Label = Annotated[str, Field(max_length=1000)]
#: Free text on the wire (reasons, details, per-request errors): at most 64 KiB.
Text = Annotated[str, Field(max_length=64 * 1024)]
#: Log tails and error reports that quote logs: at most 1 MiB (the daemon reads 256 KiB of a log tail).
LongText = Annotated[str, Field(max_length=1024 * 1024)]

#: List bounds (the frame size bound, 64 MiB, holds far less than any of these in practice).
MAX_LEASES = 100_000
MAX_SAMPLES = 1_000_000
MAX_TOKENS_PER_SAMPLE = 1_000_000
MAX_SERIES_POINTS = 100_000
MAX_METRICS = 1000
MAX_ARGV = 10_000
MAX_GPUS = 1024

#: The model config of every wire model: unknown fields refused, no NaN/infinity anywhere.
WIRE_CONFIG = ConfigDict(extra="forbid", allow_inf_nan=False)


class WireModel(BaseModel):
    """The base of every wire message (:mod:`servetune.messages`, :mod:`servetune.artifact_messages`):
    every field bounded, unknown fields refused, frozen."""

    model_config = ConfigDict(**WIRE_CONFIG, frozen=True)
