"""The fleet policy (:mod:`coordinator.policy`): pure, an injected clock, no sockets.

Queues per hardware class, per-daemon slots, resource groups with the tightest declared limit, the
implicit group of a shared endpoint, and turns: the round-robin test first shows the failure it
prevents (first come first served lets the member that just finished win the lock again, so it
drains its whole queue before the other member measures anything), then that the policy does not.
The last tests drive :class:`coordinator.control.ControlCore` with a group declared in the fleet
settings: a READY is granted only when the policy allows, else it waits and is served in turn."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from coordinator.control import ControlCore, Notice
from coordinator.fleet import FleetSettings, GroupSettings, fleet_settings
from coordinator.leases import BatchWork
from coordinator.policy import ClassQueues, FleetPolicy, shared_endpoint
from servetune.errors import SpecError
from servetune.hardware import HardwareSpec
from servetune.manifest import plan_grid
from servetune.messages import Capabilities, Grant, Hello, NoWork, Ready
from servetune.spec import BackendSpec, ExperimentSpec, parse_spec
from tests.test_control import SETTINGS, Clock, fingerprint, result, sent, spec, work


def batches(n: int, hardware_class: str | None = None) -> list[BatchWork]:
    planned = plan_grid(spec()).batches
    return [BatchWork(planned[i % len(planned)], planned[i % len(planned)].trials, hardware_class) for i in range(n)]


# ---------------------------------------------------------------------- queues


def test_queues_serve_a_class_its_own_work_then_unpinned_work_and_never_another_class() -> None:
    a1, a2 = batches(2, "gpu-a")
    b1 = batches(1, "gpu-b")[0]
    free = batches(1)[0]
    q = ClassQueues([free, a1, b1])
    q.appendleft(a2)  # a re-grant: first in line of its class
    assert len(q) == 4 and q.has_work("gpu-a") and q.has_work("gpu-z")  # unpinned work: any class
    assert q.take("gpu-a") is a2 and q.take("gpu-a") is a1
    assert q.take("gpu-a") is free  # its own queue is empty: unpinned work next
    assert q.take("gpu-a") is None, "gpu-b's pinned batch never moves to gpu-a"
    assert not q.has_work("gpu-a") and q.has_work("gpu-b")
    assert q.drain("gpu-b") == [b1] and not q and len(q) == 0


def test_iteration_lists_pinned_work_first_then_unpinned() -> None:
    free = batches(1)[0]
    pinned = batches(1, "gpu-a")[0]
    q = ClassQueues([free])
    q.appendleft(pinned)
    assert list(q) == [pinned, free] and q[0] is pinned


# ---------------------------------------------------------------------- endpoints


@pytest.mark.parametrize(("url", "group"), [
    ("http://10.0.0.7:8000", "endpoint:http://10.0.0.7:8000"),
    ("https://api.example.com/v1", "endpoint:https://api.example.com:443"),
    ("http://gpu-box", "endpoint:http://gpu-box:80"),
    ("http://127.0.0.1:8000", None),
    ("http://127.3.4.5:8000", None),
    ("http://localhost:8000", None),
    ("http://[::1]:8000", None),
])
def test_only_a_non_loopback_openai_endpoint_is_a_shared_group(url: str, group: str | None) -> None:
    assert shared_endpoint(BackendSpec(kind="openai", base_url=url)) == group


def test_backends_other_than_openai_share_nothing() -> None:
    assert shared_endpoint(BackendSpec(kind="vllm")) is None
    assert shared_endpoint(BackendSpec(kind="sim")) is None


# ---------------------------------------------------------------------- slots and groups


def test_a_daemon_holds_at_most_max_concurrency_batches_and_counts_one_until_its_next_ready() -> None:
    clock = Clock()
    p = FleetPolicy(clock=clock)
    p.join("d1", "cpu", max_concurrency=2)
    live = {"d1": 0}
    has_work: Callable[[str], bool] = lambda c: True  # noqa: E731
    p.asked("d1")
    assert p.why_wait("d1", live.get, has_work) is None
    p.granted("d1")
    live["d1"] = 1
    assert p.why_wait("d1", live.get, has_work) is None  # one slot left
    p.granted("d1")
    live["d1"] = 2
    assert "max_concurrency is 2" in str(p.why_wait("d1", live.get, has_work))
    one = FleetPolicy(clock=clock)
    one.join("d2", "cpu")  # default max_concurrency 1
    one.granted("d2")
    assert one.why_wait("d2", lambda d: 0, has_work) is not None, "its lease ended, but it has not said READY yet"
    one.asked("d2")
    assert one.why_wait("d2", lambda d: 0, has_work) is None


def test_group_limit_is_the_tightest_declared_and_one_by_default() -> None:
    clock = Clock()
    p = FleetPolicy([GroupSettings(name="box", daemons=("n*",), group_max_concurrency=3)], clock=clock)
    p.join("n1", "cpu")
    assert p.limit("box") == 3
    p.join("n2", "cpu", group_max_concurrency=2)  # a member declares tighter: it wins
    assert p.limit("box") == 2
    p.join("n3", "cpu", group_max_concurrency=5)  # looser never loosens
    assert p.limit("box") == 2
    p.leave("n2")
    assert p.limit("box") == 3
    q = FleetPolicy(clock=clock)
    q.join("x", "cpu", group="own")
    assert q.group_of("x") == "own" and q.limit("own") == 1  # nobody gave a limit: 1


def test_a_group_holds_its_limit_between_members() -> None:
    clock = Clock()
    p = FleetPolicy([GroupSettings(name="g", daemons=("a", "b", "c"), group_max_concurrency=2)], clock=clock)
    for d in "abc":
        p.join(d, "cpu")
        p.asked(d)
    live = {"a": 0, "b": 0, "c": 0}
    has_work: Callable[[str], bool] = lambda c: True  # noqa: E731
    for d in "ab":
        assert p.why_wait(d, live.get, has_work) is None
        p.granted(d)
        live[d] = 1
    assert "group_max_concurrency is 2" in str(p.why_wait("c", live.get, has_work))


def test_fleet_groups_come_first_then_the_daemons_own_then_the_shared_endpoint() -> None:
    clock = Clock()
    endpoint = "endpoint:http://10.0.0.7:8000"
    p = FleetPolicy([GroupSettings(name="g1", daemons=("a*",)), GroupSettings(name="g2", daemons=("ab",))],
                    endpoint_group=endpoint, clock=clock)
    joined = p.join("ab", "cpu", group="mine")
    assert joined.group == "g1" and any("matches fleet groups g1, g2" in n for n in joined.notes)
    assert any("declares group 'mine'" in n for n in joined.notes)
    assert p.join("z", "cpu", group="mine").group == "mine"
    shared = p.join("y", "cpu")
    assert shared.group == endpoint and any("shared endpoint http://10.0.0.7:8000" in n for n in shared.notes)
    assert FleetPolicy(clock=clock).join("y", "cpu").group is None  # loopback / no endpoint: no group


def test_fleet_file_groups_are_validated_naming_the_key(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "fleet.yaml"
    path.write_text("groups:\n  - {name: shared, daemons: [a, b], group_max_concurrency: 2, limit: 3}\n")
    with pytest.raises(SpecError, match=r"groups\.0\.limit"):
        fleet_settings(path)
    for bad, where in [({"name": "x"}, "groups.0.daemons"), ({"name": "a:b", "daemons": ["a"]}, "groups.0.name"),
                       ({"name": "x", "daemons": ["a"], "group_max_concurrency": 0}, "groups.0.group_max_concurrency")]:
        with pytest.raises(SpecError, match=where.replace(".", r"\.")):
            fleet_settings(groups=[bad])
    with pytest.raises(SpecError, match="'a' is named by groups 'x' and 'y'"):
        fleet_settings(groups=[{"name": "x", "daemons": ["a"]}, {"name": "y", "daemons": ["a"]}])
    with pytest.raises(SpecError, match="'x' is declared more than once"):
        fleet_settings(groups=[{"name": "x", "daemons": ["a"]}, {"name": "x", "daemons": ["b"]}])
    path.write_text("groups:\n  - {name: shared, daemons: ['node-*'], group_max_concurrency: 2}\n")
    assert fleet_settings(path).groups == (GroupSettings(name="shared", daemons=("node-*",), group_max_concurrency=2),)


# ---------------------------------------------------------------------- turns


def grant_order(fcfs: bool, per_member: int = 4) -> list[str]:
    """Two members of one group (limit 1), each with ``per_member`` batches of its own hardware
    class. Each batch takes 1 s; the member that finishes says READY at once (its READY arrives
    before the next tick), while the other's READY has been waiting. ``fcfs``: grant whoever asks
    while the group is free (the failure); else ask :class:`FleetPolicy`."""
    clock = Clock()
    p = FleetPolicy([GroupSettings(name="g", daemons=("a", "b"))], clock=clock, turn_wait_s=2.0)
    cls = {"a": "gpu-a", "b": "gpu-b"}
    for d, c in cls.items():
        p.join(d, c)
    q = ClassQueues([*batches(per_member, "gpu-a"), *batches(per_member, "gpu-b")])
    live = {"a": 0, "b": 0}
    order: list[str] = []
    waiting: list[str] = []

    def allows(d: str) -> bool:
        if not q.has_work(cls[d]):
            return False
        if fcfs:
            return sum(live.values()) == 0
        return p.why_wait(d, live.get, q.has_work) is None

    def grant(d: str) -> None:
        assert q.take(cls[d]) is not None
        p.granted(d)
        live[d] = 1
        order.append(d)

    def ready(d: str) -> None:
        p.asked(d)
        if allows(d):
            grant(d)
        else:
            waiting.append(d)

    def tick() -> None:
        for d in list(waiting):
            if allows(d):
                waiting.remove(d)
                grant(d)

    ready("a")
    ready("b")
    while q:
        holder = next(d for d, n in live.items() if n)
        clock.t += 1.0
        live[holder] = 0  # its last result is in: the lease ends
        for d in waiting:
            p.asked(d)  # a waiting READY is renewed every heartbeat interval (NO_WORK, READY again)
        ready(holder)  # the member that just finished asks first
        tick()
    return order


def test_first_come_first_served_lets_one_member_drain_its_whole_queue_first() -> None:
    assert grant_order(fcfs=True) == ["a", "a", "a", "a", "b", "b", "b", "b"]  # the failure turns prevent


def test_turns_go_round_robin_so_the_member_that_just_finished_does_not_win_again() -> None:
    assert grant_order(fcfs=False) == ["a", "b", "a", "b", "a", "b", "a", "b"]


def test_a_member_that_stopped_asking_loses_its_turn_after_turn_wait() -> None:
    clock = Clock()
    p = FleetPolicy([GroupSettings(name="g", daemons=("a", "b"))], clock=clock, turn_wait_s=2.0)
    p.join("a", "cpu")
    p.join("b", "cpu")
    live = {"a": 0, "b": 0}
    has_work: Callable[[str], bool] = lambda c: True  # noqa: E731
    p.asked("b")
    p.granted("a")  # a holds the group; b asks meanwhile
    p.asked("a")  # a finished and asks again at once
    assert p.why_wait("a", live.get, has_work) == "resource group g: the turn of daemon b"
    clock.t += 2.5  # b said nothing since (gone, or asking elsewhere): it keeps no turn
    p.asked("a")
    assert p.why_wait("a", live.get, has_work) is None


def test_a_member_without_work_of_its_class_does_not_hold_the_turn() -> None:
    clock = Clock()
    p = FleetPolicy([GroupSettings(name="g", daemons=("a", "b"))], clock=clock)
    p.join("a", "gpu-a")
    p.join("b", "gpu-b")
    p.granted("a")
    p.asked("b")
    p.asked("a")
    assert p.why_wait("a", lambda d: 0, lambda c: c == "gpu-a") is None


# ---------------------------------------------------------------------- the control core asks the policy


def group_core(clock: Clock) -> ControlCore:
    settings = FleetSettings(**{**SETTINGS.model_dump(), "groups": [{"name": "ep", "daemons": ["d1", "d2"]}]})
    return ControlCore(spec=spec(), work=work(), settings=settings, clock=clock)


def hello(d: str, nonce: str, **caps: object) -> Hello:
    return Hello(daemon_id=d, session_nonce=nonce, pid=1,
                 capabilities=Capabilities(fingerprint=fingerprint(), **caps))  # type: ignore[arg-type]


def test_control_core_grants_a_group_one_batch_at_a_time_in_turns() -> None:
    clock = Clock()
    c = group_core(clock)
    c.handle("d1", hello("d1", "n1"))
    c.handle("d2", hello("d2", "n2"))
    g1 = sent(c.handle("d1", Ready(session_nonce="n1", seq=1)), Grant)
    assert len(g1) == 1
    assert c.handle("d2", Ready(session_nonce="n2", seq=1)) == [], "d2 waits: the group holds d1's batch"
    assert not sent(c.tick(), Grant)
    grant = g1[0]
    assert isinstance(grant, Grant)
    for i, _ in enumerate(grant.trials):
        c.handle("d1", result("n1", grant, i, f"s{i}"))
    assert not c.leases.held_by("d1")
    # d1 is done and asks at once: it does not win again while d2 waits
    assert c.handle("d1", Ready(session_nonce="n1", seq=2, answered_seq=1)) == []
    out = c.tick()
    assert [i.daemon_id for i in out if isinstance(getattr(i, "msg", None), Grant)] == ["d2"]


def co_tenant_spec(declared: bool = True) -> ExperimentSpec:
    return spec().model_copy(update={"hardware": HardwareSpec(co_tenancy=True) if declared else None})


def test_control_core_answers_no_work_to_a_busy_daemon_and_grants_a_second_slot() -> None:
    clock = Clock()
    c = ControlCore(spec=co_tenant_spec(), work=work(), settings=SETTINGS, clock=clock)
    c.handle("d1", hello("d1", "n1", max_concurrency=2))  # a CPU-only node offering 2: its owner allows co-tenancy
    g = sent(c.handle("d1", Ready(session_nonce="n1", seq=1)), Grant)[0]
    assert isinstance(g, Grant) and g.co_tenancy, "the spec's declaration travels in the GRANT"
    held = [{"trial_id": t.trial_id, "epoch": t.attempt} for t in g.trials]
    second = c.handle("d1", Ready.model_validate({"session_nonce": "n1", "seq": 2, "answered_seq": 1, "held": held}))
    assert sent(second, Grant), "a second slot takes a second batch"
    c2 = ControlCore(spec=spec(), work=work(), settings=SETTINGS, clock=clock)
    joined = c2.handle("d1", hello("d1", "n1", max_concurrency=2))
    assert any("does not declare hardware.co_tenancy" in i.text for i in joined if isinstance(i, Notice))
    g = sent(c2.handle("d1", Ready(session_nonce="n1", seq=1)), Grant)[0]
    assert isinstance(g, Grant)
    held = [{"trial_id": t.trial_id, "epoch": t.attempt} for t in g.trials]
    assert isinstance(g, Grant) and not g.co_tenancy
    busy = c2.handle("d1", Ready.model_validate({"session_nonce": "n1", "seq": 2, "answered_seq": 1, "held": held}))
    assert sent(busy, NoWork) and not sent(busy, Grant), "no co-tenancy declared: one batch on the node's one device"


def test_without_declared_co_tenancy_a_daemon_holds_one_batch_per_gpu() -> None:
    p = FleetPolicy(clock=Clock())
    assert "one per device" in " ".join(p.join("d", "gpu", max_concurrency=6, devices=2).notes)
    assert p.slots("d") == 2
    p.join("cpu", "cpu", max_concurrency=3, devices=0)
    assert p.slots("cpu") == 1
    p.join("unknown", "cpu", max_concurrency=3)
    assert p.slots("unknown") == 3, "devices not given: taken as advertised"
    declared = FleetPolicy(clock=Clock(), co_tenancy=True)
    assert not declared.join("d", "gpu", max_concurrency=6, devices=2).notes and declared.slots("d") == 6


ENDPOINT_SPEC = """
name: ep
model: {{source: tiny}}
backend: {{kind: openai, base_url: "{url}"}}
load_points: [{{name: a, max_concurrency: 2, num_requests: 2, input_len: 8, output_len: 8}}]
repeats: 2
"""


@pytest.mark.parametrize(("url", "shared"), [("http://10.0.0.7:8000", True), ("http://127.0.0.1:8000", False)])
def test_control_core_makes_a_non_loopback_endpoint_one_group_unless_it_is_loopback(url: str, shared: bool) -> None:
    s = parse_spec(ENDPOINT_SPEC.format(url=url))
    c = ControlCore(spec=s, work=[BatchWork(b, b.trials) for b in plan_grid(s).batches], settings=SETTINGS,
                    clock=Clock())
    out = c.handle("d1", hello("d1", "n1"))
    notes = [i.text for i in out if isinstance(i, Notice)]
    assert any("shared endpoint http://10.0.0.7:8000" in n for n in notes) is shared
    c.handle("d2", hello("d2", "n2"))
    assert sent(c.handle("d1", Ready(session_nonce="n1", seq=1)), Grant)
    second = sent(c.handle("d2", Ready(session_nonce="n2", seq=1)), Grant)
    assert bool(second) is not shared, "on a shared endpoint the second daemon waits for the first"


def test_the_example_fleet_file_loads() -> None:
    settings = fleet_settings(Path(__file__).resolve().parents[1] / "configs" / "fleet.yaml")
    assert [g.name for g in settings.groups] == ["shared-endpoint", "box-7"]
    assert settings.groups[1].group_max_concurrency == 2


def test_a_daemon_cannot_name_itself_into_a_fleet_or_endpoint_group() -> None:
    """A fleet-file group is joined by its patterns, an endpoint group by measuring the endpoint: a
    daemon whose HELLO names either is refused, so it can neither join the rotation nor lower the
    limit the fleet file gave every member."""
    clock = Clock()
    endpoint = "endpoint:http://10.0.0.7:8000"
    p = FleetPolicy([GroupSettings(name="rack1", daemons=("a*",), group_max_concurrency=4)],
                    endpoint_group=endpoint, clock=clock)
    p.join("a1", "H100")
    evil = p.join("evil", "H100", group="rack1", group_max_concurrency=1)
    assert p.limit("rack1") == 4 and "evil" not in p.groups["rack1"].members
    assert any("declares group 'rack1'" in n and "refused" in n for n in evil.notes)
    assert evil.group == endpoint  # it measures the shared endpoint like any other daemon
    p.join("y", "H100")
    p.join("evil2", "H100", group=endpoint, group_max_concurrency=1)
    p.join("evil3", "H100", group_max_concurrency=1)  # a limit with no group of its own
    assert p.limit(endpoint) == 1 and all(p.members[d].declared_limit is None for d in ("evil2", "evil3"))
    p.join("z", "H100", group="mine", group_max_concurrency=2)  # a group of its own still works
    assert p.group_of("z") == "mine" and p.limit("mine") == 2


def test_the_rotation_goes_on_after_a_member_that_leaves_on_its_turn() -> None:
    clock = Clock()
    p = FleetPolicy([GroupSettings(name="g", daemons=("a", "b", "c"))], clock=clock)
    for d in "abc":
        p.join(d, "cpu")
        p.asked(d)
    idle: Callable[[str], int] = lambda d: 0  # noqa: E731
    work: Callable[[str], bool] = lambda c: True  # noqa: E731
    assert p.next_turn("g", idle, work) == "a"
    p.granted("a")
    assert p.next_turn("g", idle, work) == "b"
    p.granted("b")
    p.asked("a")  # a asks again at once: it had its turn, c has not
    p.leave("b")  # the last one granted leaves: c is next, not a again
    assert p.next_turn("g", idle, work) == "c"
