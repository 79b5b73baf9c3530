"""Authentication and trust on real sockets on loopback: the coordinator's CURVE ROUTER with its ZAP
handler, daemons pinning the coordinator's key, the allow-list re-read during a sweep, and identity
by CURVE key. Every refusal is asserted where it happened (the refusing side's counter and log
line), not only by the silence of the other side."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import xarray as xr
import zmq
from zmq.utils.monitor import recv_monitor_message

from coordinator.transport import RouterEndpoint
from coordinator.zap import KeyGate, ZapHandler
from daemon.agent import DaemonAgent, DaemonOptions
from servetune.exitcodes import ExitCode
from servetune.keys import (
    KeyPair,
    add_to_allow_list,
    check_key,
    coordinator_dir,
    daemon_dir,
    key_id,
    load_pair,
    remove_from_allow_list,
    save_coordinator_key,
    save_pair,
    shield_key_args,
)
from servetune.messages import Ack, Capabilities, Hello, Ready, Result, Welcome, decode, encode
from servetune.result import Fingerprint, RequestSample, TrialOutcome
from servetune.wire import IO_THREAD_PREFIX, batch_io_threads, configure_router, thread_ids, wait_for_io_threads
from tests.fakes.keys import fleet_home, new_pair
from tests.fleet_harness import Fleet, check_invariants, wait_for
from tests.test_fleet_faults import endpoint  # noqa: F401 (the fake endpoint fixture, module scope)

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[1]


def _until(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    return wait_for(predicate, timeout_s, what, poll_s=0.02)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return fleet_home(tmp_path / "home")


@pytest.fixture
def router(home: Path) -> Iterator[RouterEndpoint]:
    ep = RouterEndpoint("tcp://127.0.0.1:0", server=load_pair(coordinator_dir(home)), gate=KeyGate(home))
    try:
        yield ep
    finally:
        ep.close()


class Client:
    """A bare DEALER (a test double of a daemon's socket, or of an attacker's)."""

    def __init__(self, address: str, routing_id: str, pair: KeyPair | None, server_key: str | None,
                 reconnect_ivl_ms: int = 100) -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RECONNECT_IVL, reconnect_ivl_ms)
        self.sock.setsockopt(zmq.IDENTITY, routing_id.encode())
        if pair is not None and server_key is not None:
            self.sock.setsockopt(zmq.CURVE_SERVERKEY, server_key.encode())
            self.sock.setsockopt(zmq.CURVE_PUBLICKEY, pair.public.encode())
            self.sock.setsockopt(zmq.CURVE_SECRETKEY, pair.secret.encode())
        self.sock.connect(address)

    def send(self, msg: object) -> None:
        self.sock.send(encode(msg), zmq.NOBLOCK)  # type: ignore[arg-type]

    def recv(self, timeout_s: float) -> object | None:
        if not self.sock.poll(int(timeout_s * 1000)):
            return None
        return decode(self.sock.recv())

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


def _client(router: RouterEndpoint, pair: KeyPair | None, routing_id: str = "d1",
            server_key: str | None = None) -> Client:
    return Client(router.address, routing_id, pair, server_key or router.server_key)


def _recv(router: RouterEndpoint, timeout_s: float) -> tuple[str, Any, str] | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = router.recv(50)
        if got is not None:
            return got
    return None


def _ready(n: int = 0) -> Ready:
    return Ready(session_nonce=f"nonce-{n}", seq=n)


# ---------------------------------------------------------------------- the coordinator's door


def test_an_admitted_key_is_heard_under_its_key(router: RouterEndpoint, home: Path) -> None:
    pair = load_pair(daemon_dir(home))
    c = _client(router, pair)
    try:
        c.send(_ready())
        got = _recv(router, 5)
        assert got is not None, "an admitted daemon's message did not arrive"
        assert got[0] == "d1" and isinstance(got[1], Ready) and got[2] == pair.public
        assert sum(router.gate.counts.values()) == 0
    finally:
        c.close()


def _io_threads() -> dict[int, int]:
    """This process's libzmq I/O threads: thread id -> scheduling policy."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm", encoding="utf-8") as fh:
                if fh.read().startswith(IO_THREAD_PREFIX):
                    out[int(tid)] = os.sched_getscheduler(int(tid))
        except OSError:
            continue
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_BATCH and /proc/self/task are Linux's")
def test_the_routers_io_thread_does_not_preempt_the_loop(router: RouterEndpoint) -> None:
    """The coordinator's sends wake its I/O thread without preempting its loop (servetune.wire)."""
    threads = _io_threads()
    assert threads, "no libzmq I/O thread found"
    assert set(threads.values()) == {os.SCHED_BATCH}, threads
    before = thread_ids()
    ctx = zmq.Context()  # a context of its own: its I/O thread starts under the default policy
    sock = ctx.socket(zmq.DEALER)
    try:
        fresh = wait_for_io_threads(before, 1, timeout_s=10)  # named once it first runs, not at socket()
        assert fresh <= set(_io_threads())
        assert fresh and {_io_threads()[t] for t in fresh} == {os.SCHED_OTHER}
        assert fresh <= set(batch_io_threads())
        assert {_io_threads()[t] for t in fresh} == {os.SCHED_BATCH}
    finally:
        sock.close(linger=0)
        ctx.term()


