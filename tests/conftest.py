"""Shared fixtures. Tests that need real vLLM share ONE small session-scoped sweep (each vLLM
server start costs about 45 s on a 2-core machine), run through the real CLI: coordinator,
ZeroMQ on loopback, a child daemon, real vLLM (CPU build)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from daemon.server import VLLMServer, process_group_alive
from servetune.keys import HOME_ENV
from servetune.vllm_args import CHECK_ENGINE_ARGS_ENV
from tests.fakes.keys import fleet_home

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"

E2E_SPEC = textwrap.dedent(
    """
    name: e2e
    model: {source: tiny}
    engine:
      # eager: no torch.compile warm-up (about 25 s per server on these 2 cores)
      fixed: {max_model_len: 256, max_num_batched_tokens: 512, enforce_eager: true}
      configs:
        - {max_num_seqs: 2}
        - {max_num_seqs: 16}
        # A server that will not start must be a measurement failure and the sweep goes on. vLLM
        # refuses an unknown logging level within seconds (block_size 8, refused by the CPU attention
        # backend, shows the same path but costs 45-90 s of start-up first).
        - {max_num_seqs: 16, env: {VLLM_LOGGING_LEVEL: NOT_A_LEVEL}}
      env: {VLLM_CPU_KVCACHE_SPACE: 1}
    load_points:
      - {name: rate, request_rate: 20, num_requests: 12, input_len: 32, output_len: 16, warmup_requests: 2}
      - {name: conc, max_concurrency: 8, num_requests: 16, input_len: 32, output_len: 16, warmup_requests: 2}
    slos:
      - {metric: ttft_ms, percentile: 99, max_ms: 60000}
      - {metric: tpot_ms, percentile: 99, max_ms: 0.001}
    planner: {seed: 3}
    budgets: {server_start_timeout_s: 300, trial_timeout_s: 180}
    """
)


def cli_env(tmp_cache: Path) -> dict[str, str]:
    """The environment of CLI processes: a private cache, and a ``$SERVETUNE_HOME`` next to it with
    CURVE keys for a one-host fleet (tests.fakes.keys), so fleet sweeps and ``daemon start`` work."""
    env = dict(os.environ)
    env["SERVETUNE_CACHE"] = str(tmp_cache)
    env["PYTHONUNBUFFERED"] = "1"
    env[HOME_ENV] = str(fleet_home(tmp_cache.parent / f"{tmp_cache.name}-home"))
    return env


@pytest.fixture(autouse=True)
def _private_servetune_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reads or writes the user's ``~/.servetune``: an empty home per test.

    With an empty home, every ``daemon start`` would first ask vLLM which engine args it accepts
    (12-20 s, :mod:`daemon.vllm_args`): the tests' daemons do not, unless a test turns it on
    (``tests/test_engine_args.py``; the shared real-vLLM sweep, a session fixture, keeps the default)."""
    monkeypatch.setenv(HOME_ENV, str(tmp_path_factory.mktemp("servetune-home")))
    monkeypatch.setenv(CHECK_ENGINE_ARGS_ENV, "0")


def coordinator_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "coordinator", *args]


@dataclass
class SweepRun:
    spec_path: Path
    root: Path
    folder: Path
    proc: subprocess.CompletedProcess[str]
    seconds: float
    env: dict[str, str]
    daemon_codes: list[int | None] = field(default_factory=list)


def recorded_server_groups(folder: Path) -> list[int]:
    """Process groups of every vLLM server the daemon recorded for this experiment."""
    path = folder / "daemon" / "servers.jsonl"
    if not path.exists():
        return []
    return sorted({json.loads(line)["pgid"] for line in path.read_text().splitlines() if line.strip()})


def group_alive(pgid: int) -> bool:
    """A live (non-zombie) process is in the group; see daemon.server.process_group_alive."""
    return process_group_alive(pgid)


def wait_groups_gone(pgids: list[int], timeout_s: float = 60.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    alive = [g for g in pgids if group_alive(g)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.5)
        alive = [g for g in alive if group_alive(g)]
    return alive


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("servetune-cache")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bind to 0, read it, close)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def daemon_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "daemon", *args]


