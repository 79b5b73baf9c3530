"""The end of a page's background computation, shared by the pages that compute in the background.

A page hands a :func:`dashboards.app.state.background` future to :func:`dashboards.app.on_result`
and, when it is done, to :func:`settle`: its result goes to the page's ``use``; a refusal
(:class:`analysis.frame.AnalysisInputError`: the input names something the experiment does not have,
or asks what cannot be answered) is shown as a warning (``st-warn`` plus the page's ``refused``
class) with the refusal's words; anything else is a bug: logged with its traceback and shown as
``st-error``, so the page says it failed rather than spinning for ever.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import panel as pn

from analysis.frame import AnalysisInputError
from dashboards.app import esc

log = logging.getLogger(__name__)

T = TypeVar("T")


def into(column: pn.Column) -> Callable[[str], None]:
    """A ``show`` for :func:`settle` that replaces what ``column`` holds with the message."""

    def show(text: str) -> None:
        column.objects = [pn.pane.HTML(text, sizing_mode="stretch_width")]

    return show


def settle(fut: Future[T], use: Callable[[T], Any], show: Callable[[str], None], what: str, refused: str) -> bool:
    """``use(fut.result())``; on a refusal ``show`` a ``st-warn <refused>`` message, on any other
    exception (raised by the computation or by ``use``) log it and ``show`` a ``st-error`` one
    (``"<what> failed: ..."``). Returns whether ``use`` went through."""
    try:
        use(fut.result())
        return True
    except AnalysisInputError as exc:
        show(f"<div class='st-warn {esc(refused)}'>{esc(exc)}</div>")
    except Exception as exc:
        log.exception("%s failed", what)
        show(f"<div class='st-error'>{esc(what)} failed: {esc(exc)}</div>")
    return False
