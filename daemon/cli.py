"""``daemon start --coordinator tcp://HOST:PORT``: join a coordinator and run the trials it leases.

``daemon probe`` prints what this daemon would advertise about its devices (:mod:`daemon.devices`)
and its preflight result (:mod:`daemon.preflight`) as one JSON object, and exits 0 (it reports; a
failed preflight is in the JSON, not the exit code).

``daemon tiny-model OUT_DIR`` writes the embedded tiny model (same as ``python -m daemon.tiny_model``).
``daemon keys init|show`` manages this node's CURVE keys (:mod:`daemon.keys_cmd`).

``daemon start`` connects with CURVE: its key pair is ``$SERVETUNE_HOME/daemon/`` and the coordinator
public key it pins is ``--coordinator-key`` or the one ``daemon keys init --coordinator-key`` saved.

Exit codes of ``daemon start`` (the table of :mod:`servetune.exitcodes`):

====  ==================  ===================================================================
0     OK                  the coordinator said SHUTDOWN
1     ERROR               an error servetune did not expect (the log says which)
2     USAGE               bad flags (argparse prints the usage)
5     DAEMON_CONFIG       this node's configuration is unusable: ``--vllm-python`` is not an
                          executable file, ``--vllm-launch`` names no executable,
                          ``--workdir`` cannot be created or written,
                          ``--daemon-id`` is not a wire id, a CPU list names cores this process
                          may not use, no daemon keys or coordinator key (or a malformed one);
                          the message names the flag or file and its value
6     LOST_COORDINATOR    no word from the coordinator for ``--coordinator-lost`` seconds
                          (default 300), including never hearing a WELCOME
130   INTERRUPTED         SIGINT or SIGTERM (or the parent died with ``--exit-with-parent``)
====  ==================  ===================================================================
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import TypeAdapter, ValidationError

from daemon import keys_cmd
from servetune.artifacts import CHUNK_SIZE, MAX_CHUNK_SIZE, MIN_CHUNK_SIZE
from servetune.errors import ServetuneError
from servetune.exitcodes import ExitCode
from servetune.keys import (
    KeyFileError,
    KeyPair,
    check_key,
    daemon_dir,
    load_pair,
    pinned_coordinator_key,
    servetune_home,
    shield_key_args,
)
from servetune.messages import Id
from servetune.vllm_args import CHECK_ENGINE_ARGS_ENV

if TYPE_CHECKING:
    from daemon.agent import DaemonAgent
    from daemon.preflight import Preflight

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
DEFAULT_COORDINATOR_LOST_S = 300.0
_ENDPOINT = re.compile(r"^(tcp|ipc)://\S+$")


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


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text!r}")
    return value


def _endpoint(text: str) -> str:
    if not _ENDPOINT.match(text):
        raise argparse.ArgumentTypeError(f"not a ZeroMQ address: {text!r} (expected e.g. tcp://10.0.0.5:5555)")
    return text


def _command(text: str) -> list[str]:
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a command: {text!r} ({exc})") from None
    if not argv:
        raise argparse.ArgumentTypeError("empty command")
    return argv


def vllm_from_environment(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> None:
    """Fill ``--vllm-launch`` / ``--vllm-python`` from ``$SERVETUNE_VLLM_LAUNCH`` /
    ``$SERVETUNE_VLLM_PYTHON`` when neither flag was given (a flag always wins over the environment;
    of the two variables, the launch command wins)."""
    if args.vllm_python is not None or args.vllm_launch is not None:
        return
    launch = environ.get("SERVETUNE_VLLM_LAUNCH", "").strip()
    if launch:
        try:
            args.vllm_launch = shlex.split(launch) or None
        except ValueError:
            args.vllm_launch = [launch]  # node_problems names it: the first word is not an executable
    if args.vllm_launch is None:
        args.vllm_python = environ.get("SERVETUNE_VLLM_PYTHON") or None


def _bounded(cast: Callable[[str], float], what: str, low: float, high: float, unit: str = "") -> Callable[[str], float]:
    """An argparse type: ``cast`` of the text, within [low, high], or an error naming the value."""
    def parse(text: str) -> float:
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a {what}: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}{unit}, got {text!r}")
        return value

    return parse


def _byte_count(low: int, high: int) -> Callable[[str], float]:
    return _bounded(int, "number of bytes", low, high, " bytes")


_gib = _bounded(float, "number of GiB", 0, 1_000_000, " GiB")
_positive_int = _bounded(int, "whole number", 1, 1024)


def _preflight_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--expect-vllm-version", default=None, metavar="VERSION",
                        help="preflight: the vLLM version this node must run (default: the one installed when the "
                             "daemon joined)")
    parser.add_argument("--min-free-disk-gib", type=_gib, default=1.0, metavar="GIB",
                        help="preflight: free space the workdir needs for logs (default: %(default)g GiB)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="daemon", description="servetune daemon: runs leased vLLM trials on this node")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    start = sub.add_parser("start", help="connect to a coordinator and run trials",
                           description="Connect to a coordinator and run the trials it leases. Exit codes: 0 "
                                       "SHUTDOWN, 1 unexpected error, 2 bad flags, 5 unusable node configuration, "
                                       "6 coordinator lost, 130 signal.")
    start.add_argument("--coordinator", required=True, type=_endpoint,
                       help="coordinator address, e.g. tcp://10.0.0.5:5555")
    start.add_argument("--coordinator-key", default=None, metavar="KEY",
                       help="the coordinator's CURVE public key to pin (default: the one `daemon keys init "
                            "--coordinator-key` saved under $SERVETUNE_HOME)")
    start.add_argument("--workdir", type=Path, default=Path(os.environ.get("SERVETUNE_DAEMON_DIR", "servetune-daemon")),
                       help="where server logs and the record of started servers go")
    start.add_argument("--server-cpus", type=_cpu_list, default=None, help="cores for vLLM (default: all but the last)")
    start.add_argument("--client-cpus", type=_cpu_list, default=None,
                       help="cores for the daemon and its load generator (default: the last)")
    vllm = start.add_mutually_exclusive_group()
    vllm.add_argument("--vllm-python", default=None, metavar="PATH",
                      help="interpreter that has vLLM installed: runs `PATH -m vllm.entrypoints.openai.api_server` "
                           "(default: $SERVETUNE_VLLM_PYTHON, else this interpreter)")
    vllm.add_argument("--vllm-launch", type=_command, default=None,
                      metavar="'COMMAND ...'",
                      help="command that starts vLLM's OpenAI API server, one shell-quoted string (split like a shell, "
                           "never run by one), e.g. 'apptainer exec vllm.sif python3 -m "
                           "vllm.entrypoints.openai.api_server'; engine flags are appended (default: "
                           "$SERVETUNE_VLLM_LAUNCH). Only this node's flags choose what runs: a coordinator cannot")
    start.add_argument("--api-key-env", action="append", metavar="NAME", dest="api_key_envs",
                       default=[n for n in os.environ.get("SERVETUNE_API_KEY_ENVS", "").split(",") if n.strip()],
                       help="an environment variable of this node that a spec's backend.api_key_env may name: its "
                            "value is sent as the API key to the spec's base_url (repeatable; default: "
                            "$SERVETUNE_API_KEY_ENVS, comma-separated; none: no key leaves this node)")
    start.add_argument("--check-engine-args", action=argparse.BooleanOptionalAction,
                       default=os.environ.get(CHECK_ENGINE_ARGS_ENV, "1").strip().lower() not in ("0", "false", "no", "off"),
                       help="before joining, ask this node's vLLM (its argument parser) which engine flags it accepts, "
                            "so the coordinator never grants a config it would refuse: 12-20 s once per vLLM version, "
                            "then read from the cache (default: on, unless $SERVETUNE_CHECK_ENGINE_ARGS is 0; a "
                            "local sweep of the sim or openai backend turns it off)")
    start.add_argument("--engine-args-cache", type=Path, default=None, metavar="DIR",
                       help="where the accepted engine flags are cached, per vLLM version and interpreter "
                            "(default: $SERVETUNE_HOME/vllm-args)")
    start.add_argument("--daemon-id", default=None, help="routing id (default: host-pid-random)")
    start.add_argument("--coordinator-lost", type=_seconds, default=DEFAULT_COORDINATOR_LOST_S, metavar="SECONDS",
                       help="exit with code 6 after this long without a word from the coordinator, including "
                            "when it never answers the first HELLO (default: %(default)g)")
    start.add_argument("--upload-bytes-per-interval", type=_byte_count(1, 1024**3), default=4 * CHUNK_SIZE,
                       metavar="BYTES",
                       help="artifact upload pacing: chunk bytes sent per heartbeat interval, so uploads never "
                            "stall heartbeats (default: %(default)d, 1 MiB/s at a 1 s interval; lower it for a slow "
                            "link; below the chunk size, one chunk per interval)")
    start.add_argument("--artifact-chunk-size", type=_byte_count(MIN_CHUNK_SIZE, MAX_CHUNK_SIZE), default=CHUNK_SIZE,
                       metavar="BYTES",
                       help="chunk size of the artifacts this daemon spools and uploads (logs, samples; default: "
                            "%(default)d; a smaller one resends less after an interrupted upload)")
    start.add_argument("--max-concurrency", type=_positive_int, default=1, metavar="N",
                       help="batches this daemon runs at once, each on its own GPU set (CUDA_VISIBLE_DEVICES) sized by "
                            "its tensor_parallel_size; at most one per GPU, and one on a CPU-only node (one device), "
                            "unless --co-tenancy (default: %(default)d)")
    start.add_argument("--co-tenancy", action="store_true",
                       help="allow trials to share a device on this node (they then measure each other's load "
                            "too): --max-concurrency batches run even where the GPUs are too few for disjoint sets, "
                            "or on a CPU-only node, for experiments whose spec declares it too (hardware: "
                            "{co_tenancy: true}); others get one batch per device")
    start.add_argument("--exit-with-parent", action="store_true",
                       help="stop (and stop vLLM) when the process that started this daemon dies")
    _preflight_flags(start)
    probe = sub.add_parser("probe", help="print this node's device advertisement and preflight as JSON",
                           description="Print what `daemon start` would advertise about this node's devices "
                                       "(GPUs through NVML, or a CPU-only node) and its preflight result, as JSON.")
    probe.add_argument("--workdir", type=Path,
                       default=Path(os.environ.get("SERVETUNE_DAEMON_DIR", "servetune-daemon")),
                       help="the workdir whose free disk space preflight checks")
    probe.add_argument("--vllm-python", default=None, metavar="PATH", help="interpreter that has vLLM installed")
    probe.add_argument("--max-concurrency", type=_positive_int, default=1,
                       help="trials at once: the GPU sets shown (default: %(default)d)")
    probe.add_argument("--co-tenancy", action="store_true",
                       help="show GPU sets as if co-tenancy on one device were declared")
    _preflight_flags(probe)
    tiny = sub.add_parser("tiny-model", help="write the embedded tiny model into OUT_DIR")
    tiny.add_argument("out_dir")
    keys_cmd.register(sub)
    return parser


def node_keys(args: argparse.Namespace, problems: list[str]) -> tuple[KeyPair, str] | None:
    """This daemon's key pair and the coordinator key it pins; a problem naming the file or flag if not."""
    home = servetune_home()
    try:
        pair = load_pair(daemon_dir(home))
    except KeyFileError as exc:
        problems.append(f"daemon keys: {exc} (make them with `daemon keys init`)")
        return None
    try:
        if args.coordinator_key is not None:
            server = check_key(args.coordinator_key, "--coordinator-key")
        else:
            server = pinned_coordinator_key(home)
    except KeyFileError as exc:
        problems.append(str(exc))
        return None
    return pair, server


