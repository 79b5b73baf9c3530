"""Hardware targets (issue 12): the spec's ``hardware`` section, planning once per target, which
daemons are given work (coordinator.targets through the control core, no sockets), and failover.

The GPUs in these fingerprints are written by hand: no GPU exists here (FAKE fingerprints, named so)."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from coordinator.control import ControlCore, Notice
from coordinator.leases import BatchWork
from coordinator.planning import plan_experiment
from coordinator.targets import FAILOVER_BATCH_OFFSET, TargetBook, failover_work, filter_mismatch
from servetune.canonical import sha256_json
from servetune.errors import SpecError
from servetune.manifest import FAILOVER_TAG_PREFIX, plan_grid
from servetune.messages import Ack, Capabilities, Grant, Heartbeat, Hello, NoWork, Ready, Result, Shutdown, Welcome
from servetune.result import Fingerprint, GPUInfo
from servetune.spec import load_spec, parse_spec
from tests.test_control import SETTINGS, Clock, result, sent

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

BASE = """
name: hw
engine:
  grid: {max_num_seqs: [2, 4, 8]}
load_points:
  - {name: a, request_rate: 1, num_requests: 2, input_len: 8, output_len: 8}
  - {name: b, max_concurrency: 2, num_requests: 2, input_len: 8, output_len: 8}
repeats: 2
"""
TWO = BASE + """
hardware:
  targets:
    - {hardware_class: 1xH100-80GB}
    - {name: a100s, gpu_model: "*A100*", min_gpu_memory_gib: 40}
  failover_to: {1xH100-80GB: [1xH200-141GB]}
