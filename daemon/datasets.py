"""File datasets and the model's tokenizer on the node (the I/O half of :mod:`daemon.workload`).

:func:`load_prompts` reads a load point's :class:`~servetune.spec.FileDataset`, refuses it unless
its sha256 is the one the trial names (the file is part of the trial's identity), and parses it:

- ``sharegpt``: a JSON list of ``{"conversations": [{"from": ..., "value": ...}, ...]}``. The first
  human turn (``from`` human or user) is the prompt; the turn after it is the reply, whose token
  count under the model's tokenizer is the output length (``output_len_from: dataset``).
  Conversations without a reply, empty prompts and empty replies are skipped.
- ``jsonl``: one ``{"prompt": str, "output_len": int}`` object per line (blank lines ignored); a
  malformed line is an error naming its line number.

With ``max_input_len`` set, prompts longer than that many tokens are skipped. Parsed prompts are
kept for the next load point on the same file (a few entries, keyed by the file's sha256 and the
parsing options), so a sweep tokenizes a large file once per daemon, not once per trial; the file
is still read and hashed for every load point.

:class:`HFTokenizer` wraps a ``tokenizer.json`` (the ``tokenizers`` library, not transformers);
its counts leave out special tokens.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from daemon.workload import DatasetPrompt
from servetune.errors import ServetuneError
from servetune.spec import FileDataset

log = logging.getLogger(__name__)

#: ``from`` values of the turn that is the prompt in a ShareGPT conversation.
HUMAN_ROLES = frozenset({"human", "user"})
#: How many parsed datasets the node keeps between load points.
CACHE_ENTRIES = 4


class WorkloadError(ServetuneError):
    """A load point's requests cannot be made on this node (tokenizer or dataset missing or bad)."""


class DatasetError(WorkloadError):
    """A dataset file is missing, differs from the trial's sha256, or cannot be parsed."""


class HFTokenizer:
    """A Hugging Face ``tokenizer.json`` through the ``tokenizers`` library.

    Implements :class:`daemon.workload.Tokenizer`. Thread-safety: read-only after construction.
    """

    def __init__(self, tokenizer: Any, path: str) -> None:
        self._tok = tokenizer
        self.path = path

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> HFTokenizer:
        """Load ``path``. Raises :class:`WorkloadError` when it cannot be read or parsed."""
        from tokenizers import Tokenizer

        try:
            return cls(Tokenizer.from_file(str(path)), str(path))
        except Exception as exc:  # the Rust side raises plain Exception subclasses
            raise WorkloadError(f"cannot load the tokenizer {path}: {exc}") from None

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=False))

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        return [len(e.ids) for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]


@functools.lru_cache(maxsize=4)
def load_tokenizer(path: str) -> HFTokenizer:
    """:meth:`HFTokenizer.from_file`, kept for the next load point (a large tokenizer takes a while)."""
    return HFTokenizer.from_file(path)


def read_verified(ds: FileDataset) -> tuple[bytes, str]:
    """The dataset file's bytes and sha256, refused when it is missing or not the trial's file."""
    path = Path(ds.path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DatasetError(f"dataset file {path} cannot be read on this node: {exc.strerror or exc}") from None
    actual = hashlib.sha256(raw).hexdigest()
    if ds.sha256 is None:
        log.warning("dataset %s has no sha256 in the trial; using the file as it is (sha256 %s)", path, actual)
    elif actual != ds.sha256:
        raise DatasetError(
            f"dataset file {path} has sha256 {actual} on this node, but the trial was planned with {ds.sha256}:"
            " the file changed (or another file has its name); refusing to measure a different workload"
        )
    return raw, actual


def parse_sharegpt(
    raw: bytes | str,
    *,
    source: str,
    tokenizer: HFTokenizer | None,
    max_input_len: int | None = None,
    count_output: bool = True,
) -> list[DatasetPrompt]:
    """ShareGPT JSON into prompts (see the module docstring). ``count_output``: output lengths are
    the replies' token counts (needs ``tokenizer``), else left None."""
    if tokenizer is None and (count_output or max_input_len is not None):
        raise DatasetError(f"dataset {source}: counting ShareGPT tokens needs the model's tokenizer (none on this node)")
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise DatasetError(f"dataset {source} is not valid JSON: {exc}") from None
    if not isinstance(data, list):
        raise DatasetError(f"dataset {source}: a ShareGPT file is a JSON list of conversations, got {type(data).__name__}")
    pairs: list[tuple[str, str]] = []
    for entry in data:
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list):
            continue
        for k, turn in enumerate(turns[:-1]):
            if isinstance(turn, dict) and turn.get("from") in HUMAN_ROLES:
                reply = turns[k + 1]
                prompt, answer = turn.get("value"), reply.get("value") if isinstance(reply, dict) else None
                if isinstance(prompt, str) and prompt.strip() and isinstance(answer, str) and answer.strip():
                    pairs.append((prompt, answer))
                break
    in_lens: list[int | None] = [None] * len(pairs)
    out_lens: list[int | None] = [None] * len(pairs)
    if tokenizer is not None and max_input_len is not None:
        in_lens = list(tokenizer.count_batch([p for p, _ in pairs]))
    if tokenizer is not None and count_output:
        out_lens = list(tokenizer.count_batch([a for _, a in pairs]))
    prompts = [
        DatasetPrompt(text=p, input_len=n_in, output_len=n_out)
        for (p, _), n_in, n_out in zip(pairs, in_lens, out_lens)
        if (max_input_len is None or (n_in is not None and n_in <= max_input_len)) and (n_out is None or n_out >= 1)
    ]
    log.info("dataset %s: %d conversations, %d with a prompt and a reply, %d kept", source, len(data), len(pairs),
             len(prompts))
    return prompts