def node_problems(args: argparse.Namespace) -> list[str]:
    """What makes this node's configuration unusable, each naming its flag and value."""
    problems: list[str] = []
    if args.vllm_python is not None:
        path = Path(args.vllm_python)
        if not path.is_file() or not os.access(path, os.X_OK):
            problems.append(f"--vllm-python {args.vllm_python}: not an executable file")
    if args.vllm_launch is not None and shutil.which(args.vllm_launch[0]) is None:
        problems.append(f"--vllm-launch {shlex.join(args.vllm_launch)!r}: {args.vllm_launch[0]!r} is not an executable "
                        "on this node's PATH")
    if args.daemon_id is not None:
        try:
            TypeAdapter(Id).validate_python(args.daemon_id)
        except ValidationError:
            problems.append(f"--daemon-id {args.daemon_id!r}: must be 1-200 characters of A-Z a-z 0-9 . _ : @ + -")
    try:
        args.workdir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=args.workdir, prefix=".write-test-"):
            pass
    except OSError as exc:
        problems.append(f"--workdir {args.workdir}: cannot be created or written: {exc.strerror or exc}")
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    for flag, cpus in (("--server-cpus", args.server_cpus), ("--client-cpus", args.client_cpus)):
        if cpus is not None and allowed is not None and not set(cpus) <= allowed:
            outside = sorted(set(cpus) - allowed)
            problems.append(f"{flag} {','.join(map(str, cpus))}: cores {outside} are not available to this process "
                            f"(it may use {sorted(allowed)})")
    return problems


