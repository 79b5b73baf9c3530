"""The spec's default ranking policy, applied to per-trial summaries (pure, standard library).

Per load point, each engine config gets one row: the median of its repeats' per-trial statistics
(repeats are the unit of replication). Baseline re-runs are drift controls and are left out.

The ranking rule is one rule, shared with :func:`analysis.ranking.rank`, which imports :func:`tier`
and :func:`blames_config` from here and gates SLOs as :func:`meets_slos` does (the median over a
config's repeats of each SLO's latency at most its ``max_ms``): configs are ordered by tier, then by
the objective (highest first), then by config id (:func:`order_key`). The tiers, best first:

0. ``MEETS``: meets every SLO (or no SLO gate);
1. ``MEETS + FAILS``: as 0 but some of its trials failed in a way that is the config's fault;
2. ``MISSES``: misses an SLO; 3. ``MISSES + FAILS``;
4. ``NO_DATA``: no usable trial.

A failure counts against a config (:func:`blames_config`) unless its kind is ``transport``: a lost
daemon or connection says nothing about the config (the trial is re-run on resume), so such a
trial is shown (:attr:`RankedConfig.n_lost`) and counted like a hole, never held against the config.
A ``measurement`` failure (OOM, a server that would not start or died under load) does count: a
config that works only sometimes is not a deployment answer, however fast its lucky runs were.

A row also carries what its ok trials were flagged with (:attr:`RankedConfig.flags`): a load point
stopped early by a stop condition (its metrics cover what ran) and a client that fell behind its
arrival schedule (its figures understate what the server can do). Flags never change the rank.

The full analysis (uncertainty, distinguishability, other policies) lives in ``analysis``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from servetune.spec import RankingPolicy

#: ranking tiers (lower ranks first); a config with failures it is to blame for sits one below its SLO tier
MEETS, FAILS, MISSES, NO_DATA = 0, 1, 2, 4
#: failure kinds that say nothing about the config (the run never judged it)
NOT_THE_CONFIGS_FAULT: frozenset[str] = frozenset({"transport"})


def blames_config(failure_kind: str | None) -> bool:
    """Whether a failed trial of this kind counts against its config (every kind but ``transport``)."""
    return (failure_kind or "") not in NOT_THE_CONFIGS_FAULT


def tier(has_data: Any, misses_slo: Any, failing: Any) -> Any:
    """The ranking tier from three flags (Python bools or NumPy bool arrays alike, elementwise):
    whether the config has a usable trial, whether it misses an SLO of the gate, and whether some of
    its trials failed by its own fault (:func:`blames_config`)."""
    return has_data * (MISSES * misses_slo + FAILS * failing) + (has_data == 0) * NO_DATA


@dataclass(frozen=True)
class TrialSummary:
    """What the ranking needs of one trial's latest finished attempt (or its hole)."""

    trial_id: str
    config_id: str
    config_label: str
    load_point: str
    status: str  # ok / failed / hole
    failure_kind: str | None
    metrics: dict[str, Any]
    is_baseline: bool = False


@dataclass
class RankedConfig:
    rank: int
    config_id: str
    config_label: str
    load_point: str
    n_ok: int
    n_failed: int
    n_holes: int
    values: dict[str, float | None] = field(default_factory=dict)
    slos_met: bool | None = None
    failure: str | None = None
    stopped_early: list[str] = field(default_factory=list)
    n_fell_behind: int = 0
    n_lost: int = 0  # failed trials lost to transport (daemon or connection): not held against the config

    @property
    def status(self) -> str:
        if self.n_ok:
            return "ok"
        return "failed" if self.n_failed else "hole"

    @property
    def flags(self) -> list[str]:
        """Short notes for the table, e.g. ``stopped early: over-saturation``, ``client fell behind (1 of 3)``."""

        def of(n: int) -> str:
            return "" if n == self.n_ok else f" ({n} of {self.n_ok})"

        out = []
        if self.stopped_early:
            kinds = sorted({short_reason(r) for r in self.stopped_early})
            out.append(f"stopped early{of(len(self.stopped_early))}: {', '.join(kinds)}")
        if self.n_fell_behind:
            out.append(f"client fell behind{of(self.n_fell_behind)}")
        return out


def short_reason(reason: str) -> str:
    """The kind of a stop reason: ``"over-saturation: in-flight grew ..."`` -> ``"over-saturation"``."""
    return reason.split(":", 1)[0].strip()


