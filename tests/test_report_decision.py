"""The static report's decision section and its readable sections (no browser).

The dataset is SYNTHETIC (:func:`analysis.synthetic_decision.designed`, the design of
``tests/test_decision.py``: with equal weights and TTFT p99 <= 200 ms, B wins over A, and C, the best
scorer, misses the SLO), with 24 repeats so that the interaction analysis subsamples (its H² sample
holds 80 trials), which is where the report used to print raw JSON (``H\\u00b2``). The report's text
is read the way the browser gets it: the HTML panes' text inside the page's embedded Bokeh documents.
Runtime: about 20 s on 2 cores.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from analysis import decide_cli
from analysis.synthetic_decision import designed
from dashboards.report import render
from servetune.netcdf import write_netcdf
from tests.test_decision import DESIGN

_DOC = re.compile(r'<script type="application/json" id="[^"]+">(.*?)</script>', re.S)


def pane_texts(page: str) -> list[str]:
    """The HTML of every HTML pane of a saved Panel page, in document order (unescaped)."""
    found: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            text = (node.get("attributes") or {}).get("text") if "HTML" in str(node.get("name")) else None
            if isinstance(text, str):
                found.append(html.unescape(html.unescape(text)))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for m in _DOC.finditer(page):
        walk(json.loads(m.group(1)))
    return found


def plain(fragment: str) -> str:
    """What a reader sees of an HTML fragment: no style sheet, no tags, entities decoded."""
    fragment = re.sub(r"<style>.*?</style>", "", fragment, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", fragment)))


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], dict]:
    ds = designed(DESIGN, repeats=24, seed=0)
    ds.attrs["experiment"] = "decide"
    folder = tmp_path_factory.mktemp("report") / "decide"
    folder.mkdir()
    write_netcdf(ds, folder / "results.nc")
    assert decide_cli.main([str(folder / "results.nc"), "--n-boot", "50"]) == 0  # the CLI, with its defaults
    record = json.loads((folder / "decision.json").read_text())
    return pane_texts(render(ds, n_boot=10)), record


def test_the_decision_is_the_first_section_and_names_the_clis_winner(report: tuple[list[str], dict]) -> None:
    texts, record = report
    (cli,) = record["classes"]
    assert cli["winner"]["config_id"] == "B"  # the design's answer
    headings = [plain(h).strip() for t in texts for h in re.findall(r"<h2[^>]*>.*?</h2>", t, re.S)]
    assert headings[0] == "Decision: what to deploy", headings
    first = texts[0]
    assert first.index("Decision: what to deploy") < first.index("Recommended:")
    winners = re.findall(r"class='st-decision-winner[^']*' data-config='([^']*)'", first)
    assert winners == [cli["winner"]["config_id"]]
    runner = re.findall(r"class='st-decision-runner-up' data-config='([^']*)'", first)
    assert runner == [cli["runner_up"]["config_id"]]
    assert "vllm serve" in plain(first) and "python -m coordinator recommend decide" in plain(first)
    # the sections the report computes are all shown, after the decision and with their words
    for title in ("Provenance", "Ranking", "Parameter importance", "Partial dependence", "Interactions",
                  "Drift of the baseline re-runs", "Failure map"):
        assert any(h.startswith(title) for h in headings[1:]), (title, headings)
    words = plain(" ".join(texts))
    assert "H² [95% CI]" in words
    assert "Drift could not be checked" in words  # no baseline re-runs: said so, not "no drift"


def test_the_report_prints_no_raw_json(report: tuple[list[str], dict]) -> None:
    texts, _ = report
    words = plain(" ".join(texts))
    assert "trials in the H² sample" in words  # the subsampling note that used to be printed as JSON
    assert "\\u" not in words, words[max(0, words.find("\\u") - 80):words.find("\\u") + 80]
    assert '{"' not in words and '":' not in words, words[max(0, words.find('{"') - 80):words.find('{"') + 80]


def test_pane_texts_reads_what_the_page_holds(tmp_path: Path) -> None:
    import panel as pn

    page = tmp_path / "p.html"
    pn.Column(pn.pane.HTML("<h2>one</h2><p>H² &amp; more</p>")).save(str(page))
    (text,) = pane_texts(page.read_text(encoding="utf-8"))
    assert plain(text).split() == ["one", "H²", "&", "more"]


def test_the_ranking_marks_drift_suspect_trials_the_decision_leaves_out() -> None:
    from analysis.synthetic import planted
    from dashboards.report import _ranking_html, compute

    ds, _ = planted(n_configs=30, n_params=3, repeats=2, load_points=("short", "long"), baseline_every=10,
                    drift_at=0.5, drift_size=-0.4, seed=1)
    doc = compute(ds, n_boot=5)
    suspect = set(doc["drift"]["suspect"])
    assert doc["drift"]["alarm"] and suspect
    marks = doc["ranking"]["drift_suspect"]
    table = ds.sweep.table()
    want = table[table["trial_id"].astype(str).isin(suspect)]["config_id"].astype(str).value_counts().to_dict()
    assert marks == want and sum(marks.values()) == len(suspect)
    page = plain(_ranking_html(doc["ranking"], doc, {}))
    assert f"{len(suspect)} drift-suspect trials" in page and "INCLUDED in this ranking" in page
    assert doc["decision"]["n_drift_excluded"] == len(suspect)  # and the decision leaves them out
