"""The dashboard's Decision page: the same answer as ``python -m coordinator recommend``, and a
winner that flips where the page says it does.

Datasets are SYNTHETIC, built for the decision (:func:`analysis.synthetic_decision.designed`, the
design of ``tests/test_decision.py``): with equal weights and TTFT p99 <= 200 ms B wins over A; a
larger burst weight makes A win; a looser TTFT bound lets C (the best scorer) in; a tighter one
leaves A. ``decide-drift`` is the same data with B's trials marked drift-suspect: left out (the
banner says how many) A wins, included B wins.

The first tests build the page in a Bokeh document (no browser) and compare it with the CLI run
in-process. The browser test serves ``panel serve dashboards/`` as a user starts it and drives it
with Debian's chromium through playwright: it reads each threshold from the page, moves the
input just past it and just short of it, and checks the winner the page then names. Screenshot:
``test-artifacts/dashboard-decision.png``. Runtime: about 1 min on 2 cores.
"""

from __future__ import annotations

import html
import json
import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr

from analysis import decide_cli
from analysis.synthetic_decision import designed
from tests import test_dashboard
from tests.test_dashboard import ARTIFACTS, PAGE_TIMEOUT_MS, Page, panel_served, write_dataset
from tests.test_decision import DESIGN


def _drifted() -> xr.Dataset:
    ds = designed(DESIGN)
    return ds.assign_coords(drift_suspect=("trial", np.asarray(ds["config_id"].values, dtype=object) == "B"))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("decision") / "runs"
    write_dataset(designed(DESIGN), base / "decide", "decide")
    write_dataset(_drifted(), base / "decide-drift", "decide-drift")
    return base


# ------------------------------------------------------------------------------- in a Bokeh document


