"""What bounds our client: a py-spy sampling profile of our driver at the top of its range.

py-spy (PyPI, in its own virtual environment ``benchmarks/.venvs/py-spy``) attaches to the
driver by pid from the target core and samples it 250 times a second without pausing it
(``--nonblocking``), so the client runs at close to its normal speed. Only samples of work the
event loop dispatched (stacks through ``BaseEventLoop._run_once``) count: the requests, not
start-up, imports or the conversion of records into samples afterwards. Each sample is charged
to its innermost Python frame (native calls such as ``socket.send`` are charged to the Python
function that made them) and grouped by library.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.loadgen.clients import Setup
from benchmarks.loadgen.points import Point
from benchmarks.loadgen.procs import BenchmarkError, Child, Children, tail

PY_SPY_VERSION = "0.4.3"
SAMPLE_HZ = 250

#: A sample counts when its stack has this frame (event-loop work) and none of the excluded ones.
LOOP_FRAME = "BaseEventLoop._run_once"
EXCLUDED_FRAMES = ("LoadGenerator.measure (", "LoadGenerator.warmup (")

_LIBRARIES = (
    ("aiohttp/", "aiohttp"),
    ("yarl/", "yarl/multidict"),
    ("multidict/", "yarl/multidict"),
    ("asyncio/", "asyncio (stdlib)"),
    ("selectors.py", "selectors/epoll (stdlib)"),
    ("json/", "json (stdlib)"),
    ("random.py", "random (stdlib)"),
    ("daemon/", "servetune (daemon/, servetune/)"),
    ("servetune/", "servetune (daemon/, servetune/)"),
    ("pydantic", "pydantic"),
)


@dataclass
class Profile:
    rate: float
    achieved: float
    samples_total: int
    samples_loop: int
    top: list[tuple[str, float]]  # (innermost frame, share of loop samples)
    by_library: list[tuple[str, float]]  # (library, share of loop samples)


def library_of(frame: str) -> str:
    where = frame[frame.rfind("(") + 1 :]
    for needle, name in _LIBRARIES:
        if where.startswith(needle) or f"/{needle}" in where:
            return name
    return "other"


def summarize_raw(text: str, rate: float, achieved: float, top_n: int = 15) -> Profile:
    """A :class:`Profile` from py-spy's ``--format raw`` output (``frame;frame;... count`` lines)."""
    leaf: Counter[str] = Counter()
    libs: Counter[str] = Counter()
    total = loop = 0
    for line in text.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        if LOOP_FRAME not in stack or any(x in stack for x in EXCLUDED_FRAMES):
            continue
        loop += n
        frame = stack.rsplit(";", 1)[-1]
        leaf[frame] += n
        libs[library_of(frame)] += n
    share = (lambda k: k / loop) if loop else (lambda k: 0.0)
    return Profile(
        rate=rate,
        achieved=achieved,
        samples_total=total,
        samples_loop=loop,
        top=[(f, share(n)) for f, n in leaf.most_common(top_n)],
        by_library=[(lib, share(n)) for lib, n in libs.most_common()],
    )


def ensure_pyspy(venv: Path, say: Callable[[str], None], timeout_s: float = 600) -> Path:
    """py-spy in its own virtual environment (made if missing); the path of its binary."""
    binary = venv / "bin" / "py-spy"
    if binary.exists():
        return binary
    say(f"py-spy not found: installing py-spy=={PY_SPY_VERSION} into {venv}")
    for step in (
        [sys.executable, "-m", "venv", str(venv)],
        [str(venv / "bin" / "pip"), "install", "-q", f"py-spy=={PY_SPY_VERSION}"],
    ):
        try:
            res = subprocess.run(step, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as err:
            raise BenchmarkError(f"{' '.join(step)} took over {timeout_s:.0f} s") from err
        if res.returncode != 0:
            raise BenchmarkError(f"{' '.join(step)} failed ({res.returncode})", (res.stdout + res.stderr)[-3000:])
    return binary


def run_profile(setup: Setup, children: Children, rate: float, pyspy: Path, spy_cpus: str) -> Profile:
    """Run our driver at ``rate`` on the client core with py-spy attached from ``spy_cpus``."""
    setup.say(f"profiling our client with py-spy at {rate:g} req/s")
    raw = setup.out_dir / f"ours_pyspy_r{rate:g}.txt"
    out = setup.out_dir / f"ours_pyspy_r{rate:g}.json"
    argv = [
        setup.python, "-m", "benchmarks.loadgen.drive_ours",
        "--base-url", setup.base_url, "--rates", f"{rate:g}", "--seconds", f"{setup.seconds:g}",
        "--min-requests", str(setup.min_requests), "--warmup", str(setup.warmup), "--out", str(out),
    ]  # fmt: skip
    driver = Child("profiled driver", argv, setup.out_dir / "ours_pyspy_driver.log", cpus=setup.client_cpus,
                   cwd=setup.repo, env=setup.env())  # fmt: skip
    children.start(driver)
    spy_argv = [str(pyspy), "record", "--pid", str(driver.pid), "--nonblocking", "--rate", str(SAMPLE_HZ),
                "--format", "raw", "--output", str(raw)]  # fmt: skip
    spy = Child("py-spy", spy_argv, setup.out_dir / "ours_pyspy.log", cpus=spy_cpus)
    children.start(spy)
    start = time.monotonic()
    timeout = 120 + 8 * setup.seconds

    def echo(_elapsed: float) -> None:
        for line in driver.progress_lines():
            setup.say(f"  {line}")

    code = driver.wait(timeout, on_tick=echo)
    echo(0.0)
    spy.wait(max(30.0, timeout - (time.monotonic() - start)))
    if code != 0:
        raise BenchmarkError(f"the profiled driver exited with {code}", tail(driver.log_path))
    if not raw.exists():
        raise BenchmarkError("py-spy wrote no profile", tail(spy.log_path))
    point = Point.from_json(json.loads(out.read_text())["points"][0])
    return summarize_raw(raw.read_text(), rate, point.achieved)
