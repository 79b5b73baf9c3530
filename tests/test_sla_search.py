"""SLA search (``load_points[*].sla_search``): the interval on a percentile, the noise-aware verdict of
one probe, the bracketing and bisection rounds (``servetune.sla``), the spec's rules, and a sweep on
the SIMULATED backend through the real coordinator and a child daemon, resumed."""

from __future__ import annotations

import json
import math
import random
import shutil
import sqlite3
import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from coordinator.cli import main
from coordinator.planning import plan_experiment
from coordinator.sla_search import SLA_BATCH_OFFSET, search_states
from coordinator.store import Store
from servetune.errors import SpecError
from servetune.metrics import summary_dict
from servetune.result import RequestSample
from servetune.sla import (
    SlaOutcome,
    Verdict,
    combine_runs,
    first_rates,
    next_rates,
    quantile_ci,
    quantile_ci_ranks,
    search_range,
    verdict,
)
from servetune.spec import SLO, parse_spec, requests_to_confirm
from tests.conftest import cli_env, coordinator_cmd

# ---------------------------------------------------------------------------- interval on a percentile


@pytest.mark.parametrize("n, q", [(400, 0.99), (1000, 0.99), (60, 0.5), (200, 0.9), (30_000, 0.99)])
def test_the_percentile_interval_covers_the_truth_at_its_rate(n: int, q: float) -> None:
    rng = random.Random(7)
    truth = -math.log(1 - q)  # the q quantile of Exp(1)
    runs = 400 if n < 10_000 else 100
    covered = 0
    for _ in range(runs):
        lo, hi = quantile_ci([rng.expovariate(1.0) for _ in range(n)], q)
        covered += (lo is None or lo <= truth) and (hi is None or hi >= truth)
    # nominal 95%; order statistics make it a little conservative, never much under
    assert 0.92 <= covered / runs <= 0.995, covered / runs


def test_too_few_requests_leave_a_side_unbounded_and_the_spec_says_how_many() -> None:
    assert quantile_ci_ranks(367, 0.99)[1] is None and quantile_ci_ranks(368, 0.99)[1] == 368
    for p in (50.0, 90.0, 95.0, 99.0, 99.9):
        need = requests_to_confirm(p)
        assert quantile_ci_ranks(need, p / 100)[1] is not None and quantile_ci_ranks(need - 1, p / 100)[1] is None


def _sample(i: int, ttft_ms: float, error: str | None = None) -> RequestSample:
    send = i * 1_000_000_000
    first = send + int(ttft_ms * 1e6)
    return RequestSample(index=i, scheduled_ns=send, send_ns=send, first_token_ns=None if error else first,
                         end_ns=first + 10_000_000, token_ns=[] if error else [first, first + 10_000_000],
                         prompt_tokens=None if error else 8, output_tokens=None if error else 2, error=error)


def test_trial_metrics_carry_the_interval_around_the_percentile() -> None:
    samples = [_sample(i, 100.0 + i) for i in range(400)]
    m = summary_dict(samples, 400.0, [SLO(metric="ttft_ms", percentile=99, max_ms=600)])
    s = m["slos"][0]
    assert s["rank_low_ms"] <= s["value_ms"] <= s["rank_high_ms"]
    lo, hi = quantile_ci_ranks(400, 0.99)
    assert lo is not None and hi is not None and lo < 396 < hi  # p99 of 400 sits between ranks 396 and 397
    assert s["rank_low_ms"] == pytest.approx(100.0 + lo - 1) and s["rank_high_ms"] == pytest.approx(100.0 + hi - 1)
    few = summary_dict(samples[:100], 100.0, [SLO(metric="ttft_ms", percentile=99, max_ms=600)])
    assert few["slos"][0]["rank_high_ms"] is None  # 100 requests cannot bound p99 from above


# ---------------------------------------------------------------------------- one probe's verdict


def _metrics(value: float, lo: float | None, hi: float | None, *, n: int = 400, errors: int = 0,
             **extra: Any) -> dict[str, Any]:
    return {"n_requests": n, "n_errors": errors, "client_fell_behind": False, "stopped_early": None,
            "slos": [{"metric": "ttft_ms", "percentile": 99.0, "max_ms": 500.0, "value_ms": value, "met": value <= 500,
                      "rank_low_ms": lo, "rank_high_ms": hi}], **extra}


