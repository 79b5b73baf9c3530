"""A daemon's slots (:mod:`daemon.slots`, :class:`daemon.session.DaemonSession`, ``daemon start
--max-concurrency/--co-tenancy``).

Pure: the slot and GPU-set bookkeeping on the FAKE NVML's made-up GPUs (tests/fakes/fake_nvml.py;
no GPU exists here) and the session's slots with a fake clock. End to end on loopback: a real
coordinator and one real daemon measuring the FAKE ``openai`` endpoint (tests/fakes/openai_server.py)
with a load point of one request at a time, so any two requests that overlap in the endpoint's own
request log were sent by two batches measuring at once.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from daemon.cli import build_parser
from daemon.fingerprint import collect_fingerprint
from daemon.preflight import check_gpus_idle
from daemon.session import AbortBatch, DaemonSession, Log, StartBatch
from daemon.slots import SlotPool
from servetune.manifest import EngineArgs, EngineConfig
from servetune.messages import Capabilities, Grant, Heartbeat, Ready
from servetune.result import Fingerprint
from tests.fakes import fake_nvml
from tests.fakes.fake_nvml import FakeGPU
from tests.fakes.openai_server import FakeOpenAIServer
from tests.fleet_harness import Fleet
from tests.test_daemon_session import FP, Driver, grant, only, ref, result, sent


@pytest.fixture
def four_gpus(monkeypatch: pytest.MonkeyPatch) -> Iterator[Fingerprint]:
    """FAKE node: 4 made-up GPUs, NVLink between 0-2 and 1-3 only (so NVLink, not the lowest
    indices, decides the sets), PCIe elsewhere."""
    collect_fingerprint.cache_clear()
    fake_nvml.install(monkeypatch, [FakeGPU(nvlinks={2: 18}), FakeGPU(nvlinks={3: 18}), FakeGPU(nvlinks={0: 18}),
                                    FakeGPU(nvlinks={1: 18})])
    fp = collect_fingerprint()
    assert [g.index for g in fp.gpus] == [0, 1, 2, 3] and fp.gpu_topology is not None
    yield fp
    collect_fingerprint.cache_clear()


def tp_grant(batch_id: str, tp: int, trials: Iterable[str]) -> Grant:
    g = grant(batch_id=batch_id, trials=tuple(trials))
    return g.model_copy(update={"config": EngineConfig(args=EngineArgs(tensor_parallel_size=tp))})


def session_on(fp: Fingerprint, max_concurrency: int, co_tenancy: bool = False) -> Driver:
    counter = itertools.count(1)
    slots = SlotPool.for_fingerprint(fp, max_concurrency, co_tenancy)
    d = Driver(DaemonSession("d1", 4242, Capabilities(fingerprint=fp, max_concurrency=slots.capacity),
                             nonce_factory=lambda: f"n{next(counter)}", rng=lambda: 0.5, slots=slots))
    d.start()
    d.welcome()
    return d


def started(out: list[Any]) -> dict[str, str | None]:
    return {i.grant.batch_id: (i.gpu_set.cuda_visible_devices if i.gpu_set else None) for i in only(out, StartBatch)}


# --------------------------------------------------------------------------- the pool (pure)


def test_two_tp2_batches_get_disjoint_nvlink_sets_and_a_third_waits(four_gpus: Fingerprint) -> None:
    pool = SlotPool.for_fingerprint(four_gpus, max_concurrency=4)
    assert pool.capacity == 4 and pool.free_slots() == 4
    first, second = pool.claim("b1", 2), pool.claim("b2", 2)
    assert first is not None and second is not None
    assert {first.gpus, second.gpus} == {(0, 2), (1, 3)}, "the NVLink pairs, not 0,1 and 2,3"
    assert first.gpu_set is not None and first.gpu_set.nvlink and not first.shared
    assert pool.free_slots() == 0
    assert pool.claim("b3", 2) is None, "no free GPUs: the third batch waits"
    pool.release("b1")
    third = pool.claim("b3", 2)
    assert third is not None and third.gpus == first.gpus


def test_max_concurrency_two_on_four_gpus_is_two_slots(four_gpus: Fingerprint) -> None:
    pool = SlotPool.for_fingerprint(four_gpus, max_concurrency=2)
    assert pool.capacity == 2
    assert pool.claim("b1", 2) is not None and pool.claim("b2", 2) is not None
    assert pool.claim("b3", 1) is None, "both slots busy"


def test_without_co_tenancy_one_batch_per_gpu_and_one_on_a_cpu_node(four_gpus: Fingerprint) -> None:
    assert SlotPool.for_fingerprint(four_gpus, max_concurrency=8).capacity == 4
    cpu = SlotPool.for_fingerprint(FP, max_concurrency=3)
    assert cpu.capacity == 1 and cpu.claim("b1", None) is not None and cpu.claim("b2", None) is None
    assert SlotPool([0, 1], [], 2).claim("big", 4) is not None, "more GPUs than the node: it holds them all"


def test_co_tenancy_shares_a_device_only_where_declared(four_gpus: Fingerprint) -> None:
    cpu = SlotPool.for_fingerprint(FP, max_concurrency=3, co_tenancy=True)
    assert cpu.capacity == 3
    assert all(cpu.claim(b, None, co_tenancy=True) is not None for b in ("b1", "b2", "b3")) and cpu.free_slots() == 0
    gpus = SlotPool.for_fingerprint(four_gpus, max_concurrency=2, co_tenancy=True)
    assert gpus.claim("b1", 3, co_tenancy=True) is not None
    shared = gpus.claim("b2", 3, co_tenancy=True)
    assert shared is not None and shared.shared, "too few free GPUs: shared, and marked so"
    assert shared.co_tenanted == shared.gpus, "the best 3-GPU set again: all 3 held by b1"
    disjoint = SlotPool.for_fingerprint(four_gpus, max_concurrency=2)
    assert disjoint.claim("b1", 3, co_tenancy=True) is not None and disjoint.claim("b2", 3, co_tenancy=True) is None


def test_co_tenancy_needs_the_owner_and_the_spec(four_gpus: Fingerprint) -> None:
    """The owner allows it (``--co-tenancy``) but the GRANT does not declare it (the spec's
    ``hardware.co_tenancy``): no device is shared, and the node's free slots say so."""
    cpu = SlotPool.for_fingerprint(FP, max_concurrency=2, co_tenancy=True)
    assert cpu.claim("b1", None) is not None and cpu.free_slots() == 0
    assert cpu.claim("b2", None) is None and cpu.claim("b2", None, co_tenancy=True) is None, (
        "b1 was granted without co-tenancy: nothing shares its device")
    cpu.release("b1")
    assert cpu.claim("b3", None, co_tenancy=True) is not None and cpu.claim("b4", None) is None, (
        "b4's grant does not declare it: it does not join b3 on the device")
    gpus = SlotPool.for_fingerprint(four_gpus, max_concurrency=2, co_tenancy=True)
    assert gpus.claim("b1", 3) is not None and gpus.claim("b2", 3) is None
    assert gpus.claim("b2", 1) is not None, "a free GPU is not sharing: it is granted"


