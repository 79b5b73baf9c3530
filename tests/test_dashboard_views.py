"""The dashboard's Search views page (``?page=history``): parallel coordinates, slice plots, the
run-order history and the trial table, one load point at a time.

The dataset is SYNTHETIC (``tests.test_dashboard.build_planted``: two load points, repeats,
baseline re-runs and a planted drift, some failed configs). The first tests build the page in a
Bokeh document (no browser) and check what it draws against the trial table computed here; the
browser test serves ``panel serve dashboards/`` as a user starts it and reads what BokehJS and
Tabulator hold in Debian's chromium through playwright. Screenshot:
``test-artifacts/dashboard-views.png``. Runtime: about 1 min on 2 cores.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from tests import test_dashboard
from tests.test_dashboard import ARTIFACTS, Page, build_planted, panel_served

LP, OTHER = "long", "short"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("views") / "runs"
    build_planted(base / "planted")
    return base


def _expected(root: Path, lp: str, monkeypatch: pytest.MonkeyPatch | None = None) -> pd.DataFrame:
    """The trials the page should draw at ``lp``: measured, not baseline, not drift-suspect."""
    from dashboards.app.marks import drift_marks

    folder = root / "planted"
    import analysis

    df = analysis.load(folder / "results.nc").sweep.table()
    sub = df[(df["load_point"] == lp) & ~df["is_baseline"].astype(bool) & (df["status"] != "hole")]
    return sub[~drift_marks(folder).mask(sub)]


def _page(root: Path, monkeypatch: pytest.MonkeyPatch, **args: str) -> Any:
    from bokeh.document import Document
    from panel.io.state import set_curdoc

    from dashboards import app

    monkeypatch.setenv("SERVETUNE_RESULTS_ROOT", str(root))
    doc = Document()
    with set_curdoc(doc):
        shell = app.App({"page": "history", "experiment": "planted", **args}, live=False)
        shell.template().server_doc(doc)
    page = shell.current
    assert "st-views-done" in str(page.summary.object), page.summary.object
    return page


def _source(model: Any, name: str) -> dict[str, Any]:
    """The data of the Bokeh data source called ``name`` in ``model`` (empty when there is none)."""
    from bokeh.models import ColumnDataSource

    found = [m for m in model.select({"type": ColumnDataSource}) if m.name == name]
    return dict(found[0].data) if found else {}


def _lines(fig: Any) -> pd.DataFrame:
    """The parallel coordinates' polylines: one row per config (``pc_config``, ``objective``, ``axes``:
    how many axes the line passes through)."""
    parts = [_source(fig, "pc|ok"), _source(fig, "pc|failed")]
    return pd.concat([pd.DataFrame({"pc_config": list(d["pc_config"]), "objective": list(d["objective"]),
                                    "axes": [len(y) for y in d["ys"]]}) for d in parts if d], ignore_index=True)


# ------------------------------------------------------------------------------- in a Bokeh document


def test_parallel_coordinates_draw_one_line_per_config_of_the_chosen_load_point(root: Path,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    page = _page(root, monkeypatch, load_point=LP)
    mine, other = _expected(root, LP), _expected(root, OTHER)
    lines = _lines(page.parallel.object)
    axes = len(page.parallel.object.xaxis[0].ticker.ticks)
    # each config is one polyline through every axis, none of them from the other load point
    assert sorted(lines["pc_config"]) == sorted(set(mine["config_id"])) and (lines["axes"] == axes).all()
    assert set(other["config_id"]) - set(mine["config_id"]), "the data should have configs only at the other load point"
    # each line's objective is the median of its ok trials at this load point, never pooled with the other
    ok = mine[mine["status"] == "ok"]
    want = ok.groupby("config_id")["output_throughput"].median()
    got = lines.set_index("pc_config")["objective"].astype(float)
    assert np.allclose(got.reindex(want.index).to_numpy(), want.to_numpy())
    failed = set(mine["config_id"]) - set(ok["config_id"])
    assert failed and set(got[got.isna()].index) == failed  # failed configs: drawn apart (NaN objective, grey)
    assert set(_source(page.parallel.object, "pc|failed")["pc_config"]) == failed
    # the lines go to the browser as plain lists, not a binary buffer per line (thousands of websocket frames)
    from bokeh.core.serialization import Serializer
    from bokeh.models import ColumnDataSource

    sent = [Serializer().serialize(m.data) for m in page.parallel.object.select({"type": ColumnDataSource})
            if m.name in ("pc|ok", "pc|failed")]
    assert len(lines) > 10 and sum(len(s.buffers or []) for s in sent) <= 2 * len(sent)
    page.load_point.value = OTHER
    assert set(_lines(page.parallel.object)["pc_config"]) == set(other["config_id"])
    assert f"data-load-point='{OTHER}'" in page.summary.object


def test_slices_use_a_log_axis_for_power_of_two_knobs(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bokeh.models import LogScale, Plot

    page = _page(root, monkeypatch, load_point=LP)
    names = [p.name for p in page.drawn.params]
    shown = [m.title.text for m in page.slices.object.select({"type": Plot}) if str(m.name).startswith("slice|")]
    assert sorted(shown) == sorted(names[:3]) and "data-shown='3'" in page.slice_note.object  # the first three until others are picked
    page.slice_params.value = names
    figs = [m for m in page.slices.object.select({"type": Plot}) if str(m.name).startswith("slice|")]
    assert sorted(f.title.text for f in figs) == sorted(names)
    logx = {f.title.text: isinstance(f.x_scale, LogScale) for f in figs}
    assert logx["max_num_seqs"] and logx["max_num_batched_tokens"] and logx["block_size"]  # 4..256, 512..8192, 16..64
    assert not logx["gpu_memory_utilization"] and not logx["enable_chunked_prefill"]
    # one source shared by every slice: its ok trials, each parameter a column
    shared = {id(r.data_source) for f in figs for r in f.renderers if r.data_source.name == "slices|clean"}
    mine = _expected(root, LP)
    assert len(shared) == 1 and len(_source(page.slices.object, "slices|clean")["y"]) == (mine["status"] == "ok").sum()


def test_the_best_so_far_line_is_monotone_and_ends_at_the_best_ok_trial(root: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    page = _page(root, monkeypatch, load_point=LP)
    curve = _source(page.history.object, "history|best")
    line = np.asarray(curve["best_so_far"])
    assert len(line) >= 2 and (np.diff(line) >= 0).all()
    mine = _expected(root, LP)
    assert line[-1] == mine.loc[mine["status"] == "ok", "output_throughput"].max()
    assert curve["order"][-1] == len(mine)  # drawn to the last trial
    # a lower-is-better objective: the line falls
    page.objective.value = "ttft_ms_p99"
    line = np.asarray(_source(page.history.object, "history|best")["best_so_far"])
    assert (np.diff(line) <= 0).all() and line[-1] == mine.loc[mine["status"] == "ok", "ttft_ms_p99"].min()


def test_drift_suspect_trials_are_left_out_or_shown_apart(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = _page(root, monkeypatch, load_point=LP)
    n = len(_expected(root, LP))
    assert len(page.table.value) == n and "drift" not in page.table.value
    apart = _page(root, monkeypatch, load_point=LP, drift="apart")
    rows = apart.table.value
    assert len(rows) > n and (rows["drift"] == "suspect").sum() == len(rows) - n
    assert "data-suspect" in str(apart.drift.objects[0].object)  # the banner


def _image(model: Any, name: str) -> tuple[np.ndarray, dict[str, float]]:
    """The RGBA image (rows from the lowest y) and its extent of the image source ``name`` in ``model``."""
    d = _source(model, name)
    assert d, f"no image source {name!r}"
    return np.asarray(d["image"][0], dtype=np.uint32), {k: float(d[k][0]) for k in ("x", "y", "dw", "dh")}


def _bins(x: np.ndarray, y: np.ndarray, shape: tuple[int, ...], ext: dict[str, float], log_x: bool = False) -> np.ndarray:
    """Which bins of an image of ``shape`` over ``ext`` hold at least one of the points (the test's own binning)."""
    x0, x1 = ext["x"], ext["x"] + ext["dw"]
    if log_x:
        x, x0, x1 = np.log10(x), np.log10(x0), np.log10(x1)
    # as datashader scales: bin = int(x * s + t) with s = bins / span, t = -start * s (same rounding at the edges)
    sx, sy = shape[1] / (x1 - x0), shape[0] / ext["dh"]
    col = np.floor(np.asarray(x, dtype=float) * sx - x0 * sx).astype(int)
    row = np.floor(np.asarray(y, dtype=float) * sy - ext["y"] * sy).astype(int)
    assert (col >= 0).all() and (col < shape[1]).all() and (row >= 0).all() and (row < shape[0]).all()
    out = np.zeros(shape, dtype=bool)
    out[row, col] = True
    return out


def test_dense_slices_and_history_draw_every_ok_trial_as_an_image_and_the_best_as_points(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dashboards.app import history, raster

    monkeypatch.setattr(raster, "RASTER_ABOVE", 3)  # the planted data (35 ok, 4 failed trials at LP) counts as dense
    monkeypatch.setattr(history, "BEST_POINTS", 5)
    page = _page(root, monkeypatch, load_point=LP, slices="max_num_seqs,gpu_memory_utilization")
    mine = _expected(root, LP).sort_values("started_at", kind="stable").reset_index(drop=True)
    mine["order"] = np.arange(1, len(mine) + 1)
    ok = mine[(mine["status"] == "ok") & np.isfinite(mine["output_throughput"].astype(float))]
    # the page says what it draws: every ok trial, the 5 best as points
    assert f"data-ok-trials='{len(ok)}'" in page.summary.object and "data-best-points='5'" in page.summary.object
    best5 = ok.nlargest(5, "output_throughput")
    # slices: no per-trial points; one shared source of the 5 best ok trials; an image of every ok trial
    assert not _source(page.slices.object, "slices|clean")
    shared = _source(page.slices.object, "slices|best")
    assert sorted(shared["order"]) == sorted(best5["order"]) and sorted(shared["y"]) == sorted(best5["output_throughput"])
    for name, log_x in (("max_num_seqs", True), ("gpu_memory_utilization", False)):
        img, ext = _image(page.slices.object, f"slices|density|{name}")
        want = _bins(ok[f"param_{name}"].astype(float).to_numpy(), ok["output_throughput"].to_numpy(), img.shape, ext, log_x)
        assert ((img >> 24) > 0).tolist() == want.tolist(), name  # a bin is coloured iff some ok trial falls in it
    # history: an image of every ok trial by run order; to hover: the best 5 and each trial that improved the best
    img, ext = _image(page.history.object, "history|density")
    want = _bins(ok["order"].to_numpy(), ok["output_throughput"].to_numpy(), img.shape, ext)
    assert ((img >> 24) > 0).tolist() == want.tolist()
    improved = ok[ok["output_throughput"] > ok["output_throughput"].cummax().shift(fill_value=-np.inf)]
    hover = _source(page.history.object, "history|ok")
    assert sorted(hover["order"]) == sorted(set(improved["order"]) | set(best5["order"]))
    line = _source(page.history.object, "history|best")  # the best-so-far line still uses every trial
    assert line["best_so_far"][-1] == ok["output_throughput"].max() and line["order"][-1] == len(mine)
    failed = mine[mine["status"] == "failed"]
    assert len(failed) > 3, "the planted data should have more failed trials than the lowered threshold"
    assert not _source(page.history.object, "history|failed")
    img, ext = _image(page.history.object, "history|failed-density")
    assert img.shape[0] == 1 and ext["y"] + ext["dh"] <= ok["output_throughput"].min()  # under every ok trial
    cols = _bins(failed["order"].to_numpy(), np.full(len(failed), ext["y"] + ext["dh"] / 2), img.shape, ext)
    assert ((img >> 24) > 0).tolist() == cols.tolist()
    assert f"the {len(failed)} failed trials as a red strip" in page.summary.object


# ------------------------------------------------------------------------------- in a browser


@pytest.fixture(scope="module")
def served(root: Path) -> Iterator[str]:
    with panel_served(root, ARTIFACTS / "dashboard-views-server.log") as (_, port):
        yield f"http://127.0.0.1:{port}/dashboards"


browser = test_dashboard.browser  # the same fixture: Debian's chromium through playwright

#: every data-source column named ``col`` in the page's Bokeh documents
_COLUMN_JS = """(col) => {
  const out = [];
  for (const d of Bokeh.documents) for (const m of d.all_models) {
    const data = m.data;
    if (!data || typeof data !== 'object') continue;
    const v = data instanceof Map ? data.get(col) : data[col];
    if (v && v.length !== undefined) out.push(Array.from(v));
  }
  return out;
}"""
#: the label of every log / linear axis in the page's Bokeh documents
_AXES_JS = """() => {
  const out = {log: [], linear: []};
  for (const d of Bokeh.documents) for (const m of d.all_models) {
    const name = m.constructor.__name__;
    if (name === 'LogAxis') out.log.push(String(m.axis_label));
    if (name === 'LinearAxis') out.linear.push(String(m.axis_label));
  }
  return out;
}"""


def _views_done(tab: Page, lp: str) -> None:
    tab.wait_attr(".st-views-done", "data-load-point", lambda v: v == lp)
    tab.page.wait_for_timeout(1500)  # let the plots arrive


def test_the_views_in_the_browser(root: Path, served: str, browser: Any) -> None:
    mine, other = _expected(root, LP), _expected(root, OTHER)
    tab = Page(browser, f"{served}?page=history&experiment=planted&load_point={LP}"
                        "&slices=max_num_seqs,gpu_memory_utilization,enable_chunked_prefill")
    failed: list[str] = []
    tab.page.on("requestfailed", lambda r: failed.append(r.url))
    try:
        tab.page.set_viewport_size({"width": 1280, "height": 1000})
        _views_done(tab, LP)
        configs = {c for col in tab.page.evaluate(_COLUMN_JS, "pc_config") for c in col}
        assert configs == set(mine["config_id"])
        axes = tab.page.evaluate(_AXES_JS)
        assert any(a.startswith("max_num_seqs") for a in axes["log"]), axes
        assert any(a.startswith("gpu_memory_utilization") for a in axes["linear"]), axes
        unitless = [a for a in axes["log"] + axes["linear"] if a and a != "None" and not ("(" in a and ")" in a)]
        assert not unitless, unitless  # every labelled axis names its unit (the parallel axes: in their ticks)
        lines = [col for col in tab.page.evaluate(_COLUMN_JS, "best_so_far")]
        assert len(lines) == 1 and (np.diff(lines[0]) >= 0).all()
        assert lines[0][-1] == pytest.approx(mine.loc[mine["status"] == "ok", "output_throughput"].max())
        # the table: metric columns visible at 1280 px, short labels with the full id in the tooltip
        table = tab.page.locator(".st-views-table .tabulator").first
        box = table.bounding_box()
        assert box is not None
        for head in ("output (tok/s)", "TTFT p99 (ms)", "E2E p99 (ms)"):
            cell = tab.page.locator(f".st-views-table .tabulator-col[tabulator-field='{head}']").first
            cbox = cell.bounding_box()
            assert cbox is not None and cbox["x"] + cbox["width"] <= box["x"] + box["width"] + 1, (head, cbox, box)
        first = tab.page.locator(".st-views-table .st-config").first
        label, tip = first.inner_text(), str(first.get_attribute("title"))
        assert tip in set(mine["config_id"]) and label != tip and len(label) < len(tip)
        # sort by throughput (descending: click twice), then filter the status
        header = tab.page.locator(".st-views-table .tabulator-col[tabulator-field='output (tok/s)'] .tabulator-col-title")
        best = mine.loc[mine["status"] == "ok", "output_throughput"].max()
        cell = ".st-views-table .tabulator-row:first-child .tabulator-cell[tabulator-field='output (tok/s)']"
        for _ in range(3):
            header.first.dispatch_event("click")  # a row can overlap the header in a short viewport
            tab.page.wait_for_timeout(1000)
            text = tab.page.locator(cell).first.inner_text().replace(",", "")
            if text and float(text) == pytest.approx(best, abs=1e-3):
                break
        else:
            raise AssertionError(f"sorting never put the best trial first: {text!r} vs {best}")
        tab.shot("views")
        status_filter = tab.page.locator(".st-views-table .tabulator-col[tabulator-field='status'] input").first
        status_filter.fill("failed")
        status_filter.press("Enter")
        n_failed = int((mine["status"] == "failed").sum())
        rows = ".st-views-table .tabulator-row .tabulator-cell[tabulator-field='status']"
        deadline = 40
        while deadline and tab.page.locator(rows).count() != n_failed:
            tab.page.wait_for_timeout(250)
            deadline -= 1
        statuses = [t.strip() for t in tab.page.locator(rows).all_inner_texts()]
        assert statuses == ["failed"] * n_failed, statuses
        # the other load point: its own configs only
        tab.page.locator(".st-views-load-point select").first.select_option(OTHER)
        _views_done(tab, OTHER)
        # (BokehJS keeps the replaced plot's sources in the document's model set, so the count is read
        # from the page's summary here; the in-document test checks the lines after a switch)
        n = len(set(other["config_id"]))
        assert tab.attr(".st-views-done", "data-lines") == tab.attr(".st-views-done", "data-configs") == str(n)
        assert not tab.page.locator(".st-error").count()
        assert tab.errors == [], (tab.errors, sorted(set(failed)))
    finally:
        tab.close()
