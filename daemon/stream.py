"""Reading one streamed completion: Server-Sent-Events lines into a per-request record.

:class:`RequestRecord` accounts each ``data:`` payload as it arrives (a chunk that carries a
token is a token arrival; ``usage`` gives the token counts; an ``error`` object marks the request
failed) and becomes a :class:`~servetune.result.RequestSample` at the end.
Both endpoints stream this way: completions chunks carry ``choices[0].text``, chat chunks
``choices[0].delta``. A chat stream opens with a chunk announcing the role
(``"delta": {"role": "assistant", "content": ""}``, vLLM 0.32 and OpenAI alike), which is not a
token; vLLM sends it just before the first token's chunk.

Which chunks carry a token (:func:`choice_carries_token`): text (or delta content) that is not
empty; or empty text while the stream goes on (``finish_reason`` null: vLLM's chunk for a token
that ends inside a UTF-8 character, whose text a later chunk completes). A chunk with empty text
or an empty ``delta`` that *finishes* the choice (``finish_reason`` set) is the end marker
OpenAI-style servers send after the last token, not a token: counting it would add one short
inter-token gap per request and bias mean ITL low.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import aiohttp

from servetune.result import RequestSample

#: Longest error text kept on a sample.
ERROR_CHARS = 300

_HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream"}


class SSELines:
    """Split a byte stream into the payloads of its Server-Sent-Events ``data:`` lines."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        """Payloads of the lines completed by ``data`` (other SSE fields and comments dropped)."""
        buf = self._buf + data if self._buf else data
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        out: list[bytes] = []
        for line in lines:
            if line.startswith(b"data:"):
                out.append(line[5:].strip())
        return out


def short_text(text: str, limit: int = ERROR_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def exc_text(exc: BaseException) -> str:
    message = str(exc)
    return short_text(f"{type(exc).__name__}: {message}" if message else type(exc).__name__)


#: A vLLM token chunk (compact JSON) can be counted without parsing it; anything else is parsed:
#: usage, errors, the role chunk, and a chunk that finishes its choice (it may be an empty end marker).
_TOKEN_MARK = b'"choices":[{'
_PARSE_MARKS = (b'"usage":{', b'"error"', b'"role"', b'"finish_reason":"')

#: Chat delta fields that hold generated output.
_DELTA_OUTPUT = ("content", "reasoning_content", "reasoning", "tool_calls")


def choice_carries_token(choice: object) -> bool:
    """Whether one streamed choice reports a generated token (see the module docstring): non-empty
    text or delta output, or empty text (content) in a choice that has not finished. A role-only
    chat delta, an empty ``delta`` and an empty finishing chunk are not tokens."""
    if not isinstance(choice, dict):
        return False
    if "delta" in choice:
        delta = choice["delta"]
        if not isinstance(delta, dict):
            return False
        if any(delta.get(k) for k in _DELTA_OUTPUT):
            return True
        if "role" in delta:
            return False
        text = delta.get("content")
    else:
        text = choice.get("text")
    if not isinstance(text, str):
        return False
    return bool(text) or choice.get("finish_reason") is None


def _carries_token(choices: object) -> bool:
    return isinstance(choices, list) and any(choice_carries_token(c) for c in choices)


@dataclass(eq=False)
class RequestRecord:
    """A request while it is in flight; becomes a :class:`RequestSample`."""

    index: int
    warmup: bool
    scheduled_ns: int
    send_ns: int | None = None
    first_token_ns: int | None = None
    token_ns: list[int] = field(default_factory=list)
    end_ns: int | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    error: str | None = None
    done: bool = False

    def on_payload(self, payload: bytes, now_ns: int) -> None:
        """Account one ``data:`` payload that arrived at ``now_ns``.

        A chunk counts as a token arrival when one of its choices carries a token
        (:func:`choice_carries_token`); ``usage`` gives the token counts; an ``error`` object marks
        the request failed.
        """
        if self.done:
            return
        # Fast path: inside JSON strings quotes are escaped, so these marks only match real keys.
        if _TOKEN_MARK in payload and not any(mark in payload for mark in _PARSE_MARKS):
            self._token(now_ns)
            return
        if payload == b"[DONE]":
            self.done = True
            self.end_ns = now_ns
            return
        try:
            obj = json.loads(payload)
        except ValueError:
            if self.error is None:
                self.error = short_text(f"BadChunk: {payload.decode('utf-8', 'replace')}")
            return
        if not isinstance(obj, dict):
            return
        if "error" in obj or obj.get("object") == "error":
            err = obj.get("error", obj)
            message = err.get("message", err) if isinstance(err, dict) else err
            if self.error is None:
                self.error = short_text(f"StreamError: {message}")
            return
        if _carries_token(obj.get("choices")):
            self._token(now_ns)
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self.prompt_tokens = usage.get("prompt_tokens", self.prompt_tokens)
            self.output_tokens = usage.get("completion_tokens", self.output_tokens)

    def _token(self, now_ns: int) -> None:
        if self.first_token_ns is None:
            self.first_token_ns = now_ns
        self.token_ns.append(now_ns)

    def sample(self) -> RequestSample:
        now = time.monotonic_ns()
        send = self.send_ns if self.send_ns is not None else now
        return RequestSample(
            index=self.index,
            warmup=self.warmup,
            scheduled_ns=self.scheduled_ns,
            send_ns=send,
            first_token_ns=self.first_token_ns,
            end_ns=self.end_ns if self.end_ns is not None else max(send, now),
            token_ns=self.token_ns,
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            error=self.error,
        )


# --------------------------------------------------------------------------- one request


async def stream_completion(
    session: aiohttp.ClientSession, url: str, body: bytes, rec: RequestRecord, timeout_s: float
) -> None:
    """POST ``body`` to ``url`` and stream the response into ``rec``.

    Never raises but :class:`asyncio.CancelledError`: failures end up in ``rec.error``.
    """
    rec.send_ns = time.monotonic_ns()
    try:
        async with session.post(url, data=body, headers=_HEADERS) as resp:
            if resp.status != 200:
                raw = await resp.content.read(2048)
                rec.end_ns = time.monotonic_ns()
                rec.error = short_text(f"HTTP {resp.status}: {raw.decode('utf-8', 'replace')}")
                return
            lines = SSELines()
            async for data in resp.content.iter_any():
                now = time.monotonic_ns()
                if rec.done:
                    continue  # read to the end so that the connection goes back to the pool
                for payload in lines.feed(data):
                    rec.on_payload(payload, now)
        if not rec.done:
            rec.end_ns = time.monotonic_ns()
            if rec.error is None:
                rec.error = "IncompleteStream: the stream ended without data: [DONE]"
    except asyncio.CancelledError:
        raise
    except TimeoutError as exc:  # aiohttp's total, connect and read timeouts
        rec.error = exc_text(exc) if str(exc) else f"TimeoutError: request took over {timeout_s:g} s"
    except Exception as exc:  # one request must never take the load point down
        rec.error = exc_text(exc)
    finally:
        if rec.end_ns is None:
            rec.end_ns = time.monotonic_ns()
