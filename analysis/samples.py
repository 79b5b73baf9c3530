"""Raw per-request samples of finished trials, and percentiles pooled over several trials.

DESIGN.md's statistics rules: within a trial, percentiles come from its raw samples; across
repeats the unit of replication is the trial (see the per-trial variables of the dataset); a
*pooled* percentile over repeats or daemons comes from the pooled raw samples of those trials,
never from averaging their percentiles. :func:`pooled_latencies` does the latter.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence

from servetune.errors import ServetuneError
from servetune.metrics import DEFAULT_QUANTILES, is_cancelled, per_request_latencies, quantile
from servetune.paths import resolve_experiment_dir
from servetune.result import RequestSample
from servetune.schema import DB_FILE


def trial_samples(
    experiment: str | os.PathLike[str], trial_id: str, results_root: str | os.PathLike[str] | None = None
) -> list[RequestSample]:
    """The measured (not warm-up) samples of ``trial_id``'s latest finished attempt."""
    import sqlite3

    folder = resolve_experiment_dir(experiment, results_root)
    conn = sqlite3.connect(f"file:{folder / DB_FILE}?mode=ro", uri=True, timeout=30)
    try:
        row = conn.execute(
            "SELECT result_path FROM attempts WHERE trial_id=? AND status IN ('ok','failed') "
            "ORDER BY attempt DESC LIMIT 1",
            (trial_id,),
        ).fetchone()
    finally:
        conn.close()
    if row is None or row[0] is None:
        raise ServetuneError(f"trial {trial_id[:12]} of {folder} has no finished attempt with samples")
    record = json.loads((folder / row[0]).read_text(encoding="utf-8"))
    return [RequestSample.model_validate(s) for s in record["outcome"]["samples"] if not s.get("warmup")]


def pooled_latencies(
    samples_per_trial: Iterable[Sequence[RequestSample]], quantiles: Sequence[float] = DEFAULT_QUANTILES
) -> dict[str, list[float]]:
    """TTFT, TPOT, ITL and E2EL (ms) at ``quantiles`` over the pooled successful requests of
    several trials (e.g. the repeats of one config), plus ``n`` (requests pooled)."""
    series: dict[str, list[float]] = {"ttft_ms": [], "tpot_ms": [], "itl_ms": [], "e2el_ms": []}
    n = 0
    for samples in samples_per_trial:
        for s in samples:
            if s.warmup or s.error is not None or is_cancelled(s):
                continue
            n += 1
            for name, value in per_request_latencies(s).items():
                if value is not None:
                    series[name].append(value)
            series["itl_ms"] += [(b - a) / 1e6 for a, b in zip(s.token_ns, s.token_ns[1:])]
    out = {name: [quantile(values, q) for q in quantiles] for name, values in series.items()}
    out["n"] = [float(n)]
    return out
