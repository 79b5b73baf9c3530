"""What to deploy after SLA searches (:mod:`analysis.sla_decision` through
:func:`analysis.decision.recommend`): the highest max rate at SLO wins, distinguishable only when the
intervals over runs part, the sweep's record is checked against the dataset, and SLOs it was not
judged against are refused. The sweep-level path (a real SIMULATED sweep, then ``coordinator
recommend``) is in ``tests/test_sla_search.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from analysis.common import Notes, jsonable
from analysis.decision import _decide_sla_class, _split_weights
from analysis.frame import AnalysisInputError
from analysis.sla_decision import SlaSearch, parse_sla_searches, rate_text, read_sla_searches, sla_slos_match
from dashboards.decision_view import decision_html


def search(cid: str, rate: float | None, ci: tuple[float, float] | None, runs: int = 3, lp: str = "chat",
           cls: str = "h100") -> SlaSearch:
    est = None if ci is None else (ci[0] * ci[1]) ** 0.5
    return SlaSearch(cid, f"cfg-{cid}", lp, cls, runs, rate, est, ci, ((rate, None),) * runs, ("resolved",) * runs,
                     frozenset({f"{cid}-{lp}-{i}" for i in range(runs)}))


def decide(searches: list[SlaSearch], weights: dict[str, float] | None = None, rule: str = "weighted") -> Any:
    notes = Notes()
    lps = weights or {lp: 1.0 for lp in sorted({s.load_point for s in searches})}
    return _decide_sla_class("h100", searches, lps, rule, notes), notes


def test_the_highest_rate_met_in_every_run_wins_and_parted_intervals_make_it_distinguishable() -> None:
    d, notes = decide([search("a", 10.0, (9.5, 11.0)), search("b", 20.0, (19.0, 22.0)), search("c", 15.0, (14.0, 16.5))])
    assert d.winner.config_id == "b" and d.runner_up.config_id == "c"
    assert d.distinguishable and "distinguishable from the runner-up cfg-c" in d.sentence
    assert d.winner.per_load_point["chat"]["objective"] == 20.0
    assert d.winner.per_load_point["chat"]["boundary_ci95_rps"] == [19.0, 22.0]
    assert d.n_feasible == 3 and not [w for w in notes.warnings if w.code == "sla_one_run"]


def test_overlapping_intervals_or_one_run_are_not_distinguishable() -> None:
    d, _ = decide([search("a", 20.0, (19.0, 22.0)), search("b", 19.0, (18.0, 19.5))])
    assert d.winner.config_id == "a" and not d.distinguishable  # 19.0 < 19.5: they overlap
    assert "intervals over runs on the typical boundary overlap" in d.sentence
    d, notes = decide([search("a", 20.0, None, runs=1), search("b", 10.0, None, runs=1)])
    assert d.winner.config_id == "a" and not d.distinguishable and "one run per config" in d.sentence
    assert [w.code for w in notes.warnings] == ["sla_one_run"]


def test_a_config_without_a_rate_met_in_every_run_is_never_recommended() -> None:
    d, _ = decide([search("a", None, (30.0, 40.0)), search("b", 5.0, (4.0, 6.0))])
    assert d.winner.config_id == "b" and d.runner_up is None
    assert d.excluded == {"no_sla_search_on_some_load_point": 0, "no_rate_meeting_slos_in_every_run": 1}
    d, _ = decide([search("a", None, None)])
    assert d.winner is None and "nothing to recommend" in d.sentence


def test_several_sla_load_points_are_combined_by_the_rule_with_thresholds() -> None:
    s = [search("a", 10.0, (9, 11), lp="chat"), search("a", 4.0, (3.5, 4.5), lp="rag"),
         search("b", 8.0, (7, 9), lp="chat"), search("b", 6.0, (5.5, 6.5), lp="rag"),
         search("c", 12.0, (11, 13), lp="chat")]  # c has no search on rag: not a candidate
    d, _ = decide(s, {"chat": 1.0, "rag": 1.0})
    # normalised by the best rate there, c's included (as the per-load-point rule does): chat a 10/12,
    # b 8/12; rag a 4/6, b 1. Weighted: a 0.75, b 0.833; a wins once w_chat * (10 - 8) / 12 > 1 - 4/6: w_chat > 2
    assert d.winner.config_id == "b" and d.excluded["no_sla_search_on_some_load_point"] == 1
    chat = next(t for t in d.thresholds if t.name == "chat")
    assert chat.up is not None and chat.up_winner == "a" and abs(chat.up - 2.0) < 1e-9
    d, _ = decide(s, {"chat": 3.0, "rag": 1.0})
    assert d.winner.config_id == "a"


def test_weights_split_between_sla_and_other_load_points_name_the_bad_one() -> None:
    assert _split_weights(None, ["chat"], ["steady"]) == (None, {"chat": 1.0})
    assert _split_weights({"steady": 2}, ["chat"], ["steady"]) == ({"steady": 2}, {"chat": 1.0})
    assert _split_weights({"chat": 2, "rag": 0}, ["chat", "rag"], []) == (None, {"chat": 2.0, "rag": 0.0})
    with pytest.raises(AnalysisInputError, match="'chat@8rps'.*known: chat, steady.*not by its probed rates"):
        _split_weights({"chat@8rps": 1}, ["chat"], ["steady"])
    with pytest.raises(AnalysisInputError, match="'chat' must be a finite number >= 0"):
        _split_weights({"chat": -1}, ["chat"], [])
    with pytest.raises(AnalysisInputError, match="must not all be 0"):
        _split_weights({"chat": 0}, ["chat"], [])


def doc(**over: Any) -> dict[str, Any]:
    run = {"bracket_low_rps": 9.0, "bracket_high_rps": 10.0, "max_rate_at_slo_rps": 9.0, "stopped": "resolved",
           "probes": [{"rate_rps": 9.0, "trial_id": "t1", "verdict": "meets"},
                      {"rate_rps": 10.0, "trial_id": "t2", "verdict": "misses"}]}
    s = {"config_id": "c1", "config_label": "max_num_seqs=8", "load_point": "chat", "runs": 1, "per_run": [run],
         "met_in_every_run_rps": 9.0, "boundary_estimate_rps": None, "boundary_ci95_rps": None}
    s.update(over)
    return {"spec_hash": "abc", "slos": [{"metric": "ttft_ms", "percentile": 90.0, "max_ms": 500.0}], "searches": [s]}


def test_the_record_is_checked_against_the_dataset_and_names_the_bad_key() -> None:
    classes = {"t1": "h100", "t2": "h100"}
    searches, slos = parse_sla_searches(doc(), classes, "abc")
    assert searches[0].trial_ids == {"t1", "t2"} and searches[0].hardware_class == "h100"
    assert rate_text(searches[0]) == "9 req/s in every run of its one run"
    assert sla_slos_match(slos, [{"metric": "ttft_ms", "percentile": 90, "max_ms": 500}])
    assert not sla_slos_match(slos, [{"metric": "ttft_ms", "percentile": 90, "max_ms": 400}])
    with pytest.raises(AnalysisInputError, match="for spec 'abc' but results.nc for 'other'"):
        parse_sla_searches(doc(), classes, "other")
    with pytest.raises(AnalysisInputError, match="names probe trial 't2'.*does not hold"):
        parse_sla_searches(doc(), {"t1": "h100"}, "abc")
    with pytest.raises(AnalysisInputError, match="several hardware classes"):
        parse_sla_searches(doc(), {"t1": "h100", "t2": "a100"}, "abc")
    cases = {"met_in_every_run_rps": (-3, "searches\\[0\\].met_in_every_run_rps must be a positive number"),
             "boundary_ci95_rps": ([1], "boundary_ci95_rps must be \\[low, high\\]"),
             "runs": (2, "searches\\[0\\].runs must equal"), "config_id": ("", "config_id must be a non-empty string"),
             "per_run": ([], "needs a non-empty 'per_run' list")}
    for key, (value, text) in cases.items():
        with pytest.raises(AnalysisInputError, match=text):
            parse_sla_searches(doc(**{key: value}), classes, "abc")


def test_a_malformed_probe_trial_id_on_disk_is_refused_by_name(tmp_path: Path) -> None:
    table = pd.DataFrame({"trial_id": ["t1", "t2"], "hardware_class": ["h100", "h100"]})
    (tmp_path / "sla_search.json").write_text(json.dumps(doc()))
    assert read_sla_searches(tmp_path, table, "abc") is not None
    for bad in (["t1"], 7, None):  # not a string: named, never a TypeError nor a search silently dropped
        for which in ((1,), (0, 1)):  # with both probes malformed, the search has no probe the table holds
            record = doc()
            for k in which:
                record["searches"][0]["per_run"][0]["probes"][k]["trial_id"] = bad
            (tmp_path / "sla_search.json").write_text(json.dumps(record))
            with pytest.raises(AnalysisInputError, match=rf"searches\[0\].per_run\[0\].probes\[{which[0]}\].trial_id"):
                read_sla_searches(tmp_path, table, "abc")


def test_the_page_and_report_show_the_sla_decision_with_its_intervals() -> None:
    d, _ = decide([search("a", 20.0, (19.0, 22.0)), search("b", 10.0, (9.0, 11.0))])
    page = {"rule": "weighted", "rule_text": "x", "objective": "max_rate_at_slo_rps", "weights": {"chat": 1.0},
            "classes": [jsonable(d)], "sla": [jsonable(d)], "warnings": []}
    html = decision_html(page, {}, {})
    assert html.count("class='st-decision-class'") == 1  # the SLA decision is the decision: shown once
    assert "max rate at SLO, met in every run (req/s)" in html and "data-rate='20.0'" in html
    assert "19 [19, 22]" not in html and "[19, 22]" in html and "judged by the intervals over runs" in html
    assert "data-distinguishable='true'" in html
    apart = {**page, "classes": [], "sla": [jsonable(d)]}
    assert "decided apart" in decision_html(apart, {}, {})
    none, _ = decide([search("a", None, None)])
    assert "no config's SLA search found a rate" in decision_html({**page, "classes": [jsonable(none)]}, {}, {})


def test_normalised_rates_ignore_a_load_point_no_config_reached_without_warnings() -> None:
    from analysis.decision import _normalised

    with np.testing.suppress_warnings() as sup:
        rec = sup.record(RuntimeWarning)
        out = _normalised(np.array([[np.nan, 2.0], [np.nan, 4.0]]), 1)
    assert not rec and np.isnan(out[:, 0]).all() and out[:, 1].tolist() == [0.5, 1.0]
