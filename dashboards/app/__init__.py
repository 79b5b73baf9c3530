"""The servetune dashboard (``panel serve dashboards/``): one navigation, eight pages (the decision first).

:func:`build` returns the page a browser session gets: a Bootstrap template whose sidebar holds the
experiment picker and the page navigation, both mirrored in the URL query (``?page=pareto&
experiment=e2e``; pages read further arguments such as ``trial``, ``policy``, ``a`` and ``b``), so
any page can be opened directly by its link. Each page is a small module of this package that
builds its view from a :class:`Context`; the data and every computation come from
:mod:`dashboards.app.state` (which reads the results root read-only) and :mod:`analysis`.
A periodic callback (every ``REFRESH_MS``) refreshes the experiment list and lets the current page
pick up new results: a dataset's version is its ``results.nc`` modification time.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol

import holoviews as hv
import panel as pn
from panel.io.callbacks import PeriodicCallback

from dashboards.app import state

log = logging.getLogger(__name__)

REFRESH_MS = 1000
#: set by ``dashboards/app_hooks.py`` once the server's warm-up ran in this process
warmed_up = False

#: page key -> navigation label, in navigation order
PAGES: dict[str, str] = {
    "decision": "Decision: what to deploy",
    "experiments": "Experiments & live status",
    "pareto": "Pareto explorer",
    "curves": "Load curves",
    "parameters": "Parameters",
    "compare": "Compare",
    "inspector": "Trial inspector",
    "ranking": "Ranking",
    "drift": "Drift",
    "history": "Search views",
}

# Heading sizes fixed in px: left to the template, a heading took 18 px on a first load and 32 px after
# a navigation (the template's and Bokeh's stylesheets reach a pane's shadow root in a different order)
_STYLE = """
h2.st-title {font-size: 24px !important; font-weight: 600; margin: 4px 0 8px 0;}
h3 {font-size: 20px !important; font-weight: 600; margin: 10px 0 4px 0;}
h4 {font-size: 17px !important; font-weight: 600; margin: 8px 0 4px 0;}
.st-note {color: #555; font-size: 0.9em;}
.st-warn {background: #fff4e5; border-left: 4px solid #f0a020; padding: 4px 8px; margin: 2px 0;}
.st-claim {display: inline-block; padding: 2px 8px; border-radius: 10px; font-size: 0.85em; margin: 2px 0;}
.st-claim-effect {background: #e3f5e1; color: #1d6b16;}
.st-claim-association {background: #eef; color: #334;}
.st-claim-weak {background: #fff3d6; color: #7a5200;}
.st-synthetic {background: #b00020; color: white; padding: 6px 10px; font-weight: bold; margin: 2px 0 6px 0;}
.st-error {background: #fdecea; border-left: 4px solid #d33; padding: 4px 8px;}
table.st-table {border-collapse: collapse; font-size: 0.9em;}
table.st-table td, table.st-table th {border-bottom: 1px solid #ddd; padding: 3px 8px; text-align: left;}
pre.st-log {max-height: 420px; overflow: auto; background: #1e1e1e; color: #ddd; padding: 8px; font-size: 0.8em;}
pre.st-cmd {background: #f4f4f4; padding: 8px; white-space: pre-wrap;}
"""


class Page(Protocol):
    """What a page module's ``view`` returns: a Panel object plus an optional ``refresh()``."""

    def __panel__(self) -> Any: ...


@dataclass
class Context:
    """What a page is built from: the chosen experiment (its folder under the results root, None when
    there is none), the URL query arguments, and ``navigate`` to switch page with new arguments."""

    experiment: str | None
    folder: Path | None
    args: dict[str, str]
    navigate: Callable[..., None]
    extra: dict[str, Any] = field(default_factory=dict)
    #: the page being shown (its key in :data:`PAGES`)
    page: str = ""

    def arg(self, name: str, default: str = "") -> str:
        return self.args.get(name, default)


def _query_args() -> dict[str, str]:
    args: dict[str, str] = {}
    for k, v in (pn.state.session_args or {}).items():
        if v:
            raw = v[-1]
            args[str(k)] = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    return args


class App:
    """One browser session's dashboard: the page its URL query names (or ``args``). ``live=False``
    builds it without the periodic refresh (the server's warm-up rehearsal, :func:`rehearse`)."""

    def __init__(self, args: dict[str, str] | None = None, live: bool = True) -> None:
        self.args = _query_args() if args is None else dict(args)
        names = [e.name for e in state.list_experiments()]
        wanted = self.args.get("experiment")
        #: an experiment the URL asked for that does not exist yet (a sweep about to start): chosen when it appears
        self._awaited = wanted if wanted and wanted not in names else None
        self.experiment = pn.widgets.Select(name="Experiment", options=names, css_classes=["st-experiment"],
                                            value=wanted if wanted in names else (names[0] if names else None))
        start_page = self.args.get("page", "experiments")
        self.nav = pn.widgets.RadioButtonGroup(
            options={label: key for key, label in PAGES.items()}, orientation="vertical", button_type="light",
            value=start_page if start_page in PAGES else "experiments", css_classes=["st-nav"], sizing_mode="stretch_width")
        self.root_note = pn.pane.HTML(f"<div class='st-note'>results root: <code>{state.root().resolve()}</code></div>")
        self.main = pn.Column(sizing_mode="stretch_width")
        self.current: Any = None
        self.title = pn.pane.HTML("")
        self.nav.param.watch(lambda e: self._show(), "value")
        self.experiment.param.watch(lambda e: self._show(), "value")
        if pn.state.location is not None:
            pn.state.location.sync(self.nav, {"value": "page"})
            pn.state.location.sync(self.experiment, {"value": "experiment"})
        self._show()
        self._names = names
        self._callback = None
        if pn.state.curdoc is not None and live:
            # background: the refresh does not flag the session busy (Panel's busy state is shared by
            # every session, so a busy flag per tick made every open page repaint its indicator)
            self._callback = PeriodicCallback(callback=self._tick, period=REFRESH_MS, background=True, log=False)
            self._callback.start()

    def _url_experiment(self) -> str | None:
        """The experiment the page's URL names now (the user's last choice), None without a location."""
        if pn.state.location is None:
            return self._awaited
        value = pn.state.location.query_params.get("experiment")
        return str(value) if value is not None else None

    def navigate(self, page: str, **args: str) -> None:
        """Switch to ``page`` with query ``args`` (e.g. ``navigate("inspector", trial=tid)``)."""
        self.args.update(args)
        if pn.state.location is not None and args:
            pn.state.location.update_query(**args)  # type: ignore[arg-type]
        if self.nav.value == page:
            self._show()
        else:
            self.nav.value = page

    def _context(self) -> Context:
        name = self.experiment.value
        folder = state.find(name) if name else None
        return Context(name, folder, dict(self.args), self.navigate, page=str(self.nav.value))

    def _show(self) -> None:
        from dashboards.app import (
            compare,
            curves,
            decision,
            drift,
            experiments,
            history,
            inspector,
            parameters,
            pareto,
            ranking,
        )

        modules = {"decision": decision, "experiments": experiments, "pareto": pareto, "curves": curves,
                   "parameters": parameters, "compare": compare, "inspector": inspector, "ranking": ranking,
                   "drift": drift, "history": history}
        ctx = self._context()
        page = self.nav.value
        from dashboards.app.marks import synthetic_html

        title = (f"<h2 class='st-title'>{PAGES[page]}"
                 f"{' &middot; ' + ctx.experiment if ctx.experiment else ''}</h2>{synthetic_html(ctx.folder)}")
        if page == "experiments" and isinstance(self.current, experiments.ExperimentsPage) and self.main.objects:
            # Another experiment on the experiments page: the same panes with new text. No new Bokeh
            # models, so a switch made by the periodic tick (a sweep's experiment appearing) cannot
            # send the browser a reference to a model whose definition is still on its way in
            # another message ("reference pNNNN isn't known"); Bokeh's and Panel's writes to the
            # socket can reach the browser out of order.
            self.title.object = title
            self.current.show(ctx)
            return
        try:
            if page != "experiments" and ctx.folder is None:
                self.current = pn.pane.HTML(f"<div class='st-note st-empty'>No experiment under {state.root()}: "
                                            "run a sweep, then pick it here.</div>")
            else:
                self.current = modules[page].view(ctx)
        except Exception as exc:  # show what went wrong in the page rather than a blank page
            log.exception("page %s of %s failed", page, ctx.experiment)
            self.current = pn.pane.HTML(f"<div class='st-error'>{page} could not be shown: "
                                        f"{type(exc).__name__}: {exc}</div>")
        self.title = pn.pane.HTML(title, sizing_mode="stretch_width")
        self.main.objects = [self.title, self.current]

    def _tick(self) -> None:
        names = [e.name for e in state.list_experiments()]
        if names != self._names:
            self._names = names
            self.experiment.options = names
            if self._awaited in names and self._url_experiment() == self._awaited:
                self.experiment.value, self._awaited = self._awaited, None
            elif self.experiment.value is None and names:
                self.experiment.value = names[0]
        refresh = getattr(self.current, "refresh", None)
        if callable(refresh):
            try:
                refresh()
            except Exception:
                log.exception("refresh of %s failed", self.nav.value)

    def template(self) -> pn.template.BootstrapTemplate:
        tmpl = pn.template.BootstrapTemplate(title="servetune", sidebar_width=280,
                                             sidebar=[self.experiment, self.nav, self.root_note], main=[self.main])
        return tmpl


def build(args: dict[str, str] | None = None, live: bool = True) -> pn.template.BootstrapTemplate:
    """The dashboard of one browser session (called by ``dashboards/main.py``); ``args`` and
    ``live`` as :class:`App`'s."""
    hv.extension("bokeh", logo=False)
    pn.extension("tabulator", raw_css=[_STYLE], notifications=False)
    return App(args, live).template()


def rehearse(experiment: str | None, page: str) -> None:
    """Build ``page`` of ``experiment`` once in a throwaway Bokeh document, every model of it, as a
    browser session's first request does; the server's warm-up calls this so that its first real
    session finds the modules imported, datashader's kernels compiled and the page's per-version
    caches filled (the first visit otherwise took about a second longer than the next ones)."""
    from bokeh.document import Document
    from panel.io.state import set_curdoc

    doc = Document()
    with set_curdoc(doc):
        args = {"page": page, **({"experiment": experiment} if experiment else {})}
        build(args, live=False).server_doc(doc)
    # what Bokeh does when a session ends (bokeh.application.handlers.document_lifecycle): run the
    # document's end-of-session hooks, by which Panel releases the page's models (they read only the
    # ending session's document and id), logging rather than raising what fails
    ending = SimpleNamespace(id=f"rehearsal-{id(doc)}", _document=doc)
    hooks, doc.session_destroyed_callbacks = doc.session_destroyed_callbacks, set()
    for hook in hooks:
        try:
            hook(ending)
        except Exception as exc:
            log.debug("end-of-session hook %s of the rehearsal failed: %s", hook, exc)
    doc.clear()


class _LoadGate:
    """Holds a session's background results until its browser has loaded the page.

    Panel 1.9 loses a model update made between the browser's websocket connecting and the page
    reporting itself loaded (Panel's ``onload``): the update is deferred to a later tick, and what
    it sends is never applied in the browser (the Parameters page's interactions section kept its
    spinner in about 1 of 3 fresh servers, the result assigned on the server). So results that
    finish before the page has loaded wait here and are applied, each on its own tick, once it has."""

    def __init__(self, doc: Any) -> None:
        # weakly: the gate is the value of a WeakKeyDictionary keyed by this document, and a strong
        # reference from the value would keep every ended session's document alive
        self.doc = weakref.ref(doc)
        self.loaded = False
        self.waiting: list[Callable[[], None]] = []

    def deliver(self, apply: Callable[[], None]) -> None:
        """On the document's tick: ``apply`` now when the page has loaded, else once it has."""
        if self.loaded:
            apply()
        else:
            self.waiting.append(apply)

    def open(self) -> None:
        """Panel's ``onload`` callback: the page has loaded; apply what waited."""
        self.loaded = True
        waiting, self.waiting = self.waiting, []
        doc = self.doc()
        if doc is None:  # the session ended
            return
        for apply in waiting:
            doc.add_next_tick_callback(apply)


#: the load gate of each live session's document
_GATES: weakref.WeakKeyDictionary[Any, _LoadGate] = weakref.WeakKeyDictionary()


def _gate(doc: Any) -> _LoadGate:
    gate = _GATES.get(doc)
    if gate is None:
        gate = _GATES[doc] = _LoadGate(doc)
        pn.state.onload(gate.open)  # called at once when the page has already loaded
    return gate


def on_result(fut: Future[Any], fn: Callable[[Future[Any]], None]) -> None:
    """Call ``fn(fut)`` in the session once the background ``fut`` is done: at once when it already
    is (a cached result), else on a tick of the document (Bokeh's thread-safe way to update a
    session from another thread), and never before the browser has loaded the page
    (:class:`_LoadGate`)."""
    doc = pn.state.curdoc
    if fut.done() or doc is None or doc.session_context is None:
        fn(fut)
        return
    gate = _gate(doc)
    fut.add_done_callback(lambda f: doc.add_next_tick_callback(lambda: gate.deliver(lambda: fn(f))))


#: caveats under which a green "causal effect" badge would overclaim: the model behind the numbers fits poorly
_BADGE_YIELDS_TO = frozenset({"poor_fit"})


def claim_html(claim: Any, warnings: Any = ()) -> str:
    """The causal/associational label of an analysis result, with its reason; an effect badge yields
    (amber, "effect, model fits poorly") when the result's ``warnings`` include ``poor_fit``."""
    kind = getattr(claim, "kind", "association")
    why = getattr(claim, "why", "")
    word = "causal effect" if kind == "effect" else "association"
    if kind == "effect" and any(getattr(w, "code", "") in _BADGE_YIELDS_TO for w in warnings or ()):
        kind, word = "weak", "effect, model fits poorly"
        why = f"{why}; but the model behind these numbers fits poorly (poor_fit), so treat them as rough"
    return f"<span class='st-claim st-claim-{kind}' title='{_esc(why)}'>{word}</span> <span class='st-note'>{_esc(why)}</span>"


def warnings_html(warnings: Any) -> str:
    """An analysis result's caveats, one box each: code, message, and what the code means
    (:data:`dashboards.app.codes.MEANING`, in ``span.st-code-help``)."""
    from dashboards.app.codes import MEANING

    out = []
    for w in list(warnings or []):
        code = str(getattr(w, "code", ""))
        meaning = MEANING.get(code, "")
        help_ = f" <span class='st-note st-code-help'>({_esc(code)}: {_esc(meaning)})</span>" if meaning else ""
        out.append(f"<div class='st-warn' data-code='{_esc(code)}'><b title='{_esc(meaning)}'>{_esc(code)}</b>: "
                   f"{_esc(getattr(w, 'message', w))}"
                   f"{' (' + _esc(w.subject) + ')' if getattr(w, 'subject', '') else ''}{help_}</div>")
    return "".join(out)


def _esc(text: Any) -> str:
    import html

    return html.escape(str(text), quote=True)


esc = _esc


def experiment_page(ctx: Context, preferred_metric: Callable[[Any], str]) -> tuple[Path, Any, Any, pn.widgets.Select]:
    """What a page about one experiment starts from: its folder, dataset, trial table and a metric
    picker over the table's metrics, set to ``preferred_metric(dataset)`` when that is one of them,
    else to the first."""
    from dashboards.app.pareto import metric_options  # pareto imports this package

    assert ctx.folder is not None
    ds, df = state.dataset(ctx.folder), state.table(ctx.folder)
    metrics = metric_options(df)
    preferred = preferred_metric(ds)
    picker = pn.widgets.Select(name="metric", options=metrics, value=preferred if preferred in metrics else metrics[0])
    return ctx.folder, ds, df, picker