"""


def fake_fp(hw: str, gpus: list[tuple[str, int | None]] = ()) -> Fingerprint:  # type: ignore[assignment]
    """A FAKE fingerprint: ``gpus`` as (model name, memory MiB), written by hand."""
    return Fingerprint(hostname="node", cpu_model="test", cpu_count=1, cpu_isa="none", ram_gib=1.0, os="linux",
                       kernel="test", python="3", servetune_version="0", hardware_class=hw,
                       gpus=[GPUInfo(index=i, name=n, memory_mib=m) for i, (n, m) in enumerate(gpus)])


H100 = fake_fp("1xH100-80GB", [("NVIDIA H100 80GB HBM3", 81_559)])
A100 = fake_fp("1xA100-80GB", [("NVIDIA A100-SXM4-80GB", 81_920)])
A100_40 = fake_fp("1xA100-40GB", [("NVIDIA A100-PCIE-40GB", 40_960)])
H200 = fake_fp("1xH200-141GB", [("NVIDIA H200", 143_771)])
L4 = fake_fp("1xL4-22GB", [("NVIDIA L4", 23_034)])


def problems(text: str) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        parse_spec(BASE + text)
    return {i.path: i.message for i in info.value.issues}


# --------------------------------------------------------------------------- the spec section


def test_hardware_section_refuses_unknown_keys_naming_them() -> None:
    got = problems("hardware: {targets: [{hardware_class: 1xH100-80GB, colour: red}], failover: {}}")
    assert "unknown key 'colour'" in got["hardware.targets[0].colour"]
    assert "gpu_model" in got["hardware.targets[0].colour"], "the allowed keys are listed"
    assert "unknown key 'failover'" in got["hardware.failover"] and "failover_to" in got["hardware.failover"]


@pytest.mark.parametrize(("text", "path", "words"), [
    ("hardware: {targets: []}", "hardware.targets", "at least 1"),
    ("hardware: {targets: [{name: x}]}", "hardware.targets[0]", "filters nothing"),
    ("hardware: {targets: [{gpu_model: '*H100*'}]}", "hardware.targets[0]", "needs hardware_class, or a filter's name"),
    ("hardware: {targets: [{hardware_class: 1xH100-80GB, gpu_count: 2}]}", "hardware.targets[0]", "remove gpu_count"),
    ("hardware: {targets: [{hardware_class: 'H100 80GB'}]}", "hardware.targets[0].hardware_class",
     "not a hardware class name"),
    ("hardware: {targets: [{name: x, gpu_model_regex: '('}]}", "hardware.targets[0].gpu_model_regex",
     "not a regular expression"),
    ("hardware: {targets: [{name: x, gpu_model: '*', gpu_model_regex: '.*'}]}", "hardware.targets[0]", "not both"),
    ("hardware: {targets: [{name: x, min_gpu_memory_gib: -1}]}", "hardware.targets[0].min_gpu_memory_gib",
     "greater than 0"),
    ("hardware: {targets: [{hardware_class: a}, {hardware_class: a}]}", "hardware", "named twice"),
    ("hardware: {targets: [{hardware_class: a}], failover_to: {b: [c]}}", "hardware", "'b' is not a target"),
    ("hardware: {targets: [{hardware_class: a}], failover_to: {a: [a]}}", "hardware", "cannot fail over to itself"),
    ("hardware: {targets: [{hardware_class: a}], failover_to: {a: []}}", "hardware.failover_to.a", "at least 1"),
])
def test_hardware_section_errors_name_the_key(text: str, path: str, words: str) -> None:
    got = problems(text)
    assert path in got, got
    assert words in got[path], got[path]


def test_no_section_keeps_spec_hash_and_trial_ids() -> None:
    spec = parse_spec(BASE)
    assert spec.hardware is None
    # the hash and ids are those of the dumps without the new fields (as recorded before they existed)
    dump = spec.model_dump(mode="json")
    assert dump.pop("hardware") is None
    dump.pop("gpu_hour_prices")
    assert dump.pop("restart_per_repeat") is True
    for key in ("n_configs", "n_trials", "sampler", "batch", "eta", "min_fidelity"):
        dump["planner"].pop(key)
    for key in ("profile", "model_shape", "noise"):
        dump["backend"].pop(key)
    dump["backend"].update(python=None, launch=None)
    for lp in dump["load_points"]:
        assert lp.pop("sla_search") is None
    assert spec.spec_hash() == sha256_json(dump)
    plan = plan_experiment(spec)
    for m in plan.trials():
        data = m.model_dump(mode="json")
        assert data.pop("hardware_target") is None and data.pop("tags") == [] and data.pop("fidelity") == 1.0
        data["load_point"]["dataset"].pop("path", None)
        assert data["load_point"].pop("sla_search") is None
        assert m.trial_id == sha256_json(data)
    assert all(BatchWork(b, b.trials).hardware_class is None for b in plan.batches), "no pin: any class, as before"
    # and naming targets changes the spec hash (it is a different experiment)
    assert parse_spec(TWO).spec_hash() != spec.spec_hash()


# --------------------------------------------------------------------------- planning


def test_two_targets_each_get_every_config_load_point_and_repeat() -> None:
    one, two = plan_grid(parse_spec(BASE)), plan_grid(parse_spec(TWO))
    cells = Counter((m.config_id, m.load_point.name, m.repeat) for m in one.trials())
    by_target: dict[str | None, Counter[tuple[str, str, int]]] = {}
    for m in two.trials():
        by_target.setdefault(m.hardware_target, Counter())[(m.config_id, m.load_point.name, m.repeat)] += 1
    assert set(by_target) == {"1xH100-80GB", "filter:a100s"}
    assert all(c == cells for c in by_target.values()), "each target gets the whole grid, once"
    assert len(two.batches) == 2 * len(one.batches)
    assert len({b.index for b in two.batches}) == len(two.batches)
    assert len({m.trial_id for m in two.trials()}) == len(two.trials()), "the target is part of the trial id"
    for i, b in enumerate(two.batches):  # b0@H100, b0@a100s, b1@H100, ...: same config and load-point order
        twin = one.batches[i // 2]
        assert b.config_id == twin.config_id
        assert [t.load_point.name for t in b.trials] == [t.load_point.name for t in twin.trials]
        assert {t.hardware_target for t in b.trials} == {("1xH100-80GB", "filter:a100s")[i % 2]}
        assert BatchWork(b, b.trials).hardware_class == ("1xH100-80GB", "filter:a100s")[i % 2]


def test_fleet_example_config_validates_and_plans_per_target() -> None:
    spec = load_spec(CONFIGS / "fleet-example.yaml")
    assert spec.hardware is not None and spec.hardware.failover_to
    plan = plan_experiment(spec)
    per = Counter(m.hardware_target for m in plan.trials())
    assert set(per) == set(spec.hardware.labels()) and len(set(per.values())) == 1


# --------------------------------------------------------------------------- matching


def test_filter_matching_rules() -> None:
    spec = parse_spec(TWO)
    assert spec.hardware is not None
    f = spec.hardware.targets[1]
    assert filter_mismatch(f, A100) is None
    assert filter_mismatch(f, A100_40) is None  # 40 GiB is enough for min 40
    assert "does not match gpu_model" in (filter_mismatch(f, L4) or "")
    assert "no GPU" in (filter_mismatch(f, fake_fp("cpu-2c-AVX2")) or "")
    assert "does not report its memory" in (filter_mismatch(f, fake_fp("1xA100", [("NVIDIA A100", None)])) or "")
    big = parse_spec(BASE + "hardware: {targets: [{name: big, gpu_model_regex: 'nvidia a100.*', min_gpu_memory_gib: 79,"
                            " gpu_count: 2}]}").hardware
    assert big is not None
    two_a100 = fake_fp("2xA100-80GB", [("NVIDIA A100-SXM4-80GB", 81_920)] * 2)
    assert filter_mismatch(big.targets[0], two_a100) is None
    assert "1 GPU(s), not 2" in (filter_mismatch(big.targets[0], A100) or "")
    mixed = fake_fp("1xA100-80GB+1xA100-40GB", [("NVIDIA A100-SXM4-80GB", 81_920), ("NVIDIA A100-PCIE-40GB", 40_960)])
    assert "below min_gpu_memory_gib" in (filter_mismatch(big.targets[0], mixed) or "")


def test_book_binds_a_filter_to_the_first_matching_class_and_refuses_others() -> None:
    spec = parse_spec(TWO)
    book = TargetBook(spec.hardware)
    queue = [BatchWork(b, b.trials) for b in plan_grid(spec).batches]
    assert book.admit(H100, queue).refusal is None
    assert {w.hardware_class for w in queue} == {"1xH100-80GB", "filter:a100s"}, "an H100 binds no A100 filter"
    first = book.admit(A100_40, queue)
    assert first.refusal is None and "bound to 1xA100-40GB" in first.notes[0]
    assert {w.hardware_class for w in queue} == {"1xH100-80GB", "1xA100-40GB"}
    later = book.admit(A100, queue)
    assert later.refusal is not None and "bound to 1xA100-40GB" in later.refusal
    l4 = book.admit(L4, queue)
    assert l4.refusal is not None and "1xL4-22GB is not a target" in l4.refusal and "'*A100*'" in l4.refusal
    assert book.admit(H200, queue).refusal is None, "a declared failover class is admitted"
    assert TargetBook(None).admit(L4).refusal is None, "no hardware section: every daemon is admitted"


# --------------------------------------------------------------------------- through the control core


def hello(d: str, fp: Fingerprint) -> Hello:
    return Hello(daemon_id=d, session_nonce=f"n-{d}", pid=1, capabilities=Capabilities(fingerprint=fp))


def run_to_end(c: ControlCore, daemons: dict[str, Fingerprint]) -> dict[str, list[Any]]:
    """Every admitted daemon asks for work and answers each GRANT with ok results until none is left;
    returns the manifests each daemon measured."""
    measured: dict[str, list[Any]] = {d: [] for d in daemons}
    for _ in range(200):
        granted = False
        for d in daemons:
            if not c.knows(d, f"n-{d}"):
                continue
            for g in sent(c.handle(d, Ready(session_nonce=f"n-{d}")), Grant):
                granted = True
                assert isinstance(g, Grant)
                for i, t in enumerate(g.trials):
                    c.handle(d, result(f"n-{d}", g, i, sub=f"s-{t.trial_id[:8]}"))
                    measured[d].append(t.manifest)
        if not granted:
            break
    return measured


def test_two_target_classes_each_measure_every_config_and_others_are_refused_work() -> None:
    spec = parse_spec(TWO)
    work = [BatchWork(b, b.trials) for b in plan_grid(spec).batches]
    c = ControlCore(spec=spec, work=work, settings=SETTINGS, clock=Clock())
    fleet = {"h1": H100, "l4": L4, "a1": A100, "h2": H100}
    for d, fp in fleet.items():
        out = c.handle(d, hello(d, fp))
        if d == "l4":
            shut = sent(out, Shutdown)
            assert shut and "refused work" in shut[0].reason and "1xL4-22GB" in shut[0].reason  # type: ignore[attr-defined]
            assert any(isinstance(i, Notice) and "daemon l4 refused work" in i.text for i in out), "a console line"
            assert not sent(out, Welcome) and not c.knows("l4", "n-l4")
            again = c.handle(d, hello(d, fp))  # a re-sent HELLO: refused again, said once
            assert sent(again, Shutdown) and not [i for i in again if isinstance(i, Notice)]
        else:
            assert sent(out, Welcome)
    measured = run_to_end(c, fleet)
    assert c.finished
    cells = Counter((m.config_id, m.load_point.name, m.repeat) for m in plan_grid(parse_spec(BASE)).trials())
    h100 = Counter((m.config_id, m.load_point.name, m.repeat) for m in measured["h1"] + measured["h2"])
    a100 = Counter((m.config_id, m.load_point.name, m.repeat) for m in measured["a1"])
    assert h100 == cells and a100 == cells, "each class measured every (config, load point, repeat) once"
    assert {m.hardware_target for m in measured["h1"] + measured["h2"]} == {"1xH100-80GB"}
    assert {m.hardware_target for m in measured["a1"]} == {"filter:a100s"}
    assert measured["l4"] == []


def test_filter_work_waits_for_a_matching_class() -> None:
    spec = parse_spec(TWO)
    c = ControlCore(spec=spec, work=[BatchWork(b, b.trials) for b in plan_grid(spec).batches], settings=SETTINGS,
                    clock=Clock())
    c.handle("h1", hello("h1", H100))
    measured = run_to_end(c, {"h1": H100})
    assert measured["h1"] and {m.hardware_target for m in measured["h1"]} == {"1xH100-80GB"}
    assert not c.finished and {w.hardware_class for w in c.queue} == {"filter:a100s"}, "the A100 half waits"
    c.handle("a1", hello("a1", A100))
    assert {w.hardware_class for w in c.queue} == {"1xA100-80GB"}
    run_to_end(c, {"a1": A100})
    assert c.finished


def test_work_added_after_a_filter_is_bound_goes_to_its_class() -> None:
    """A rate sweep's follow-ups are planned during the sweep: a filter's are pinned to its bound class."""
    spec = parse_spec(TWO)
    batches = [b for b in plan_grid(spec).batches if b.hardware_target == "filter:a100s"]
    c = ControlCore(spec=spec, work=[BatchWork(batches[0], batches[0].trials)], settings=SETTINGS, clock=Clock())
    c.handle("a1", hello("a1", A100))
    assert run_to_end(c, {"a1": A100})["a1"] and c.finished
    assert c.add(BatchWork(batches[1], batches[1].trials))
    assert [w.hardware_class for w in c.queue] == ["1xA100-80GB"]
    assert len(run_to_end(c, {"a1": A100})["a1"]) == len(batches[1].trials) and c.finished


# --------------------------------------------------------------------------- failover


def test_failover_makes_new_tagged_trials_pinned_to_the_declared_class() -> None:
    spec = parse_spec(TWO)
    plan = plan_grid(spec)
    h100 = next(BatchWork(b, b.trials) for b in plan.batches if b.hardware_target == "1xH100-80GB")
    moved = failover_work(spec.hardware, h100, {"1xH200-141GB", "1xL4-22GB"}, since="2026-12-01 20:00:00Z")
    assert moved is not None and moved.to_class == "1xH200-141GB"
    work = moved.moved
    assert work.hardware_class == "1xH200-141GB" and work.batch.index == FAILOVER_BATCH_OFFSET + h100.batch.index
    assert work.batch_id != h100.batch_id
    originals = {m.trial_id for m in plan.trials()}
    for old, new in zip(h100.trials, work.trials):
        assert new.trial_id != old.trial_id and new.trial_id not in originals, "its own trial id"
        assert new.tags == (f"{FAILOVER_TAG_PREFIX}1xH100-80GB",) and new.failover_from == "1xH100-80GB"
        assert old.failover_from is None
        assert (new.config_id, new.load_point, new.repeat) == (old.config_id, old.load_point, old.repeat)
        reason = moved.holes[old.trial_id]
        assert reason.startswith("not attempted") and "1xH200-141GB" in reason and new.trial_id[:12] in reason
        assert "since 2026-12-01 20:00:00Z" in reason and "failover-from:1xH100-80GB" in reason
    assert set(moved.holes) == {m.trial_id for m in h100.trials}
    # a daemon (not a class) as the source names the daemon in the tag
    by_daemon = failover_work(spec.hardware, h100, {"1xH200-141GB"}, source="node-7")
    assert by_daemon is not None and by_daemon.moved.trials[0].tags == ("failover-from:node-7",)


def test_failover_only_where_declared_and_available_and_never_twice() -> None:
    spec = parse_spec(TWO)
    plan = plan_grid(spec)
    h100 = next(BatchWork(b, b.trials) for b in plan.batches if b.hardware_target == "1xH100-80GB")
    a100 = next(BatchWork(b, b.trials) for b in plan.batches if b.hardware_target == "filter:a100s")
    assert failover_work(spec.hardware, a100, {"1xH200-141GB", "1xH100-80GB"}) is None, "a100s declares no failover"
    assert failover_work(spec.hardware, h100, {"1xL4-22GB"}) is None, "no declared class in service"
    assert failover_work(None, h100, {"1xH200-141GB"}) is None, "no hardware section: nothing moves"
    moved = failover_work(spec.hardware, h100, {"1xH200-141GB"})
    assert moved is not None
    assert failover_work(spec.hardware, moved.moved, {"1xH200-141GB"}) is None, "a failover trial stays put"


def test_failover_work_is_granted_only_to_the_failover_class() -> None:
    spec = parse_spec(TWO)
    plan = plan_grid(spec)
    h100 = next(BatchWork(b, b.trials) for b in plan.batches if b.hardware_target == "1xH100-80GB")
    moved = failover_work(spec.hardware, h100, {"1xH200-141GB"})
    assert moved is not None
    c = ControlCore(spec=spec, work=[moved.moved], settings=SETTINGS, clock=Clock())
    c.handle("a1", hello("a1", A100))
    c.handle("x1", hello("x1", H200))
    measured = run_to_end(c, {"a1": A100, "x1": H200})
    assert measured["a1"] == [] and len(measured["x1"]) == len(h100.trials) and c.finished



def test_a_target_class_that_never_joins_fails_over_where_declared_and_drains_where_not() -> None:
    """The drain (coordinator.breaker) meets failover: with only an H200 daemon in service, the
    H100 target's batches move to the H200 (new ids, tagged) after two cool-downs, and the A100
    filter's (no failover declared) become holes; the moved work is measured on the H200 only. A
    class no daemon of which has joined waits the sweep's daemon wait (3 s here), not only the two
    cool-downs (2 s): its daemons may still be starting."""
    from coordinator.breaker import Drained
    from coordinator.control import FailedOver

    spec = parse_spec(TWO)
    plan = plan_grid(spec)
    clock = Clock()
    c = ControlCore(spec=spec, work=[BatchWork(b, b.trials) for b in plan.batches],
                    settings=SETTINGS.model_copy(update={"recovery_after_s": 1.0, "daemon_wait_s": 3.0}), clock=clock)
    c.handle("x1", hello("x1", H200))
    c.tick()
    clock.t += 1.9
    assert not [e for e in c.tick() if isinstance(e, (FailedOver, Drained))], "not before two cool-downs"
    clock.t += 0.2
    assert not [e for e in c.tick() if isinstance(e, (FailedOver, Drained))], "not before the daemon wait"
    clock.t += 1.0
    out = c.tick()
    moved = [e.failover for e in out if isinstance(e, FailedOver)]
    drained = [e for e in out if isinstance(e, Drained)]
    h100 = [m for b in plan.batches if b.hardware_target == "1xH100-80GB" for m in b.trials]
    a100 = {m.trial_id for b in plan.batches if b.hardware_target == "filter:a100s" for m in b.trials}
    assert sorted(t for fo in moved for t in fo.holes) == sorted(m.trial_id for m in h100)
    assert all(fo.to_class == "1xH200-141GB" and fo.source == "1xH100-80GB" for fo in moved)
    assert [d.hardware_class for d in drained] == ["filter:a100s"] and set(drained[0].trial_ids) == a100
    assert not c.finished, "the moved work is queued"
    measured = run_to_end(c, {"x1": H200})
    assert len(measured["x1"]) == len(h100)
    assert all(m.tags == ("failover-from:1xH100-80GB",) for m in measured["x1"])


# --------------------------------------------------------------------------- store and dataset


def planned_store(folder: Path) -> tuple[Any, Any, Any]:
    """The spec TWO, its plan and a real store (``folder``) that has recorded it: close the store."""
    from coordinator.store import Store

    spec = parse_spec(TWO)
    plan = plan_grid(spec)
    store = Store.open(folder)
    store.record_plan(spec.spec_hash(), spec.model_dump(mode="json"), TWO, plan)
    return spec, plan, store


def test_store_and_dataset_keep_each_trials_target_and_failover_tag(tmp_path: Path) -> None:
    from coordinator.dataset import build_dataset
    from coordinator.sweep import select_work

    spec, plan, store = planned_store(tmp_path / "exp")
    try:
        work, _ = select_work(plan, store, retry_failed=False)
        assert Counter(w.hardware_class for w in work) == {"1xH100-80GB": 6, "filter:a100s": 6}, "pinned per target"
        moved = failover_work(spec.hardware, work[0], {"1xH200-141GB"})
        assert moved is not None
        store.add_trials(spec.spec_hash(), list(moved.moved.trials), moved.moved.batch.index)
        ds = build_dataset(store)
    finally:
        store.close()
    tags = dict(zip(ds["trial_id"].values.tolist(), ds["tags"].values.tolist()))
    targets = dict(zip(ds["trial_id"].values.tolist(), ds["hardware_target"].values.tolist()))
    for m in moved.moved.trials:
        assert tags[m.trial_id] == "failover-from:1xH100-80GB" and targets[m.trial_id] == "1xH200-141GB"
    originals = [m.trial_id for m in plan.trials()]
    assert all(tags[t] == "" for t in originals)
    assert Counter(targets[t] for t in originals) == {"1xH100-80GB": 12, "filter:a100s": 12}


def test_validate_says_how_many_targets_each_plan_covers(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from coordinator.commands import validate

    assert validate.run(argparse.Namespace(config=str(CONFIGS / "fleet-example.yaml"))) == 0
    line = capsys.readouterr().out
    assert "x 2 hardware target(s) (1xH100-80GB, filter:a100-80g) = 32 trials" in line
    assert validate.run(argparse.Namespace(config=str(CONFIGS / "quickstart.yaml"))) == 0
    assert "hardware target" not in capsys.readouterr().out


# --------------------------------------------------------------------------- end to end, scripted daemons

E2E_SPEC = """
name: targets-e2e
model: {source: tiny}
backend: {kind: sim}
engine:
  grid: {max_num_seqs: [2, 8, 32]}