def test_io_threads_are_awaited_until_they_have_named_themselves(tmp_path: Path) -> None:
    """libzmq's I/O thread names itself when it first runs, after ``ctx.socket()`` returned (the
    flaky "no libzmq I/O thread found"): the wait sees it once named, and gives up at its deadline."""
    task = tmp_path / "task"
    for tid, name in ((100, "python"), (200, "python")):
        (task / str(tid)).mkdir(parents=True)
        (task / str(tid) / "comm").write_text(name + "\n")
    before = {100}
    renamer = threading.Timer(0.2, lambda: (task / "200" / "comm").write_text(IO_THREAD_PREFIX + "0\n"))
    renamer.start()
    t0 = time.monotonic()
    assert wait_for_io_threads(before, 1, timeout_s=10, task_dir=str(task)) == {200}
    assert 0.15 < time.monotonic() - t0 < 5
    (task / "100" / "comm").write_text(IO_THREAD_PREFIX + "1\n")  # named, but there before: not this context's
    t0 = time.monotonic()
    assert wait_for_io_threads(before | {200}, 1, timeout_s=0.3, task_dir=str(task)) == set()
    assert time.monotonic() - t0 >= 0.3


def test_a_plaintext_client_reaches_the_coordinator_and_is_refused(
        router: RouterEndpoint, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="coordinator.zap")
    c = _client(router, None)  # no CURVE at all
    try:
        c.send(_ready())
        _until(lambda: router.gate.counts["plaintext"] >= 1, 5, "the plaintext handshake to be refused")
        assert _recv(router, 0.5) is None
        assert "refused (plaintext)" in caplog.text
    finally:
        c.close()


def test_an_unknown_key_reaches_the_zap_handler_and_is_refused(
        router: RouterEndpoint, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="coordinator.zap")
    stranger = new_pair()  # knows the server key, as anyone may
    c = _client(router, stranger)
    try:
        c.send(_ready())
        _until(lambda: router.gate.counts["unknown_key"] >= 1, 5, "the unknown key to be refused")
        assert _recv(router, 0.5) is None
        assert f"key {key_id(stranger.public)}" in caplog.text and "not in the allow-list" in caplog.text
        assert router.gate.counts["plaintext"] == 0
    finally:
        c.close()


def test_a_client_that_pinned_another_coordinator_key_is_refused(router: RouterEndpoint, home: Path) -> None:
    c = _client(router, load_pair(daemon_dir(home)), server_key=new_pair().public)
    try:
        c.send(_ready())
        _until(lambda: router.gate.counts["bad_handshake"] >= 1, 5, "the failed handshake to be counted")
        assert _recv(router, 0.5) is None
    finally:
        c.close()


