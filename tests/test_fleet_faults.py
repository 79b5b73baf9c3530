"""The fault suite: real coordinator and daemon processes on loopback, the ``openai`` backend
against a FAKE endpoint (tests/fakes) wherever a fault must land on a trial in flight, the SIMULATED
``sim`` backend (no HTTP load per trial) for the scenarios whose fault needs none (a crash inside
the daemon's batch), a TCP fault proxy, short timings (heartbeat 0.2 s, TTL 2 s, grace 1 s). After every scenario the store's invariants are checked (tests/fleet_harness.py) and no
process may be left behind."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from servetune.keys import coordinator_dir, daemon_dir, load_pair
from servetune.messages import (
    Ack,
    Bye,
    Capabilities,
    Conflict,
    Grant,
    Heartbeat,
    Hello,
    Ready,
    Result,
    Shutdown,
    Stale,
    Welcome,
    decode,
    encode,
)
from servetune.result import Fingerprint, RequestSample, TrialOutcome
from servetune.wire import configure_dealer
from tests.fakes.faultproxy import FaultProxy
from tests.fakes.openai_server import FakeOpenAIServer
from tests.fleet_harness import Fleet, acked_submissions, check_invariants, wait_for

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with FakeOpenAIServer(token_delay_ms=5.0, ttft_ms=5.0) as server:
        yield server.base_url


@pytest.fixture
def fleet(tmp_path: Path, endpoint: str) -> Iterator[Fleet]:
    f = Fleet(tmp_path, endpoint)
    yield f
    left = f.close()
    assert not left, f"processes left behind: {left}"


@pytest.fixture
def sim_fleet(tmp_path: Path) -> Iterator[Fleet]:
    """A fleet on the SIMULATED backend: the same coordinator, daemons and protocol, trials in milliseconds."""
    f = Fleet(tmp_path, "", kind="sim")
    yield f
    left = f.close()
    assert not left, f"processes left behind: {left}"


def _finish(fleet: Fleet, expect: int = 0, timeout_s: float = 120) -> str:
    code, out, log = fleet.wait_coordinator(timeout_s)
    assert code == expect, f"exit {code}, expected {expect}:\n{log[-4000:]}"
    # A daemon that was reconnecting (fenced, in backoff) when the coordinator finished hears no
    # SHUTDOWN; it exits once its --coordinator-lost deadline (30 s in the harness) has passed.
    for proc in fleet.daemons.values():
        if proc.poll() is None:
            proc.wait(timeout=45)
    return log


def _invariants(fleet: Fleet, *daemon_ids: str) -> None:
    acked: set[str] = set()
    for d in daemon_ids:
        acked |= acked_submissions(fleet.daemon_log(d))
    problems = check_invariants(fleet, acked)
    assert not problems, "\n".join(problems)


def test_sigkill_of_a_daemon_mid_trial_is_regranted_after_ttl_and_grace(fleet: Fleet) -> None:
    fleet.start_coordinator()
    d1 = fleet.start_daemon("d1")
    wait_for(lambda: fleet.measuring_on("d1"), 60, "d1 measuring")
    fleet.start_daemon("d2")
    lost = fleet.running_on("d1")
    killed_at = time.monotonic()
    d1.send_signal(signal.SIGKILL)
    log = _finish(fleet)
    attempts = fleet.attempts()
    closed = [a for a in attempts if a["failure_kind"] == "transport"]
    assert {(a["trial_id"], a["attempt"]) for a in closed} == {(a["trial_id"], a["attempt"]) for a in lost}
    assert all("lease expired" in a["error"] and "d1" in a["error"] for a in closed)
    regranted = [a for a in attempts if a["trial_id"] in {c["trial_id"] for c in closed} and a["status"] == "ok"]
    assert regranted and all(a["daemon_id"] == "d2" and a["attempt"] == 2 for a in regranted)
    assert "d1 suspected" in log and "lease expired" in log
    assert time.monotonic() - killed_at >= 3.0  # never re-granted before TTL + grace
    assert all(a["status"] == "ok" for a in attempts if a["failure_kind"] != "transport")
    _invariants(fleet, "d2")


def test_sigstop_past_the_ttl_fences_the_daemon_then_it_rejoins(fleet: Fleet) -> None:
    fleet.start_coordinator()
    d1 = fleet.start_daemon("d1")
    wait_for(lambda: fleet.measuring_on("d1"), 60, "d1 measuring")
    lost = fleet.running_on("d1")
    d1.send_signal(signal.SIGSTOP)
    wait_for(lambda: all(a["status"] != "running" for a in fleet.attempts() if (a["trial_id"], a["attempt"]) in
                         {(x["trial_id"], x["attempt"]) for x in lost}), 20, "the paused daemon's lease revoked")
    time.sleep(1.0)
    d1.send_signal(signal.SIGCONT)
    _finish(fleet)
    attempts = fleet.attempts()
    for a in lost:
        rows = [b for b in attempts if b["trial_id"] == a["trial_id"]]
        assert rows[0]["failure_kind"] == "transport" and "lease expired" in rows[0]["error"]
        assert rows[-1]["status"] == "ok" and rows[-1]["attempt"] == 2
    assert "lease" in fleet.daemon_log("d1").lower() and "expired" in fleet.daemon_log("d1").lower()
    _invariants(fleet, "d1")


def test_blackhole_shorter_than_the_ttl_changes_nothing(fleet: Fleet) -> None:
    fleet.start_coordinator()
    with FaultProxy("127.0.0.1", fleet.port) as proxy:
        fleet.start_daemon("d1", proxy.address)
        wait_for(lambda: fleet.measuring_on("d1"), 60, "d1 measuring")
        proxy.blackhole()
        time.sleep(1.0)
        proxy.pass_through()
        log = _finish(fleet)
        assert proxy.stats()["bytes_dropped"] > 0, "the scenario never blackholed anything"
    attempts = fleet.attempts()
    assert all(a["attempt"] == 1 and a["status"] == "ok" for a in attempts), attempts
    assert "lease expired" not in log
    _invariants(fleet, "d1")


def test_blackhole_longer_than_the_ttl_regrants_and_fences(fleet: Fleet) -> None:
    fleet.start_coordinator()
    with FaultProxy("127.0.0.1", fleet.port) as proxy:
        fleet.start_daemon("d1", proxy.address)
        wait_for(lambda: fleet.measuring_on("d1"), 60, "d1 measuring")
        lost = fleet.running_on("d1")
        proxy.blackhole()
        fleet.start_daemon("d2")
        wait_for(lambda: any(a["attempt"] == 2 for a in fleet.attempts()), 30, "the re-grant to d2")
        time.sleep(0.5)
        proxy.pass_through()
        _finish(fleet)
        assert proxy.stats()["bytes_dropped"] > 0
    attempts = fleet.attempts()
    for a in lost:
        rows = [b for b in attempts if b["trial_id"] == a["trial_id"]]
        assert rows[0]["failure_kind"] == "transport" and rows[-1]["status"] == "ok" and rows[-1]["daemon_id"] == "d2"
    assert "expired" in fleet.daemon_log("d1")
    _invariants(fleet, "d1", "d2")


def test_delay_and_reset_on_the_wire_lose_nothing(fleet: Fleet) -> None:
    fleet.start_coordinator()
    with FaultProxy("127.0.0.1", fleet.port) as proxy:
        fleet.start_daemon("d1", proxy.address)
        wait_for(lambda: fleet.measuring_on("d1"), 60, "d1 measuring")
        proxy.delay(0.3)
        wait_for(lambda: fleet.ok_count() >= 2, 60, "results through a slow link")
        proxy.pass_through()
        assert proxy.reset() >= 1
        wait_for(lambda: fleet.ok_count() >= 4, 60, "results after a reset")
        proxy.reset()
        _finish(fleet)
        stats = proxy.stats()
        assert stats["chunks_delayed"] > 0 and stats["connections_reset"] >= 2
    assert all(a["status"] == "ok" or a["failure_kind"] == "transport" for a in fleet.attempts())
    _invariants(fleet, "d1")


def test_coordinator_killed_and_restarted_resumes_with_the_surviving_daemon(fleet: Fleet) -> None:
    fleet.timings["--lease-ttl"] = "8"
    coordinator = fleet.start_coordinator()
    fleet.start_daemon("d1")
    wait_for(lambda: fleet.ok_count() >= 1 and fleet.measuring_on("d1"), 60, "a result and d1 measuring")
    coordinator.send_signal(signal.SIGKILL)
    coordinator.wait(timeout=10)
    running = fleet.running_on("d1")
    assert running
    fleet.start_coordinator()
    log = _finish(fleet)
    assert "renewed if its daemon rejoins" in log and "rejoined holding" in log
    attempts = fleet.attempts()
    adopted = {(a["trial_id"], a["attempt"]) for a in running}
    assert all(a["status"] == "ok" for a in attempts if (a["trial_id"], a["attempt"]) in adopted), \
        "the attempts in flight at the crash were renewed when their daemon came back within the TTL"
    _invariants(fleet, "d1")


def test_a_new_daemon_process_under_an_old_id_never_keeps_the_dead_lease(fleet: Fleet) -> None:
    fleet.timings["--lease-ttl"] = "20"  # waiting out the lease would be obvious
    fleet.start_coordinator()
    d1 = fleet.start_daemon("d1")
    wait_for(lambda: fleet.measuring_on("d1"), 60, "d1 measuring")
    lost = fleet.running_on("d1")
    d1.send_signal(signal.SIGKILL)
    d1.wait(timeout=10)
    t0 = time.monotonic()
    fleet.start_daemon("d1")
    keys = {(a["trial_id"], a["attempt"]) for a in lost}
    wait_for(lambda: all(a["status"] != "running" for a in fleet.attempts() if (a["trial_id"], a["attempt"]) in keys),
             15, "the old lease revoked")
    assert time.monotonic() - t0 < 15
    _finish(fleet)
    closed = [a for a in fleet.attempts() if (a["trial_id"], a["attempt"]) in keys]
    assert all(a["failure_kind"] == "transport" and "restarted" in a["error"] for a in closed)
    _invariants(fleet, "d1")


CRASHING_DAEMON = """
# A daemon with a planted fault (a test double): its first batch raises inside our own code.
import sys
import daemon.batch
from daemon.cli import main