load_points:
  - {name: c2, max_concurrency: 2, num_requests: 4, input_len: 8, output_len: 8}
hardware:
  targets:
    - {hardware_class: 1xH100-80GB}
    - {name: a100s, gpu_model: "*A100*"}
"""


def test_two_target_classes_end_to_end_through_the_coordinator(tmp_path: Path) -> None:
    """The real coordinator process (sockets, CURVE, store, dataset) with scripted daemons whose
    FAKE fingerprints claim an H100, an A100 and an L4 (no GPU exists here; the daemons are test
    doubles of the wire, tests.test_fleet_faults.Scripted): each target class measures every
    config, the L4 is refused work with the reason, and the dataset names each trial's target."""
    import xarray as xr

    from tests.fleet_harness import Fleet
    from tests.test_fleet_faults import Scripted, _outcome

    fleet = Fleet(tmp_path, url="http://127.0.0.1:9", name="targets-e2e",
                  timings={"--heartbeat-interval": "0.5", "--lease-ttl": "10", "--lease-grace": "2", "--daemon-wait": "30"})
    fleet.spec.write_text(E2E_SPEC)
    fleet.start_coordinator()
    nodes = {"h100": H100, "a100": A100, "l4": L4}
    daemons: dict[str, Scripted] = {}
    try:
        for name, fp in nodes.items():
            d = daemons[name] = Scripted(fleet.address, fleet.home, daemon_id=name)
            d.nonce = f"nonce-{name}"
            d.send(Hello(daemon_id=name, session_nonce=d.nonce, pid=1, capabilities=Capabilities(fingerprint=fp)))
            if name == "l4":
                shut = d.recv((Shutdown,), 30)
                assert isinstance(shut, Shutdown) and "1xL4-22GB is not a target" in shut.reason
            else:
                assert isinstance(d.recv((Welcome,), 30), Welcome)
        measured: dict[str, list[Any]] = {"h100": [], "a100": []}
        done: set[str] = set()
        deadline = time.monotonic() + 90
        while len(done) < 2 and fleet.poll_coordinator() is None and time.monotonic() < deadline:
            for name in sorted(set(measured) - done):  # take turns, so each keeps heartbeating
                d = daemons[name]
                d.send(Ready(session_nonce=d.nonce))
                msg = d.recv((Grant, NoWork, Shutdown), 30)
                if isinstance(msg, Shutdown):
                    done.add(name)
                if not isinstance(msg, Grant):
                    continue
                for t in msg.trials:
                    outcome = _outcome().model_copy(update={"fingerprint": nodes[name]})
                    d.send(Result(session_nonce=d.nonce, batch_id=msg.batch_id, trial_id=t.trial_id, epoch=t.attempt,
                                  submission_id=f"s-{t.trial_id[:8]}", outcome=outcome))
                    assert isinstance(d.recv((Ack,), 30), Ack)
                    measured[name].append(t.manifest)
        code, _, log = fleet.wait_coordinator(60)
    finally:
        for d in daemons.values():
            d.close()
        fleet.close()
    assert code == 0, log[-3000:]
    assert "daemon l4 refused work: hardware class 1xL4-22GB is not a target" in log
    assert "filter 'a100s' bound to 1xA100-80GB" in log
    for name, target in (("h100", "1xH100-80GB"), ("a100", "filter:a100s")):
        assert {m.hardware_target for m in measured[name]} == {target}
        assert sorted(m.engine.args.max_num_seqs for m in measured[name]) == [2, 8, 32], "every config on each class"
    ds = xr.open_dataset(fleet.folder / "results.nc")
    try:
        rows = sorted(zip(ds["hardware_target"].values.tolist(), ds["hardware_class"].values.tolist(),
                          ds["status"].values.tolist()))
    finally:
        ds.close()
    assert rows == [("1xH100-80GB", "1xH100-80GB", "ok")] * 3 + [("filter:a100s", "1xA100-80GB", "ok")] * 3