def test_a_probe_meets_misses_or_is_unsure_by_the_interval_not_the_point() -> None:
    assert verdict("ok", _metrics(300, 250, 400)) == "meets"
    assert verdict("ok", _metrics(480, 400, 520)) == "unsure", "the point meets, the interval straddles the bound"
    assert verdict("ok", _metrics(520, 480, 700)) == "unsure", "the point misses, the interval straddles the bound"
    assert verdict("ok", _metrics(700, 600, 900)) == "misses"
    assert verdict("ok", _metrics(300, 250, None)) == "unsure", "too few requests to bound the percentile"
    assert verdict("ok", _metrics(300, 250, 400, errors=5)) == "misses", "5 of 400 failed: p99 of all requests is above"
    assert verdict("ok", _metrics(300, 250, 400, errors=2)) == "unsure", "failed requests sit above any bound"
    assert verdict("failed", None) == "misses", "a server that falls over under load offers no rate"
    assert verdict("ok", _metrics(300, 250, 400, stopped_early="over-saturation: in-flight grew")) == "misses"
    assert verdict("ok", _metrics(300, 250, 400, client_fell_behind=True)) == "invalid"
    assert verdict("ok", {**_metrics(300, 250, 400), "slos": []}) == "unsure", "no SLO evaluated: nothing shown"


# ---------------------------------------------------------------------------- rounds


def _run(truth: Callable[[float], Verdict], *, lo: float = 1.0, hi: float = 64.0, per_round: int = 3,
         rel_tol: float = 0.05, max_rounds: int = 12) -> tuple[Any, int, int]:
    probes: dict[float, Verdict] = {r: truth(r) for r in first_rates(lo, hi, per_round)}
    floor, ceiling = search_range(lo, hi)
    rounds = 1
    while True:
        rates, outcome = next_rates(probes, per_round=per_round, rel_tol=rel_tol, rounds_done=rounds,
                                    max_rounds=max_rounds, floor=floor, ceiling=ceiling)
        assert all(floor <= r <= ceiling for r in rates), "never outside the first round's range widened 16x"
        if not rates:
            return outcome, rounds, len(probes)
        assert not set(rates) & set(probes), "a rate is never probed twice"
        assert len(rates) <= per_round
        probes.update({r: truth(r) for r in rates})
        rounds += 1


def _step(boundary: float, band: float = 0.0) -> Callable[[float], Verdict]:
    def truth(r: float) -> Verdict:
        if r <= boundary * (1 - band):
            return "meets"
        if r >= boundary * (1 + band):
            return "misses"
        return "unsure"
    return truth


@pytest.mark.parametrize("boundary", [0.3, 3.7, 10.0, 41.0, 300.0])
def test_bracketing_and_bisection_resolve_the_boundary_within_tolerance(boundary: float) -> None:
    outcome, rounds, trials = _run(_step(boundary))
    assert outcome.reason == "resolved", outcome
    assert outcome.lo <= boundary < outcome.hi and outcome.hi <= outcome.lo * 1.05
    assert outcome.max_rate_rps == outcome.lo
    # bisection: far fewer rounds than a 1 req/s descent would take steps
    assert rounds <= 8 and trials <= 24, (rounds, trials)


def test_an_unsure_band_stops_the_search_as_noise_with_an_interval_around_it() -> None:
    outcome, _, _ = _run(_step(10.0, band=0.08))
    assert outcome.reason == "noise", outcome
    assert outcome.lo <= 10.0 * 0.92 and outcome.hi >= 10.0 * 1.08
    assert outcome.lo <= 10.0 <= outcome.hi
    assert any(v == "unsure" for _, v in outcome.probes)


def test_budget_none_meets_and_client_limit() -> None:
    outcome, rounds, _ = _run(_step(10.0), max_rounds=2)
    assert outcome.reason == "budget" and rounds == 2 and outcome.lo is not None and outcome.hi is not None
    nothing, _, _ = _run(lambda r: "misses")
    assert nothing.reason == "none_meets" and nothing.lo is None
    assert "no rate down to 0.0625 req/s shown to meet" in nothing.describe()
    unsure, _, _ = _run(lambda r: "unsure")  # too few requests to show anything: bounded, never "met"
    assert unsure.lo is None and unsure.hi is None and unsure.reason in ("budget", "all_meet")
    everything, _, _ = _run(lambda r: "meets")
    assert everything.reason == "all_meet" and everything.hi is None and everything.lo == 1020  # 1024, 3 digits

    def capped(r: float) -> Verdict:
        return "invalid" if r > 20 else "meets"
    outcome, _, _ = _run(capped)
    assert outcome.reason == "client_limit" and outcome.hi is None and outcome.lo is not None and outcome.lo <= 20


