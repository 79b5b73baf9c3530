"""Rewrite ``results.nc`` while a sweep runs without stalling the coordinator's loop.

It also writes the per-attempt result files of such sweeps: the coordinator makes each record
durable in SQLite before its ACK and leaves the file, a view of that row, to this process
(:meth:`coordinator.store.Store.materialize_result_files`) and to its own store's close, which
writes any still missing. A reader may therefore find an attempt's ``result_path`` not yet
written for a few seconds while a large sweep runs.

Rebuilding the dataset re-reads every trial from SQLite and writes netCDF: seconds for a large
experiment, which on the loop's thread would delay every heartbeat answer by as much (and under
the GIL a thread would still take its share of the loop's time). :class:`DatasetWriter` hands
the interim rewrites to a child process (``python -m coordinator.dataset_writer FOLDER``) that
opens the store read-only and runs at a lower CPU priority; the loop only writes one byte to its
stdin to say "there is something new", never waits for it, and coalesces requests.

Contract:

- The child is the only writer of ``results.nc`` while it runs; :meth:`DatasetWriter.close` stops
  it (and waits, bounded) before the sweep's final rewrite, which is synchronous and complete:
  :func:`write_final` runs it in one more child (``--once``) and waits for it, so that the
  coordinator's own process never imports xarray, pandas or netCDF (their ~55 MB stay out of its
  resident set), and writes it in-process only if that child fails.
- The child ends when its stdin closes (the coordinator stopped, or died: the pipe's end closes
  with it) and, on Linux, with a SIGKILL when its parent dies; a rewrite in progress then leaves
  the previous ``results.nc`` in place (each rewrite replaces the file atomically).
- A failed interim rewrite is logged by the child and does not stop the sweep; if the child
  dies, interim rewrites stop with a warning (the final one still happens).
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from servetune.manifest import TrialManifest

log = logging.getLogger(__name__)

#: The child's niceness: it yields the core to the coordinator's loop whenever both want it.
NICENESS = 10
#: After an interim rewrite that took T seconds, the next starts no sooner than this times T later.
REWRITE_SHARE = 10.0


class DatasetWriter:
    """The coordinator's side: start the child, ask it for rewrites, stop it."""

    def __init__(self, folder: Path, *, debounce_s: float, python: str = sys.executable):
        self.folder = folder
        self.debounce_s = debounce_s
        self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            [python, "-m", "coordinator.dataset_writer", str(folder), str(debounce_s)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=None,
        )
        assert self._proc.stdin is not None
        os.set_blocking(self._proc.stdin.fileno(), False)
        self.requests = 0

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def request(self) -> bool:
        """Ask for a rewrite (never blocks; a full pipe means one is already asked for).
        False when the child is gone."""
        proc = self._proc
        if proc is None or proc.stdin is None:
            return False
        try:
            os.write(proc.stdin.fileno(), b"w")
        except BlockingIOError:
            return True
        except (BrokenPipeError, OSError) as exc:
            log.warning("the results.nc writer (pid %d) is gone (%s): interim rewrites stop; the final one still "
                        "happens", proc.pid, exc)
            self._stop(timeout_s=1.0)
            return False
        self.requests += 1
        return True

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the child (it finishes a rewrite in progress) and wait for it, bounded."""
        self._stop(timeout_s)

    def _stop(self, timeout_s: float) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            try:
                proc.stdin.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("the results.nc writer (pid %d) did not stop within %.0f s; killing it", proc.pid, timeout_s)
            proc.kill()
            proc.wait(timeout=10)


def rewrite_wait_s(debounce_s: float, took_s: float) -> float:
    """How long after an interim rewrite that took ``took_s`` the next may start: the debounce,
    or :data:`REWRITE_SHARE` times the rewrite when that is longer."""
    return max(debounce_s, REWRITE_SHARE * took_s)


def _die_with_parent() -> None:
    """Linux: get SIGKILL when the parent dies (PR_SET_PDEATHSIG), so a killed coordinator
    leaves no writer behind even mid-rewrite."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def serve(folder: Path, debounce_s: float, stdin_fd: int = 0) -> int:
    """The child's loop: wait for a request byte, write the result files the coordinator left to
    it, rewrite results.nc, wait out the debounce; end at EOF."""
    from coordinator.dataset import write_dataset
    from coordinator.store import Store

    pending = False
    files_after = 0  # result files written up to this pending_results row
    manifests: dict[str, tuple[str, TrialManifest]] = {}  # parsed once for all rewrites (Store.manifest_cache)
    while True:
        if not pending:
            ready, _, _ = select.select([stdin_fd], [], [], 60.0)
            if not ready:
                continue
            if not os.read(stdin_fd, 4096):
                return 0
        t0 = time.monotonic()
        try:
            store = Store.open_readonly(folder)
            store.manifest_cache = manifests
            try:
                files_after = store.materialize_result_files(files_after)
                write_dataset(store)
            finally:
                store.close()
        except Exception:  # an interim view: log it and keep serving; the final write is the coordinator's
            log.exception("interim rewrite of %s/results.nc failed", folder)
        # Debounce: requests that come meanwhile make one more rewrite after it; EOF ends at once.
        # A rewrite re-reads every trial, so it grows with the sweep: the wait after it is at least
        # REWRITE_SHARE times its length (as the coordinator's in-process rewrites), keeping this
        # child to about a tenth of the coordinator's core however large the store grows.
        deadline = time.monotonic() + rewrite_wait_s(debounce_s, time.monotonic() - t0)
        pending = False
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([stdin_fd], [], [], left)
            if ready:
                if not os.read(stdin_fd, 4096):
                    return 0
                pending = True


def write_final(folder: Path, *, python: str = sys.executable, timeout_s: float = 600.0) -> Path | None:
    """The sweep's final ``results.nc`` rewrite in a child process (``--once``), waited for; its
    path, or None when the child failed or ran past ``timeout_s`` (the caller then rewrites it
    itself). The store must be committed: the child opens it read-only."""
    from servetune.schema import DATASET_FILE

    try:
        proc = subprocess.run([python, "-m", "coordinator.dataset_writer", str(folder), "0", "--once"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("the final results.nc writer failed (%s); rewriting in the coordinator", exc)
        return None
    if proc.returncode != 0:
        log.warning("the final results.nc writer exited with code %d; rewriting in the coordinator", proc.returncode)
        return None
    return folder / DATASET_FILE


def _once(folder: Path) -> int:
    """``--once``: rewrite results.nc one time, complete (the final rewrite); non-zero on failure."""
    from coordinator.dataset import write_dataset
    from coordinator.store import Store

    store = Store.open_readonly(folder)
    try:
        write_dataset(store)
    finally:
        store.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[2:] == ["--once"]:
        logging.basicConfig(level=logging.WARNING, format="results.nc writer: %(levelname)s %(message)s")
        return _once(Path(args[0]))
    _die_with_parent()
    try:
        os.nice(NICENESS)
    except OSError:
        pass
    logging.basicConfig(level=logging.WARNING, format="results.nc writer: %(levelname)s %(message)s")
    return serve(Path(args[0]), float(args[1]))


if __name__ == "__main__":
    raise SystemExit(main())
