"""Browser test of the dashboard's hardware-class views: ``panel serve dashboards/`` as a user starts
it, driven by Debian's chromium through playwright, on ONE SYNTHETIC experiment written as a bare
``results.nc``: two simulated classes (``sim-gpu-a``, ``sim-gpu-b``, analysis.synthetic.planted),
with b planted ten times faster and in the reverse order of configs (so a pooled view would show
b's answer for a), and two of b's configs' trials tagged ``failover-from:sim-gpu-a``.

Checked: the Parameters page offers a hardware-class picker (one class analysed at a time, chosen
by ``?hardware_class=``) and its failure map keeps one group per class with the counts by kind
never pooled; the Ranking page has one card per class with a different winner each, marks the
failover rows and drops them when ``leave out failover trials`` is ticked; its cross-hardware view
is off by default and, when chosen, labelled as a normalised cross-hardware comparison.

No vLLM: this needs no shared sweep (unlike tests/test_dashboard.py). Runtime: about a minute on 2 cores.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
import xarray as xr

from analysis.hardware import FAILOVER_PREFIX
from analysis.ranking import rank
from analysis.synthetic import planted
from tests.test_dashboard import ARTIFACTS, PAGE_TIMEOUT_MS, Page, browser, panel_served, write_dataset  # noqa: F401 (browser: a fixture)

A, B = "sim-gpu-a", "sim-gpu-b"
#: for what the server computes in the background (bootstrapped rankings, fitted models): a deadline that
#: only matters when the test fails, so it is generous for a slow, busy CI machine
BACKGROUND_TIMEOUT_MS = 240_000
NAME = "two-classes"


def two_classes() -> tuple[xr.Dataset, list[str]]:
    """SYNTHETIC: two classes that disagree, and the config ids of b whose trials are failovers."""
    ds, _ = planted(n_configs=8, n_params=3, repeats=3, seed=11, hardware_classes=(A, B), noise=0.05)
    hw = ds["hardware_class"].values.astype(str)
    out = ds["output_throughput"].values.copy()
    out[hw == B] = 1.0e7 / out[hw == B]
    ds = ds.assign(output_throughput=("trial", out))
    cfg = ds["config_id"].values.astype(str)
    moved = sorted({c for c, h in zip(cfg, hw) if h == B})[:2]
    tags = np.where((hw == B) & np.isin(cfg, moved), f"{FAILOVER_PREFIX}{A}", "").astype(object)
    return ds.assign_coords(tags=("trial", tags)), moved


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, xr.Dataset, list[str]]]:
    root = tmp_path_factory.mktemp("dash-hw") / "runs"
    ds, moved = two_classes()
    write_dataset(ds, root / NAME, NAME)
    with panel_served(root, ARTIFACTS / "dashboard-hardware-server.log") as (_, port):
        yield f"http://127.0.0.1:{port}/dashboards", ds, moved


def test_hardware_class_views_keep_classes_apart_and_failover_optional(served, browser) -> None:  # noqa: F811
    url, ds, moved = served
    winners = {g.group["hardware_class"]: g.rows[0].label for g in rank(ds, policy="slo_throughput", n_boot=0).groups}
    assert winners[A] != winners[B], "the planted classes disagree (else pooling would not show)"

    # Parameters: one class at a time, chosen in the URL; the failure map keeps the classes apart
    tab = Page(browser, f"{url}?page=parameters&experiment={NAME}&hardware_class={B}")
    try:
        picker = tab.page.locator("select").filter(has=tab.page.locator(f"option[value='{A}']")).first
        picker.wait_for(state="attached", timeout=PAGE_TIMEOUT_MS)
        assert picker.input_value() == B, "?hardware_class= picks the class analysed"
        assert sorted(picker.locator("option").all_inner_texts()) == [A, B]
        # every section computed before the tab closes: the server's two background workers are shared
        # by all sessions, and a section still computing would delay the Ranking page's work below
        # (interactions too: a result finishing while the page loaded was once lost, see on_result)
        for section in ("importance", "pd", "interactions", "failure"):
            tab.page.locator(f"[data-section='{section}'].st-section-done").first.wait_for(
                state="attached", timeout=BACKGROUND_TIMEOUT_MS)
        failure = tab.page.get_by_text("failure kinds modelled").first.inner_text()
        assert "by kind:" in failure and failure.split("by kind:")[1].strip() == "", (
            f"no count by kind pooled across the two classes: {failure!r}")
        caveat = tab.page.get_by_text("failures by kind are counted per class").first
        caveat.wait_for(state="attached", timeout=PAGE_TIMEOUT_MS)
        said = str(caveat.text_content())
        assert f"{A}: measurement" in said and f"{B}: measurement" in said, said
        for cls in (A, B):  # a failure group of its own for each class
            tab.page.get_by_text(f"{cls} / all:").first.wait_for(state="attached", timeout=PAGE_TIMEOUT_MS)
        tab.shot("hardware-parameters")
        assert not tab.page.locator(".st-error").count(), tab.text(".st-error")
        assert tab.errors == [], tab.errors
    finally:
        tab.close()

    # Ranking: a card per class, each with its own winner; failover rows marked, and left out on request
    tab = Page(browser, f"{url}?page=ranking&experiment={NAME}&policy=slo_throughput")
    try:
        cards = tab.page.locator(".st-winner")
        for cls, label in winners.items():
            try:  # a bootstrapped ranking, computed in the background: generous on 2 busy cores
                tab.page.locator(f".st-winner[data-group*='hardware_class={cls}']", has_text=label).first.wait_for(
                    timeout=BACKGROUND_TIMEOUT_MS)
            except Exception as exc:
                tab.shot("hardware-ranking-winner-missing")
                shown = [c.inner_text() for c in cards.all()]
                raise AssertionError(f"no {cls} winner card naming {label!r}; cards shown: {shown}; "
                                     f"page text: {tab.page.inner_text('body')[:2000]!r}") from exc
        assert cards.count() == 2, [c.inner_text() for c in cards.all()]
        marked = tab.page.locator(".st-failover")
        marked.first.wait_for(state="attached", timeout=PAGE_TIMEOUT_MS)
        assert marked.count() == len(moved) and all("3 moved" == t for t in marked.all_inner_texts())
        assert not tab.page.locator(".st-cross-label").count(), "the cross-hardware view is off by default"
        # Bokeh's checkbox: an <input> beside a <div> with its label, in one shadow root (the page's only checkbox)
        box = tab.page.locator("input[type='checkbox']").first
        box.check()
        assert box.is_checked()
        deadline = time.monotonic() + BACKGROUND_TIMEOUT_MS / 1000
        while tab.page.locator(".st-failover").count() and time.monotonic() < deadline:
            tab.page.wait_for_timeout(250)
        assert not tab.page.locator(".st-failover").count(), "ticked: the failover trials are left out"
        tab.page.locator(".st-winner").nth(1).wait_for(state="attached", timeout=BACKGROUND_TIMEOUT_MS)
        # the cross-hardware select is the one offering "off" (the policy select offers per_gpu too)
        cross = tab.page.locator("select").filter(has=tab.page.locator("option[value='off']")).first
        cross.select_option("per_gpu")
        label = tab.page.locator(".st-cross-label, .st-cross-refused").first
        try:  # computed in the background (a bootstrapped ranking and front): generous on 2 busy cores
            label.wait_for(state="attached", timeout=BACKGROUND_TIMEOUT_MS)
        except Exception as exc:
            tab.shot("hardware-ranking-cross-missing")
            raise AssertionError(f"no cross-hardware view after choosing per_gpu (select shows "
                                 f"{cross.input_value()!r})") from exc
        text = label.inner_text()
        assert "CROSS-HARDWARE" in text and A in text and B in text and "normalised" in text
        tab.shot("hardware-ranking-cross")
        assert not tab.page.locator(".st-error").count(), tab.text(".st-error")
        assert tab.errors == [], tab.errors
    finally:
        tab.close()