def test_a_pass_above_a_miss_is_reported_not_hidden() -> None:
    def bumpy(r: float) -> Verdict:
        return "misses" if 5 <= r <= 6 else ("meets" if r < 10 else "misses")
    outcome, _, _ = _run(bumpy, lo=1, hi=16, per_round=6)
    assert outcome.hi is not None and outcome.hi <= 6
    if any(v == "meets" and r > outcome.hi for r, v in outcome.probes):
        assert outcome.non_monotone and "not monotone" in outcome.describe()


# ---------------------------------------------------------------------------- runs combined


def test_the_interval_over_runs_covers_the_typical_runs_boundary_at_its_rate() -> None:
    """Each run's boundary is the typical one moved by the run's own speed (lognormal, 3-8%); its
    search brackets it within 5-10%. The t-interval over 2, 3 or 5 runs covers the typical boundary
    at least 95% of the time (it adds each bracket's width: conservative), one run gives none."""
    rng = random.Random(11)
    for runs in (2, 3, 5):
        for sigma in (0.03, 0.08):
            covered, n = 0, 600
            for _ in range(n):
                outcomes = []
                for _ in range(runs):
                    b = 10.0 * math.exp(rng.gauss(0, sigma))
                    width = rng.uniform(0.02, 0.1)
                    lo = b * math.exp(-width * rng.random())
                    outcomes.append(SlaOutcome(lo=lo, hi=lo * math.exp(width), reason="resolved"))
                c = combine_runs(outcomes)
                assert c.low is not None and c.high is not None and c.low < c.estimate < c.high  # type: ignore[operator]
                assert c.met_in_every_run == min(o.lo for o in outcomes if o.lo is not None)
                covered += c.low <= 10.0 <= c.high
            assert 0.95 <= covered / n <= 1.0, (runs, sigma, covered / n)
    one = combine_runs([SlaOutcome(lo=9.0, hi=10.0, reason="resolved")])
    assert one.low is None and "one run" in one.describe()
    open_ended = combine_runs([SlaOutcome(lo=9.0, hi=10.0, reason="resolved"), SlaOutcome(lo=None, hi=3.0, reason="none_meets")])
    assert open_ended.low is None and open_ended.met_in_every_run is None and "1 of 2 runs" in open_ended.describe()


# ---------------------------------------------------------------------------- the spec

SPEC = textwrap.dedent(
    """
    name: slasweep
    model: {source: tiny}
    backend: {kind: sim}
    engine:
      grid: {max_num_seqs: [2, 16]}
    load_points:
      - {name: sla, sla_search: {min_rps: 1, max_rps: 64, rel_tol: 0.1, max_rounds: 4}, num_requests: 60,
         input_len: 128, output_len: 32}
    slos:
      - {metric: ttft_ms, percentile: 90, max_ms: 500}
    """
)


def test_the_spec_rules_name_the_key() -> None:
    plan = plan_experiment(parse_spec(SPEC))
    names = sorted({m.load_point.name for m in plan.trials()})
    assert names == ["sla@1rps", "sla@64rps", "sla@8rps"]  # evenly in log from 1 to 64
    assert all(m.load_point.sla_search is None and m.load_point.request_rate for m in plan.trials())
    assert any("SLA search 'sla'" in n for n in plan.notes)
    cases = {
        "slos:\n  - {metric: ttft_ms, percentile: 90, max_ms: 500}\n": ("", "load_points[0].sla_search", "give `slos`"),
        "num_requests: 60": ("num_requests: 20", "load_points[0].num_requests", "at least 36"),
        "sla_search: {": ("request_rate: 3, sla_search: {", "load_points[0]", "sets request_rate itself"),
        "max_rps: 64": ("max_rps: 0.5", "load_points[0].sla_search", "below min_rps"),
        "num_requests: 60,": ("duration_s: 0.5,", "load_points[0].duration_s", "sends about 32 requests"),
    }
    for old, (new, path, text) in cases.items():
        with pytest.raises(SpecError) as err:
            parse_spec(SPEC.replace(old, new))
        assert any(i.path.startswith(path) and text in i.message for i in err.value.issues), err.value.issues
    with pytest.raises(SpecError, match="restart_per_repeat"):
        parse_spec(SPEC + "restart_per_repeat: false\n")
    with pytest.raises(SpecError, match="fixed load points only"):
        parse_spec(SPEC + "planner: {kind: optuna, n_trials: 2}\n")
    with pytest.raises(SpecError, match="not both"):
        parse_spec(SPEC.replace("sla_search: {", "rate_sweep: {num_rates: 2}, sla_search: {"))