_run = daemon.batch.BatchRunner.run
calls = []

def run(self, grant):
    calls.append(grant.batch_id)
    if len(calls) == 1:
        raise RuntimeError("planted fault in the batch runner")
    return _run(self, grant)

daemon.batch.BatchRunner.run = run
sys.exit(main(sys.argv[1:]))
"""


def test_a_crash_inside_the_daemon_is_a_daemon_error_and_is_retried(sim_fleet: Fleet, tmp_path: Path) -> None:
    fleet = sim_fleet
    script = tmp_path / "crashing_daemon.py"
    script.write_text(CRASHING_DAEMON)
    fleet.start_coordinator()
    fleet.start_daemon("d1", argv=[sys.executable, str(script)])
    _finish(fleet)
    attempts = fleet.attempts()
    errors = [a for a in attempts if a["failure_kind"] == "transport"]
    assert errors and all("daemon error on d1" in a["error"] and "planted fault" in a["error"] for a in errors)
    assert all("Traceback" in a["error"] or "line" in a["error"] for a in errors), "the traceback's tail is kept"
    retried = {a["trial_id"] for a in errors}
    assert all(any(b["trial_id"] == t and b["status"] == "ok" and b["attempt"] == 2 for b in attempts) for t in retried)
    assert not [a for a in attempts if a["failure_kind"] == "measurement"], "never blamed on the engine config"
    ok = next(a for a in attempts if a["status"] == "ok")
    assert "servetune-sim" in (fleet.folder / ok["result_path"]).read_text(), "measured by the SIMULATED backend"
    _invariants(fleet, "d1")


def test_no_daemon_for_daemon_wait_exits_4_listing_the_holes(fleet: Fleet) -> None:
    fleet.timings["--daemon-wait"] = "2"
    fleet.start_coordinator()
    d1 = fleet.start_daemon("d1")
    wait_for(lambda: fleet.measuring_on("d1"), 60, "d1 measuring")
    d1.send_signal(signal.SIGKILL)
    t0 = time.monotonic()
    log = _finish(fleet, expect=4, timeout_s=60)
    assert time.monotonic() - t0 < 20
    assert "no daemon connected for" in log and "were not measured (holes)" in log
    assert "lease expired" in log and "never granted" in log
    _invariants(fleet)


# ---------------------------------------------------------------------- a scripted daemon


def _fingerprint() -> Fingerprint:
    return Fingerprint(hostname="scripted", cpu_model="test", cpu_count=1, cpu_isa="none", ram_gib=1.0, os="linux",
                       kernel="test", python="3", servetune_version="0", hardware_class="cpu-scripted")


def _outcome() -> TrialOutcome:
    samples = [RequestSample(index=i, scheduled_ns=i * 1000, send_ns=i * 1000, first_token_ns=i * 1000 + 500,
                             end_ns=i * 1000 + 900, token_ns=[i * 1000 + 500, i * 1000 + 900],
                             prompt_tokens=8, output_tokens=2) for i in range(4)]
    return TrialOutcome(status="ok", samples=samples, window_s=1.0, started_at_us=1, finished_at_us=2)


class Scripted:
    """A daemon written out message by message (a test double for the wire, not our daemon)."""

    def __init__(self, address: str, home: Path, daemon_id: str = "scripted") -> None:
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        pair = load_pair(daemon_dir(home))  # the fleet's admitted daemon key
        configure_dealer(self.sock, daemon_id, zmq, public_key=pair.public, secret_key=pair.secret,
                         server_key=load_pair(coordinator_dir(home)).public)
        self.sock.connect(address)
        self.daemon_id = daemon_id
        self.nonce = "nonce-1"
        self.seq = 0

    def send(self, msg: object) -> None:
        self.sock.send(encode(msg), zmq.NOBLOCK)  # type: ignore[arg-type]

    def recv(self, kinds: tuple[type, ...], timeout_s: float = 10) -> object:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.sock.poll(100):
                msg = decode(self.sock.recv())
                if isinstance(msg, kinds):
                    return msg
            self.seq += 1
            self.send(Heartbeat(session_nonce=self.nonce, seq=self.seq, leases=[]))
        raise AssertionError(f"no {kinds} within {timeout_s} s")

    def close(self) -> None:
        self.sock.close(linger=0)


def test_duplicate_replayed_conflicting_and_stale_submissions(fleet: Fleet) -> None:
    fleet.repeats = 1
    fleet.spec.write_text(fleet.spec.read_text().replace("repeats: 4", "repeats: 1"))
    fleet.start_coordinator()
    d = Scripted(fleet.address, fleet.home)
    try:
        d.send(Hello(daemon_id=d.daemon_id, session_nonce=d.nonce, pid=1,
                     capabilities=Capabilities(fingerprint=_fingerprint())))
        assert isinstance(d.recv((Welcome,), 30), Welcome)
        d.send(Ready(session_nonce=d.nonce))
        grant = d.recv((Grant,))
        assert isinstance(grant, Grant)
        t0, t1 = grant.trials
        res = Result(session_nonce=d.nonce, batch_id=grant.batch_id, trial_id=t0.trial_id, epoch=t0.attempt,
                     submission_id="sub-a", outcome=_outcome())
        d.send(res)
        assert isinstance(d.recv((Ack, Stale, Conflict)), Ack)
        d.send(res)  # a replay: the same ACK
        assert isinstance(d.recv((Ack, Stale, Conflict)), Ack)
        d.send(res.model_copy(update={"submission_id": "sub-b"}))
        assert isinstance(d.recv((Ack, Stale, Conflict)), Conflict)
        d.send(res.model_copy(update={"trial_id": t1.trial_id, "epoch": t1.attempt + 5, "submission_id": "sub-c"}))
        assert isinstance(d.recv((Ack, Stale, Conflict)), Stale)
        d.send(res.model_copy(update={"trial_id": t1.trial_id, "epoch": t1.attempt, "submission_id": "sub-d"}))
        assert isinstance(d.recv((Ack, Stale, Conflict)), Ack)
        assert isinstance(d.recv((Shutdown,), 15), Shutdown)
        d.send(Bye(session_nonce=d.nonce, reason="done"))
    finally:
        d.close()
    _finish(fleet)
    subs = sorted(a["submission_id"] for a in fleet.attempts())
    assert subs == ["sub-a", "sub-d"], subs
    _invariants(fleet)


ALWAYS_CRASHING_DAEMON = CRASHING_DAEMON.replace("if len(calls) == 1:", "if True:")


def test_a_trial_out_of_retries_is_a_hole_and_the_sweep_exits_3(sim_fleet: Fleet, tmp_path: Path) -> None:
    fleet = sim_fleet
    script = tmp_path / "always_crashing_daemon.py"
    script.write_text(ALWAYS_CRASHING_DAEMON)
    fleet.repeats = 1
    fleet.spec.write_text(fleet.spec.read_text().replace("repeats: 4", "repeats: 1"))
    fleet.start_coordinator("--max-transport-retries", "2")
    fleet.start_daemon("d1", argv=[sys.executable, str(script)])
    log = _finish(fleet, expect=3)
    assert "lost 2 attempts to transport or daemon errors in this sweep; left as a hole" in log
    assert "were not measured (holes)" in log and "daemon error on d1" in log
    assert sorted(a["attempt"] for a in fleet.attempts()) == [1, 1, 2, 2]
    _invariants(fleet)


@pytest.mark.parametrize(("args", "needle"), [
    (["--lease-ttl", "0.1"], "lease_ttl_s"),
    (["--fleet", "/nonexistent/fleet.yaml"], "cannot read the fleet file"),
    (["--bind"], "cannot bind"),
])
def test_bad_fleet_settings_exit_2_naming_them(fleet: Fleet, args: list[str], needle: str) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", fleet.port))  # --bind names a port already in use
        busy.listen()
        fleet.start_coordinator(*[a for a in args if a != "--bind"])
        code, _, log = fleet.wait_coordinator(30)
    assert code == 2 and needle in log, log[-2000:]
    assert not (fleet.folder / "experiment.sqlite").exists(), "nothing is written for a refused setting"
