"""Sweep progress for people: trials done / total, the current trial and phase, and an ETA.

On a terminal it is a live rich progress bar; elsewhere (CI logs, pipes) one line per change,
at most ten a second for trials that finished ok.
The ETA starts from the plan's estimate and is rescaled by how fast the sweep actually goes.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

#: Off a terminal, the shortest time between two lines about finished trials (failures excepted).
LINE_INTERVAL_S = 0.1


def _fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return "ETA --"
    seconds = max(0, int(seconds))
    return f"ETA {seconds // 60}:{seconds % 60:02d}"


class SweepProgress:
    def __init__(self, total: int, estimate_s: float | None, console: Console | None = None):
        """``estimate_s``: the expected wall time of the ``total`` trials, the ETA until the first
        finishes; None: unknown (the ETA shows ``--`` until then)."""
        self.console = console or Console(stderr=True)
        self.total = total
        self.done = 0
        self.failed = 0
        self._estimate_s = estimate_s
        self._start = time.monotonic()
        self._current = "waiting for the daemon"
        self._live = self.console.is_terminal
        self._last_line = ""
        self._last_print = -LINE_INTERVAL_S
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> SweepProgress:
        if self._live:
            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("[bold]trials"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[eta]}"),
                TextColumn("{task.description}"),
                console=self.console,
                transient=False,
            )
            self._progress.__enter__()
            self._task = self._progress.add_task(self._current, total=self.total, eta=_fmt_eta(self.eta()))
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.__exit__(et, ev, tb)

    def eta(self) -> float | None:
        elapsed = time.monotonic() - self._start
        if self.done == 0:
            return None if self._estimate_s is None else max(0.0, self._estimate_s - elapsed)
        per_trial = elapsed / self.done
        return per_trial * (self.total - self.done)

    def add_total(self, n: int) -> None:
        """Trials planned during the sweep (a rate sweep's follow-ups) join the total."""
        self.total += n
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, total=self.total)

    def phase(self, text: str) -> None:
        self._current = text
        self._render()

    def note(self, text: str) -> None:
        """A warning that must stay visible (a suspect daemon, a lost lease): its own line, always."""
        if self._progress is not None:
            self._progress.console.print(f"[yellow]{text}")
        else:
            print(f"[{self.done}/{self.total}] warning: {text}", file=sys.stderr, flush=True)

    def trial_done(self, ok: bool, text: str) -> None:
        self.done += 1
        if not ok:
            self.failed += 1
        self._current = text
        # Off a terminal, a finished trial gets its own line unless one was printed less than
        # LINE_INTERVAL_S ago (a fleet finishes thousands a second: a line each would cost the loop
        # more than the result). A failure and the last trial always get theirs.
        if (self._live or not ok or self.done >= self.total
                or time.monotonic() - self._last_print >= LINE_INTERVAL_S):
            self._render(force=True)

    def _render(self, force: bool = False) -> None:
        eta = _fmt_eta(self.eta())
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=self.done, description=self._current, eta=eta)
            return
        line = f"[{self.done}/{self.total}] {self._current}"
        if force or line != self._last_line:
            self._last_line = line
            self._last_print = time.monotonic()
            elapsed = int(time.monotonic() - self._start)
            print(f"{line}  (elapsed {elapsed // 60}:{elapsed % 60:02d}, {eta})", file=sys.stderr, flush=True)
