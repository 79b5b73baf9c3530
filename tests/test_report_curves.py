"""The static report's Load curves section (``dashboards.report.curves_items``), in a Bokeh document
(no browser): on the SYNTHETIC planted curves of ``tests/test_dashboard_curves.py`` (7 configs, 7
concurrencies and 6 rates, 3 repeats) each config's line carries its medians, the closed-loop
knees sit where the planted throughput stops growing, the SLO is drawn, and drift-suspect trials
named by the document's drift section are left out and counted."""

from __future__ import annotations

import re
from html import unescape as html_unescape
from typing import Any

import numpy as np

from tests.test_dashboard_curves import CONC, _max_num_seqs, _planted


def _html(items: list[Any]) -> str:
    return "".join(str(i.object) for i in items if isinstance(getattr(i, "object", None), str))


def _sources(items: list[Any]) -> dict[str, dict[str, Any]]:
    from bokeh.models import ColumnDataSource

    out: dict[str, dict[str, Any]] = {}
    for i in items:
        model = getattr(i, "object", None)
        if model is not None and not isinstance(model, str):
            out |= {m.name: dict(m.data) for m in model.select({"type": ColumnDataSource}) if m.name}
    return out


def test_the_report_draws_the_load_curves_with_the_planted_knees() -> None:
    from analysis.curves import curves
    from analysis.frame import trial_table
    from dashboards.report import curves_items

    ds, truth = _planted(3, seed=1)
    items = curves_items(ds, {})
    html, src = _html(items), _sources(items)
    assert "<h2 class=\"curves\">Load curves</h2>" in html and "knee: the highest load" in html
    rate, conc = curves(trial_table(ds), ["output_throughput"])
    for si, s in enumerate((rate, conc)):
        lines = src[f"lines|{si}|output_throughput"]
        assert sorted(lines["config"]) == sorted(s.config_ids)
        for cid, ys in zip(lines["config"], lines["ys"]):
            assert np.allclose(ys, s.medians["output_throughput"][s.config_ids.index(cid)], rtol=1e-9)
    knees = dict((html_unescape(c), x) for c, x in re.findall(r"<tr class='st-knee' data-series='1' data-config='([^']+)' data-load='([^']*)'>", html))
    assert sorted(knees) == sorted(conc.config_ids)
    for cid, load in knees.items():
        sat = truth.saturation({"max_num_seqs": _max_num_seqs(cid)}, "concurrency")
        assert load == ("" if sat >= max(CONC) else f"{sat:g}"), (cid, load, sat)
    assert "slo|0|ttft_ms_p99" in {m for m in _span_names(items)}


def _span_names(items: list[Any]) -> list[str]:
    from bokeh.models import Span

    return [m.name for i in items if not isinstance(getattr(i, "object", ""), str)
            for m in i.object.select({"type": Span})]


def test_drift_suspect_trials_are_left_out_of_the_report_curves() -> None:
    from analysis.frame import trial_table
    from dashboards.report import curves_items

    ds, _ = _planted(3, seed=1)
    df = trial_table(ds)
    cid = str(df["config_id"].iloc[0])
    gone = df.loc[(df["config_id"] == cid) & (df["load_point"] == "c4"), "trial_id"].astype(str).tolist()
    items = curves_items(ds, {"drift": {"suspect": gone}})
    assert f"{len(gone)} drift-suspect trials (see the drift section) are left out" in _html(items)
    src = _sources(items)["points|1|output_throughput"]
    at = [n for c, x, n in zip(src["config"], src["x"], src["n"]) if c == cid and x == 4.0]
    assert at == [] or at == [0], at  # no median at c4 for that config: all its trials there are left out
