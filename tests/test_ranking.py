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
