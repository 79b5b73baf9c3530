"""``daemon start --coordinator tcp://HOST:PORT``: join a coordinator and run the trials it leases.

``daemon tiny-model OUT_DIR`` writes the embedded tiny model (same as ``python -m daemon.tiny_model``).
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from servetune.errors import ServetuneError

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1


def _cpu_list(text: str) -> list[int]:
    """Parse ``0,2-3`` into [0, 2, 3]."""
    cpus: list[int] = []
    try:
        for part in text.split(","):
            if "-" in part:
                lo, hi = part.split("-", 1)
                cpus += list(range(int(lo), int(hi) + 1))
            elif part.strip():
                cpus.append(int(part))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a CPU list: {text!r} (expected e.g. 0,2-3)") from None
    if not cpus:
        raise argparse.ArgumentTypeError("empty CPU list")
    return cpus


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="daemon", description="servetune daemon: runs leased vLLM trials on this node")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    start = sub.add_parser("start", help="connect to a coordinator and run trials")
    start.add_argument("--coordinator", required=True, help="coordinator address, e.g. tcp://10.0.0.5:5555")
    start.add_argument("--workdir", type=Path, default=Path(os.environ.get("SERVETUNE_DAEMON_DIR", "servetune-daemon")),
                       help="where server logs and the record of started servers go")
    start.add_argument("--server-cpus", type=_cpu_list, default=None, help="cores for vLLM (default: all but the last)")
    start.add_argument("--client-cpus", type=_cpu_list, default=None,
                       help="cores for the daemon and its load generator (default: the last)")
    start.add_argument("--vllm-python", default=None,
                       help="interpreter that has vLLM installed (default: this one); a spec's backend.python wins")
    start.add_argument("--daemon-id", default=None, help="routing id (default: host-pid-random)")
    start.add_argument("--exit-with-parent", action="store_true",
                       help="stop (and stop vLLM) when the process that started this daemon dies")
    tiny = sub.add_parser("tiny-model", help="write the embedded tiny model into OUT_DIR")
    tiny.add_argument("out_dir")
    return parser


def _watch_parent(agent_stop: threading.Event, parent: int) -> None:
    """Fallback for systems without PR_SET_PDEATHSIG: poll the parent pid."""
    while not agent_stop.wait(1.0):
        if os.getppid() != parent:
            log.warning("parent process %d is gone; stopping", parent)
            agent_stop.set()
            return


def _set_pdeathsig() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    if args.command == "tiny-model":
        from daemon.tiny_model import generate

        print(generate(args.out_dir))
        return 0
    from daemon.agent import DaemonAgent, DaemonOptions

    agent = DaemonAgent(DaemonOptions(
        coordinator=args.coordinator, workdir=args.workdir, server_cpus=args.server_cpus,
        client_cpus=args.client_cpus, vllm_python=args.vllm_python, daemon_id=args.daemon_id,
    ))
    agent.install_signal_handlers()
    if args.exit_with_parent:
        parent = os.getppid()
        _set_pdeathsig()
        if os.getppid() != parent:  # the parent died before prctl took effect
            return 1
        threading.Thread(target=_watch_parent, args=(agent.stop, parent), daemon=True).start()
    started = time.monotonic()
    try:
        code = agent.run()
    except ServetuneError as exc:
        log.error("%s", exc)
        return 1
    log.info("daemon stopped after %.0f s (%s)", time.monotonic() - started, agent.stop_reason or "done")
    return code
