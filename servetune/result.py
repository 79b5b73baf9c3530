"""What one attempt of a trial produced: raw per-request samples, server facts, the fingerprint.

The daemon sends a :class:`TrialOutcome` in a RESULT message; the coordinator derives
:class:`~servetune.metrics.TrialMetrics` from its raw samples (so SLOs can change without a re-run)
and keeps both. Failure kinds are never blurred:

- ``transport``: the daemon or the connection was lost; retried on resume.
- ``measurement``: the run happened and said no (server would not start, OOM, died or timed out
  under load). It is a result: not retried unless asked.
- ``config``: the spec was invalid; refused before any run.
- ``parse``: output could not be understood; the raw output is kept.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Status = Literal["ok", "failed"]
FailureKind = Literal["transport", "measurement", "config", "parse"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GPUInfo(_Model):
    index: int
    name: str
    memory_mib: int | None = None
    driver: str | None = None
    compute_capability: str | None = None


class Fingerprint(_Model):
    """Hardware and software of the node that ran a trial, read for real on that node."""

    hostname: str
    cpu_model: str
    cpu_count: int
    cpu_isa: str = Field(description="best vector ISA: AVX512, AVX2, AVX, NEON or none")
    ram_gib: float
    gpus: list[GPUInfo] = Field(default_factory=list)
    os: str
    kernel: str
    python: str
    vllm_version: str | None = None
    torch_version: str | None = None
    transformers_version: str | None = None
    servetune_version: str
    hardware_class: str


class RequestSample(_Model):
    """One request as the client saw it. Times are monotonic nanoseconds on the daemon's clock."""

    index: int
    warmup: bool = False
    scheduled_ns: int
    send_ns: int
    first_token_ns: int | None = None
    end_ns: int
    token_ns: list[int] = Field(default_factory=list, description="arrival of every streamed chunk")
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    error: str | None = Field(
        None,
        description="error class and short message; None when ok. 'cancelled...' when the load generator "
        "ended it itself (end of window, early stop, deadline): not a server error",
    )


class ServerInfo(_Model):
    """Facts about the vLLM server that served a batch."""

    argv: list[str]
    pid: int | None = None
    pgid: int | None = None
    port: int | None = None
    startup_s: float | None = None
    kv_cache_tokens: int | None = None
    reported_max_concurrency: float | None = None
    log_path: str | None = None
    exit_code: int | None = None
    cpus: list[int] = Field(default_factory=list, description="cores the server was pinned to")


class TrialOutcome(_Model):
    """The payload of a RESULT: everything one attempt measured, ok or failed."""

    status: Status
    failure_kind: FailureKind | None = None
    error: str | None = None
    exit_code: int | None = None
    log_tail: str | None = None
    samples: list[RequestSample] = Field(default_factory=list)
    window_s: float | None = Field(None, description="length of the measurement window (warm-up excluded)")
    offered_rate: float | None = None
    stopped_early: str | None = None
    server: ServerInfo | None = None
    server_counters: dict[str, float] = Field(
        default_factory=dict, description="deltas of vLLM /metrics counters over the measurement window"
    )
    server_series: list[dict[str, float]] = Field(
        default_factory=list,
        description="the server's /metrics read about every 0.5 s from the start of the measurement until the "
        "server drained: each point has t_ns (monotonic ns on the daemon's clock, as the samples) and the gauges "
        "and cumulative counters read (daemon.scrape); empty when the server has no /metrics",
    )
    fingerprint: Fingerprint | None = None
    started_at_us: int
    finished_at_us: int
