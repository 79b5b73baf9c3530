"""The scheduler's pure logic, with an injected clock and no sockets."""

from __future__ import annotations

from coordinator.scheduler import BatchWork, Scheduler
from servetune.manifest import plan_grid
from servetune.spec import parse_spec

SPEC = """
name: sched
engine: {grid: {max_num_seqs: [2, 4]}, fixed: {max_model_len: 256}}
load_points:
  - {name: a, request_rate: 1, num_requests: 2, input_len: 8, output_len: 8}
  - {name: b, request_rate: 1, num_requests: 2, input_len: 8, output_len: 8}
"""


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _work() -> list[BatchWork]:
    plan = plan_grid(parse_spec(SPEC))
    return [BatchWork(batch=b, trials=b.trials) for b in plan.batches]


def test_grants_in_order_and_classifies_results() -> None:
    clock = Clock()
    work = _work()
    s = Scheduler(work, clock)
    assert s.take("d1") is None  # unknown daemon gets nothing
    s.add_daemon("d1")
    w = s.take("d1")
    assert w is work[0]
    lease = s.grant("d1", w, {t.trial_id: 1 for t in w.trials})
    t0, t1 = (t.trial_id for t in w.trials)
    assert s.classify_result("d2", lease.batch_id, t0, 1, "s") == "stale"  # not this daemon's lease
    assert s.classify_result("d1", lease.batch_id, t0, 2, "s") == "stale"  # wrong epoch
    assert s.classify_result("d1", lease.batch_id, t0, 1, "s") == "accept"
    s.resolve(lease.batch_id, t0, "s")
    assert s.classify_result("d1", lease.batch_id, t0, 1, "s") == "duplicate"
    assert s.classify_result("d1", lease.batch_id, t0, 1, "other") == "conflict"
    s.resolve(lease.batch_id, t1, "s1")
    assert lease.batch_id not in s.leases
    assert not s.finished and s.queued == 1


def test_lost_daemon_returns_outstanding_attempts_and_expiry_uses_clock() -> None:
    clock = Clock()
    s = Scheduler(_work(), clock)
    s.add_daemon("d1")
    w = s.take("d1")
    assert w is not None
    lease = s.grant("d1", w, {t.trial_id: 3 for t in w.trials})
    s.resolve(lease.batch_id, w.trials[0].trial_id, "x")
    clock.t = 10
    assert s.expired(20) == []
    clock.t = 31
    assert [e.batch_id for e in s.expired(20)] == [lease.batch_id]
    assert s.remove_daemon("d1") == [(w.trials[1].trial_id, 3)]
    assert s.leases == {}


def test_stop_leaves_queue_as_holes() -> None:
    s = Scheduler(_work(), Clock())
    s.add_daemon("d")
    assert s.stop() == 2
    assert s.take("d") is None and s.finished