#: A two-config sim experiment (the scripted daemons answer for it), its name and hardware section to follow.
SIM_BODY = """
model: {source: tiny}
backend: {kind: sim}
engine:
  grid: {max_num_seqs: [2, 8]}
load_points:
  - {name: c2, max_concurrency: 2, num_requests: 4, input_len: 8, output_len: 8}
"""
FAILOVER_SPEC = "name: failover-e2e" + SIM_BODY + """\
hardware:
  targets:
    - {hardware_class: 1xH100-80GB}
    - {hardware_class: 1xH200-141GB}
  failover_to: {1xH100-80GB: [1xH200-141GB]}
"""


def test_a_declared_failover_end_to_end_is_tagged_and_leaves_the_originals_as_holes(tmp_path: Path) -> None:
    """The real coordinator with one scripted daemon, a FAKE H200 fingerprint (no GPU here): the
    H100 target never gets a daemon, so after two cool-downs its trials fail over to the H200 as
    new trials tagged ``failover-from:1xH100-80GB``; the originals stay holes that name them
    (exit 3), results.nc carries the tag, and retries.jsonl a ``failover`` line for each."""
    import json

    import xarray as xr

    from tests.fleet_harness import Fleet
    from tests.test_fleet_faults import Scripted

    fleet = Fleet(tmp_path, url="http://127.0.0.1:9", name="failover-e2e",
                  timings={"--heartbeat-interval": "0.5", "--lease-ttl": "10", "--lease-grace": "2", "--daemon-wait": "60"})
    fleet.spec.write_text(FAILOVER_SPEC)
    settings = tmp_path / "settings-fleet.yaml"
    settings.write_text("recovery_after_s: 1.0\n")
    fleet.start_coordinator("--fleet", str(settings))
    d = Scripted(fleet.address, fleet.home, daemon_id="h200")
    measured: list[Any] = []
    try:
        d.nonce = "nonce-h200"
        d.send(Hello(daemon_id="h200", session_nonce=d.nonce, pid=1, capabilities=Capabilities(fingerprint=H200)))
        assert isinstance(d.recv((Welcome,), 30), Welcome)
        measured = serve_scripted(fleet, d, H200, "ok", deadline_s=90)
        code, _, log = fleet.wait_coordinator(60)
    finally:
        d.close()
        fleet.close()
    assert code == 3, log[-3000:]
    assert log.count("FAILOVER 1 trial(s) from 1xH100-80GB to 1xH200-141GB") >= 2, log[-3000:]  # one per batch
    moved = [m for m in measured if m.failover_from is not None]
    assert len(moved) == 2 and all(m.tags == ("failover-from:1xH100-80GB",) for m in moved)
    assert len([m for m in measured if m.failover_from is None]) == 2, "the H200 target's own trials"
    lines = [json.loads(x) for x in (fleet.folder / "retries.jsonl").read_text().splitlines()]
    assert sorted(x["event"] for x in lines) == ["failover", "failover"]
    assert all("failed over to class 1xH200-141GB" in x["reason"] for x in lines)
    ds = xr.open_dataset(fleet.folder / "results.nc")
    try:
        tags = [str(t) for t in ds["tags"].values.tolist()]
    finally:
        ds.close()
    assert sum("failover-from:1xH100-80GB" in t for t in tags) == 2