def test_a_session_shares_the_device_only_for_grants_that_declare_it() -> None:
    d = session_on(FP, max_concurrency=2, co_tenancy=True)
    d.answer = "renew"
    assert started(d.message(grant(batch_id="b1", trials=("t1",)))) == {"b1": None}
    d.until(1.0)
    out = d.message(grant(batch_id="b2", trials=("t2",)))
    assert not only(out, StartBatch), "the spec did not declare co-tenancy: b2 waits for b1's device"
    assert started(d.feed(d.s.on_batch_done("b1", d.now))) == {"b2": None}
    d2 = session_on(FP, max_concurrency=2, co_tenancy=True)
    d2.answer = "renew"
    declared = grant(batch_id="b1", trials=("t1",)).model_copy(update={"co_tenancy": True})
    assert started(d2.message(declared)) == {"b1": None}
    d2.until(1.0)
    assert started(d2.message(declared.model_copy(update={"batch_id": "b2"}))) == {"b2": None}


def test_preflight_skips_only_the_gpus_a_co_tenant_of_this_daemon_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """FAKE GPUs: GPU 0 runs the co-tenant batch's server (pid 5001), GPU 1 a stranger's (pid 6002)."""
    fake_nvml.install(monkeypatch, [FakeGPU(used_mib=60000, processes=[(5001, 60000)]),
                                    FakeGPU(used_mib=30000, processes=[(6002, 30000)]), FakeGPU()])
    assert check_gpus_idle([0, 2]).status == "failed", "a shared GPU fails the idle check unless declared"
    ok = check_gpus_idle([0, 2], shared=[0])
    assert ok.status == "ok" and "GPU(s) 2 idle" in ok.detail and "GPU(s) 0 not checked" in ok.detail
    only_shared = check_gpus_idle([0], shared=[0])
    assert only_shared.status == "skipped" and "declared co-tenancy" in only_shared.detail
    stranger = check_gpus_idle([0, 1], shared=[0])
    assert stranger.status == "failed" and "pid 6002" in stranger.detail and "pid 5001" not in stranger.detail


