"""The canned completion streams every target of the benchmark serves (pure, no I/O).

The bodies look like vLLM's: compact JSON, one ``data:`` event per token chunk (the last one
with ``finish_reason: "length"``), then a usage chunk with an empty ``choices`` list, then
``data: [DONE]``. Clients count tokens from the usage chunk, so the figures match a real server
asked for ``OUTPUT_TOKENS`` tokens of a ``PROMPT_TOKENS``-token prompt.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

#: Token chunks per streamed response.
OUTPUT_TOKENS = 32
#: Prompt length every client asks for (and the usage chunk reports).
PROMPT_TOKENS = 128
#: The ``model`` of every request and response (the tiny model's served name).
MODEL = "tiny"

_TEXT = " tok"


def _event(obj: dict[str, Any]) -> str:
    return "data: " + json.dumps(obj, separators=(",", ":")) + "\n\n"


def _usage(n_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": PROMPT_TOKENS, "total_tokens": PROMPT_TOKENS + n_tokens, "completion_tokens": n_tokens}


def _stream(base: dict[str, Any], content: Callable[[int], dict[str, Any]], n_tokens: int) -> list[bytes]:
    """``n_tokens`` chunk events (``content(i)`` is token i's text or delta), then the usage event
    and ``[DONE]``."""
    events = [
        _event(base | {"choices": [{"index": 0, **content(i), "logprobs": None,
                                    "finish_reason": "length" if i == n_tokens - 1 else None}]})
        for i in range(n_tokens)
    ]
    events.append(_event(base | {"choices": [], "usage": _usage(n_tokens)}))
    events.append("data: [DONE]\n\n")
    return [e.encode() for e in events]


def completion_events(n_tokens: int = OUTPUT_TOKENS) -> list[bytes]:
    """The events of one ``/v1/completions`` stream, ``[DONE]`` included."""
    base: dict[str, Any] = {"id": "cmpl-bench", "object": "text_completion", "created": 0, "model": MODEL}
    return _stream(base, lambda i: {"text": _TEXT}, n_tokens)


def chat_events(n_tokens: int = OUTPUT_TOKENS) -> list[bytes]:
    """The events of one ``/v1/chat/completions`` stream, ``[DONE]`` included."""
    base: dict[str, Any] = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": MODEL}
    return _stream(base, lambda i: {"delta": {"role": "assistant", "content": _TEXT} if i == 0 else {"content": _TEXT}},
                   n_tokens)


def completion_body(n_tokens: int = OUTPUT_TOKENS) -> bytes:
    return b"".join(completion_events(n_tokens))


def chat_body(n_tokens: int = OUTPUT_TOKENS) -> bytes:
    return b"".join(chat_events(n_tokens))
