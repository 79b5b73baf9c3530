"""Reading a vLLM server's log: start-up facts (KV-cache capacity) and why a start failed (pure)."""

from __future__ import annotations

import re

_KV_SIZE_RE = re.compile(r"KV cache size: ([\d,]+) tokens")
_MAX_CONCURRENCY_RE = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")


def parse_kv_cache(log_text: str) -> tuple[int | None, float | None]:
    """The KV-cache capacity (tokens) and maximum concurrency vLLM reported at start-up.

    vLLM logs e.g. ``CPU KV cache size: 4,194,304 tokens, Maximum concurrency for 512 tokens per
    request: 8192.00x`` (``GPU KV cache size`` on CUDA). The last report in ``log_text`` wins.
    """
    tokens: int | None = None
    concurrency: float | None = None
    for match in _KV_SIZE_RE.finditer(log_text):
        tokens = int(match.group(1).replace(",", ""))
    for match in _MAX_CONCURRENCY_RE.finditer(log_text):
        concurrency = float(match.group(2))
    return tokens, concurrency


def _clip(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


_ESTIMATED_LEN_RE = re.compile(r"estimated maximum model length is (\d+)")
_MAX_SEQ_LEN_RE = re.compile(r"model's max seq len \((\d+)\)")
_VALUE_ERROR_RE = re.compile(r"(?:ValueError: |Value error, )(.*?)(?: \[type=value_error.*)?$")
_ARGPARSE_RE = re.compile(r": error: ((?:argument|unrecognized arguments|the following arguments).*)$")
_EXCEPTION_RE = re.compile(r"^\s*(?:\(\S+ pid=\d+\)\s*)?([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")


def _last_line(lines: list[str], needle: str) -> str | None:
    for line in reversed(lines):
        if needle in line:
            return line
    return None


def classify_failure(log_text: str) -> str | None:
    """A short reason for a well-known start-up failure found in a server log, or ``None``.

    Most specific first: KV-cache memory, device memory, out-of-memory, port in use, illegal
    instruction, invalid arguments (argparse, ``ValueError``, pydantic ``Value error``), then the
    last ``...Error: message`` line.
    """
    lines = log_text.splitlines()
    if _last_line(lines, "No available memory for the cache blocks"):
        return "no memory left for the KV cache (No available memory for the cache blocks)"
    estimated = _ESTIMATED_LEN_RE.findall(log_text)
    if estimated or "larger than the available KV cache memory" in log_text:
        wanted = _MAX_SEQ_LEN_RE.findall(log_text)
        reason = "KV cache too small for max_model_len"
        if wanted:
            reason += f" ({wanted[-1]})"
        if estimated:
            reason += f": the estimated maximum model length is {estimated[-1]}"
        return reason
    line = _last_line(lines, "Free memory on device")
    if line is not None:
        start = line.find("Free memory on device")
        return "not enough free device memory: " + _clip(line[start:])
    line = _last_line(lines, "CUDA out of memory") or _last_line(lines, "OutOfMemoryError")
    if line is not None:
        return "out of memory: " + _clip(line.strip())
    if _last_line(lines, "Address already in use"):
        return "port already in use (Address already in use)"
    if _last_line(lines, "Illegal instruction") or _last_line(lines, "SIGILL"):
        return "illegal instruction: the kernels need an instruction set this CPU lacks"
    for line in reversed(lines):
        match = _ARGPARSE_RE.search(line)
        if match:
            return "invalid arguments: " + _clip(match.group(1))
    for line in reversed(lines):
        match = _VALUE_ERROR_RE.search(line)
        if match and match.group(1).strip():
            return "invalid engine arguments: " + _clip(match.group(1))
    for line in reversed(lines):
        match = _EXCEPTION_RE.match(line)
        if match:
            return f"{match.group(1)}: {_clip(match.group(2))}"
    return None