# --------------------------------------------------------------------------- the session's slots


def test_session_runs_two_batches_each_with_its_own_leases_and_results(four_gpus: Fingerprint) -> None:
    d = session_on(four_gpus, max_concurrency=2)
    d.answer = "renew"
    assert [r.free_slots for r in sent([i for _, i in d.log], Ready)] == [2]
    assert started(d.message(tp_grant("b1", 2, ["t1"]))) == {"b1": "0,2"}
    ready = sent(d.until(1.0), Ready)
    assert [r.free_slots for r in ready] == [1], "a READY for the free slot while b1 runs"
    assert ready[0].held == [ref("t1")]
    assert started(d.message(tp_grant("b2", 2, ["t2"]))) == {"b2": "1,3"}
    assert not sent(d.until(4.0), Ready), "no slot free: no READY"
    beats = sent([i for _, i in d.log], Heartbeat)
    assert set(beats[-1].leases) == {ref("t1"), ref("t2")}, "every running batch's leases in each heartbeat"
    assert sent(d.feed(d.s.on_outgoing(result("t2", batch_id="b2"), d.now)))
    ready = sent(d.feed(d.s.on_batch_done("b2", d.now)), Ready)
    assert d.s.running_batch == "b1" and "b2" not in d.s.running
    assert [r.free_slots for r in ready] == [1], "b2's GPUs are free again: READY at once"
    assert ref("t2") in ready[0].held, "b2's result is unanswered: its lease is still held"


def test_a_grant_without_a_free_gpu_set_waits_with_its_leases_renewed(four_gpus: Fingerprint) -> None:
    d = session_on(four_gpus, max_concurrency=3)
    d.answer = "renew"
    assert started(d.message(tp_grant("b1", 1, ["t1"]))) == {"b1": "0"}
    d.until(1.0)
    assert started(d.message(tp_grant("b2", 2, ["t2"]))) == {"b2": "1,3"}
    assert [r.free_slots for r in sent(d.until(2.0), Ready)] == [1], "GPU 2 is free"
    out = d.message(tp_grant("b3", 2, ["t3"]))
    assert not only(out, StartBatch) and "b3 waits for 2 free GPU(s)" in "\n".join(
        i.text for i in out if isinstance(i, Log))
    later = d.until(30.0)  # past the grant's 10 s TTL: renewed through the heartbeats
    assert not sent(later, Ready), "no READY while a granted batch waits"
    assert ref("t3") in sent(later, Heartbeat)[-1].leases and ref("t3") in d.s.held(d.now)
    assert started(d.feed(d.s.on_batch_done("b2", d.now))) == {"b3": "1,3"}


def test_a_waiting_batch_whose_lease_expires_is_dropped_not_aborted(four_gpus: Fingerprint) -> None:
    d = session_on(four_gpus, max_concurrency=3)
    d.message(tp_grant("b1", 2, ["t1"]))
    d.until(1.0)
    d.message(tp_grant("b2", 1, ["t2"]))
    d.until(2.0)
    d.message(tp_grant("b3", 2, ["t3"]))  # GPUs 0,2 and 1 (or 3) busy: waits
    assert [g.batch_id for g in d.s.waiting] == ["b3"]
    out = d.until(12.0)  # silent coordinator: every lease runs out
    assert {i.batch_id for i in only(out, AbortBatch)} == {"b1", "b2"}, "the running ones are fenced"
    assert not d.s.waiting and ref("t3") not in d.s.held(d.now)
    assert not only(out, StartBatch)


def test_exit_aborts_every_running_batch(four_gpus: Fingerprint) -> None:
    d = session_on(four_gpus, max_concurrency=2)
    d.message(tp_grant("b1", 1, ["t1"]))
    d.until(1.0)
    d.message(tp_grant("b2", 1, ["t2"]))
    out = d.s.on_stop_requested("signal SIGTERM", d.now)
    assert {i.batch_id for i in only(out, AbortBatch)} == {"b1", "b2"}


