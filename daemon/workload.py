"""What a load point sends: prompts, lengths and arrival gaps (pure: no I/O, no clock).

Everything is deterministic under ``lp.seed``: each random quantity has its own stream, seeded by
:func:`derived_seed` from the load point's seed and a label, so request *i* is the same request on
every machine and changing one field (say the output lengths) leaves the others (the prompt
tokens) as they were. Warm-up draws from streams seeded differently from the measurement's, so
its prompts differ from the measured ones and leave nothing useful in the prefix cache.

- :func:`arrival_gaps`: seconds between sends for ``poisson`` (exponential gaps), ``constant``
  and ``gamma`` (shape ``burstiness``, scale ``1 / (rate * burstiness)``, exactly as ``vllm bench
  serve --burstiness``: mean gap ``1 / rate``, coefficient of variation ``1 / sqrt(burstiness)``;
  burstiness 1 is Poisson).
- :func:`draw_length`: one draw of an ``input_len`` / ``output_len`` (an int or a
  :class:`~servetune.spec.LengthDist`).
- :func:`iter_requests` / :func:`build_requests`: the requests of a load point, in send order, as
  :class:`PlannedRequest` (token ids for the completions endpoint with random or shared-prefix
  prompts; text for chat and for file datasets, whose prompts the caller loads, see
  :mod:`daemon.datasets`).

Random prompts draw token ids uniformly from ``[MIN_TOKEN_ID, vocab_size)``. For the chat endpoint
they are decoded to text with the model's tokenizer and adjusted until the text re-encodes to the
drawn length (almost always exact; :attr:`PlannedRequest.input_len` holds the count reached). The
chat template adds its own tokens on the server, so a chat request's ``prompt_tokens`` is the
content's length plus the template's.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from servetune.spec import FileDataset, LengthDist, LoadPoint, SharedPrefixDataset

#: Smallest token id in a random prompt (skips the special tokens at the start of a vocabulary).
MIN_TOKEN_ID = 10
#: Attempts at making decoded random tokens re-encode to the wanted length.
TEXT_LENGTH_ATTEMPTS = 10


class Tokenizer(Protocol):
    """What the workload needs of a tokenizer (see :class:`daemon.datasets.HFTokenizer`).
    Counts are of the text alone: no special tokens added."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def count_batch(self, texts: Sequence[str]) -> list[int]: ...


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    """One request of a load point. Exactly one of ``prompt_ids`` and ``prompt_text`` is set.

    ``input_len`` is the prompt's length in tokens as planned (exact for token ids; for text, its
    count under the model's tokenizer, or None when no tokenizer was needed to plan it).
    ``output_len`` is what the request asks for (``max_tokens`` = ``min_tokens``, EOS ignored).
    ``group`` is the shared prefix the request uses (shared-prefix dataset) or None.
    """

    output_len: int
    input_len: int | None
    prompt_ids: list[int] | None = None
    prompt_text: str | None = None
    group: int | None = None


@dataclass(frozen=True, slots=True)
class DatasetPrompt:
    """One prompt of a file dataset: its text, its length in tokens when counted, and the output
    length the file gives (ShareGPT: the reply's token count; JSONL: ``output_len``)."""

    text: str
    input_len: int | None
    output_len: int | None