def parse_jsonl(
    raw: bytes | str,
    *,
    source: str,
    tokenizer: HFTokenizer | None,
    max_input_len: int | None = None,
    need_output_len: bool = True,
) -> list[DatasetPrompt]:
    """JSONL prompts (see the module docstring); ``need_output_len``: every line must carry one."""
    if tokenizer is None and max_input_len is not None:
        raise DatasetError(f"dataset {source}: max_input_len needs the model's tokenizer (none on this node)")
    text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    rows: list[tuple[str, int | None]] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"dataset {source} line {lineno}"
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise DatasetError(f"{where} is not valid JSON: {exc}") from None
        prompt = obj.get("prompt") if isinstance(obj, dict) else None
        if not isinstance(prompt, str) or not prompt:
            raise DatasetError(f'{where}: expected {{"prompt": non-empty string, "output_len": int}}')
        out = obj.get("output_len")
        if out is None and not need_output_len:
            rows.append((prompt, None))
            continue
        if isinstance(out, bool) or not isinstance(out, int) or out < 1:
            raise DatasetError(f"{where}: output_len must be a positive integer, got {out!r}")
        rows.append((prompt, out))
    in_lens: list[int | None] = [None] * len(rows)
    if tokenizer is not None and max_input_len is not None:
        in_lens = list(tokenizer.count_batch([p for p, _ in rows]))
    prompts = [
        DatasetPrompt(text=p, input_len=n_in, output_len=out)
        for (p, out), n_in in zip(rows, in_lens)
        if max_input_len is None or (n_in is not None and n_in <= max_input_len)
    ]
    log.info("dataset %s: %d prompts, %d kept", source, len(rows), len(prompts))
    return prompts


_cache: OrderedDict[tuple[object, ...], list[DatasetPrompt]] = OrderedDict()
_cache_lock = threading.Lock()


def load_prompts(ds: FileDataset, tokenizer: HFTokenizer | None) -> list[DatasetPrompt]:
    """The usable prompts of a file dataset, after checking the file is the trial's.

    Raises:
        DatasetError: missing or unreadable file, sha256 mismatch, malformed content, no usable
            prompt left, or a tokenizer needed and absent. The message names the file.
    """
    raw, digest = read_verified(ds)
    path = ds.path
    from_file = ds.output_len_from == "dataset"
    key = (digest, ds.kind, ds.max_input_len, from_file, tokenizer.path if tokenizer else None)
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    if ds.kind == "sharegpt":
        prompts = parse_sharegpt(raw, source=path, tokenizer=tokenizer, max_input_len=ds.max_input_len,
                                 count_output=from_file)
    else:
        prompts = parse_jsonl(raw, source=path, tokenizer=tokenizer, max_input_len=ds.max_input_len,
                              need_output_len=from_file)
    if not prompts:
        limit = f" of at most {ds.max_input_len} tokens" if ds.max_input_len is not None else ""
        raise DatasetError(f"dataset file {path} has no usable prompt{limit}")
    with _cache_lock:
        _cache[key] = prompts
        while len(_cache) > CACHE_ENTRIES:
            _cache.popitem(last=False)
    return prompts
