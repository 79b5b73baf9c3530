"""Where the coordinator's time goes: py-spy attached to it by pid during a run.

py-spy (its own virtual environment, ``benchmarks/.venvs/py-spy``, made on first use by
:func:`benchmarks.loadgen.spy.ensure_pyspy`) samples the coordinator ``--idle`` at 100 Hz: idle
samples are kept because a thread blocked in ``fsync`` or in SQLite's commit is not on the CPU,
and that is time in which the single-threaded loop serves no message. It samples in its default
blocking mode (it stops the process for each sample, some percent of slow-down):
``--nonblocking`` gave torn stacks and one sample in six unreadable here.

py-spy shows Python frames only: a native call (``os.fsync``, SQLite's ``COMMIT``, ``zmq_poll``)
is charged to the Python line that made it, so the self time of a line is the time of the call on
it. Shares are of all samples (wall time). Each sample is charged once to every function on its
stack (inclusive, line numbers dropped) and once to its innermost line (self); the "part" of the
loop is the first of :data:`PARTS` whose test matches the stack.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SAMPLE_HZ = 100
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def _lines_of(path: Path, needle: str) -> set[int]:
    try:
        return {i for i, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if needle in text}
    except OSError:
        return set()


@dataclass(frozen=True)
class Frame:
    func: str
    file: str
    line: int | None

    @property
    def where(self) -> str:
        return f"{self.func} ({self.file})"

    @property
    def at(self) -> str:
        return f"{self.func} ({self.file}:{self.line})" if self.line else self.where


def parse_frame(text: str) -> Frame:
    m = _FRAME.match(text.strip())
    if not m:
        return Frame(text.strip(), "", None)
    return Frame(m.group("func"), m.group("file"), int(m.group("line")) if m.group("line") else None)


def parts(repo: Path) -> list[tuple[str, Callable[[list[Frame]], bool]]]:
    """Named parts of the coordinator's loop, tested in order (the first match names a sample)."""
    fsync_lines = _lines_of(repo / "coordinator" / "store.py", "os.fsync(")
    commit_lines = _lines_of(repo / "coordinator" / "store.py", '"COMMIT"')

    def leaf_at(file_end: str, lines: set[int]) -> Callable[[list[Frame]], bool]:
        return lambda fs: fs[-1].file.endswith(file_end) and fs[-1].line in lines

    def through(*funcs: str) -> Callable[[list[Frame]], bool]:
        return lambda fs: any(f.func in funcs for f in fs)

    return [
        ("fsync of the result file (store.py, before the ACK)", leaf_at("coordinator/store.py", fsync_lines)),
        ("waiting for a message (zmq poll: idle)", lambda fs: fs[-1].func in ("Poller.poll", "Socket.poll")),
        ("results.nc rewrite (coordinator.dataset.write_dataset)", through("write_dataset")),
        ("SQLite COMMIT (store.py _tx)", leaf_at("coordinator/store.py", commit_lines)),
        ("rest of storing a result (Store.finish_attempt: JSON dump, mkdir, SQL)", through("Store.finish_attempt")),
        ("opening attempts for a GRANT (Store.begin_attempt)", through("Store.begin_attempt")),
        ("closing lost attempts (Store.close_attempts)", through("Store.close_attempts")),
        ("summarize() of the samples", through("summarize")),
        ("rest of accepting a result (SweepRunner._accept)", through("SweepRunner._accept")),
        ("progress lines and logging (rich, print, logging)", lambda fs: any(
            f.func.startswith("SweepProgress") or "rich/" in f.file or f.file.startswith("logging") for f in fs)),
        ("decoding messages (transport.recv, pydantic)", through("RouterEndpoint.recv")),
        ("encoding and sending (transport.send, pydantic)", through("RouterEndpoint.send")),
        ("control core: handle()", through("ControlCore.handle")),
        ("control core: tick()", through("ControlCore.tick")),
    ]


@dataclass
class CoordProfile:
    samples: int
    by_part: list[tuple[str, float]]
    top_self: list[tuple[str, float]]
    top_inclusive: list[tuple[str, float]]


def summarize_raw(text: str, repo: Path, top_n: int = 15) -> CoordProfile:
    """A :class:`CoordProfile` from py-spy's ``--format raw`` output (``frame;frame;... count``)."""
    named = parts(repo)
    self_c: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    by_part: Counter[str] = Counter()
    total = 0
    for row in text.splitlines():
        stack, _, count = row.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [parse_frame(f) for f in stack.split(";") if f.strip()]
        if not frames:
            continue
        n = int(count)
        total += n
        self_c[frames[-1].at] += n
        for where in {f.where for f in frames}:
            incl[where] += n
        name = next((p for p, test in named if test(frames)), None)
        by_part[name or "other"] += n
    share = (lambda k: k / total) if total else (lambda k: 0.0)
    skip = ("<module>", "_run_module_as_main", "_run_code", "main (coordinator/cli.py)", "run (coordinator/commands",
            "SweepRunner.run ", "SweepRunner._run_with_store", "SweepRunner._loop")
    return CoordProfile(
        samples=total,
        by_part=[(p, share(n)) for p, n in by_part.most_common()],
        top_self=[(f, share(n)) for f, n in self_c.most_common(top_n)],
        top_inclusive=[(f, share(n)) for f, n in incl.most_common(top_n + 20) if not f.startswith(skip)][:top_n],
    )