# --------------------------------------------------------------------------- a resumed sweep prefers last time's class

A100S = "filter:a100s"


def test_a_resumed_book_waits_for_the_class_a_filter_was_bound_to_last_time() -> None:
    spec = parse_spec(TWO)
    queue = [BatchWork(b, b.trials) for b in plan_grid(spec).batches]
    book = TargetBook(spec.hardware, preferred={A100S: "1xA100-80GB"}, prefer_until=100.0)
    early = book.admit(A100_40, queue, now=10.0)
    assert early.refusal is None, "it matches the filter: admitted"
    assert A100S not in book.bound and "waits for up to 90 s for 1xA100-80GB" in early.notes[0]
    assert book.settle(50.0, {"1xA100-40GB"}, queue) == [], "the wait is not over"
    again = book.admit(A100, queue, now=60.0)
    assert book.bound[A100S] == "1xA100-80GB" and "bound to 1xA100-80GB again, as in the previous sweep" in again.notes[0]
    assert {w.hardware_class for w in queue} == {"1xH100-80GB", "1xA100-80GB"}
    assert book.settle(200.0, {"1xA100-40GB"}, queue) == [] and book.bound[A100S] == "1xA100-80GB"


def test_a_resumed_filter_binds_elsewhere_once_its_wait_is_over_and_says_so() -> None:
    spec = parse_spec(TWO)
    queue = [BatchWork(b, b.trials) for b in plan_grid(spec).batches]
    book = TargetBook(spec.hardware, preferred={A100S: "1xA100-80GB"}, prefer_until=100.0)
    book.admit(A100_40, queue, now=10.0)
    assert book.settle(150.0, set(), queue) == [], "the class that matched left: nothing to bind to"
    notes = book.settle(160.0, {"1xA100-40GB"}, queue)
    assert book.bound[A100S] == "1xA100-40GB" and "span two hardware classes" in notes[0] and "1xA100-80GB" in notes[0]
    assert {w.hardware_class for w in queue} == {"1xH100-80GB", "1xA100-40GB"}
    late = TargetBook(spec.hardware, preferred={A100S: "1xA100-80GB"}, prefer_until=100.0)
    past = late.admit(A100_40, [], now=120.0)
    assert late.bound[A100S] == "1xA100-40GB" and "span two hardware classes" in past.notes[0]
    fresh = TargetBook(spec.hardware)  # not a resume: the first matching class, as before
    fresh.admit(A100_40, [], now=0.0)
    assert fresh.bound[A100S] == "1xA100-40GB"


