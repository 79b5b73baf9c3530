"""Parse the Prometheus text exposition format (what vLLM serves on ``/metrics``).

Pure functions, no I/O. :func:`parse_samples` reads every sample line with its labels;
:func:`totals` sums each metric name over all its label sets (what a trial records as server
counters and gauges); :func:`select` sums one metric over the label sets that match a filter,
e.g. ``vllm:request_success_total`` with ``finished_reason`` in ``{"stop", "length"}``.

``*_bucket`` (histogram buckets, meaningless when summed over ``le``) and ``*_created``
(counter creation timestamps) are left out of :func:`totals`; ``*_sum`` and ``*_count`` stay.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

#: Suffixes of sample names that :func:`totals` leaves out.
SKIPPED_SUFFIXES: tuple[str, ...] = ("_bucket", "_created")

_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


class PromTextError(ValueError):
    """A line of the exposition could not be parsed (only raised with ``strict=True``)."""


@dataclass(frozen=True)
class Sample:
    """One sample line: ``name{labels} value [timestamp]``."""

    name: str
    value: float
    labels: Mapping[str, str] = field(default_factory=dict)

    def matches(self, labels: Mapping[str, str | Collection[str]] | None) -> bool:
        """True when every filter label is present and equal to (or one of) the wanted value(s)."""
        if not labels:
            return True
        for key, wanted in labels.items():
            have = self.labels.get(key)
            if have is None:
                return False
            if isinstance(wanted, str):
                if have != wanted:
                    return False
            elif have not in wanted:
                return False
        return True


def _parse_value(text: str) -> float:
    lowered = text.lower()
    if lowered in ("+inf", "inf"):
        return math.inf
    if lowered == "-inf":
        return -math.inf
    if lowered == "nan":
        return math.nan
    return float(text)


def _parse_labels(line: str, start: int) -> tuple[dict[str, str], int]:
    """Parse ``{a="x",b="y"}`` beginning at ``line[start] == "{"``; return labels and the index after ``}``."""
    labels: dict[str, str] = {}
    i = start + 1
    n = len(line)
    while True:
        while i < n and line[i] in " \t,":
            i += 1
        if i >= n:
            raise PromTextError("unterminated label set")
        if line[i] == "}":
            return labels, i + 1
        eq = line.find("=", i)
        if eq < 0:
            raise PromTextError("label without '='")
        key = line[i:eq].strip()
        i = eq + 1
        while i < n and line[i] in " \t":
            i += 1
        if i >= n or line[i] != '"':
            raise PromTextError(f"label {key!r} value is not quoted")
        i += 1
        chars: list[str] = []
        while True:
            if i >= n:
                raise PromTextError(f"unterminated value of label {key!r}")
            ch = line[i]
            if ch == "\\" and i + 1 < n:
                chars.append(_ESCAPES.get(line[i + 1], "\\" + line[i + 1]))
                i += 2
                continue
            if ch == '"':
                i += 1
                break
            chars.append(ch)
            i += 1
        labels[key] = "".join(chars)


def parse_line(line: str) -> Sample | None:
    """One line of the exposition as a :class:`Sample`; ``None`` for blank lines and comments.

    Raises:
        PromTextError: the line is neither a comment nor a well-formed sample.
    """
    line = line.strip()
    if not line or line.startswith("#"):
        return None
    brace = line.find("{")
    space = min((p for p in (line.find(" "), line.find("\t")) if p >= 0), default=-1)
    labels: dict[str, str] = {}
    if brace >= 0 and (space < 0 or brace < space):
        name = line[:brace]
        labels, end = _parse_labels(line, brace)
        rest = line[end:].split()
    else:
        if space < 0:
            raise PromTextError(f"no value in sample line {line!r}")
        name = line[:space]
        rest = line[space:].split()
    if not name or not rest:
        raise PromTextError(f"malformed sample line {line!r}")
    try:
        value = _parse_value(rest[0])
    except ValueError:
        raise PromTextError(f"bad value {rest[0]!r} in sample line {line!r}") from None
    return Sample(name=name, value=value, labels=labels)


def parse_samples(text: str, *, strict: bool = False, names: Collection[str] | None = None) -> list[Sample]:
    """Every sample in an exposition, in order. Malformed lines are skipped (logged at debug)
    unless ``strict``, in which case :class:`PromTextError` names the line number.

    ``names``: keep only samples of these metric names, and parse only the lines that start with
    one of them (a cheap string test), so a poller that wants a few metrics of a large exposition
    (vLLM's is about 600 lines) spends a fraction of the time and holds the GIL that much less.
    """
    samples: list[Sample] = []
    prefixes = tuple(names) if names is not None else None
    for number, line in enumerate(text.splitlines(), start=1):
        if prefixes is not None and not line.startswith(prefixes):
            continue
        try:
            sample = parse_line(line)
        except PromTextError as exc:
            if strict:
                raise PromTextError(f"line {number}: {exc}") from None
            log.debug("skipping unparseable metrics line %d: %s", number, exc)
            continue
        if sample is not None and (names is None or sample.name in names):
            samples.append(sample)
    return samples


def parse_types(text: str) -> dict[str, str]:
    """The ``# TYPE name kind`` declarations of an exposition (family name to kind)."""
    types: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0] == "#" and parts[1] == "TYPE":
            types[parts[2]] = parts[3]
    return types


def totals(samples: Iterable[Sample]) -> dict[str, float]:
    """Each metric name summed over all its label sets, ``*_bucket`` and ``*_created`` left out."""
    out: dict[str, float] = {}
    for sample in samples:
        if sample.name.endswith(SKIPPED_SUFFIXES):
            continue
        out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def parse_totals(text: str) -> dict[str, float]:
    """:func:`totals` of :func:`parse_samples` of ``text``: ``{metric name: sum over label sets}``."""
    return totals(parse_samples(text))


def select(
    samples: Iterable[Sample],
    name: str,
    labels: Mapping[str, str | Collection[str]] | None = None,
    *,
    exclude: Mapping[str, Collection[str]] | None = None,
) -> float | None:
    """Sum of ``name`` over the label sets matching ``labels`` and not matching ``exclude``.

    A filter value is either one string or a collection of allowed strings. Returns ``None`` when
    no sample matched (the metric is absent), so a caller can tell "absent" from "zero".
    """
    found = False
    total = 0.0
    for sample in samples:
        if sample.name != name or not sample.matches(labels):
            continue
        if exclude and any(sample.labels.get(k) in set(v) for k, v in exclude.items()):
            continue
        found = True
        total += sample.value
    return total if found else None
