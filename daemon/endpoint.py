"""The HTTP side of an OpenAI-compatible server: ``/metrics``, idle checks, the prefix-cache reset.

:class:`Endpoint` is what a trial runs against. :class:`~daemon.server.VLLMServer` extends it with
the lifecycle of a vLLM process servetune starts; a bare :class:`Endpoint` is a server the user
already runs (the ``openai`` backend), where servetune starts and stops nothing. Counters and
gauges come from vLLM's ``/metrics`` when ``has_metrics`` (vLLM exposes it; other servers may not).
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import time
from collections.abc import Collection
from urllib.parse import urlsplit

from daemon import promtext
from daemon.serverlog import _clip
from servetune.errors import ServetuneError
from servetune.result import ServerInfo

log = logging.getLogger(__name__)

_HEALTH_REQUEST_TIMEOUT_S = 2.0

#: ``vllm:request_success_total`` finish reasons that count as a served request.
OK_FINISH_REASONS: frozenset[str] = frozenset({"stop", "length", "repetition"})

#: ``counters()`` key -> vLLM /metrics sample name (summed over label sets).
COUNTER_METRICS: dict[str, str] = {
    "request_success_total": "vllm:request_success_total",
    "generation_tokens_total": "vllm:generation_tokens_total",
    "prompt_tokens_total": "vllm:prompt_tokens_total",
    "num_preemptions_total": "vllm:num_preemptions_total",
    "prefix_cache_hits_total": "vllm:prefix_cache_hits_total",
    "prefix_cache_queries_total": "vllm:prefix_cache_queries_total",
}
#: ``gauges()`` key -> vLLM /metrics sample name.
GAUGE_METRICS: dict[str, str] = {
    "num_requests_running": "vllm:num_requests_running",
    "num_requests_waiting": "vllm:num_requests_waiting",
    "kv_cache_usage_perc": "vllm:kv_cache_usage_perc",
}


class ServerRequestError(ServetuneError):
    """An HTTP request to a running server failed (connection error, timeout or bad status)."""


class Endpoint:
    """An OpenAI-compatible server at ``base_url`` (``http://host:port`` plus an optional path).

    Thread-safety: every method opens its own connection; any thread may call them.
    """

    def __init__(self, base_url: str, *, has_metrics: bool = True, api_key: str | None = None):
        self.configure_endpoint(base_url, has_metrics=has_metrics, api_key=api_key)

    def configure_endpoint(self, base_url: str, *, has_metrics: bool = True, api_key: str | None = None) -> None:
        parts = urlsplit(base_url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) base URL: {base_url!r}")
        self._base_url = base_url.rstrip("/")
        self._scheme = parts.scheme
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._prefix = parts.path
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.has_metrics = has_metrics

    @property
    def base_url(self) -> str:
        return self._base_url

    def is_alive(self) -> bool:
        """An endpoint servetune did not start is assumed up; requests say otherwise."""
        return True

    @property
    def returncode(self) -> int | None:
        return None

    def info(self) -> ServerInfo | None:
        """Facts about a server servetune started (None for an external endpoint)."""
        return None

    def log_tail(self, lines: int = 60) -> str:
        return ""

    def _request(self, method: str, path: str, timeout_s: float, body: bytes | None = None) -> tuple[int, bytes]:
        """One HTTP request with a deadline. Raises :class:`ServerRequestError` on connection errors."""
        conn_cls = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
        conn = conn_cls(self._host, self._port, timeout=max(0.05, timeout_s))
        try:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            headers.update(self._auth)
            conn.request(method, self._prefix + path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        except (OSError, http.client.HTTPException) as exc:
            raise ServerRequestError(f"{method} {self.base_url}{path} failed: {exc}") from exc
        finally:
            conn.close()

    def _health(self, timeout_s: float) -> bool:
        try:
            status, _ = self._request("GET", "/health", timeout_s)
        except ServerRequestError:
            return False
        return status == 200

    def scrape_samples(self, timeout_s: float = 5, names: Collection[str] | None = None) -> list[promtext.Sample]:
        """Every sample of ``GET /metrics`` (only those of ``names`` when given, see
        :func:`~daemon.promtext.parse_samples`). Raises :class:`ServerRequestError`."""
        status, body = self._request("GET", "/metrics", timeout_s)
        if status != 200:
            raise ServerRequestError(f"GET {self.base_url}/metrics answered {status}")
        return promtext.parse_samples(body.decode("utf-8", "replace"), names=names)

    def scrape_metrics(self, timeout_s: float = 5) -> dict[str, float]:
        """``GET /metrics`` as ``{metric: sum over label sets}``. Raises :class:`ServerRequestError`."""
        return promtext.totals(self.scrape_samples(timeout_s))

    def counters(self, timeout_s: float = 5) -> dict[str, float]:
        """vLLM's cumulative counters, under the keys of :data:`COUNTER_METRICS` plus
        ``request_success_ok`` (finish reasons stop, length, repetition). Subtract two readings for a
        window's deltas. A counter this vLLM does not export is left out; without ``has_metrics``
        the result is empty. Raises :class:`ServerRequestError`."""
        if not self.has_metrics:
            return {}
        samples = self.scrape_samples(timeout_s)
        out = select_all(samples, COUNTER_METRICS)
        ok = promtext.select(samples, "vllm:request_success_total", {"finished_reason": OK_FINISH_REASONS})
        if ok is not None and math.isfinite(ok):
            out["request_success_ok"] = ok
        return out

    def gauges(self, timeout_s: float = 5) -> dict[str, float]:
        """Current queue and KV-cache gauges (keys of :data:`GAUGE_METRICS`); empty without
        ``has_metrics``. Raises :class:`ServerRequestError`."""
        if not self.has_metrics:
            return {}
        return select_all(self.scrape_samples(timeout_s), GAUGE_METRICS)

    def wait_idle(self, timeout_s: float, poll_s: float = 0.2) -> bool:
        """Wait until no request is running or waiting. False at the deadline or if the server died.
        Without ``has_metrics`` the server's queues cannot be seen: True at once (the client has
        finished or cancelled every request it sent)."""
        if not self.has_metrics:
            return True
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.is_alive():
                return False
            remaining = deadline - time.monotonic()
            try:
                gauges = self.gauges(timeout_s=max(0.1, min(5.0, remaining)))
            except ServerRequestError as exc:
                log.debug("metrics scrape failed while waiting for idle: %s", exc)
            else:
                if gauges.get("num_requests_running", 0.0) + gauges.get("num_requests_waiting", 0.0) == 0:
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))

    def reset_prefix_cache(self, timeout_s: float = 10) -> bool:
        """``POST /reset_prefix_cache``, retried until the deadline while vLLM answers
        ``success: false`` (blocks still held by running requests). Logs a warning on failure.
        Without ``has_metrics`` (not known to be vLLM) nothing is attempted and True is returned."""
        if not self.has_metrics:
            return True
        deadline = time.monotonic() + timeout_s
        problem = "no attempt"
        while True:
            remaining = deadline - time.monotonic()
            try:
                status, body = self._request("POST", "/reset_prefix_cache", max(0.1, min(5.0, remaining)))
            except ServerRequestError as exc:
                problem = str(exc)
            else:
                if status == 200:
                    try:
                        success = bool(json.loads(body or b"{}").get("success", True))
                    except (ValueError, AttributeError):
                        success = True  # older vLLM answers 200 with an empty body
                    if success:
                        return True
                    problem = "vLLM answered success=false (blocks still in use)"
                else:
                    problem = f"HTTP {status}: {_clip(body.decode('utf-8', 'replace'), 200)}"
                    if status == 404:
                        break  # VLLM_SERVER_DEV_MODE is off: retrying will not help
            if time.monotonic() >= deadline or not self.is_alive():
                break
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        log.warning("could not reset the prefix cache of %s: %s", self.base_url, problem)
        return False


def select_all(samples: list[promtext.Sample], names: dict[str, str]) -> dict[str, float]:
    """``{key: value}`` for each ``key -> metric name`` that the samples have (absent ones left out,
    and so are NaN and infinite readings: a result carries finite numbers only)."""
    out: dict[str, float] = {}
    for key, name in names.items():
        value = promtext.select(samples, name)
        if value is not None and math.isfinite(value):
            out[key] = value
    return out