def test_the_control_core_of_a_resumed_sweep_gives_the_filter_to_last_times_class() -> None:
    spec = parse_spec(TWO)
    clock = Clock()
    c = ControlCore(spec=spec, work=[BatchWork(b, b.trials) for b in plan_grid(spec).batches], settings=SETTINGS,
                    clock=clock, preferred_bindings={A100S: "1xA100-80GB"})
    out = c.handle("a40", hello("a40", A100_40))
    assert sent(out, Welcome) and any(isinstance(i, Notice) and "waits" in i.text for i in out)
    assert run_to_end(c, {"a40": A100_40})["a40"] == [], "the 40 GB node waits: the filter prefers last time's class"
    assert any("bound to 1xA100-80GB again" in i.text for i in c.handle("a80", hello("a80", A100))
               if isinstance(i, Notice))
    c.handle("h1", hello("h1", H100))
    measured = run_to_end(c, {"a40": A100_40, "a80": A100, "h1": H100})
    assert measured["a80"] and {m.hardware_target for m in measured["a80"]} == {A100S} and measured["a40"] == []
    # the previous class never comes: after recovery_after_s the filter goes to the class that is here
    c2 = ControlCore(spec=spec, work=[BatchWork(b, b.trials) for b in plan_grid(spec).batches], settings=SETTINGS,
                     clock=clock, preferred_bindings={A100S: "1xA100-80GB"})
    c2.handle("a40", hello("a40", A100_40))
    clock.t += SETTINGS.recovery_after_s + 1
    c2.handle("a40", Heartbeat(session_nonce="n-a40", seq=1, leases=[]))
    notes = [i.text for i in c2.tick() if isinstance(i, Notice)]
    assert any("bound to 1xA100-40GB" in n and "span two hardware classes" in n for n in notes), notes
    assert run_to_end(c2, {"a40": A100_40})["a40"]