def _page(root: Path, experiment: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    from bokeh.document import Document
    from panel.io.state import set_curdoc

    from dashboards import app

    monkeypatch.setenv("SERVETUNE_RESULTS_ROOT", str(root))
    doc = Document()
    with set_curdoc(doc):
        shell = app.App({"page": "decision", "experiment": experiment}, live=False)
        shell.template().server_doc(doc)
    assert list(app.PAGES)[0] == "decision"  # first in the menu
    return shell.current


def _shown(page: Any) -> str:
    text = page.body.objects[0].object
    return str(text)


def _winners(text: str) -> list[str]:
    return re.findall(r"class='st-decision-winner[^']*' data-config='([^']*)'", text)


def _cli(root: Path, experiment: str, capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    capsys.readouterr()
    assert decide_cli.main([str(root / experiment / "results.nc"), "--json", *args]) == 0
    doc = json.loads(capsys.readouterr().out)
    return [(c["winner"] or {}).get("config_id", "") for c in doc["classes"]]


def test_the_page_names_the_clis_config_for_the_same_inputs(root: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    page = _page(root, "decide", monkeypatch)
    text = _shown(page)
    assert _winners(text) == _cli(root, "decide", capsys) == ["B"]
    assert "vllm serve" in text and "NOT distinguishable" not in text and "data-distinguishable='true'" in text
    # the CLI line the page shows for its inputs gives the page's answer
    cli = re.search(r"class='st-cmd st-decision-cli'>([^<]*)<", text)
    assert cli is not None and "recommend decide --weights burst=1,steady=1" in cli.group(1)
    page.weights[0].value = 3.0  # burst (load points in sorted order)
    page.bounds[0].value = 250.0
    assert _winners(_shown(page)) == _cli(root, "decide", capsys, "--weights", "burst=3,steady=1", "--slo",
                                          "ttft_ms_p99<=250") == ["A"]
    page.start()  # shown again, now that the CLI wrote its record
    text = _shown(page)
    # and the CLI line the page shows for these inputs, run as shown, gives the page's answer
    line = re.search(r"class='st-cmd st-decision-cli'>([^<]*)<", text)
    assert line is not None
    words = shlex.split(html.unescape(line.group(1)))
    assert words[:4] == ["python", "-m", "coordinator", "recommend"] and "--slo" in words
    capsys.readouterr()
    assert decide_cli.main([*words[4:], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["classes"][0]["winner"]["config_id"] == "A"
    # the record the CLI just wrote was made with these inputs: the page says it names the same config
    assert "data-state='same'" in text, text[text.find("st-decision-record"):][:400]
    page.weights[0].value = 1.0
    assert "data-state='differs'" in _shown(page)


def test_drift_suspect_trials_are_left_out_with_a_banner_and_a_switch(root: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    page = _page(root, "decide-drift", monkeypatch)
    text = _shown(page)
    n = int(np.asarray(_drifted()["config_id"].values == "B").sum())
    assert f"data-excluded='{n}'" in text and f"{n} drift-suspect trials are left out" in text
    assert _winners(text) == _cli(root, "decide-drift", capsys) == ["A"]
    page.include_drift.value = True
    text = _shown(page)
    assert _winners(text) == _cli(root, "decide-drift", capsys, "--include-drift") == ["B"]
    assert "INCLUDED" in text


def test_bad_input_on_the_page_is_named_not_a_crash(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = _page(root, "decide", monkeypatch)
    page.weights[0].value = 0.0
    page.weights[1].value = 0.0
    assert "st-decision-refused" in _shown(page) and "must not all be 0" in _shown(page)
    page.weights[0].value = 1.0
    page.more.value = "bogus_p99<=3"
    assert "st-decision-refused" in _shown(page) and "bogus_p99" in _shown(page)


# ------------------------------------------------------------------------------- in a browser


@pytest.fixture(scope="module")
def served(root: Path) -> Iterator[str]:
    with panel_served(root, ARTIFACTS / "dashboard-decision-server.log") as (_, port):
        yield f"http://127.0.0.1:{port}/dashboards"


browser = test_dashboard.browser  # the same fixture: Debian's chromium through playwright


def _winner_becomes(tab: Page, config: str) -> None:
    tab.wait_attr(".st-decision-winner", "data-config", lambda v: v == config)


def _set(tab: Page, selector: str, value: float) -> None:
    box = tab.page.locator(f"{selector} input").first
    box.fill(f"{value:.10g}")
    box.press("Enter")


def _text(tab: Page, selector: str) -> str:
    loc = tab.page.locator(selector).first
    loc.wait_for(state="attached", timeout=PAGE_TIMEOUT_MS)
    return str(loc.text_content())


def _threshold(tab: Page, kind: str, name: str) -> dict[str, str]:
    row = tab.page.locator(f"tr.st-decision-threshold[data-kind='{kind}'][data-name='{name}']").first
    row.wait_for(state="attached", timeout=PAGE_TIMEOUT_MS)
    return {k: str(row.get_attribute(f"data-{k}")) for k in ("up", "down", "up-winner", "down-winner")}


def test_the_winner_flips_where_the_page_says(served: str, browser: Any) -> None:
    tab = Page(browser, f"{served}?page=decision&experiment=decide")
    try:
        _winner_becomes(tab, "B")
        first = tab.page.locator(".st-nav button").first
        assert first.inner_text().strip() == "Decision: what to deploy"  # first in the menu
        assert "vllm serve" in _text(tab, ".st-decision-command")
        tab.shot("decision")
        # the weight of burst (the first input): A wins above the threshold, B below it
        t = _threshold(tab, "weight", "burst")
        up = float(t["up"])
        assert t["up-winner"] == "A" and 1.1 < up < 1.4, t
        _set(tab, ".st-weight-0", up * 1.02)
        _winner_becomes(tab, "A")
        _set(tab, ".st-weight-0", up * 0.98)
        _winner_becomes(tab, "B")
        # the TTFT p99 bound: C wins once it reaches C's bound, A once it drops below B's
        t = _threshold(tab, "slo", "ttft_ms_p99")
        up, down = float(t["up"]), float(t["down"])
        assert (t["up-winner"], t["down-winner"]) == ("C", "A") and down < 200 < up, t
        _set(tab, ".st-slo-0", up * 1.002)
        _winner_becomes(tab, "C")
        _set(tab, ".st-slo-0", up * 0.998)
        _winner_becomes(tab, "B")
        _set(tab, ".st-slo-0", down * 0.998)
        _winner_becomes(tab, "A")
        _set(tab, ".st-slo-0", down * 1.002)
        _winner_becomes(tab, "B")
        assert not tab.page.locator(".st-error").count()
        assert tab.errors == [], tab.errors
    finally:
        tab.close()


def test_the_drift_banner_and_switch_in_the_browser(served: str, browser: Any) -> None:
    tab = Page(browser, f"{served}?page=decision&experiment=decide-drift")
    try:
        _winner_becomes(tab, "A")
        assert "drift-suspect trials are left out" in _text(tab, ".st-drift-banner")
        tab.page.locator(".st-include-drift input").first.check()
        _winner_becomes(tab, "B")
        tab.page.wait_for_timeout(500)
        assert "INCLUDED" in _text(tab, ".st-drift-banner")
        tab.shot("decision-drift-included")
        assert tab.errors == [], tab.errors
    finally:
        tab.close()


def test_classes_apart_and_cross_hardware_only_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    other = dict(DESIGN, A={"burst": (100.0, 120.0), "steady": (100.0, 120.0)})
    two = xr.concat([designed(DESIGN, hardware_class="h1"), designed(other, hardware_class="h2", seed=1)], dim="trial")
    two = two.assign_coords(trial=np.arange(two.sizes["trial"]))
    two.attrs = designed(DESIGN).attrs
    write_dataset(two, tmp_path / "two", "two")
    page = _page(tmp_path, "two", monkeypatch)
    text = _shown(page)
    classes = re.findall(r"class='st-decision-class' data-class='([^']*)'", text)
    assert classes == ["h1", "h2"] and _winners(text) == _cli(tmp_path, "two", capsys) == ["B", "A"]
    assert "data-mode='per-class'" in text and "cross-hardware (" not in text
    page.cross.value = "per_gpu"
    text = _shown(page)
    assert "data-mode='cross-hardware per_gpu'" in text
    assert _winners(text) == _cli(tmp_path, "two", capsys, "--cross-hardware", "per_gpu")
    page.cross.value = "per_gpu_hour"  # no prices: refused, naming what is missing
    assert "st-decision-refused" in _shown(page) and "price" in _shown(page)
    page.prices.value = "h1=1, h2=4"
    text = _shown(page)
    assert _winners(text) == _cli(tmp_path, "two", capsys, "--cross-hardware", "per_gpu_hour", "--gpu-hour-price",
                                  "h1=1", "--gpu-hour-price", "h2=4")


def test_a_link_presets_the_traffic_mix(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bokeh.document import Document
    from panel.io.state import set_curdoc

    from dashboards import app

    monkeypatch.setenv("SERVETUNE_RESULTS_ROOT", str(root))
    with set_curdoc(Document()):
        shell = app.App({"page": "decision", "experiment": "decide", "weights": "burst=3,steady=1"}, live=False)
    assert [w.value for w in shell.current.weights] == [3.0, 1.0]
    assert _winners(_shown(shell.current)) == ["A"]


def test_a_new_dataset_version_is_decided_afresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page keeps the decision's per-version part (trial table, drift check) per dataset version:
    a new ``results.nc`` (here: B's trials now drift-suspect) must be decided on the new data, not on
    the part kept for the old one."""
    root = tmp_path / "runs"
    nc = write_dataset(designed(DESIGN), root / "fresh", "fresh")
    page = _page(root, "fresh", monkeypatch)
    assert _winners(_shown(page)) == ["B"]
    before = nc.stat().st_mtime_ns
    write_dataset(_drifted(), root / "fresh", "fresh")
    os.utime(nc, ns=(before + 10**9, before + 10**9))  # a new version even on a coarse clock
    page.refresh()
    text = _shown(page)
    assert _winners(text) == ["A"] and "drift-suspect trials are left out" in text