def _watch_parent(agent: DaemonAgent, parent: int) -> None:
    """Fallback for systems without PR_SET_PDEATHSIG: poll the parent pid."""
    while not agent.stop.wait(1.0):
        if os.getppid() != parent:
            log.warning("parent process %d is gone; stopping", parent)
            agent.request_stop(f"parent process {parent} gone")
            return


def _set_pdeathsig() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def node_preflight(args: argparse.Namespace, node_has_gpus: bool) -> Preflight:
    """This node's preflight settings from its flags."""
    from daemon.preflight import Preflight, VllmCheck

    return Preflight(workdir=args.workdir, node_has_gpus=node_has_gpus,
                     vllm=VllmCheck(python=args.vllm_python, launch=getattr(args, "vllm_launch", None),
                                    expected=args.expect_vllm_version),
                     min_free_disk_bytes=int(args.min_free_disk_gib * 1024**3))


def probe(args: argparse.Namespace) -> int:
    """``daemon probe``: the advertisement and the preflight, one JSON object on stdout."""
    import json

    from daemon.devices import probe_devices
    from servetune.errors import ServetuneError

    try:
        devices = probe_devices(args.vllm_python, args.max_concurrency, args.co_tenancy)
    except ServetuneError as exc:  # NVML not answering
        log.error("%s", exc)
        return ExitCode.ERROR
    result = node_preflight(args, bool(devices.gpus)).run()
    print(json.dumps({"devices": devices.model_dump(mode="json"), "preflight": result.as_dict()}, indent=2))
    return ExitCode.OK


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(shield_key_args(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    if args.command == "tiny-model":
        from daemon.tiny_model import generate

        print(generate(args.out_dir))
        return ExitCode.OK
    if args.command == "keys":
        return keys_cmd.run(args)
    if args.command == "probe":
        return probe(args)
    vllm_from_environment(args)
    problems = node_problems(args)
    keys = node_keys(args, problems)
    if problems:
        for problem in problems:
            log.error("%s", problem)
        log.error("this node's daemon configuration is unusable; exiting with %d", ExitCode.DAEMON_CONFIG)
        return ExitCode.DAEMON_CONFIG
    from daemon.agent import DaemonAgent, DaemonOptions
    from daemon.vllm_args import EngineArgsProbe

    assert keys is not None
    agent = DaemonAgent(DaemonOptions(
        coordinator=args.coordinator, workdir=args.workdir, keys=keys[0], coordinator_key=keys[1],
        server_cpus=args.server_cpus,
        client_cpus=args.client_cpus, vllm_python=args.vllm_python, vllm_launch=args.vllm_launch,
        api_key_envs=tuple(n.strip() for n in args.api_key_envs), daemon_id=args.daemon_id,
        coordinator_lost_s=args.coordinator_lost, upload_bytes_per_interval=args.upload_bytes_per_interval,
        artifact_chunk_size=args.artifact_chunk_size, preflight=node_preflight(args, node_has_gpus=False),
        max_concurrency=int(args.max_concurrency), co_tenancy=args.co_tenancy,
        engine_args=(EngineArgsProbe(python=args.vllm_python, launch=args.vllm_launch, cache=args.engine_args_cache)
                     if args.check_engine_args else None),
    ))
    agent.install_signal_handlers()
    if args.exit_with_parent:
        parent = os.getppid()
        _set_pdeathsig()
        if os.getppid() != parent:  # the parent died before prctl took effect
            return ExitCode.INTERRUPTED
        threading.Thread(target=_watch_parent, args=(agent, parent), daemon=True).start()
    started = time.monotonic()
    try:
        code = agent.run()
    except ServetuneError as exc:
        log.error("%s", exc)
        return ExitCode.ERROR
    log.info("daemon stopped after %.0f s", time.monotonic() - started)
    return int(code)

