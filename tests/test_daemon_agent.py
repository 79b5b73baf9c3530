"""A real daemon (``python -m daemon start``, or :class:`DaemonAgent` in a thread) against a scripted
coordinator: a ZeroMQ ROUTER in the test (loopback, random port, LINGER 0, every receive with a
deadline) that speaks protocol 2 by hand.

The measured endpoint is :mod:`tests.fakes.openai_server` (FAKE: it stands in for vLLM, which needs
a GPU or 45 s of CPU start-up) through the ``openai`` backend, so a batch starts nothing.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import zmq

from coordinator.zap import KeyGate, ZapHandler
from daemon.agent import DaemonAgent, DaemonOptions
from daemon.batch import BatchRunner
from servetune.exitcodes import ExitCode
from servetune.keys import coordinator_dir, daemon_dir, load_pair, servetune_home
from servetune.manifest import plan_grid
from servetune.messages import (
    Ack,
    BatchError,
    Bye,
    Grant,
    GrantedTrial,
    Heartbeat,
    Hello,
    LeaseRef,
    Message,
    Ready,
    Renewed,
    Result,
    Shutdown,
    Welcome,
    decode,
    encode,
)
from servetune.spec import parse_spec
from servetune.wire import configure_router
from tests.fakes.keys import fleet_home
from tests.fakes.openai_server import FakeOpenAIServer

REPO = Path(__file__).resolve().parents[1]
HEARTBEAT_S = 0.2
TTL_S = 1.5
M = TypeVar("M")

SPEC = textwrap.dedent(
    """
    name: agent-test
    model: {{source: path, path: "{model}", served_name: fake}}
    backend: {{kind: openai, base_url: "{url}"}}
    planner: {{randomize: false}}
    budgets: {{trial_timeout_s: 60, drain_timeout_s: 5}}
    load_points:
      - {{name: quick, max_concurrency: 2, num_requests: 2, input_len: 8, output_len: 4}}
      - {{name: long, max_concurrency: 1, num_requests: 500, input_len: 8, output_len: 32}}
    """
)


class ScriptedCoordinator:
    """A ROUTER the test drives by hand. :meth:`expect` answers heartbeats with RENEWED while
    ``renew`` is set (renewing every lease listed) and records every message it took in ``seen``."""

    def __init__(self) -> None:
        # CURVE like the real coordinator: the keys of $SERVETUNE_HOME (a private one per test,
        # conftest), which daemons started by the test find there too.
        self.home = fleet_home(servetune_home())
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        configure_router(self.sock, zmq, secret_key=load_pair(coordinator_dir(self.home)).secret)
        self.zap = ZapHandler(self.ctx, KeyGate(self.home), self.sock)
        self.zap.start()
        self.sock.bind("tcp://127.0.0.1:*")
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.peer: bytes | None = None
        self.renew = True
        self.seen: list[tuple[float, Message]] = []

    def close(self) -> None:
        self.sock.disable_monitor()
        self.sock.close(linger=0)
        self.zap.stop()
        self.ctx.term()

    def agent_keys(self) -> dict[str, Any]:
        """The key options of an in-process DaemonAgent dialling this coordinator."""
        return {"keys": load_pair(daemon_dir(self.home)), "coordinator_key": load_pair(coordinator_dir(self.home)).public}

    def send(self, msg: object) -> None:
        assert self.peer is not None
        self.sock.send_multipart([self.peer, encode(msg)])  # type: ignore[arg-type]

    def recv(self, timeout_s: float) -> Message:
        if not self.sock.poll(max(0, int(timeout_s * 1000)), zmq.POLLIN):
            raise TimeoutError(f"nothing from the daemon within {timeout_s:.1f} s")
        peer, frame = self.sock.recv_multipart()
        self.peer = peer
        msg = decode(frame)
        self.seen.append((time.monotonic(), msg))
        if isinstance(msg, Heartbeat) and self.renew:
            self.send(Renewed(seq=msg.seq, leases=msg.leases, ttl_s=TTL_S))
        return msg

    def expect(self, kind: type[M], timeout_s: float, where: Callable[[M], bool] = lambda m: True) -> M:
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {kind.__name__} within {timeout_s:.1f} s; saw "
                                   f"{[type(m).__name__ for _, m in self.seen[-20:]]}")
            msg = self.recv(remaining)
            if isinstance(msg, kind) and where(msg):
                return msg

    def since(self, t: float, kind: type[M]) -> list[M]:
        return [m for at, m in self.seen if at >= t and isinstance(m, kind)]

    def join(self, timeout_s: float = 15.0) -> Hello:
        """HELLO -> WELCOME -> READY; returns the HELLO."""
        hello = self.expect(Hello, timeout_s)
        self.send(Welcome(session_nonce=hello.session_nonce, coordinator_id="scripted",
                          heartbeat_interval_s=HEARTBEAT_S, lease_ttl_s=TTL_S))
        ready = self.expect(Ready, 5)
        assert ready.session_nonce == hello.session_nonce
        return hello


@pytest.fixture
def coordinator() -> Iterator[ScriptedCoordinator]:
    coord = ScriptedCoordinator()
    try:
        yield coord
    finally:
        coord.close()


@pytest.fixture
def fake_endpoint() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(token_delay_ms=2.0, ttft_ms=2.0) as server:
        yield server


def make_grant(tmp_path: Path, base_url: str, batch_id: str = "b1") -> Grant:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"vocab_size": 1000}))
    spec = parse_spec(SPEC.format(model=model, url=base_url))
    batch = plan_grid(spec).batches[0]
    return Grant(batch_id=batch_id, epoch=1, ttl_s=TTL_S, model=spec.model, backend=spec.backend,
                 budgets=spec.budgets, config=batch.config,
                 trials=[GrantedTrial(trial_id=t.trial_id, attempt=1, manifest=t) for t in batch.trials])


class Daemon:
    """``python -m daemon start`` as a child process; its log goes to ``log_path``."""

    def __init__(self, tmp_path: Path, *args: str):
        self.log_path = tmp_path / "daemon.log"
        fleet_home(servetune_home())  # its CURVE keys, in this test's $SERVETUNE_HOME
        env = dict(os.environ, PYTHONUNBUFFERED="1", SERVETUNE_CACHE=str(tmp_path / "cache"))
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "daemon", "start", "--workdir", str(tmp_path / "work"), *args],
                stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env,
            )

    def wait(self, timeout_s: float) -> int:
        return self.proc.wait(timeout=timeout_s)

    def log(self) -> str:
        return self.log_path.read_text()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    started: list[Daemon] = []
    try:
        yield started
    finally:
        for d in started:
            d.kill()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------- the protocol, end to end


@pytest.mark.timeout(90)
def test_result_then_silence_fences_then_reconnect_then_shutdown(
    coordinator: ScriptedCoordinator, fake_endpoint: FakeOpenAIServer, tmp_path: Path, daemons: list[Daemon]
) -> None:
    d = Daemon(tmp_path, "--coordinator", coordinator.address, "--daemon-id", "agent-test", "--coordinator-lost", "30")
    daemons.append(d)
    hello = coordinator.join()
    assert (hello.daemon_id, hello.held) == ("agent-test", [])
    first = hello.session_nonce

    # idle heartbeats, every 0.2 s
    t_idle = time.monotonic()
    beats = [coordinator.expect(Heartbeat, 3) for _ in range(4)]
    assert all(b.leases == [] and b.session_nonce == first for b in beats)
    assert 0.4 < time.monotonic() - t_idle < 2.0
    assert [b.seq for b in beats] == sorted({b.seq for b in beats})

    grant = make_grant(tmp_path, fake_endpoint.base_url)
    quick, long = grant.trials
    coordinator.send(grant)
    result = coordinator.expect(Result, 20)
    assert (result.trial_id, result.epoch, result.session_nonce) == (quick.trial_id, 1, first)
    assert result.outcome.status == "ok", result.outcome.error
    both = [LeaseRef(trial_id=quick.trial_id, epoch=1), LeaseRef(trial_id=long.trial_id, epoch=1)]
    # busy heartbeats list every lease, the one whose result awaits its answer included
    coordinator.expect(Heartbeat, 2, where=lambda b: b.leases == both)
    coordinator.send(Ack(trial_id=quick.trial_id, submission_id=result.submission_id))
    coordinator.expect(Heartbeat, 2, where=lambda b: b.leases == both[1:])  # the ACK released the first lease

    # the coordinator goes silent: the lease of the long trial runs out 1.5 s after its last renewal
    coordinator.renew = False
    t_silent = time.monotonic()
    hello2 = coordinator.expect(Hello, 10)
    assert hello2.session_nonce != first and hello2.held == [], "a fenced daemon holds nothing"
    assert coordinator.since(t_silent, Result) == [], "the fenced trial submits nothing"
    assert any(b.leases == [] for b in coordinator.since(t_silent, Heartbeat)), "fenced before reconnecting"
    served = fake_endpoint.requests_received
    time.sleep(0.5)
    assert fake_endpoint.requests_received == served, "the fenced trial's load stopped"
    log = d.log()
    assert "lease expired: could not renew within TTL" in log and long.trial_id[:12] in log
    assert "aborting batch b1" in log

    # welcomed again: READY for new work, then SHUTDOWN -> BYE and exit 0
    coordinator.renew = True
    coordinator.send(Welcome(session_nonce=hello2.session_nonce, coordinator_id="scripted",
                             heartbeat_interval_s=HEARTBEAT_S, lease_ttl_s=TTL_S))
    coordinator.expect(Ready, 5, where=lambda r: r.session_nonce == hello2.session_nonce)
    coordinator.send(Shutdown(reason="test done"))
    bye = coordinator.expect(Bye, 5)
    assert bye.session_nonce == hello2.session_nonce and "test done" in bye.reason
    assert d.wait(15) == ExitCode.OK


class CrashingRunner(BatchRunner):
    """A runner whose own code raises: stands in for a bug in the daemon."""

    def run(self, grant: Grant) -> None:
        self._prepare(grant)

    def _prepare(self, grant: Grant) -> None:
        raise RuntimeError(f"our own bug while preparing batch {grant.batch_id}")


@pytest.mark.timeout(60)
def test_a_crash_of_our_code_is_a_batch_error_with_its_traceback(
    coordinator: ScriptedCoordinator, tmp_path: Path
) -> None:
    # server_cpus given and client_cpus not: the agent pins nothing (it runs inside pytest)
    agent = DaemonAgent(DaemonOptions(coordinator=coordinator.address, workdir=tmp_path / "work", server_cpus=[0],
                                      daemon_id="crash-test", coordinator_lost_s=30, **coordinator.agent_keys()),
                        runner_factory=CrashingRunner)
    codes: list[ExitCode] = []
    thread = threading.Thread(target=lambda: codes.append(agent.run()), daemon=True)
    thread.start()
    try:
        hello = coordinator.join()
        coordinator.send(make_grant(tmp_path, "http://127.0.0.1:9"))
        error = coordinator.expect(BatchError, 10)
        assert (error.batch_id, error.epoch, error.session_nonce) == ("b1", 1, hello.session_nonce)
        assert error.error == "RuntimeError: our own bug while preparing batch b1"
        assert "Traceback (most recent call last)" in error.traceback_tail and "in _prepare" in error.traceback_tail
        assert len(error.traceback_tail.splitlines()) <= 40
        coordinator.expect(Ready, 5)  # the daemon stays up and asks for new work
        assert coordinator.since(0, Result) == []
        coordinator.send(Shutdown(reason="test done"))
        coordinator.expect(Bye, 5)
        thread.join(timeout=15)
        assert codes == [ExitCode.OK]
    finally:
        agent.request_stop("test over")
        thread.join(timeout=15)


# --------------------------------------------------------------------------- exit codes


@pytest.mark.timeout(30)
def test_no_coordinator_at_all_exits_lost_coordinator(tmp_path: Path, daemons: list[Daemon]) -> None:
    t0 = time.monotonic()
    d = Daemon(tmp_path, "--coordinator", f"tcp://127.0.0.1:{free_port()}", "--coordinator-lost", "2")
    daemons.append(d)
    assert d.wait(15) == ExitCode.LOST_COORDINATOR, d.log()
    assert time.monotonic() - t0 < 6.0
    assert "no word from the coordinator" in d.log()


@pytest.mark.timeout(30)
def test_sigterm_says_bye_and_exits_interrupted(coordinator: ScriptedCoordinator, tmp_path: Path,
                                                daemons: list[Daemon]) -> None:
    d = Daemon(tmp_path, "--coordinator", coordinator.address)
    daemons.append(d)
    hello = coordinator.join()
    d.proc.send_signal(signal.SIGTERM)
    bye = coordinator.expect(Bye, 5)
    assert bye.session_nonce == hello.session_nonce and "SIGTERM" in bye.reason
    assert d.wait(10) == ExitCode.INTERRUPTED


@pytest.mark.timeout(30)
@pytest.mark.parametrize("flag, value", [
    ("--vllm-python", "/nonexistent"),
    ("--daemon-id", "not a wire id!"),
    ("--workdir", "{tmp}/a-file/work"),
    ("--server-cpus", "100000"),
])
def test_an_unusable_node_configuration_exits_daemon_config(tmp_path: Path, flag: str, value: str,
                                                             caplog: pytest.LogCaptureFixture,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    value = value.format(tmp=tmp_path)
    args = ["--workdir", str(tmp_path / "work")] if flag != "--workdir" else []
    argv = ["start", "--coordinator", "tcp://127.0.0.1:9", *args, flag, value]
    code, err = _daemon_cli(argv, real=flag == "--vllm-python", caplog=caplog, monkeypatch=monkeypatch)
    assert code == ExitCode.DAEMON_CONFIG, err
    assert f"{flag} {value}" in err or f"{flag} {value!r}" in err, err


def _daemon_cli(argv: list[str], *, real: bool, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
                capsys: pytest.CaptureFixture[str] | None = None) -> tuple[int, str]:
    """``python -m daemon ARGV``: its exit code and stderr, as a real child process when ``real``
    (one case of each test), else in-process through the same entry function (``daemon.cli.main``;
    its log lines read from ``caplog``, argparse's usage from ``capsys``)."""
    if real:
        proc = subprocess.run([sys.executable, "-m", "daemon", *argv], capture_output=True, text=True, timeout=20,
                              cwd=REPO)
        return proc.returncode, proc.stderr
    from daemon.cli import main

    monkeypatch.chdir(REPO)
    caplog.set_level("INFO")
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code if isinstance(exc.code, int) else 1
    err = capsys.readouterr().err if capsys is not None else ""
    return int(code), err + caplog.text


@pytest.mark.timeout(30)
@pytest.mark.parametrize("args", [["--coordinator-lost", "-1"], ["--coordinator-lost", "soon"], []])
def test_bad_flags_exit_usage(tmp_path: Path, args: list[str], caplog: pytest.LogCaptureFixture,
                              monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    coordinator = [] if not args else ["--coordinator", "tcp://127.0.0.1:9"]
    code, err = _daemon_cli(["start", "--workdir", str(tmp_path), *coordinator, *args], real=args == [],
                            caplog=caplog, monkeypatch=monkeypatch, capsys=capsys)
    assert code == ExitCode.USAGE, err
    assert "usage:" in err


@pytest.mark.timeout(60)
def test_exit_with_parent_stops_the_daemon_when_its_parent_dies(coordinator: ScriptedCoordinator,
                                                                tmp_path: Path) -> None:
    log_path = tmp_path / "daemon.log"
    parent_code = textwrap.dedent(f"""
        import subprocess, sys, time
        with open({str(log_path)!r}, "w") as log:
            child = subprocess.Popen([sys.executable, "-m", "daemon", "start", "--coordinator", {coordinator.address!r},
                                      "--workdir", {str(tmp_path / "work")!r}, "--exit-with-parent"],
                                     stdout=log, stderr=subprocess.STDOUT)
        print(child.pid, flush=True)
        time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True, cwd=REPO)
    child_pid: int | None = None
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        hello = coordinator.join()
        parent.kill()
        parent.wait(timeout=10)
        bye = coordinator.expect(Bye, 10)
        assert bye.session_nonce == hello.session_nonce
        deadline = time.monotonic() + 10
        while "exits with 130" not in log_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "exits with 130 (INTERRUPTED)" in log_path.read_text()
    finally:
        parent.kill()
        parent.wait(timeout=10)
        if child_pid is not None:
            try:
                os.kill(child_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