def test_prior_bindings_come_from_the_latest_attempt_that_ran_in_the_store(tmp_path: Path) -> None:
    from coordinator.targets import prior_bindings

    spec, plan, store = planned_store(tmp_path / "exp")
    try:
        filt = [m for m in plan.trials() if m.hardware_target == A100S]
        h100 = next(m for m in plan.trials() if m.hardware_target == "1xH100-80GB")
        for m, cls in [(filt[0], "1xA100-40GB"), (filt[1], "1xA100-80GB"), (h100, "1xH100-80GB")]:
            n = store.begin_attempt(m.trial_id, daemon_id="d", batch_id="b", spec_hash=spec.spec_hash())
            time.sleep(0.002)  # distinct start times (microseconds)
            store.finish_attempt(m.trial_id, n, status="ok", failure_kind=None, error=None, submission_id=f"s{n}",
                                 record=None, metrics=None, hardware_class=cls)
        store.begin_attempt(filt[2].trial_id, daemon_id="d", batch_id="b", spec_hash=spec.spec_hash())  # never ran
        attempts = [(a.trial_id, a.hardware_class, a.started_at_us) for a in store.all_attempts()]
    finally:
        store.close()
    targets_of = {m.trial_id: m.hardware_target for m in plan.trials()}
    assert prior_bindings(targets_of, attempts) == {A100S: "1xA100-80GB"}, "the latest attempt's class; classes only"
    assert prior_bindings(targets_of, []) == {}


