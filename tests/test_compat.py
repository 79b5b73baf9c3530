"""Experiment folders recorded by the protocol-1 code (tests/data/wave1, see its README) resume
with nothing to run: trial ids, spec hashes and the store schema stay compatible."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from coordinator.planning import plan_experiment
from coordinator.store import Store
from coordinator.sweep import select_work
from servetune.canonical import drop_added_defaults, sha256_json
from servetune.manifest import ADDED_MANIFEST_FIELDS, TrialManifest
from servetune.spec import load_spec
from tests.conftest import cli_env, coordinator_cmd

DATA = Path(__file__).parent / "data" / "wave1"
NAMES = ["wave1-openai", "wave1-vllm"]


@pytest.mark.parametrize("name", NAMES)
def test_wave1_plan_matches_the_recorded_trials(name: str, tmp_path: Path) -> None:
    spec = load_spec(DATA / f"{name}.yaml")
    shutil.copytree(DATA / name, tmp_path / name)  # a reader of a WAL database writes beside it
    store = Store.open_readonly(tmp_path / name)
    try:
        assert store.current_spec_hash() == spec.spec_hash(), "the spec hash of a wave-1 spec changed"
        plan = plan_experiment(spec)
        recorded = {t for t, _, _ in store.trials()}
        assert {m.trial_id for m in plan.trials()} == recorded, "trial ids of a wave-1 plan changed"
        work, skipped = select_work(plan, store, retry_failed=False)
        assert work == [] and set(skipped.values()) == {"ok"}
    finally:
        store.close()


@pytest.mark.parametrize("name", NAMES)
def test_wave1_folder_resumes_with_nothing_to_run(name: str, tmp_path: Path) -> None:
    root = tmp_path / "runs"
    shutil.copytree(DATA / name, root / name)
    before = {p: p.read_bytes() for p in (root / name / "results").rglob("*.json")}
    env = cli_env(tmp_path / "cache")
    for args in (["--resume", name], [str(DATA / f"{name}.yaml")]):
        proc = subprocess.run(coordinator_cmd("sweep", *args, "--results-root", str(root)),
                              capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "nothing to run: every planned trial has a result" in proc.stderr, proc.stderr[-2000:]
        assert "spec changed" not in proc.stderr
        assert "rank" in proc.stdout
    assert {p: p.read_bytes() for p in (root / name / "results").rglob("*.json")} == before


def test_added_manifest_fields_keep_ids_while_they_hold_their_default(tmp_path: Path) -> None:
    shutil.copytree(DATA / "wave1-openai", tmp_path / "w")
    store = Store.open_readonly(tmp_path / "w")
    try:
        trial_id, manifest, _ = store.trials()[0]
    finally:
        store.close()
    assert manifest.trial_id == trial_id
    data = manifest.model_dump(mode="json")
    data["load_point"]["dataset"].pop("path", None)
    # a field added later, holding its default, is dropped before hashing; any other value counts
    data["load_point"]["new_knob"] = 0
    added = {**ADDED_MANIFEST_FIELDS, "load_point.new_knob": 0}
    assert sha256_json(drop_added_defaults(dict(data), added)) == trial_id
    data["load_point"]["new_knob"] = 5
    assert sha256_json(drop_added_defaults(dict(data), added)) != trial_id
    assert isinstance(manifest, TrialManifest)
