"""Child processes of the benchmark: pinned to a core, in their own session, always cleaned up.

Every child starts in a new session (its own process group), so a Ctrl-C at the terminal reaches
only the benchmark, which then stops each group it started: SIGTERM, a grace period, SIGKILL.
Children are reaped with :func:`os.wait4`, which also gives the CPU time of the whole tree that
the child waited for (:attr:`Child.cpu_s`). Every wait has a timeout.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

log = logging.getLogger(__name__)

#: Seconds a child gets between SIGTERM and SIGKILL.
STOP_GRACE_S = 5.0
#: Lines a child writes to its log that start with this are echoed as progress.
PROGRESS_PREFIX = "[progress] "


def progress(msg: str) -> None:
    """Print a progress line that the parent echoes (for driver scripts run as children)."""
    print(f"{PROGRESS_PREFIX}{msg}", flush=True)


def write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (a reader never sees half a file)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


class BenchmarkError(RuntimeError):
    """Something the benchmark needs failed; ``log_tail`` holds the end of the child's log, if any."""

    def __init__(self, message: str, log_tail: str | None = None) -> None:
        super().__init__(message)
        self.log_tail = log_tail

    def __str__(self) -> str:
        base = super().__str__()
        return f"{base}\n--- log tail ---\n{self.log_tail}" if self.log_tail else base


def tail(path: Path, n_chars: int = 3000) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - n_chars))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def pinned(argv: Sequence[str], cpus: str | None) -> list[str]:
    """``argv`` under ``taskset -c cpus`` (unchanged when ``cpus`` is None)."""
    if cpus is None:
        return list(argv)
    taskset = shutil.which("taskset")
    if taskset is None:
        raise BenchmarkError("taskset (util-linux) is needed to pin processes to a core")
    return [taskset, "-c", cpus, *argv]


class Child:
    """One child process: output to ``log_path``, reaped with :func:`os.wait4`.

    Not thread-safe: one thread starts, polls and stops it.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        cpus: str | None = None,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = pinned(argv, cpus)
        self.log_path = log_path
        self.cwd = cwd
        self.env = dict(env) if env is not None else None
        self.proc: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None
        self.cpu_s: float | None = None
        self._log_pos = 0

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise BenchmarkError(f"{self.name} was never started")
        return self.proc.pid

    def start(self) -> Child:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
                env=self.env,
                start_new_session=True,
            )
        log.debug("started %s (pid %d): %s", self.name, self.proc.pid, " ".join(self.argv))
        return self

    def poll(self) -> int | None:
        """The exit code once the child ended (reaping it), else None."""
        if self.returncode is not None or self.proc is None:
            return self.returncode
        pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
        if pid == 0:
            return None
        self.returncode = os.waitstatus_to_exitcode(status)
        self.proc.returncode = self.returncode  # so that Popen never waits for it again
        self.cpu_s = usage.ru_utime + usage.ru_stime
        return self.returncode

    def progress_lines(self) -> list[str]:
        """New lines of the log that start with :data:`PROGRESS_PREFIX` (prefix removed)."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(self._log_pos)
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self._log_pos += end + 1
        lines = data[: end + 1].decode("utf-8", "replace").splitlines()
        return [line[len(PROGRESS_PREFIX) :] for line in lines if line.startswith(PROGRESS_PREFIX)]

    def wait(self, timeout_s: float, on_tick: Callable[[float], None] | None = None, tick_s: float = 0.2) -> int:
        """Wait for the child to end; on timeout stop it and raise :class:`BenchmarkError`.

        ``on_tick(elapsed_s)`` runs every ``tick_s`` while waiting (progress display).
        """
        start = time.monotonic()
        while True:
            code = self.poll()
            if code is not None:
                return code
            elapsed = time.monotonic() - start
            if elapsed > timeout_s:
                self.stop()
                raise BenchmarkError(f"{self.name} still running after {timeout_s:.0f} s", tail(self.log_path))
            if on_tick is not None:
                on_tick(elapsed)
            time.sleep(tick_s)

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM the child's process group, then SIGKILL after ``grace_s``; reap the child."""
        if self.proc is None or self.poll() is not None:
            self._kill_group(signal.SIGKILL)  # leftovers of the group, if any
            return
        self._kill_group(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if self.poll() is not None:
                self._kill_group(signal.SIGKILL)
                return
            time.sleep(0.05)
        log.warning("%s ignored SIGTERM for %.0f s: killing it", self.name, grace_s)
        self._kill_group(signal.SIGKILL)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and self.poll() is None:
            time.sleep(0.05)

    def _kill_group(self, sig: signal.Signals) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)  # the group id is the child's pid (new session)
        except (ProcessLookupError, PermissionError):
            pass


class Children:
    """Every child the benchmark started; leaving the block stops those still running."""

    def __init__(self) -> None:
        self._children: list[Child] = []

    def start(self, child: Child) -> Child:
        self._children.append(child)
        return child.start()

    def __enter__(self) -> Children:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop_all()

    def stop_all(self) -> None:
        for child in reversed(self._children):
            try:
                child.stop()
            except Exception as err:  # cleanup goes on for the others
                log.warning("could not stop %s: %s", child.name, err)
        self._children.clear()


def install_sigterm_as_interrupt() -> None:
    """Turn SIGTERM (and SIGHUP) into KeyboardInterrupt so that cleanup runs as for Ctrl-C."""

    def _raise(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _raise)
    signal.signal(signal.SIGHUP, _raise)
