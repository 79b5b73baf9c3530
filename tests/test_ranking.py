"""The default ranking (servetune.ranking) and what the ranked table shows of flagged trials."""

from __future__ import annotations

from typing import Any

from servetune.ranking import TrialSummary, rank, short_reason
from servetune.spec import RankingPolicy


def trial(config: str, n: int, tput: float, **metrics: Any) -> TrialSummary:
    return TrialSummary(trial_id=f"{config}-{n}", config_id=config, config_label=f"label {config}", load_point="lp",
                        status="ok", failure_kind=None, metrics={"output_throughput": tput, **metrics})


def test_flags_of_stopped_early_and_client_fell_behind_never_change_the_rank() -> None:
    reason = "over-saturation: in-flight grew from 3 to 41 and TTFT rose 12 ms/s over 5 s"
    trials = [
        trial("a", 0, 100.0, stopped_early=reason),
        trial("a", 1, 110.0, stopped_early="error budget: 12 errors > max_errors 10"),
        trial("b", 0, 90.0, client_fell_behind=True),
        trial("b", 1, 95.0),
        trial("c", 0, 50.0, stopped_early=None, client_fell_behind=False),
    ]
    rows = rank(trials, RankingPolicy())["lp"]
    assert [r.config_id for r in rows] == ["a", "b", "c"]
    a, b, c = rows
    assert a.flags == ["stopped early: error budget, over-saturation"]
    assert b.flags == ["client fell behind (1 of 2)"]
    assert c.flags == []
    assert short_reason(reason) == "over-saturation"


def failed(config: str, n: int, kind: str) -> TrialSummary:
    return TrialSummary(trial_id=f"{config}-{n}", config_id=config, config_label=f"label {config}", load_point="lp",
                        status="failed", failure_kind=kind, metrics={})


def test_transport_losses_are_not_held_against_a_config_measurement_failures_are() -> None:
    """The rule analysis.rank applies: a 700 tok/s config with one trial lost to a daemon ranks above a
    500 tok/s config; with that trial an OOM (measurement) it ranks below every config that never failed."""
    base = [trial("fast", i, 700.0 + i) for i in range(3)] + [trial("slow", i, 500.0 + i) for i in range(3)]
    lost = rank([*base, failed("fast", 3, "transport")], RankingPolicy())["lp"]
    assert [r.config_id for r in lost] == ["fast", "slow"]
    assert (lost[0].n_failed, lost[0].n_lost, lost[0].status) == (1, 1, "ok")
    oom = rank([*base, failed("fast", 3, "measurement")], RankingPolicy())["lp"]
    assert [r.config_id for r in oom] == ["slow", "fast"] and oom[1].n_lost == 0
    never = rank([*base, failed("gone", 0, "measurement")], RankingPolicy())["lp"]
    assert [r.config_id for r in never] == ["fast", "slow", "gone"]


def test_the_tier_rule_is_one_rule_for_bools_and_arrays() -> None:
    import numpy as np

    from servetune.ranking import FAILS, MEETS, MISSES, NO_DATA, tier
    cases = [(True, False, False, MEETS), (True, False, True, MEETS + FAILS), (True, True, False, MISSES),
             (True, True, True, MISSES + FAILS), (False, False, True, NO_DATA), (False, True, False, NO_DATA)]
    for has, miss, fail, want in cases:
        assert tier(has, miss, fail) == want
    arr = tier(*(np.array([c[i] for c in cases]) for i in range(3)))
    assert arr.tolist() == [c[3] for c in cases]
