"""The refresh rule shared by pages that recompute everything when their dataset changes.

A page that keeps ``folder`` (its experiment's folder) and ``version`` (the dataset version it
shows, :func:`dashboards.app.state.version`) and recomputes with ``start()`` mixes in
:class:`RestartOnNewVersion` for its ``refresh()``: the app calls it on every live tick, and it
starts again only when ``results.nc`` changed.
"""

from __future__ import annotations

from pathlib import Path

from dashboards.app import state


class RestartOnNewVersion:
    """``refresh()``: ``start()`` again when the experiment's dataset version moved on."""

    folder: Path
    version: int

    def start(self) -> None:
        raise NotImplementedError

    def refresh(self) -> None:
        v = state.version(self.folder)
        if v != self.version:
            self.version = v
            self.start()
