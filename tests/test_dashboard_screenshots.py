"""Every page of the dashboard gets a screenshot: ``tests/test_dashboard.py``'s
``test_every_page_loads_without_console_errors`` shoots each page of its ``PAGES`` into
``test-artifacts/``, and this (not a browser test, so it runs in every suite) fails when a page is
registered in ``dashboards.app.PAGES`` without an entry there, or an entry names no page."""

from __future__ import annotations

from dashboards.app import PAGES as APP_PAGES
from tests.test_dashboard import PAGES as SHOT_PAGES


def test_every_page_of_the_dashboard_is_shot() -> None:
    assert set(SHOT_PAGES) == set(APP_PAGES), (
        f"pages without a screenshot in tests/test_dashboard.py PAGES: {sorted(set(APP_PAGES) - set(SHOT_PAGES))}; "
        f"entries there for no page: {sorted(set(SHOT_PAGES) - set(APP_PAGES))}")