def _median(xs: Iterable[Any]) -> float | None:
    vals = [float(x) for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.median(vals) if vals else None


def _q(metrics: dict[str, Any], name: str, q: float) -> Any:
    qs = metrics.get("quantiles") or []
    vals = metrics.get(name) or []
    for qq, v in zip(qs, vals):
        if abs(qq - q) < 1e-9:
            return v
    return None


def summary_values(metrics: dict[str, Any]) -> dict[str, Any]:
    """The columns shown in the ranked table, from one trial's metrics."""
    return {
        "request_throughput": metrics.get("request_throughput"),
        "output_throughput": metrics.get("output_throughput"),
        "total_token_throughput": metrics.get("total_token_throughput"),
        "request_goodput": metrics.get("request_goodput"),
        "ttft_p50_ms": _q(metrics, "ttft_ms", 0.5),
        "ttft_p99_ms": _q(metrics, "ttft_ms", 0.99),
        "tpot_p50_ms": _q(metrics, "tpot_ms", 0.5),
        "tpot_p99_ms": _q(metrics, "tpot_ms", 0.99),
        "n_errors": metrics.get("n_errors"),
        "slo_attainment": metrics.get("slo_attainment"),
    }


def meets_slos(slo_results: Sequence[Sequence[dict[str, Any]] | None]) -> bool | None:
    """Whether a config meets every SLO, from its ok repeats' per-trial SLO results (each a list of
    ``{metric, percentile, max_ms, value_ms, met}``, as :mod:`servetune.metrics` records them).

    The rule :func:`analysis.ranking.rank` applies: an SLO is met when the median over the repeats
    of its value (the latency at the SLO's percentile) is at most ``max_ms``; a value no repeat
    measured misses it. One slow repeat of three does not sink a config, nor one fast repeat save it.
    None when no repeat recorded an SLO (no gate)."""
    by_slo: dict[tuple[str, float, float], list[Any]] = {}
    for results in slo_results:
        for r in results or []:
            key = (str(r.get("metric")), float(r.get("percentile", 99.0)), float(r.get("max_ms", math.inf)))
            by_slo.setdefault(key, []).append(r.get("value_ms"))
    if not by_slo:
        return None
    for (_metric, _pct, max_ms), values in by_slo.items():
        med = _median(values)
        if med is None or not med <= max_ms:
            return False
    return True


def order_key(tier_of: int, objective: float | None, config_id: str) -> tuple[int, float, str]:
    """Sort key of one config (ascending): tier, then the objective (highest first; a missing one
    last), then config id; :func:`analysis.ranking.rank` orders by the same three keys."""
    return int(tier_of), -(objective if objective is not None and not math.isnan(objective) else -math.inf), config_id


def rank(trials: Sequence[TrialSummary], policy: RankingPolicy) -> dict[str, list[RankedConfig]]:
    """Rank engine configs per load point (insertion order of load points is kept)."""
    groups: dict[str, dict[str, list[TrialSummary]]] = {}
    for t in trials:
        if t.is_baseline:
            continue
        groups.setdefault(t.load_point, {}).setdefault(t.config_id, []).append(t)
    out: dict[str, list[RankedConfig]] = {}
    for lp, by_config in groups.items():
        rows: list[RankedConfig] = []
        for config_id, ts in by_config.items():
            ok = [t for t in ts if t.status == "ok"]
            failed = [t for t in ts if t.status == "failed"]
            blamed = [t for t in failed if blames_config(t.failure_kind)]
            per_trial = [summary_values(t.metrics) for t in ok]
            values = {k: _median(v[k] for v in per_trial) for k in (per_trial[0] if per_trial else {})}
            slos_met = meets_slos([t.metrics.get("slos") for t in ok]) if ok else None
            failure = None
            if failed and not ok:
                failure = failed[-1].failure_kind or "failed"
            rows.append(
                RankedConfig(
                    rank=0,
                    config_id=config_id,
                    config_label=ts[0].config_label,
                    load_point=lp,
                    n_ok=len(ok),
                    n_failed=len(failed),
                    n_holes=len(ts) - len(ok) - len(failed),
                    values=values,
                    slos_met=slos_met,
                    failure=failure,
                    stopped_early=[str(t.metrics["stopped_early"]) for t in ok if t.metrics.get("stopped_early")],
                    n_fell_behind=sum(1 for t in ok if t.metrics.get("client_fell_behind")),
                    n_lost=len(failed) - len(blamed),
                )
            )

        def key(r: RankedConfig) -> tuple[int, float, str]:
            misses = bool(policy.require_slos and r.slos_met is False)
            return order_key(tier(bool(r.n_ok), misses, r.n_failed > r.n_lost), r.values.get(policy.objective),
                             r.config_id)

        rows.sort(key=key)
        for i, r in enumerate(rows, start=1):
            r.rank = i
        out[lp] = rows
    return out
