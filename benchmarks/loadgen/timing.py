"""Timing accuracy of our client against the self-timing target.

Accuracy: :mod:`.timing_target` (pinned to the target core) logs ``recv_ns`` and
``first_byte_ns`` per request; :mod:`.drive_ours` (pinned to the client core, Poisson arrivals)
writes every request's ``send_ns`` and ``first_token_ns``; both are CLOCK_MONOTONIC. Requests are
matched in order (the client's by send time, the target's by arrival; the counts must agree and
every pair must arrive within ``MAX_SEND_TO_RECV_MS`` of its send). The error of one request is
``client TTFT - target TTFT = (recv - send) + (first_token - first_byte)``. The same check with
:mod:`.drive_floor` (a blocking raw socket) shows the floor that the machine sets for any client.
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from benchmarks.loadgen.clients import Setup, run_child
from benchmarks.loadgen.nginx import free_port, wait_ready
from benchmarks.loadgen.procs import Child, Children
from servetune.metrics import quantile

#: Name of the floor client (:mod:`.drive_floor`) in the tables.
FLOOR = "raw blocking socket (floor)"
#: A matched pair whose request reached the target later than this after its send is a mismatch.
MAX_SEND_TO_RECV_MS = 50.0


@dataclass
class Accuracy:
    """Our TTFT minus the target's own, per request, at one offered rate (ms)."""

    client: str
    rate: float
    n: int
    delay_ms: float
    target_ttft_p50_ms: float
    client_ttft_p50_ms: float
    error_ms: dict[str, float]
    send_to_recv_ms: dict[str, float]
    byte_to_token_ms: dict[str, float]
    mismatched: int = 0
    notes: list[str] = field(default_factory=list)


def _stats(xs: list[float]) -> dict[str, float]:
    return {"p50": quantile(xs, 0.5), "p99": quantile(xs, 0.99), "max": max(xs) if xs else float("nan")}


def match(
    client: dict[str, Any], target: list[list[int]], rate: float, delay_ms: float, name: str = "servetune"
) -> Accuracy:
    """Pair the client's requests with the target's records in order and compute the errors."""
    rows = sorted(
        (s, f)
        for s, f, err in zip(client["send_ns"], client["first_token_ns"], client["error"])
        if err is None and f is not None
    )
    recs = sorted((r, b) for r, b in target)
    notes = []
    if len(rows) != len(recs):
        notes.append(f"{len(rows)} successful client requests but {len(recs)} target records")
    err, up, down, ttft_c, ttft_t = [], [], [], [], []
    mismatched = 0
    for (send, first_token), (recv, first_byte) in zip(rows, recs):
        lead = (recv - send) / 1e6
        if not 0 <= lead <= MAX_SEND_TO_RECV_MS:
            mismatched += 1
            continue
        up.append(lead)
        down.append((first_token - first_byte) / 1e6)
        ttft_c.append((first_token - send) / 1e6)
        ttft_t.append((first_byte - recv) / 1e6)
        err.append(ttft_c[-1] - ttft_t[-1])
    return Accuracy(
        client=name,
        rate=rate,
        n=len(err),
        delay_ms=delay_ms,
        target_ttft_p50_ms=quantile(ttft_t, 0.5),
        client_ttft_p50_ms=quantile(ttft_c, 0.5),
        error_ms=_stats(err),
        send_to_recv_ms=_stats(up),
        byte_to_token_ms=_stats(down),
        mismatched=mismatched,
        notes=notes,
    )


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def run_accuracy(
    setup: Setup,
    children: Children,
    rates: list[float],
    n_requests: list[int],
    delay_ms: float,
    target_cpus: str,
) -> list[Accuracy]:
    out: list[Accuracy] = []
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [setup.python, "-m", "benchmarks.loadgen.timing_target", "--port", str(port), "--delay-ms", f"{delay_ms:g}"]
    logf = setup.out_dir / "timing_target.log"
    target = Child("timing target", argv, logf, cpus=target_cpus, cwd=setup.repo, env=setup.env())
    children.start(target)
    try:
        wait_ready(url, 30, target)
        for rate, n in zip(rates, n_requests):
            setup.say(f"timing accuracy at {rate:g} req/s ({n} requests, Poisson arrivals)")
            out.append(_accuracy_point(setup, children, url, rate, n, delay_ms))
            out.append(_floor_point(setup, children, url, rate, n, delay_ms))
    finally:
        target.stop()
    return out


def _accuracy_point(setup: Setup, children: Children, url: str, rate: float, n: int, delay_ms: float) -> Accuracy:
    tag = f"timing_r{rate:g}"
    samples = setup.out_dir / f"{tag}.json"
    argv = [
        setup.python, "-m", "benchmarks.loadgen.drive_ours",
        "--base-url", url, "--rates", f"{rate:g}", "--min-requests", str(n), "--seconds", "0",
        "--warmup", str(setup.warmup), "--arrival", "poisson", "--samples",
        "--clear-url", f"{url}/_log", "--out", str(samples),
    ]  # fmt: skip
    child = Child(f"timing driver {rate:g}", argv, setup.out_dir / f"{tag}.log", cpus=setup.client_cpus,
                  cwd=setup.repo, env=setup.env())  # fmt: skip
    run_child(setup, children, child, 60 + 3 * n / rate, f"timing {rate:g} req/s")
    records = _get_json(f"{url}/_log")
    client = json.loads(samples.read_text())["samples"][0]
    acc = match(client, records, rate, delay_ms)
    _say_error(setup, acc)
    return acc


def _floor_point(setup: Setup, children: Children, url: str, rate: float, n: int, delay_ms: float) -> Accuracy:
    tag = f"timing_floor_r{rate:g}"
    samples = setup.out_dir / f"{tag}.json"
    argv = [
        setup.python, "-m", "benchmarks.loadgen.drive_floor", "--base-url", url, "--rate", f"{rate:g}",
        "--requests", str(n), "--warmup", str(setup.warmup), "--clear-url", f"{url}/_log", "--out", str(samples),
    ]  # fmt: skip
    child = Child(f"floor driver {rate:g}", argv, setup.out_dir / f"{tag}.log", cpus=setup.client_cpus,
                  cwd=setup.repo, env=setup.env())  # fmt: skip
    run_child(setup, children, child, 60 + 3 * n / rate, f"floor {rate:g} req/s")
    records = _get_json(f"{url}/_log")
    client = json.loads(samples.read_text())["samples"][0]
    acc = match(client, records, rate, delay_ms, FLOOR)
    _say_error(setup, acc)
    return acc


def _say_error(setup: Setup, acc: Accuracy) -> None:
    setup.say(
        f"  {acc.client}: error (its TTFT - target's) p50 {acc.error_ms['p50']:.3f} ms, "
        f"p99 {acc.error_ms['p99']:.3f} ms over {acc.n} requests"
    )
