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

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from servetune.bounds import (
    MAX_ARGV,
    MAX_GPUS,
    MAX_METRICS,
    MAX_SAMPLES,
    MAX_SERIES_POINTS,
    MAX_TOKENS_PER_SAMPLE,
    WIRE_CONFIG,
    Count,
    Finite,
    Int64,
    Label,
    LongText,
    Text,
)

Status = Literal["ok", "failed"]
FailureKind = Literal["transport", "measurement", "config", "parse"]


class _Model(BaseModel):
    """Unknown fields refused; every field bounded (:mod:`servetune.bounds`): these travel in RESULTs."""

    model_config = WIRE_CONFIG


class GPUInfo(_Model):
    index: Count
    name: Label
    memory_mib: Count | None = None
    driver: Label | None = None
    compute_capability: Label | None = None


class GPULink(_Model):
    """How two GPUs of a node reach each other (NVML, :mod:`daemon.nvml`)."""

    a: Count
    b: Count
    nvlinks: Count = Field(0, description="active NVLink links between the two (0: none)")
    path: Label = Field(description="NVML's common ancestor of the pair: internal, single PCIe switch, multiple "
                                    "PCIe switches, host bridge, NUMA node, system (across sockets)")


class GPUTopology(_Model):
    """The GPUs' interconnect, recorded with every trial (read through NVML on the node)."""

    cuda_driver_version: Label | None = Field(None, description="the CUDA version the driver supports, e.g. 12.4")
    interconnect: Label = Field(description="NVLink, NVLink (some pairs) + PCIe, PCIe, or single GPU")
    links: list[GPULink] = Field(default_factory=list, max_length=MAX_GPUS * 8)


class Fingerprint(_Model):
    """Hardware and software of the node that ran a trial, read for real on that node."""

    hostname: Label
    cpu_model: Label
    cpu_count: Count
    cpu_isa: Label = Field(description="best vector ISA: AVX512, AVX2, AVX, NEON or none")
    ram_gib: Finite
    gpus: list[GPUInfo] = Field(default_factory=list, max_length=MAX_GPUS)
    os: Label
    kernel: Label
    python: Label
    vllm_version: Label | None = None
    torch_version: Label | None = None
    transformers_version: Label | None = None
    servetune_version: Label
    hardware_class: Label
    gpu_topology: GPUTopology | None = Field(None, description="None: no GPU read through NVML")


class RequestSample(_Model):
    """One request as the client saw it. Times are monotonic nanoseconds on the daemon's clock."""

    index: Int64
    warmup: bool = False
    scheduled_ns: Int64
    send_ns: Int64
    first_token_ns: Int64 | None = None
    end_ns: Int64
    token_ns: list[Int64] = Field(default_factory=list, max_length=MAX_TOKENS_PER_SAMPLE,
                                  description="arrival of every streamed chunk")
    prompt_tokens: Int64 | None = None
    output_tokens: Int64 | None = None
    error: Text | None = Field(
        None,
        description="error class and short message; None when ok. 'cancelled...' when the load generator "
        "ended it itself (end of window, early stop, deadline): not a server error",
    )


class ServerInfo(_Model):
    """Facts about the vLLM server that served a batch."""

    argv: list[Text] = Field(max_length=MAX_ARGV)
    pid: Count | None = None
    pgid: Count | None = None
    port: Count | None = None
    startup_s: Finite | None = None
    kv_cache_tokens: Int64 | None = None
    reported_max_concurrency: Finite | None = None
    log_path: Text | None = None
    exit_code: Int64 | None = None
    cpus: list[Count] = Field(default_factory=list, max_length=MAX_ARGV, description="cores the server was pinned to")


class LoopLag(_Model):
    """The load generator's own event-loop lag over one measurement window (milliseconds).

    A probe task on the client's event loop sleeps ``interval_ms`` again and again and records how
    much later than asked it woke: a loop busy with callbacks, a blocking call, or a host that does
    not schedule the client. Every time the client stamps (sends and chunk arrivals alike) can be
    that late, so a receive-side stall that the send lag cannot see shows up here.
    """

    interval_ms: Finite
    n: Count = Field(description="probe wake-ups measured")
    p50_ms: Finite
    p99_ms: Finite
    max_ms: Finite


class GPUTelemetrySummary(_Model):
    """One GPU over one measurement window (:mod:`daemon.telemetry`); None where NVML gave no reading."""

    index: Count
    n: Count = Field(description="samples taken")
    power_w_mean: Finite | None = None
    power_w_max: Finite | None = None
    temperature_c_mean: Finite | None = None
    temperature_c_max: Finite | None = None
    sm_clock_mhz_mean: Finite | None = None
    sm_clock_mhz_min: Finite | None = None
    memory_used_mib_max: Finite | None = None


class GPUTelemetry(_Model):
    """GPU telemetry of a measurement window; ``sampled`` False (and ``note`` says why) where there was
    none to read: never made-up numbers."""

    sampled: bool
    note: Text = ""
    interval_s: Finite | None = None
    gpus: list[GPUTelemetrySummary] = Field(default_factory=list, max_length=MAX_GPUS)


class TrialOutcome(_Model):
    """The payload of a RESULT: everything one attempt measured, ok or failed."""

    status: Status
    failure_kind: FailureKind | None = None
    error: LongText | None = None
    exit_code: Int64 | None = None
    log_tail: LongText | None = None
    samples: list[RequestSample] = Field(default_factory=list, max_length=MAX_SAMPLES)
    window_s: Finite | None = Field(None, description="length of the measurement window (warm-up excluded)")
    offered_rate: Finite | None = None
    client_loop_lag: LoopLag | None = Field(None, description="the load generator's event-loop lag while it measured")
    stopped_early: Text | None = None
    server: ServerInfo | None = None
    server_counters: dict[Label, Finite] = Field(
        default_factory=dict, max_length=MAX_METRICS,
        description="deltas of vLLM /metrics counters over the measurement window",
    )
    server_series: list[Annotated[dict[Label, Finite], Field(max_length=MAX_METRICS)]] = Field(
        default_factory=list, max_length=MAX_SERIES_POINTS,
        description="the server's /metrics read about every 0.5 s from the start of the measurement until the "
        "server drained: each point has t_ns (monotonic ns on the daemon's clock, as the samples) and the gauges "
        "and cumulative counters read (daemon.scrape); empty when the server has no /metrics",
    )
    fingerprint: Fingerprint | None = None
    gpu_telemetry: GPUTelemetry | None = Field(None, description="GPU power, temperature, SM clock and memory "
                                                                  "over the measurement window (None: not asked)")
    started_at_us: Int64
    finished_at_us: Int64
