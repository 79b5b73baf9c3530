"""Start-up of ``panel serve dashboards/``: Bokeh runs this file of the served folder once per server
process, while it builds the application and before it opens its port. Like ``main.py`` it is an
entry point that Bokeh executes, never a module anything imports, so its work runs at the bottom.

The server warms up here, before it announces its URL: it loads every experiment's dataset, trial
table and (for large ones) the default Pareto front (:func:`dashboards.app.state.warm_all`, the
same per-version cache the pages read), then builds the Pareto explorer of the largest experiment,
its Decision page (which decides for the default inputs, cached for the first visit) and the
experiments page once in a throwaway document (:func:`dashboards.app.rehearse`: imports,
datashader's numba kernels, per-version caches). The first browser visit then costs what any later
one does (a 100,000-trial dataset otherwise made the first Pareto visit wait seconds for loading,
the front and the compilation). It prints a line per experiment and one when done.

The warm-up waits at most ``$SERVETUNE_DASHBOARD_WARM_UP_S`` seconds (default 60): experiments not
loaded by then go on loading in the background while the server starts (a page that needs one
waits for that load rather than starting another), and the rehearsal is skipped. ``0`` starts the
server at once with everything loading in the background.

It also makes the dashboard listen on **localhost only** unless told otherwise: Bokeh's own default
(no ``--address``) is every interface, which would open every result to the network by accident.
When ``panel serve`` was given no ``--address`` (and no ``--unix-socket``), this file sets the
command's address to ``localhost`` before Bokeh binds its port (:func:`listen_on_loopback_by_default`);
an explicit ``--address`` is kept, with a loud warning when it is not loopback and no authentication
(``--basic-auth``, ``--oauth-provider``, ``--auth-module`` or their environment variables) is on.
Serving to a team: ``dashboards/README.md``, "Sharing the dashboard".
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys
import time
import types
from concurrent.futures import FIRST_COMPLETED, wait
from pathlib import Path

_REPO = str(Path(__file__).resolve().parents[1])
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

log = logging.getLogger("dashboards.app_hooks")

BUDGET_ENV = "SERVETUNE_DASHBOARD_WARM_UP_S"
DEFAULT_BUDGET_S = 60.0


def _say(text: str) -> None:
    # print, not only log: `panel serve` shows no INFO lines by default, and the benchmark waits for these
    print(f"servetune dashboard: {text}", flush=True)


def _serve_args() -> argparse.Namespace | None:
    """The options of the ``panel serve`` (or ``bokeh serve``) command executing this file: the
    ``args`` of Bokeh's ``Serve.invoke``, found up the call stack (None when run some other way)."""
    from bokeh.command.subcommands.serve import Serve

    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        args = frame.f_locals.get("args")
        if frame.f_code.co_name == "invoke" and isinstance(frame.f_locals.get("self"), Serve) \
                and isinstance(args, argparse.Namespace):
            return args
        frame = frame.f_back
    return None


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) stands for this machine's loopback interface only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _auth_on(args: argparse.Namespace) -> bool:
    return any(getattr(args, k, None) for k in ("basic_auth", "oauth_provider", "auth_module")) or any(
        os.environ.get(k) for k in ("PANEL_BASIC_AUTH", "PANEL_OAUTH_PROVIDER", "BOKEH_AUTH_MODULE"))


def listen_on_loopback_by_default() -> None:
    """Set ``panel serve``'s address to ``localhost`` when none was given (see the module doc)."""
    args = _serve_args()
    if args is None:
        if "serve" in sys.argv[1:2]:
            _say("WARNING: could not read the options of `panel serve`: without --address it listens on EVERY "
                 "interface; pass --address localhost (dashboards/README.md, 'Sharing the dashboard')")
        return
    if getattr(args, "unix_socket", None):
        return
    if args.address is None:
        args.address = "localhost"
        _say("listening on localhost only; to serve a team see 'Sharing the dashboard' in dashboards/README.md "
             "(--address, --basic-auth, --cookie-secret)")
    elif not is_loopback(args.address) and not _auth_on(args):
        _say(f"WARNING: listening on {args.address or 'every interface'} with NO authentication: anyone who "
             "can reach this port sees every result; add --basic-auth and --cookie-secret (dashboards/README.md, "
             "'Sharing the dashboard')")


def budget_s() -> float:
    """The warm-up's time limit from ``$SERVETUNE_DASHBOARD_WARM_UP_S`` (a clear error names a bad value)."""
    raw = os.environ.get(BUDGET_ENV, "").strip()
    if not raw:
        return DEFAULT_BUDGET_S
    try:
        value = float(raw)
    except ValueError:
        raise SystemExit(f"{BUDGET_ENV}={raw!r} is not a number of seconds") from None
    if value < 0:
        raise SystemExit(f"{BUDGET_ENV}={raw!r} must be >= 0")
    return value


def warm_up(limit_s: float) -> None:
    """Load every experiment (at most ``limit_s`` seconds), then rehearse the pages (see the module doc)."""
    from dashboards.app import rehearse, state

    t0 = time.perf_counter()
    started = state.warm_all()
    _say(f"loading {len(started)} experiment(s) under {state.root()} before serving (at most {limit_s:.0f} s)")
    names = {fut: name for name, fut in started}
    pending = set(names)
    deadline = t0 + limit_s
    while pending:
        left = deadline - time.perf_counter()
        if left <= 0:
            break
        done, pending = wait(pending, timeout=left, return_when=FIRST_COMPLETED)
        for fut in done:
            if fut.exception() is not None:
                log.error("warm-up of experiment %s failed", names[fut], exc_info=fut.exception())
                _say(f"[{len(names) - len(pending)}/{len(names)}] {names[fut]}: could not be loaded "
                     f"({type(fut.exception()).__name__}: {fut.exception()})")
            else:
                _say(f"[{len(names) - len(pending)}/{len(names)}] {names[fut]} loaded "
                     f"({time.perf_counter() - t0:.1f} s)")
    if pending:
        _say(f"{len(pending)} experiment(s) still loading after {limit_s:.0f} s ({', '.join(sorted(names[f] for f in pending))});"
             " they go on in the background")
    else:
        loaded = [info for info in state.list_experiments() if info.has_dataset]
        largest = max(loaded, key=lambda info: sum(info.counts.values()), default=None)
        for name, page in [*([(largest.name, "pareto"), (largest.name, "decision")] if largest else []),
                           (None, "experiments")]:
            t1 = time.perf_counter()
            try:
                rehearse(name, page)
            except Exception:
                log.exception("rehearsal of the %s page failed", page)
                continue
            _say(f"rehearsed the {page} page{' of ' + name if name else ''} in {time.perf_counter() - t1:.2f} s")
    _say(f"warm-up of {len(started)} experiment(s) under {state.root()} done in {time.perf_counter() - t0:.1f} s")


def _start() -> None:
    from dashboards import app

    if app.warmed_up:  # `panel serve` loads this file twice in one process
        return
    app.warmed_up = True
    limit = budget_s()
    try:
        warm_up(limit)
    except Exception:  # the dashboard must start even when its warm-up fails
        log.exception("dashboard warm-up failed")


listen_on_loopback_by_default()
_start()