def test_a_removed_key_is_refused_on_its_live_connection_and_on_reconnect(
        router: RouterEndpoint, home: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="coordinator")
    pair = load_pair(daemon_dir(home))
    c = _client(router, pair)
    try:
        c.send(_ready(1))
        assert _recv(router, 5) is not None
        time.sleep(0.02)  # a new mtime even on coarse clocks
        remove_from_allow_list(home, "test-daemon")
        removed: list[str] = []
        _until(lambda: removed.extend(router.gate.take_removed()) or removed, 5, "the allow-list to be re-read")
        assert removed == [pair.public]
        c.send(_ready(2))  # the connection is still open: libzmq checked the key only at its handshake
        assert _recv(router, 1.0) is None
        assert router.gate.counts["removed_key"] == 1
        assert "refused (removed_key)" in caplog.text
    finally:
        c.close()
    again = _client(router, pair, routing_id="d1-again")
    try:
        again.send(_ready(3))
        _until(lambda: router.gate.counts["unknown_key"] >= 1, 5, "the removed key's new connection to be refused")
        assert _recv(router, 0.5) is None
    finally:
        again.close()


def test_a_key_added_while_running_is_admitted(router: RouterEndpoint) -> None:
    newcomer = new_pair()
    assert router.gate.home is not None
    time.sleep(0.02)
    add_to_allow_list(router.gate.home, "newcomer", newcomer.public)
    _until(lambda: router.gate.name(newcomer.public) == "newcomer", 5, "the allow-list to be re-read")
    c = _client(router, newcomer)
    try:
        c.send(_ready())
        got = _recv(router, 5)
        assert got is not None and got[2] == newcomer.public
    finally:
        c.close()


# ---------------------------------------------------------------------- the daemon pins the coordinator


