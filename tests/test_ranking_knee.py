"""The knee policy on fronts built so the knee is known: the score means the same thing for every
front member (1 = the ideal corner, 0 = the chord between the front's extremes), and fronts
without a knee (1 or 2 points) are handled explicitly, each saying so in the row's note."""

from __future__ import annotations

import pytest

from analysis.ranking import rank
from tests.test_analysis_pareto import make_ds
from tests.test_analysis_ranking import cfg, order, spread


def scores_and_notes(recs: list[dict[str, object]], n_boot: int = 200) -> tuple[list[str], dict[str, float],
                                                                               dict[str, str], float | None]:
    res = rank(make_ds(recs), "knee", slos=[], n_boot=n_boot, latency="ttft_ms_p99")
    rows = res.groups[0].rows
    return (order(res), {r.config_id: r.score.estimate for r in rows}, {r.config_id: r.note for r in rows},
            rows[0].p_best)


def test_an_interior_knee_scores_its_normalised_distance_from_the_chord() -> None:
    # normalised (1 = best): high (1, 0), knee (0.8, 0.875), low (0, 1), dominated (0.6, 0.5); the
    # chord is u + v = 1 and the ideal corner lies 1/sqrt(2) from it, so the score is u + v - 1
    recs = (cfg("high", spread(1000), spread(500)) + cfg("knee", spread(900), spread(150))
            + cfg("low", spread(500), spread(100)) + cfg("dominated", spread(800), spread(300)))
    ranked, score, note, p_best = scores_and_notes(recs, n_boot=0)
    assert ranked[0] == "knee"
    assert score["knee"] == pytest.approx(0.675) and score["dominated"] == pytest.approx(0.1)
    assert score["high"] == pytest.approx(0.0, abs=1e-12) and score["low"] == pytest.approx(0.0, abs=1e-12)
    assert "extreme of the front (best output_throughput)" in note["high"]
    assert "extreme of the front (best ttft_ms_p99)" in note["low"]
    assert "no knee" not in note["high"] and note["knee"] == "" and note["dominated"] == ""


def test_a_one_point_front_is_the_knee_and_scores_the_ideal_corner() -> None:
    recs = cfg("both", spread(1000), spread(100)) + cfg("other", spread(600), spread(300))
    ranked, score, note, p_best = scores_and_notes(recs)
    assert ranked == ["both", "other"]
    assert score["both"] == pytest.approx(1.0) and score["other"] == pytest.approx(0.0)
    assert "the front is this one config" in note["both"] and note["other"] == ""
    assert p_best == pytest.approx(1.0)


def test_a_two_point_front_has_no_knee_and_the_extreme_nearer_the_ideal_corner_wins() -> None:
    # normalised: a (1, 0.5) is 0.5 from the ideal corner, b (0.8, 1) 0.2: b wins, not the config id
    recs = (cfg("a", spread(1000), spread(200)) + cfg("b", spread(900), spread(100))
            + cfg("c", spread(500), spread(300)))
    ranked, score, note, p_best = scores_and_notes(recs)
    assert ranked == ["b", "a", "c"]
    assert score["a"] == pytest.approx(0.0, abs=1e-12) and score["b"] == pytest.approx(0.0, abs=1e-12)
    assert score["c"] < 0
    assert "front has no knee" in note["b"] and "front has no knee" in note["a"]
    assert p_best == pytest.approx(1.0)  # the same tie-break in every resample
