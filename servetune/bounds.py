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

import os
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


# ---------------------------------------------------------------------- spec sections on the wire

#: A GRANT carries spec sections (model, backend, budgets, engine config, trial manifests) whose
#: models belong to the spec, where a string is a path or a URL. On the wire each of their
#: strings (dict keys included) is at most this long, each list or dict at most
#: :data:`MAX_SPEC_ENTRIES` entries, nested at most :data:`MAX_SPEC_DEPTH` deep.
SPEC_STR_MAX_CHARS = 4096
MAX_SPEC_ENTRIES = 10_000
MAX_SPEC_DEPTH = 32


def spec_tree_problem(value: object, where: str = "", depth: int = 0) -> str | None:
    """Where ``value`` (decoded JSON, or a model of it) breaks the spec-section bounds above, as
    ``"PATH: what"``, or None when it keeps them. A model is read through its fields."""
    if isinstance(value, str):
        if len(value) > SPEC_STR_MAX_CHARS:
            return f"{where or '<root>'}: a string of {len(value)} characters (at most {SPEC_STR_MAX_CHARS})"
        return None
    if value is None or isinstance(value, (bool, int, float)):
        return None
    if isinstance(value, os.PathLike):
        return spec_tree_problem(os.fspath(value), where, depth)
    if depth >= MAX_SPEC_DEPTH:
        return f"{where or '<root>'}: nested more than {MAX_SPEC_DEPTH} deep"
    if isinstance(value, BaseModel):
        value = {name: getattr(value, name) for name in type(value).model_fields}
    if isinstance(value, dict):
        items: list[tuple[str, object]] = []
        for k, v in value.items():
            if isinstance(k, str) and len(k) > SPEC_STR_MAX_CHARS:
                return f"{where or '<root>'}: a key of {len(k)} characters (at most {SPEC_STR_MAX_CHARS})"
            items.append((str(k), v))
    elif isinstance(value, (list, tuple)):
        items = [(str(i), v) for i, v in enumerate(value)]
    else:
        return None  # another scalar: the model's own validation judges it
    if len(items) > MAX_SPEC_ENTRIES:
        return f"{where or '<root>'}: {len(items)} entries (at most {MAX_SPEC_ENTRIES})"
    for k, v in items:
        problem = spec_tree_problem(v, f"{where}.{k}" if where else k, depth + 1)
        if problem:
            return problem
    return None