def test_the_preview_says_later_rounds_are_not_in_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    assert main(["sweep", str(path), "--preview", "--profile", "H100-80G", "--results-root", str(tmp_path / "r")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "SLA search sla: only its first round's rates are simulated and costed" in out, out[-2000:]


# ---------------------------------------------------------------------------- a sweep, resumed


def test_a_sweep_runs_round_after_round_then_resumes_to_the_same_answer(tmp_path: Path, tiny_cache: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(SPEC)
    root = tmp_path / "runs"
    cmd = coordinator_cmd("sweep", str(spec_path), "--results-root", str(root))
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=cli_env(tiny_cache))
    assert first.returncode == 0, first.stderr[-3000:]
    assert "SLA search: max request rate meeting every SLO" in first.stdout, first.stdout[-3000:]
    assert "SLA search: queued round 2" in first.stderr
    spec = parse_spec(SPEC)
    store = Store.open(root / "slasweep")
    states = search_states(store, spec, plan_experiment(spec), spec.spec_hash(), record=False)
    assert len(states) == 2 and all(st.outcome.reason is not None and not st.pending for st in states)
    for st in states:
        assert 2 <= len(st.rounds) <= 4
        o = st.outcome
        assert o.lo is not None and o.hi is not None and o.lo < o.hi
        assert any(v == "meets" and r == o.lo for r, v in o.probes) and any(v == "misses" and r == o.hi for r, v in o.probes)
    doc = json.loads((root / "slasweep" / "sla_search.json").read_text())
    by_label = {d["config_label"]: d for d in doc["searches"]}
    for st in states:
        d = by_label[st.batch.config.label(["max_num_seqs"])]
        assert d["runs"] == 1 and d["boundary_ci95_rps"] is None and "one run" in d["summary"]
        run = d["per_run"][0]
        assert run["max_rate_at_slo_rps"] == st.outcome.lo == d["met_in_every_run_rps"]
        assert run["bracket_high_rps"] == st.outcome.hi
        assert run["stopped"] == st.outcome.reason and run["rounds"] == len(st.rounds)
        assert {p["trial_id"] for p in run["probes"]} == {m.trial_id for r in st.rounds for m in r}
    assert "caveat: one run per config" in " ".join(first.stdout.split())
    # one server start per round: every round's trials ran in one batch of their own
    conn = sqlite3.connect(root / "slasweep" / "experiment.sqlite")
    rows = conn.execute("SELECT s.batch_index, a.batch_id FROM spec_trials s JOIN attempts a ON a.trial_id=s.trial_id "
                        "WHERE a.status IN ('ok', 'failed')").fetchall()
    n_trials = conn.execute("SELECT COUNT(*) FROM trials").fetchone()[0]
    conn.close()
    by_index: dict[int, set[str]] = {}
    for index, batch_id in rows:
        by_index.setdefault(int(index), set()).add(str(batch_id))
    assert all(len(ids) == 1 for ids in by_index.values()), by_index
    assert len(by_index) == sum(len(st.rounds) for st in states)
    assert {i // SLA_BATCH_OFFSET for i in by_index} == set(range(max(len(st.rounds) for st in states)))
    # and every probe ran once: a round in flight is not queued again by each of its results
    conn = sqlite3.connect(root / "slasweep" / "experiment.sqlite")
    runs_of = dict(conn.execute("SELECT trial_id, COUNT(*) FROM attempts GROUP BY trial_id").fetchall())
    conn.close()
    assert len(runs_of) == n_trials and set(runs_of.values()) == {1}, sorted(runs_of.values())[-5:]
    # resumed: the rounds are re-derived from the store, nothing runs again, the same answer is printed
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=cli_env(tiny_cache))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "nothing to run" in again.stderr + again.stdout
    table = [line for line in first.stdout.splitlines() if "req/s" in line and "max_num_seqs" in line]
    assert table and table == [line for line in again.stdout.splitlines() if "req/s" in line and "max_num_seqs" in line]
    conn = sqlite3.connect(root / "slasweep" / "experiment.sqlite")
    assert conn.execute("SELECT COUNT(*) FROM trials").fetchone()[0] == n_trials
    # a sweep stopped before one search's last round ran (its trials recorded, no result): resume runs
    # exactly those, and the search ends where it did
    last = states[0].rounds[-1]
    ids = [m.trial_id for m in last]
    conn.execute(f"DELETE FROM attempts WHERE trial_id IN ({','.join('?' * len(ids))})", ids)
    conn.commit()
    conn.close()
    for trial_id in ids:  # and their result files: as if they never ran
        shutil.rmtree(root / "slasweep" / "results" / trial_id, ignore_errors=True)
    resumed = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=cli_env(tiny_cache))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{len(ids)} trial(s) in 1 batch(es)" in resumed.stderr, resumed.stderr[-3000:]
    assert table == [line for line in resumed.stdout.splitlines() if "req/s" in line and "max_num_seqs" in line]
    # what to deploy: `recommend` decides on the searches' max rate at SLO, not on the probed rates
    rec = subprocess.run(coordinator_cmd("recommend", "slasweep", "--results-root", str(root), "--json"),
                         capture_output=True, text=True, timeout=120, env=cli_env(tiny_cache))
    assert rec.returncode == 0, rec.stderr[-3000:]
    decision = json.loads(rec.stdout)
    assert decision["objective"] == "max_rate_at_slo_rps" and list(decision["weights"]) == ["sla"]
    best = min(doc["searches"], key=lambda d: (-(d["met_in_every_run_rps"] or 0), d["config_id"]))  # ties: smaller id
    (cls,) = decision["classes"]
    assert cls["winner"]["config_id"] == best["config_id"]
    assert cls["winner"]["per_load_point"]["sla"]["objective"] == best["met_in_every_run_rps"]
    assert not cls["distinguishable"] and "one run per config gives no interval" in cls["sentence"]
    assert "sla_one_run" in {w["code"] for w in decision["warnings"]}
    assert decision["serve_commands"][best["config_id"]].rstrip().endswith(
        f"--max-num-seqs {best['config_label'].split('=')[1]}")
    for bad, text in ((["--slo", "ttft_ms_p90<=400"], "cannot re-judge"), (["--weights", "sla@8rps=1"], "known: sla")):
        refused = subprocess.run(coordinator_cmd("recommend", "slasweep", "--results-root", str(root), *bad),
                                 capture_output=True, text=True, timeout=120, env=cli_env(tiny_cache))
        assert refused.returncode == 2 and text in refused.stderr, refused.stderr[-2000:]
    # the same decision for every reader of the dataset (report, notebooks): the record beside results.nc is read
    from analysis.load import load

    again_d = load("slasweep", root).sweep.recommend(n_boot=0)
    assert again_d.objective == "max_rate_at_slo_rps" and again_d.classes[0].winner.config_id == best["config_id"]
    # and the dashboard's Decision page: one weight for the search (not one per probed rate), the same config
    from tests.test_dashboard_decision import _page, _shown, _winners

    page = _page(root, "slasweep", monkeypatch)
    assert page.load_points == ["sla"] and len(page.weights) == 1
    text = _shown(page)
    assert _winners(text) == [best["config_id"]] and "max rate at SLO, met in every run (req/s)" in text
    # the page's CLI line, run as shown, names the page's config
    import html
    import re
    import shlex

    from analysis import decide_cli

    line = re.search(r"class='st-cmd st-decision-cli'>([^<]*)<", text)
    assert line is not None
    words = shlex.split(html.unescape(line.group(1)))
    assert words[4:7] == ["slasweep", "--weights", "sla=1"], words
    monkeypatch.setenv("SERVETUNE_RESULTS_ROOT", str(root))
    assert decide_cli.main([*words[4:], "--json"]) == 0
    page.bounds[0].value = 400.0  # a bound the searches were not judged against: named, not a crash
    assert "st-decision-refused" in _shown(page) and "cannot re-judge" in _shown(page)
