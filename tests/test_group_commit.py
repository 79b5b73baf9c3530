"""Group commit in the coordinator's loop: a pass over the queued messages makes all their results
durable in one transaction before any of their ACKs is sent (real ROUTER and DEALER on loopback,
the real store; no daemon process: the test speaks the protocol itself)."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
import zmq
from rich.console import Console

from coordinator.control import ControlCore
from coordinator.fleet import FleetSettings
from coordinator.progress import SweepProgress
from coordinator.store import Store
from coordinator.sweep import SweepOptions, SweepRunner, select_work
from coordinator.transport import RouterEndpoint
from coordinator.zap import KeyGate
from servetune.keys import coordinator_dir, daemon_dir, load_pair
from servetune.messages import Ack, Capabilities, Grant, Hello, Message, Ready, Result, Welcome, decode, encode
from servetune.result import Fingerprint, TrialOutcome
from servetune.spec import parse_spec
from servetune.wire import configure_dealer
from tests.fakes.keys import fleet_home

SPEC = """
name: group-commit
engine: {grid: {max_num_seqs: [2]}, fixed: {max_model_len: 256}}
load_points:
  - {name: a, request_rate: 1, num_requests: 2, input_len: 8, output_len: 8}
  - {name: b, request_rate: 1, num_requests: 2, input_len: 8, output_len: 8}
  - {name: c, request_rate: 1, num_requests: 2, input_len: 8, output_len: 8}
"""


class WatchedEndpoint(RouterEndpoint):
    """The real ROUTER; before each ACK goes out, note what another process could read of the store."""

    def __init__(self, folder: Path, home: Path):
        super().__init__("tcp://127.0.0.1:0", server=load_pair(coordinator_dir(home)), gate=KeyGate(home))
        self.folder = folder
        self.finished_at_ack: list[int] = []

    def send(self, daemon_id: str, msg: object) -> bool:
        if isinstance(msg, Ack):
            reader = Store.open_readonly(self.folder)
            try:
                self.finished_at_ack.append(sum(1 for a in reader.all_attempts() if a.status != "running"))
            finally:
                reader.close()
        return super().send(daemon_id, msg)


def _recv(sock: zmq.Socket[bytes], timeout_s: float = 10.0) -> Message:
    if not sock.poll(int(timeout_s * 1000)):
        raise TimeoutError("no answer from the coordinator")
    return decode(sock.recv())


def test_results_of_one_pass_are_committed_together_before_their_acks(tmp_path: Path) -> None:
    spec = parse_spec(SPEC)
    runner = SweepRunner(spec, SPEC, SweepOptions(results_root=tmp_path, local_daemon=False))
    folder = tmp_path / spec.name
    store = runner.store = Store.open(folder)
    store.record_plan(runner.spec_hash, spec.model_dump(mode="json"), SPEC, runner.plan)
    work, _ = select_work(runner.plan, store, retry_failed=False)
    runner.core = ControlCore(spec=spec, work=work, settings=FleetSettings())
    home = fleet_home(tmp_path / "home")  # CURVE: the coordinator's pair and one admitted daemon key
    endpoint = WatchedEndpoint(folder, home)
    ctx = zmq.Context.instance()
    dealer = ctx.socket(zmq.DEALER)
    pair = load_pair(daemon_dir(home))
    configure_dealer(dealer, "d1", zmq, public_key=pair.public, secret_key=pair.secret,
                     server_key=load_pair(coordinator_dir(home)).public)
    dealer.connect(endpoint.address)
    fp = Fingerprint(hostname="node", cpu_model="test", cpu_count=1, cpu_isa="none", ram_gib=1.0, os="linux",
                     kernel="test", python="3", servetune_version="0", hardware_class="cpu-test")
    try:
        with SweepProgress(3, 1.0, Console(file=io.StringIO())) as progress:
            runner.progress = progress

            def one_pass() -> None:
                got = endpoint.recv(10_000)
                assert got is not None
                runner._pass(endpoint, got)

            dealer.send(encode(Hello(daemon_id="d1", session_nonce="n1", pid=1,
                                     capabilities=Capabilities(fingerprint=fp))))
            one_pass()
            assert isinstance(_recv(dealer), Welcome)
            dealer.send(encode(Ready(session_nonce="n1", seq=1)))
            one_pass()
            grant = _recv(dealer)
            assert isinstance(grant, Grant) and len(grant.trials) == 3
            for t in grant.trials:
                outcome = TrialOutcome(status="failed", failure_kind="measurement", error="OOM", started_at_us=1,
                                       finished_at_us=2)
                dealer.send(encode(Result(session_nonce="n1", batch_id=grant.batch_id, trial_id=t.trial_id,
                                          epoch=t.attempt, submission_id=f"s-{t.trial_id[:8]}", outcome=outcome)))
            deadline = time.monotonic() + 10
            while endpoint._sock.getsockopt(zmq.EVENTS) & zmq.POLLIN == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.3)  # all three queued on the ROUTER before the pass starts
            statements: list[str] = []
            store._conn.set_trace_callback(statements.append)
            one_pass()
            store._conn.set_trace_callback(None)
            acks = [_recv(dealer) for _ in grant.trials]
    finally:
        dealer.close(linger=0)
        endpoint.close()
    assert all(isinstance(a, Ack) for a in acks)
    # one transaction for the three results, committed before the first ACK went out
    assert sum(1 for s in statements if s.strip().upper() == "COMMIT") == 1
    assert endpoint.finished_at_ack == [3, 3, 3]
    for t in grant.trials:
        assert (folder / "results" / t.trial_id / f"attempt-{t.attempt}.json").exists()
    store.close()


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(pytest.main([__file__]))