def derived_seed(seed: int, label: str) -> int:
    """A 64-bit seed derived from ``seed`` and ``label``, the same on every machine."""
    digest = hashlib.sha256(f"servetune:{label}:{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


# --------------------------------------------------------------------------- arrivals


def arrival_gaps(lp: LoadPoint) -> Iterator[float]:
    """Endless seconds between consecutive sends of a load point with a ``request_rate``."""
    rate = lp.request_rate
    if rate is None:
        raise ValueError(f"load point {lp.name!r} has no request_rate")
    if lp.arrival == "constant":
        return itertools.repeat(1.0 / rate)
    rng = random.Random(derived_seed(lp.seed, "arrivals"))
    if lp.arrival == "gamma":
        return _gamma_gaps(rng, lp.burstiness, 1.0 / (rate * lp.burstiness))
    return _exponential_gaps(rng, rate)


def _exponential_gaps(rng: random.Random, rate: float) -> Iterator[float]:
    while True:
        yield rng.expovariate(rate)


def _gamma_gaps(rng: random.Random, shape: float, scale: float) -> Iterator[float]:
    while True:
        yield rng.gammavariate(shape, scale)


# --------------------------------------------------------------------------- lengths


def draw_length(length: int | LengthDist, rng: random.Random) -> int:
    """One length: an int as it is; ``fixed`` its value; ``uniform`` an integer in [min, max];
    ``normal`` rounded and clipped to [min or 1, max or the distribution's upper bound]."""
    if isinstance(length, int):
        return length
    if length.dist == "fixed":
        assert length.value is not None
        return length.value
    if length.dist == "uniform":
        assert length.min is not None and length.max is not None
        return rng.randint(length.min, length.max)
    assert length.mean is not None and length.std is not None
    value = round(rng.gauss(length.mean, length.std))
    return max(length.min or 1, min(length.upper(), value))


def length_stream(length: int | LengthDist, seed: int) -> Iterator[int]:
    """Endless lengths drawn from ``length`` under ``seed``."""
    if isinstance(length, int):
        return itertools.repeat(length)
    rng = random.Random(seed)
    return (draw_length(length, rng) for _ in itertools.count())


# --------------------------------------------------------------------------- prompts


def _population(vocab_size: int) -> range:
    if vocab_size <= MIN_TOKEN_ID:
        raise ValueError(f"vocab_size must exceed {MIN_TOKEN_ID}, got {vocab_size}")
    return range(MIN_TOKEN_ID, vocab_size)


def text_of_length(
    ids: list[int], target: int, tokenizer: Tokenizer, rng: random.Random, vocab_size: int
) -> tuple[str, int]:
    """Text whose encoding has ``target`` tokens, made from random ``ids`` of that length.

    Decoded random tokens re-encode differently (merges across token boundaries, split UTF-8
    bytes), so the encoding is cut or topped up with fresh random tokens, backing off one more
    token each round, until it round-trips. Returns the text and its token count (``target`` but
    in rare cases one or two off after :data:`TEXT_LENGTH_ATTEMPTS` rounds).
    """
    population = _population(vocab_size)
    text, count = "", 0
    for attempt in range(TEXT_LENGTH_ATTEMPTS):
        text = tokenizer.decode(ids)
        encoded = tokenizer.encode(text)
        count = len(encoded)
        if count == target:
            break
        keep = max(0, min(count, target) - attempt)
        ids = encoded[:keep] + rng.choices(population, k=target - keep)
    return text, count


def prompt_stream(seed: int, vocab_size: int, input_len: int) -> Iterator[list[int]]:
    """Endless prompts of ``input_len`` token ids drawn uniformly from ``[MIN_TOKEN_ID, vocab_size)``."""
    rng = random.Random(seed)
    population = _population(vocab_size)
    while True:
        yield rng.choices(population, k=input_len)


def _base_seed(lp: LoadPoint, warmup: bool) -> int:
    return derived_seed(lp.seed, "warmup") if warmup else lp.seed


def load_point_prompts(lp: LoadPoint, vocab_size: int, *, warmup: bool = False) -> Iterator[list[int]]:
    """The token-id prompts of a random-dataset load point on the completions endpoint, in order."""
    return (r.prompt_ids or [] for r in iter_requests(lp, vocab_size, None, warmup=warmup))


def needs_tokenizer(lp: LoadPoint) -> bool:
    """Whether planning ``lp``'s requests needs the model's tokenizer: random tokens made into chat
    text, or a file dataset whose lengths must be counted (ShareGPT output lengths, max_input_len)."""
    ds = lp.dataset
    if isinstance(ds, FileDataset):
        counts_output = ds.kind == "sharegpt" and ds.output_len_from == "dataset"
        return counts_output or ds.max_input_len is not None
    return lp.endpoint == "chat"


def iter_requests(
    lp: LoadPoint,
    vocab_size: int,
    tokenizer: Tokenizer | None,
    *,
    warmup: bool = False,
    prompts: Sequence[DatasetPrompt] | None = None,
) -> Iterator[PlannedRequest]:
    """The requests of ``lp`` in send order, endless (request *i* does not depend on how many follow).

    Args:
        lp: the load point; its ``dataset``, ``endpoint``, lengths and ``seed`` decide everything.
        vocab_size: random token ids are drawn from ``[MIN_TOKEN_ID, vocab_size)``.
        tokenizer: needed when :func:`needs_tokenizer` says so (chat with random or shared-prefix
            prompts; ShareGPT output lengths are counted by the loader).
        warmup: the warm-up's requests (other seeds; file prompts taken from the other end).
        prompts: a file dataset's prompts (see :func:`daemon.datasets.load_prompts`).

    Raises:
        ValueError: a tokenizer or the file prompts are needed and missing.
    """
    ds = lp.dataset
    base = _base_seed(lp, warmup)
    outputs = length_stream(lp.output_len, derived_seed(base, "output_len"))
    if isinstance(ds, FileDataset):
        if not prompts:
            raise ValueError(f"load point {lp.name!r}: dataset {ds.kind} needs its prompts loaded (none given)")
        return _file_requests(lp, ds, prompts, outputs, warmup)
    chat = lp.endpoint == "chat"
    if chat and tokenizer is None:
        raise ValueError(f"load point {lp.name!r}: the chat endpoint needs the model's tokenizer to make text prompts")
    if isinstance(ds, SharedPrefixDataset):
        return _shared_prefix_requests(lp, ds, vocab_size, tokenizer if chat else None, outputs, base)
    return _random_requests(lp, vocab_size, tokenizer if chat else None, outputs, base)


def build_requests(
    lp: LoadPoint,
    vocab_size: int,
    tokenizer: Tokenizer | None,
    n: int,
    *,
    warmup: bool = False,
    prompts: Sequence[DatasetPrompt] | None = None,
) -> list[PlannedRequest]:
    """The first ``n`` requests of :func:`iter_requests`."""
    return list(itertools.islice(iter_requests(lp, vocab_size, tokenizer, warmup=warmup, prompts=prompts), n))


def _random_requests(
    lp: LoadPoint, vocab_size: int, tokenizer: Tokenizer | None, outputs: Iterator[int], base: int
) -> Iterator[PlannedRequest]:
    population = _population(vocab_size)
    rng = random.Random(base)  # token ids: the same stream as before lengths could vary
    inputs = length_stream(lp.input_len, derived_seed(base, "input_len"))
    for input_len, output_len in zip(inputs, outputs):
        ids = rng.choices(population, k=input_len)
        if tokenizer is None:
            yield PlannedRequest(output_len=output_len, input_len=input_len, prompt_ids=ids)
        else:
            text, count = text_of_length(ids, input_len, tokenizer, rng, vocab_size)
            yield PlannedRequest(output_len=output_len, input_len=count, prompt_text=text)


def _shared_prefix_requests(
    lp: LoadPoint,
    ds: SharedPrefixDataset,
    vocab_size: int,
    tokenizer: Tokenizer | None,
    outputs: Iterator[int],
    base: int,
) -> Iterator[PlannedRequest]:
    """Request *i* uses prefix ``i % num_prefixes`` and that prefix's suffix
    ``(i // num_prefixes) % suffixes_per_prefix``: consecutive requests cycle through the prefixes,
    and after ``num_prefixes * suffixes_per_prefix`` requests the prompts repeat. Each suffix's
    length is drawn once (``input_len - prefix_len``, at least 1), so a repeated prompt is identical.
    """
    population = _population(vocab_size)
    prefixes: dict[int, tuple[list[int], str | None]] = {}

    def prefix(p: int) -> tuple[list[int], str | None]:
        if p not in prefixes:
            rng = random.Random(derived_seed(base, f"prefix:{p}"))
            ids = rng.choices(population, k=ds.prefix_len)
            text = None
            if tokenizer is not None:
                text, _ = text_of_length(ids, ds.prefix_len, tokenizer, rng, vocab_size)
            prefixes[p] = (ids, text)
        return prefixes[p]

    for i, output_len in enumerate(outputs):
        p = i % ds.num_prefixes
        s = (i // ds.num_prefixes) % ds.suffixes_per_prefix
        rng = random.Random(derived_seed(base, f"suffix:{p}:{s}"))
        suffix_len = max(1, draw_length(lp.input_len, rng) - ds.prefix_len)
        suffix_ids = rng.choices(population, k=suffix_len)
        prefix_ids, prefix_text = prefix(p)
        if tokenizer is None:
            ids = prefix_ids + suffix_ids
            yield PlannedRequest(output_len=output_len, input_len=len(ids), prompt_ids=ids, group=p)
        else:
            assert prefix_text is not None
            suffix_text, _ = text_of_length(suffix_ids, suffix_len, tokenizer, rng, vocab_size)
            text = prefix_text + suffix_text
            yield PlannedRequest(output_len=output_len, input_len=len(tokenizer.encode(text)),
                                 prompt_text=text, group=p)


def _file_requests(
    lp: LoadPoint,
    ds: FileDataset,
    prompts: Sequence[DatasetPrompt],
    outputs: Iterator[int],
    warmup: bool,
) -> Iterator[PlannedRequest]:
    """The file's prompts in an order shuffled under the load point's seed, cycled when the load
    point sends more requests than the file holds; the warm-up walks the same order backwards,
    so a short warm-up and the measurement's first requests do not share prompts."""
    order = list(range(len(prompts)))
    random.Random(derived_seed(lp.seed, "dataset-order")).shuffle(order)
    if warmup:
        order.reverse()
    from_file = ds.output_len_from == "dataset"
    for i, drawn in enumerate(outputs):
        prompt = prompts[order[i % len(order)]]
        if from_file:
            if prompt.output_len is None:
                raise ValueError(f"dataset {ds.path}: a prompt has no output length and output_len_from is 'dataset'")
            output_len = prompt.output_len
        else:
            output_len = drawn
        yield PlannedRequest(output_len=output_len, input_len=prompt.input_len, prompt_text=prompt.text)
