"""What a load point sends: seeded random token-id prompts and arrival gaps (pure, no I/O).

Prompts are deterministic: ``random.Random(lp.seed)`` draws token ids uniformly from
``[MIN_TOKEN_ID, vocab_size)`` for the measurement (request *i* gets the *i*-th prompt); warm-up
and arrivals use seeds derived from it, so warm-up prompts differ from the measured ones.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator

from servetune.spec import LoadPoint

#: Smallest token id in a random prompt (skips the special tokens at the start of a vocabulary).
MIN_TOKEN_ID = 10


def derived_seed(seed: int, label: str) -> int:
    """A 64-bit seed derived from ``seed`` and ``label``, the same on every machine."""
    digest = hashlib.sha256(f"servetune:{label}:{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def prompt_stream(seed: int, vocab_size: int, input_len: int) -> Iterator[list[int]]:
    """Endless prompts of ``input_len`` token ids drawn uniformly from ``[MIN_TOKEN_ID, vocab_size)``."""
    if vocab_size <= MIN_TOKEN_ID:
        raise ValueError(f"vocab_size must exceed {MIN_TOKEN_ID}, got {vocab_size}")
    rng = random.Random(seed)
    population = range(MIN_TOKEN_ID, vocab_size)
    while True:
        yield rng.choices(population, k=input_len)


def load_point_prompts(lp: LoadPoint, vocab_size: int, *, warmup: bool = False) -> Iterator[list[int]]:
    """The prompts a load point sends, in order: seeded by ``lp.seed`` (warm-up: a derived seed)."""
    seed = derived_seed(lp.seed, "warmup") if warmup else lp.seed
    return prompt_stream(seed, vocab_size, lp.input_len)


def arrival_gaps(lp: LoadPoint) -> Iterator[float]:
    """Endless seconds between consecutive sends of a load point with a ``request_rate``."""
    rate = lp.request_rate
    if rate is None:
        raise ValueError(f"load point {lp.name!r} has no request_rate")
    if lp.arrival == "constant":
        while True:
            yield 1.0 / rate
    rng = random.Random(derived_seed(lp.seed, "arrivals"))
    while True:
        yield rng.expovariate(rate)