RESUME_SPEC = "name: resume-binding" + SIM_BODY + """\
hardware:
  targets:
    - {name: a100s, gpu_model: "*A100*"}
"""


def serve_scripted(fleet: Any, d: Any, fp: Fingerprint, status: str, deadline_s: float = 60) -> list[Any]:
    """Scripted daemon ``d`` asks for work and answers each GRANT with ``status`` results (heartbeating
    while there is none) until told SHUTDOWN or the coordinator ends; returns the manifests it measured."""
    from tests.test_fleet_faults import _outcome

    measured: list[Any] = []
    deadline = time.monotonic() + deadline_s
    while fleet.poll_coordinator() is None and time.monotonic() < deadline:
        d.send(Ready(session_nonce=d.nonce))
        msg = d.recv((Grant, NoWork, Shutdown), 30)
        if isinstance(msg, Shutdown):
            break
        if not isinstance(msg, Grant):
            d.seq += 1
            d.send(Heartbeat(session_nonce=d.nonce, seq=d.seq, leases=[]))
            time.sleep(0.2)
            continue
        for t in msg.trials:
            outcome = _outcome().model_copy(update={"fingerprint": fp, "status": status})
            if status == "failed":
                outcome = outcome.model_copy(update={"failure_kind": "measurement", "error": "OOM (scripted)"})
            d.send(Result(session_nonce=d.nonce, batch_id=msg.batch_id, trial_id=t.trial_id, epoch=t.attempt,
                          submission_id=f"s-{t.trial_id[:8]}-{t.attempt}", outcome=outcome))
            assert isinstance(d.recv((Ack,), 30), Ack)
            measured.append(t.manifest)
    return measured


def test_a_resumed_sweep_binds_a_filter_to_last_times_class_end_to_end(tmp_path: Path) -> None:
    """The real coordinator (sockets, store) twice with scripted daemons whose FAKE fingerprints
    claim A100s (no GPU exists here). Sweep 1: the 80 GB node measures the filter's trials (they
    fail, so ``--retry-failed`` has work). Sweep 2: a 40 GB node, which matches the filter too,
    joins first and waits; the 80 GB node joins and the filter binds to it again, as the log says."""
    import xarray as xr

    from tests.fleet_harness import Fleet
    from tests.test_fleet_faults import Scripted

    fleet = Fleet(tmp_path, url="http://127.0.0.1:9", name="resume-binding",
                  timings={"--heartbeat-interval": "0.5", "--lease-ttl": "10", "--lease-grace": "2", "--daemon-wait": "30"})
    fleet.spec.write_text(RESUME_SPEC)
    daemons: list[Scripted] = []

    def join(name: str, fp: Fingerprint, nonce: str) -> Scripted:
        d = Scripted(fleet.address, fleet.home, daemon_id=name)
        daemons.append(d)
        d.nonce = nonce
        d.send(Hello(daemon_id=name, session_nonce=nonce, pid=1, capabilities=Capabilities(fingerprint=fp)))
        assert isinstance(d.recv((Welcome,), 30), Welcome)
        return d

    try:
        fleet.start_coordinator()
        first = serve_scripted(fleet, join("a80", A100, "n1"), A100, "failed")
        fleet.wait_coordinator(60)
        for d in daemons:
            d.close()
        daemons.clear()
        fleet.start_coordinator("--retry-failed")
        a40 = join("a40", A100_40, "n2")
        a40.send(Ready(session_nonce="n2"))
        assert isinstance(a40.recv((NoWork,), 30), NoWork), "the filter waits for last time's class"
        second = serve_scripted(fleet, join("a80", A100, "n3"), A100, "ok")
        code, out, log = fleet.wait_coordinator(60)
    finally:
        for d in daemons:
            d.close()
        fleet.close()
    assert len(first) == 2 and len(second) == 2, (first, second)
    assert code == 0, log[-3000:]
    text = out + log
    assert "resuming: hardware target filter:a100s ran on 1xA100-80GB before" in text, text[-3000:]
    assert "1xA100-40GB matches, but the filter waits" in text
    assert "filter 'a100s' bound to 1xA100-80GB again, as in the previous sweep" in text
    ds = xr.open_dataset(fleet.folder / "results.nc")
    try:
        assert set(ds["hardware_class"].values.tolist()) == {"1xA100-80GB"}
        assert set(ds["status"].values.tolist()) == {"ok"}
    finally:
        ds.close()
