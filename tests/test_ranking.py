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


def test_one_slo_rule_the_median_over_repeats() -> None:
    """An SLO is met when the median of the repeats' values is at most max_ms (as analysis.rank
    gates): one slow repeat of three does not sink a config; two do."""
    from servetune.ranking import meets_slos

    def slo(v: float | None) -> list[dict[str, Any]]:
        return [{"metric": "ttft_ms", "percentile": 99.0, "max_ms": 100.0, "value_ms": v, "met": v is not None and v <= 100}]
    assert meets_slos([slo(90.0), slo(95.0), slo(300.0)]) is True
    assert meets_slos([slo(90.0), slo(150.0), slo(300.0)]) is False
    assert meets_slos([slo(None), slo(None)]) is False  # never measured: not met
    assert meets_slos([None, []]) is None  # no SLO recorded: no gate
    one_slow = [trial("a", i, 700.0, slos=slo(v)) for i, v in enumerate((90.0, 95.0, 300.0))]
    fine = [trial("b", i, 500.0, slos=slo(50.0)) for i in range(3)]
    rows = rank([*one_slow, *fine], RankingPolicy())["lp"]
    assert [(r.config_id, r.slos_met) for r in rows] == [("a", True), ("b", True)]


def test_the_cli_table_and_analysis_rank_order_the_same_trials_the_same_way() -> None:
    """One ranking: the table ``sweep`` prints and analysis.rank give the same order on the same
    trials, with SLO misses, an OOM (measurement failure) and transport losses among them."""
    import numpy as np

    from analysis.frame import trial_table
    from analysis.ranking import rank as analysis_rank
    from analysis.synthetic import planted

    ds, _ = planted(n_configs=14, repeats=3, seed=5)
    df = trial_table(ds)
    limit = float(np.nanmedian(df["ttft_ms_p99"].to_numpy(dtype=float)))
    status, kind = ds["status"].values.astype(object), ds["failure_kind"].values.astype(object)
    ok_idx = np.flatnonzero(status == "ok")
    for i in ok_idx[:6:2]:  # three trials lost to the daemon: never held against their configs
        status[i], kind[i] = "failed", "transport"
    ds = ds.assign(status=("trial", status.astype(str)), failure_kind=("trial", kind.astype(str)))
    df = trial_table(ds)
    summaries = [
        TrialSummary(trial_id=str(r.trial_id), config_id=str(r.config_id), config_label=str(r.config_id),
                     load_point=str(r.load_point), status=str(r.status), failure_kind=str(r.failure_kind) or None,
                     metrics={} if r.status != "ok" else {
                         "output_throughput": float(r.output_throughput),
                         "slos": [{"metric": "ttft_ms", "percentile": 99.0, "max_ms": limit,
                                   "value_ms": float(r.ttft_ms_p99), "met": bool(r.ttft_ms_p99 <= limit)}]})
        for r in df.itertuples()]
    cli = rank(summaries, RankingPolicy())
    res = analysis_rank(ds, slos=[{"metric": "ttft_ms", "percentile": 99.0, "max_ms": limit}], n_boot=0)
    assert len(res.groups) == len(cli) == 1
    ana = [row.config_id for row in res.groups[0].rows]
    table = [r.config_id for r in next(iter(cli.values()))]
    assert table == ana
    tiers = {r.config_id: (r.slos_met, r.n_failed > r.n_lost, r.n_lost) for r in next(iter(cli.values()))}
    assert any(lost for *_, lost in tiers.values()) and any(m is False for m, *_ in tiers.values())
    assert any(blamed for _, blamed, _ in tiers.values())
