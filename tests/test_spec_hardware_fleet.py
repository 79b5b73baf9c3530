"""The spec's own fleet declarations (``hardware.co_tenancy``, ``hardware.groups``): strict keys,
merged with the fleet file's resource groups (the tightest limit wins), and obeyed by the control
core. Pure: a real :class:`coordinator.control.ControlCore` with a fake clock, no sockets. The
end-to-end co-tenancy check (two batches on one device only where declared, on the endpoint's own
request log) is in tests/test_daemon_slots.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.control import ControlCore
from coordinator.fleet import FleetSettings, GroupSettings, merge_groups
from coordinator.policy import FleetPolicy
from servetune.errors import SpecError
from servetune.hardware import HardwareSpec
from servetune.messages import Grant, Ready
from servetune.spec import parse_spec
from tests.test_control import SETTINGS, SPEC, Clock, result, sent, spec, work
from tests.test_policy import hello


def spec_with(hardware: str) -> str:
    return SPEC + f"hardware: {hardware}\n"


@pytest.mark.parametrize(("hardware", "where", "says"), [
    ("{co_tenancy: yes please}", "hardware.co_tenancy", "boolean"),
    ("{cotenancy: true}", "hardware.cotenancy", "unknown key 'cotenancy'"),
    ("{groups: [{name: a, daemons: [x], limit: 2}]}", "hardware.groups[0].limit", "unknown key 'limit'"),
    ("{groups: [{name: a, daemons: []}]}", "hardware.groups[0].daemons", "at least 1"),
    ("{groups: [{name: 'a:b', daemons: [x]}]}", "hardware.groups[0].name", "pattern"),
    ("{groups: [{name: a, daemons: [x], group_max_concurrency: 0}]}", "hardware.groups[0].group_max_concurrency",
     "greater than or equal to 1"),
    ("{groups: [{name: a, daemons: [x]}, {name: a, daemons: [y]}]}", "hardware", "'a' is declared more than once"),
    ("{groups: [{name: a, daemons: [x]}, {name: b, daemons: [x]}]}", "hardware", "named by groups 'a' and 'b'"),
])
def test_bad_fleet_declarations_in_the_spec_are_refused_naming_the_key(hardware: str, where: str, says: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(spec_with(hardware))
    text = str(info.value)
    assert f"{where}:" in text and says in text, text


def test_a_hardware_section_of_only_co_tenancy_measures_any_class_and_keeps_trial_ids() -> None:
    plain, declared = parse_spec(SPEC), parse_spec(spec_with("{co_tenancy: true}"))
    assert declared.hardware is not None and declared.hardware.co_tenancy and not declared.hardware.targets
    from servetune.manifest import plan_grid

    assert [m.trial_id for b in plan_grid(plain).batches for m in b.trials] == [
        m.trial_id for b in plan_grid(declared).batches for m in b.trials], "no target: manifests unchanged"
    assert plain.spec_hash() != declared.spec_hash(), "co-tenancy is a measurement condition: the spec hash says so"
    assert parse_spec(spec_with("{co_tenancy: false}")).spec_hash() != plain.spec_hash()  # a section is a section
    with_targets = parse_spec(spec_with("{targets: [{hardware_class: cpu-2c}]}"))
    assert with_targets.hardware is not None
    again = parse_spec(spec_with("{targets: [{hardware_class: cpu-2c}], co_tenancy: false, groups: []}"))
    assert again.spec_hash() == with_targets.spec_hash(), "the new keys at their defaults leave a spec's hash alone"


def test_groups_of_the_spec_and_the_fleet_file_merge_and_the_tightest_limit_wins() -> None:
    fleet = (GroupSettings(name="ep", daemons=["d1"], group_max_concurrency=3),
             GroupSettings(name="box", daemons=["n*"]))
    spec_groups = [GroupSettings(name="ep", daemons=["d1", "d2"], group_max_concurrency=2),
                   GroupSettings(name="rack", daemons=["r1"], group_max_concurrency=4)]
    merged = {g.name: g for g in merge_groups(fleet, spec_groups)}
    assert list(merged) == ["ep", "box", "rack"]
    assert merged["ep"].daemons == ["d1", "d2"] and merged["ep"].group_max_concurrency == 2
    assert merged["box"].group_max_concurrency is None and merged["rack"].group_max_concurrency == 4
    looser = merge_groups([GroupSettings(name="ep", daemons=["d1"], group_max_concurrency=1)],
                          [GroupSettings(name="ep", daemons=["d1"], group_max_concurrency=5)])
    assert looser[0].group_max_concurrency == 1, "the fleet file's tighter limit wins over the spec's"
    p = FleetPolicy(merge_groups(fleet, spec_groups), clock=Clock())
    p.join("d2", "cpu", group_max_concurrency=1)
    assert p.group_of("d2") == "ep" and p.limit("ep") == 1, "a member's HELLO may tighten it further"


def test_a_daemon_in_two_groups_across_the_spec_and_the_fleet_file_is_refused() -> None:
    with pytest.raises(SpecError) as info:
        merge_groups([GroupSettings(name="a", daemons=["d1"])], [GroupSettings(name="b", daemons=["d1"])])
    text = str(info.value)
    assert "hardware.groups" in text and "'d1' is named by groups 'a' and 'b'" in text


def test_the_control_core_holds_a_spec_declared_group_to_one_batch_at_a_time() -> None:
    s = spec().model_copy(update={"hardware": HardwareSpec(groups=[GroupSettings(name="ep", daemons=["d1", "d2"])])})
    clock = Clock()
    c = ControlCore(spec=s, work=work(), settings=SETTINGS, clock=clock)
    c.handle("d1", hello("d1", "n1"))
    c.handle("d2", hello("d2", "n2"))
    g1 = sent(c.handle("d1", Ready(session_nonce="n1", seq=1)), Grant)
    assert len(g1) == 1
    assert c.handle("d2", Ready(session_nonce="n2", seq=1)) == [], "d2 waits: the spec's group holds d1's batch"
    grant = g1[0]
    assert isinstance(grant, Grant)
    for i, _ in enumerate(grant.trials):
        c.handle("d1", result("n1", grant, i, f"s{i}"))
    assert c.handle("d1", Ready(session_nonce="n1", seq=2, answered_seq=1)) == [], "d1 does not win the turn again"
    out = c.tick()
    assert [i.daemon_id for i in out if isinstance(getattr(i, "msg", None), Grant)] == ["d2"], "then d2's turn"
    loose = FleetSettings(**{**SETTINGS.model_dump(), "groups": [{"name": "ep", "daemons": ["d1"],
                                                                  "group_max_concurrency": 2}]})
    c2 = ControlCore(spec=s, work=work(), settings=loose, clock=clock)
    c2.handle("d1", hello("d1", "n1"))
    assert c2.policy.limit("ep") == 2, "fleet file 2, the spec none: 2"


def test_sweep_refuses_a_conflicting_group_with_exit_2_before_writing(tmp_path: Path) -> None:
    spec_file = tmp_path / "exp.yaml"
    spec_file.write_text(spec_with("{groups: [{name: b, daemons: [d1]}]}"))
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text("groups:\n  - {name: a, daemons: [d1]}\n")
    root = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-m", "coordinator", "sweep", str(spec_file), "--fleet", str(fleet_file),
                           "--results-root", str(root)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "'d1' is named by groups 'a' and 'b'" in proc.stderr
    assert not root.exists() or not any(root.iterdir()), "nothing half-written"