# --------------------------------------------------------------------------- end to end

SERIAL_SPEC = """\
name: {name}
model: {{source: tiny}}
backend: {{kind: openai, base_url: "{url}"}}
load_points:
  - {{name: c1, max_concurrency: 1, num_requests: 12, input_len: 8, output_len: 16}}
repeats: 4
budgets: {{trial_timeout_s: 60}}
"""


def overlapped_s(log: Iterable[Any], slack_s: float = 0.005) -> float:
    """Seconds during which two requests were in flight at once (each request's start against the
    latest end before it; ``slack_s`` forgives a next request sent as the last one's stream closes)."""
    total, latest = 0.0, float("-inf")
    for r in sorted(log, key=lambda r: r.start):
        if r.start < latest - slack_s:
            total += min(latest, r.end) - r.start
        latest = max(latest, r.end)
    return total


CO_TENANCY = "hardware: {co_tenancy: true}\n"


def run_one_daemon(tmp: Path, server: FakeOpenAIServer, *flags: str, spec_extra: str = "") -> tuple[float, str, str]:
    """The seconds two of the endpoint's requests overlapped, the daemon's log and the coordinator's."""
    fleet = Fleet(tmp, server.base_url)
    fleet.spec.write_text(SERIAL_SPEC.format(name=fleet.name, url=server.base_url) + spec_extra)
    try:
        fleet.start_coordinator()
        fleet.start_daemon("d1", None, *flags)
        code, _, log = fleet.wait_coordinator(150)
        assert code == 0, f"exit {code}:\n{log[-4000:]}"
        fleet.daemons["d1"].wait(timeout=15)
        daemon_log = fleet.daemon_log("d1")
    finally:
        left = fleet.close()
    assert not left, f"processes left behind: {left}"
    assert fleet.ok_count() == 4
    requests = list(server.fake.request_log)
    assert len(requests) >= 48 and all(r.status == 200 for r in requests)
    return overlapped_s(requests), daemon_log, log


@pytest.mark.timeout(300)
def test_one_daemon_runs_two_batches_at_once_only_where_spec_and_owner_declare_co_tenancy(tmp_path: Path) -> None:
    with FakeOpenAIServer(token_delay_ms=4.0, ttft_ms=5.0) as server:
        together, log, _ = run_one_daemon(tmp_path / "two", server, "--max-concurrency", "2", "--co-tenancy",
                                          spec_extra=CO_TENANCY)
    assert together > 0.2, f"two batches measured at once on one daemon ({together:.3f} s overlapped)"
    assert "(shared: co-tenancy)" not in log  # a CPU-only node: no GPU set, the node's one device
    with FakeOpenAIServer(token_delay_ms=4.0, ttft_ms=5.0) as server:
        owner_only, _, coord = run_one_daemon(tmp_path / "owner", server, "--max-concurrency", "2", "--co-tenancy")
    assert owner_only < 0.05, f"the spec does not declare co-tenancy: one batch at a time ({owner_only:.3f} s overlapped)"
    assert "the spec does not declare hardware.co_tenancy" in coord
    with FakeOpenAIServer(token_delay_ms=4.0, ttft_ms=5.0) as server:
        alone, log, _ = run_one_daemon(tmp_path / "one", server, "--max-concurrency", "2", spec_extra=CO_TENANCY)
    assert alone < 0.05, f"without --co-tenancy a CPU-only node is one slot ({alone:.3f} s overlapped)"
    assert "runs 1 batch(es) at once" in log


@pytest.mark.parametrize("value", ["0", "1025", "two"])
def test_max_concurrency_flag_is_bounded(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["start", "--coordinator", "tcp://127.0.0.1:1", "--max-concurrency", value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--max-concurrency" in err and repr(value) in err


def test_max_concurrency_flag_defaults_to_one_without_co_tenancy() -> None:
    args = build_parser().parse_args(["start", "--coordinator", "tcp://127.0.0.1:1"])
    assert (args.max_concurrency, args.co_tenancy) == (1, False)
    args = build_parser().parse_args(["start", "--coordinator", "tcp://127.0.0.1:1", "--max-concurrency", "3",
                                      "--co-tenancy"])
    assert (args.max_concurrency, args.co_tenancy) == (3, True)