@pytest.fixture(scope="session")
def e2e_sweep(tmp_path_factory: pytest.TempPathFactory, tiny_cache: Path) -> Iterator[SweepRun]:
    """The shared real-vLLM sweep, run as a fleet: a coordinator bound on a loopback port with
    ``--no-local-daemon`` and two ``daemon start`` processes dialling it."""
    base = tmp_path_factory.mktemp("e2e")
    spec_path = base / "e2e.yaml"
    spec_path.write_text(E2E_SPEC)
    root = base / "runs"
    env = cli_env(tiny_cache)
    address = f"tcp://127.0.0.1:{free_port()}"
    ARTIFACTS.mkdir(exist_ok=True)
    t0 = time.monotonic()
    coordinator = subprocess.Popen(
        coordinator_cmd("sweep", str(spec_path), "--results-root", str(root), "--no-local-daemon",
                        "--bind", address, "--daemon-wait", "120"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=base,
    )
    daemons = []
    logs = root / "e2e" / "logs"  # where the dashboard's trial inspector reads the daemons' lines
    logs.mkdir(parents=True)
    for i in (1, 2):
        with open(logs / f"daemon-e2e-daemon-{i}.log", "wb") as fh:
            daemons.append(subprocess.Popen(
                daemon_cmd("start", "--coordinator", address, "--workdir", str(root / "e2e" / "daemon"),
                           "--daemon-id", f"e2e-daemon-{i}", "--coordinator-lost", "60"),
                stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=base,
            ))
    try:
        out, err = coordinator.communicate(timeout=1500)
    finally:
        if coordinator.poll() is None:
            coordinator.kill()
            out, err = coordinator.communicate(timeout=30)
        for d in daemons:
            try:
                d.wait(timeout=60)
            except subprocess.TimeoutExpired:
                d.kill()
                d.wait(timeout=10)
    proc = subprocess.CompletedProcess(coordinator.args, coordinator.returncode, out, err)
    run = SweepRun(spec_path, root, root / "e2e", proc, time.monotonic() - t0, env)
    run.daemon_codes = [d.returncode for d in daemons]
    for i in (1, 2):
        shutil.copy(logs / f"daemon-e2e-daemon-{i}.log", ARTIFACTS / f"e2e-daemon-{i}.log")
    (ARTIFACTS / "e2e-sweep.stdout.txt").write_text(proc.stdout)
    (ARTIFACTS / "e2e-sweep.stderr.txt").write_text(proc.stderr)
    yield run


def group_members(pgid: int) -> list[int]:
    """Pids whose process group is ``pgid`` (from /proc; field 5 of stat)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """ONE real vLLM server (CPU build) on the tiny model for the tests of the daemon's parts
    (server lifecycle, load generator); the end-to-end tests use the shared sweep instead.

    Teardown is itself a test of ``VLLMServer.stop``: every process of the group must be gone."""
    from daemon.tiny_model import generate
    from servetune.manifest import EngineConfig
    from servetune.spec import EngineArgs

    root = tmp_path_factory.mktemp("vllm-server")
    cpus = sorted(os.sched_getaffinity(0))
    server = VLLMServer(
        model=str(generate(root / "tiny")),
        served_name="tiny",
        config=EngineConfig(args=EngineArgs(max_model_len=512, max_num_seqs=4, enforce_eager=True)),
        log_path=root / "vllm.log",
        load_format="dummy",
        server_cpus=cpus[:-1] if len(cpus) > 1 else None,
    )
    try:
        server.start(timeout_s=300)
        yield server
    finally:
        pgid = server.pgid
        members = group_members(pgid) if pgid else []
        code = server.stop(timeout_s=30)
        assert server.stop() == code, "stop() must be idempotent"
        assert pgid is None or not process_group_alive(pgid), "vLLM process group survived stop()"
        assert not [pid for pid in members if pid in group_members(pgid or -1)], "a vLLM process survived stop()"