class FakeCoordinator:
    """A ROUTER posing as the coordinator: CURVE with its own key pair and a ZAP handler that admits
    the daemon's key (so only the pinned server key can stop it), or plaintext. It records what it got."""

    def __init__(self, admit: str, curve: bool = True) -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.gate = KeyGate(None, extra={admit: "victim"})
        self.zap: ZapHandler | None = None
        self.events: list[dict[str, Any]] = []
        if curve:
            configure_router(self.sock, zmq, secret_key=new_pair().secret)
            self.zap = ZapHandler(self.ctx, self.gate, self.sock)
            self.zap.start()
        else:
            self.sock.setsockopt(zmq.LINGER, 0)
            self.sock.monitor("inproc://fake-monitor",
                              zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
            self.monitor = self.ctx.socket(zmq.PAIR)
            self.monitor.connect("inproc://fake-monitor")
        self.sock.bind("tcp://127.0.0.1:*")
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.received: list[list[bytes]] = []

    def watch(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.sock.poll(50):
                self.received.append(self.sock.recv_multipart())
            if self.zap is None and self.monitor.poll(0):
                self.events.append(recv_monitor_message(self.monitor))

    def close(self) -> None:
        self.sock.disable_monitor()
        self.sock.close(linger=0)
        if self.zap is not None:
            self.zap.stop()
        else:
            self.monitor.close(linger=0)
        self.ctx.term()


@pytest.mark.parametrize("curve", [True, False], ids=["curve-with-another-key", "plaintext"])
def test_a_fake_coordinator_gets_nothing_from_a_daemon(home: Path, tmp_path: Path, curve: bool,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="daemon.agent")
    pair = load_pair(daemon_dir(home))
    fake = FakeCoordinator(admit=pair.public, curve=curve)
    agent = DaemonAgent(DaemonOptions(coordinator=fake.address, workdir=tmp_path / "work", server_cpus=[0],
                                      daemon_id="victim", coordinator_lost_s=2.5, keys=pair,
                                      coordinator_key=load_pair(coordinator_dir(home)).public))
    codes: list[ExitCode] = []
    thread = threading.Thread(target=lambda: codes.append(agent.run()), daemon=True)
    thread.start()
    try:
        fake.watch(3.0)
        thread.join(timeout=20)
        assert codes == [ExitCode.LOST_COORDINATOR], "the daemon must never hear a WELCOME from a fake"
        assert fake.received == [], "the fake coordinator received a message"
        if curve:  # the daemon's HELLO reached it and failed: it cannot open the box made for the real key
            assert fake.gate.counts["bad_handshake"] >= 1, fake.gate.counts
            assert "CURVE handshake with" in caplog.text and "failed" in caplog.text
        else:  # a mechanism mismatch, or the daemon hanging up first on seeing the NULL greeting
            assert any(e["value"] == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
                       or e["event"] == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL for e in fake.events), fake.events
    finally:
        agent.request_stop("test over")
        thread.join(timeout=15)
        fake.close()


# ---------------------------------------------------------------------- key files and the CLI


def _cli(module: str, *args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SERVETUNE_HOME": str(home), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=30,
                          env=env, cwd=REPO)


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
            ) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``_cli`` in-process: the same entry function ``python -m coordinator`` / ``python -m daemon`` runs
    (``coordinator.cli.main`` / ``daemon.cli.main``), its exit code and what it printed. Each CLI is
    still run as a real child process by ``_cli`` in the tests below."""
    from coordinator.cli import main as coordinator_main
    from daemon.cli import main as daemon_main

    mains = {"coordinator": coordinator_main, "daemon": daemon_main}

    def run(module: str, *args: str, home: Path) -> subprocess.CompletedProcess[str]:
        monkeypatch.setenv("SERVETUNE_HOME", str(home))
        capsys.readouterr()
        try:
            code = mains[module](list(args))
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code if isinstance(exc.code, int) else 1
        out = capsys.readouterr()
        return subprocess.CompletedProcess([module, *args], int(code), out.out, out.err)

    return run


def test_keys_cli_makes_private_keys_and_manages_the_allow_list(
        tmp_path: Path, run_cli: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    home = tmp_path / "h"
    init = _cli("coordinator", "keys", "init", home=home)  # a real child process; the rest in-process
    assert init.returncode == 0, init.stderr
    coordinator_public = init.stdout.strip()
    secret = home / "coordinator" / "secret.key"
    assert secret.stat().st_mode & 0o777 == 0o600
    assert (home / "coordinator").stat().st_mode & 0o777 == 0o700
    assert run_cli("coordinator", "keys", "show", home=home).stdout.strip() == coordinator_public
    again = run_cli("coordinator", "keys", "init", home=home)  # keeps the pair
    assert again.stdout.strip() == coordinator_public and "kept" in again.stderr
    node = tmp_path / "node"
    d = _cli("daemon", "keys", "init", "--coordinator-key", coordinator_public, home=node)  # a real child
    assert d.returncode == 0, d.stderr
    daemon_public = d.stdout.strip()
    assert (node / "daemon" / "secret.key").stat().st_mode & 0o777 == 0o600
    assert (node / "daemon" / "coordinator.key").read_text().strip() == coordinator_public
    shown = run_cli("daemon", "keys", "show", home=node)
    assert shown.stdout.strip() == daemon_public and coordinator_public in shown.stderr
    add = run_cli("coordinator", "keys", "add", "gpu-1", daemon_public, home=home)
    assert add.returncode == 0, add.stderr
    listed = run_cli("coordinator", "keys", "list", home=home).stdout
    assert f"gpu-1\t{key_id(daemon_public)}\t{daemon_public}" in listed
    assert (home / "coordinator" / "daemons.allow").stat().st_mode & 0o777 == 0o600
    rm = run_cli("coordinator", "keys", "remove", "gpu-1", home=home)
    assert rm.returncode == 0 and "gpu-1" not in run_cli("coordinator", "keys", "list", home=home).stdout


@pytest.mark.parametrize(("args", "needle"), [
    (["add", "gpu-1", "not-a-key"], "'not-a-key' is not a CURVE public key"),
    (["add", "bad name!", "x" * 40], "daemon name 'bad name!'"),
    (["remove", "nobody"], "no daemon named 'nobody'"),
    (["show"], "no public key at"),
])
def test_keys_cli_errors_name_the_bad_value_and_exit_usage(
        tmp_path: Path, args: list[str], needle: str, run_cli: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    proc = run_cli("coordinator", "keys", *args, home=tmp_path / "h")
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert needle in proc.stderr, proc.stderr


def test_a_duplicate_name_or_key_and_a_world_readable_secret_are_refused(
        tmp_path: Path, run_cli: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    home = tmp_path / "h"
    key = new_pair().public
    assert run_cli("coordinator", "keys", "add", "a", key, home=home).returncode == 0
    dup = run_cli("coordinator", "keys", "add", "b", key, home=home)
    assert dup.returncode == ExitCode.USAGE and "already in the allow-list as 'a'" in dup.stderr
    assert run_cli("coordinator", "keys", "init", home=home).returncode == 0
    (home / "coordinator" / "secret.key").chmod(0o644)
    shown = run_cli("coordinator", "keys", "show", home=home)
    assert shown.returncode == ExitCode.USAGE and "readable by others" in shown.stderr


def _pair_beginning_with(prefix: str) -> KeyPair:
    """A real CURVE pair whose public key begins with ``prefix`` (one in 85 begins with ``-``)."""
    for _ in range(100_000):
        pair = new_pair()
        if pair.public.startswith(prefix):
            return pair
    raise AssertionError(f"no key beginning with {prefix!r} in 100,000 tries")


def test_keys_beginning_with_a_dash_pass_every_cli_that_takes_a_key(tmp_path: Path) -> None:
    """The stop-33 CI failure: a coordinator key that began with ``-`` made ``daemon keys init
    --coordinator-key KEY`` exit 2 ("expected one argument"). Real child processes, keys forced to begin
    with ``-`` and ``--``, as option values and as the positional KEY of ``keys add``."""
    for prefix in ("-", "--"):
        coordinator, daemon = _pair_beginning_with(prefix), _pair_beginning_with(prefix)
        home, node = tmp_path / f"coord{len(prefix)}", tmp_path / f"node{len(prefix)}"
        save_pair(coordinator_dir(home), coordinator)
        save_pair(daemon_dir(node), daemon)
        init = _cli("daemon", "keys", "init", "--coordinator-key", coordinator.public, home=node)
        assert init.returncode == 0, init.stderr
        assert (node / "daemon" / "coordinator.key").read_text().strip() == coordinator.public
        add = _cli("coordinator", "keys", "add", "gpu-1", daemon.public, home=home)
        assert add.returncode == 0, add.stderr
        assert f"gpu-1\t{key_id(daemon.public)}\t{daemon.public}" in _cli("coordinator", "keys", "list",
                                                                           home=home).stdout
        # daemon start parses its --coordinator-key the same way: the key is accepted, then the start
        # fails on the malformed --workdir below (a file), not on the key
        (tmp_path / "afile").write_text("")
        start = _cli("daemon", "start", "--coordinator", "tcp://127.0.0.1:9", "--workdir", str(tmp_path / "afile"),
                     "--coordinator-key", coordinator.public, home=node)
        assert "expected one argument" not in start.stderr and "--coordinator-key" not in start.stderr, start.stderr


def test_shield_key_args_leaves_flags_and_other_values_alone() -> None:
    key = _pair_beginning_with("-").public
    argv = ["keys", "add", "gpu-1", key, "--force", "-v", "--coordinator-key", "x" * 40, "-" + "a" * 39]
    shielded = shield_key_args(argv)
    assert shielded[3] == " " + key and check_key(shielded[3]) == key
    assert shielded[:3] + shielded[4:] == argv[:3] + argv[4:], "a flag, a key without a dash or a flag-shaped token"


def test_daemon_start_without_keys_exits_daemon_config_saying_what_to_run(tmp_path: Path) -> None:
    proc = _cli("daemon", "start", "--coordinator", "tcp://127.0.0.1:9", "--workdir", str(tmp_path / "w"),
                home=tmp_path / "empty")
    assert proc.returncode == ExitCode.DAEMON_CONFIG, proc.stderr
    assert "daemon keys init" in proc.stderr
    home = tmp_path / "node"
    save_pair(daemon_dir(home), new_pair())
    bad = _cli("daemon", "start", "--coordinator", "tcp://127.0.0.1:9", "--workdir", str(tmp_path / "w"),
               "--coordinator-key", "short", home=home)
    assert bad.returncode == ExitCode.DAEMON_CONFIG and "--coordinator-key 'short'" in bad.stderr


def test_secret_files_are_never_readable_by_others_even_with_a_lax_umask(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import servetune.keys

    at_creation: list[int] = []  # the mode of each file the moment it exists, before a byte is written
    real_fdopen = os.fdopen

    def fdopen(fd: int, *args: Any, **kw: Any) -> Any:
        at_creation.append(os.fstat(fd).st_mode & 0o777)
        return real_fdopen(fd, *args, **kw)

    monkeypatch.setattr(servetune.keys.os, "fdopen", fdopen)
    old = os.umask(0)
    try:
        save_pair(tmp_path / "k", new_pair())
    finally:
        os.umask(old)
    assert at_creation and set(at_creation) == {0o600}, at_creation
    assert (tmp_path / "k" / "secret.key").stat().st_mode & 0o777 == 0o600
    assert [p.name for p in (tmp_path / "k").iterdir() if p.name.endswith(".tmp")] == []


# ---------------------------------------------------------------------- a sweep: removal and identity


@pytest.fixture
def fleet(tmp_path: Path, endpoint: str) -> Iterator[Fleet]:  # noqa: F811 (the imported fixture)
    f = Fleet(tmp_path, endpoint, repeats=2, requests=60)
    yield f
    f.close()


def _second_daemon_home(fleet: Fleet, name: str = "second") -> tuple[Path, KeyPair]:
    """Another node's $SERVETUNE_HOME: its own pair, the fleet's coordinator key pinned, admitted as ``name``."""
    home = fleet.tmp / f"home-{name}"
    pair = new_pair()
    save_pair(daemon_dir(home), pair)
    save_coordinator_key(home, load_pair(coordinator_dir(fleet.home)).public)
    add_to_allow_list(fleet.home, name, pair.public)
    return home, pair


def test_removing_a_key_cuts_the_live_session_and_fences_its_leases(fleet: Fleet) -> None:
    first = load_pair(daemon_dir(fleet.home))
    second_home, second = _second_daemon_home(fleet)
    fleet.start_coordinator()
    d1 = fleet.start_daemon("d1", None, "--coordinator-lost", "4")
    wait_for(lambda: fleet.measuring_on("d1"), 60, "d1 to measure")
    removed = _cli("coordinator", "keys", "remove", "test-daemon", home=fleet.home)
    assert removed.returncode == 0, removed.stderr
    d2 = fleet.start_daemon("d2", home=second_home)
    code, _, log = fleet.wait_coordinator(120)
    assert code == 0, log[-4000:]
    assert d1.wait(timeout=30) == ExitCode.LOST_COORDINATOR  # cut off: it hears nothing more
    assert d2.wait(timeout=30) == ExitCode.OK
    assert f"key {key_id(first.public)} removed from the allow-list" in log
    attempts = fleet.attempts()
    fenced = [a for a in attempts if a["daemon_id"] == "d1" and a["failure_kind"] == "transport"]
    assert fenced and all("removed from the allow-list" in a["error"] for a in fenced), attempts
    ok = [a for a in attempts if a["status"] == "ok"]
    assert len(ok) == 4
    fenced_trials = {a["trial_id"] for a in fenced}
    for a in ok:
        expected = key_id(second.public) if a["trial_id"] in fenced_trials else None
        assert a["daemon_key_id"] in {key_id(first.public), key_id(second.public)}
        if expected:
            assert a["daemon_key_id"] == expected
    ds = xr.open_dataset(fleet.folder / "results.nc")
    try:
        assert set(ds["daemon_key_id"].values.tolist()) <= {key_id(first.public), key_id(second.public)}
        assert key_id(second.public) in ds["daemon_key_id"].values.tolist()
    finally:
        ds.close()
    problems = check_invariants(fleet)
    assert not problems, "\n".join(problems)


def _forged_outcome() -> TrialOutcome:
    samples = [RequestSample(index=i, scheduled_ns=i * 1000, send_ns=i * 1000, first_token_ns=i * 1000 + 1,
                             end_ns=i * 1000 + 2, token_ns=[i * 1000 + 1, i * 1000 + 2], prompt_tokens=8,
                             output_tokens=2) for i in range(4)]
    return TrialOutcome(status="ok", samples=samples, window_s=1e-6, started_at_us=1, finished_at_us=2)


def _fingerprint() -> Fingerprint:
    return Fingerprint(hostname="impostor", cpu_model="test", cpu_count=1, cpu_isa="none", ram_gib=1.0, os="linux",
                       kernel="test", python="3", servetune_version="0", hardware_class="8xH100-80GB")


def test_a_client_reusing_a_live_daemons_routing_id_with_another_key_is_refused(fleet: Fleet) -> None:
    first = load_pair(daemon_dir(fleet.home))
    _, impostor_pair = _second_daemon_home(fleet, "impostor")  # admitted: a key of this fleet, not d1's
    # A lease outlives the few seconds d1 needs to notice its displaced connection and reconnect.
    fleet.timings["--lease-ttl"] = "8"
    fleet.start_coordinator()
    fleet.start_daemon("d1")
    wait_for(lambda: fleet.measuring_on("d1"), 60, "d1 to measure")
    # ZeroMQ hands the routing id over to the newest connection (ROUTER_HANDOVER, which reconnects
    # need), so the impostor briefly displaces d1's connection until d1 reconnects; it must not get
    # into d1's session. It does not reconnect itself (a long interval), so the test stays about identity.
    impostor = Client(fleet.address, "d1", impostor_pair, load_pair(coordinator_dir(fleet.home)).public,
                      reconnect_ivl_ms=60_000)
    running = fleet.running_on("d1")
    try:
        impostor.send(Hello(daemon_id="d1", session_nonce="forged", pid=1,
                            capabilities=Capabilities(fingerprint=_fingerprint())))
        impostor.send(Result(session_nonce="forged", batch_id=running[0]["batch_id"], trial_id=running[0]["trial_id"],
                             epoch=running[0]["attempt"], submission_id="forged", outcome=_forged_outcome()))
        deadline = time.monotonic() + 0.6
        while time.monotonic() < deadline:
            got = impostor.recv(0.1)
            assert not isinstance(got, (Welcome, Ack)), f"the impostor got {got}"
    finally:
        impostor.close()
    code, _, log = fleet.wait_coordinator(120)
    assert code == 0, log[-4000:]
    assert "refused (identity)" in log and f"key {key_id(impostor_pair.public)}" in log
    attempts = fleet.attempts()
    assert [a for a in attempts if a["failure_kind"] == "transport"] == [], "d1's leases were revoked"
    assert {a["daemon_key_id"] for a in attempts} == {key_id(first.public)}
    assert "forged" not in {a["submission_id"] for a in attempts}
    problems = check_invariants(fleet)
    assert not problems, "\n".join(problems)
