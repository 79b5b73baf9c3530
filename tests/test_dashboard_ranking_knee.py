"""The Ranking page shows the knee policy's note beside the row it applies to (in a Bokeh document,
no browser): on a front built so the knee is known (``tests/test_ranking_knee.py``), the two
extremes score 0 by construction and their rows say so; the knee's row carries no note."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.test_analysis_pareto import make_ds
from tests.test_analysis_ranking import cfg, spread


def _rows(html: str) -> dict[str, str]:
    """config id -> the HTML of its ranking row."""
    return dict(re.findall(r"<tr class='st-rank-row' data-config='([^']+)'>(.*?)</tr>", html))


def test_the_knee_note_is_shown_in_its_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bokeh.document import Document
    from panel.io.state import set_curdoc

    from dashboards import app
    from servetune.netcdf import write_netcdf
    from servetune.schema import SCHEMA_VERSION

    recs = (cfg("high", spread(1000), spread(500)) + cfg("knee", spread(900), spread(150))
            + cfg("low", spread(500), spread(100)) + cfg("dominated", spread(800), spread(300)))
    ds = make_ds(recs, slos=[])
    ds.attrs.update(experiment="knee", schema_version=SCHEMA_VERSION)
    (tmp_path / "knee").mkdir()
    write_netcdf(ds, tmp_path / "knee" / "results.nc")
    monkeypatch.setenv("SERVETUNE_RESULTS_ROOT", str(tmp_path))
    doc = Document()
    with set_curdoc(doc):
        shell = app.App({"page": "ranking", "experiment": "knee", "policy": "knee"}, live=False)
        shell.template().server_doc(doc)
    page = shell.current
    html = "".join(str(getattr(o, "object", "")) for card in page.body.objects
                   for o in (card.objects if hasattr(card, "objects") else [card]))
    rows = _rows(html)
    assert set(rows) == {"high", "knee", "low", "dominated"}, html[:2000]
    assert "<th>about the score</th>" in html
    note = re.compile(r"<td class='st-note st-rank-note'>(.*?)</td>")
    got = {cid: note.search(row).group(1) for cid, row in rows.items()}  # type: ignore[union-attr]
    assert "extreme of the front (best output_throughput)" in got["high"]
    assert "extreme of the front (best ttft_ms_p99)" in got["low"]
    assert got["knee"] == "" and got["dominated"] == ""
