"""``TrialManifest.trial_id`` is computed once per manifest and can never go stale."""

from __future__ import annotations

import copy
import pickle

import pytest
from pydantic import ValidationError

from servetune.canonical import drop_added_defaults, sha256_json
from servetune.manifest import ADDED_MANIFEST_FIELDS, TrialManifest, plan_grid
from servetune.spec import parse_spec

SPEC = """
name: id-cache
engine: {grid: {max_num_seqs: [2, 4]}, fixed: {max_model_len: 256}}
load_points:
  - {name: a, request_rate: 1, num_requests: 2, input_len: 8, output_len: 8}
  - {name: b, request_rate: 2, num_requests: 2, input_len: 8, output_len: 8}
"""


def _fresh_id(m: TrialManifest) -> str:
    """The id computed from scratch, as the uncached property did."""
    data = drop_added_defaults(m.model_dump(mode="json"), ADDED_MANIFEST_FIELDS)
    data["load_point"]["dataset"].pop("path", None)
    return sha256_json(data)


def _manifests() -> list[TrialManifest]:
    return list(plan_grid(parse_spec(SPEC)).trials())


def test_cached_id_matches_a_fresh_one_and_is_computed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    m = _manifests()[0]
    first = m.trial_id
    assert first == _fresh_id(m)
    calls = []
    monkeypatch.setattr("servetune.manifest.sha256_json", lambda data: calls.append(data) or "x")
    assert m.trial_id == first and not calls  # cached: no second hash
    assert TrialManifest.model_validate_json(m.model_dump_json()).trial_id == "x"  # a new instance hashes again


def test_copies_with_changes_get_their_own_id_and_equality_ignores_the_cache() -> None:
    a, b = _manifests()[:2]
    a_id = a.trial_id
    changed = a.model_copy(update={"load_point": b.load_point})
    assert changed.trial_id == _fresh_id(changed) != a_id
    deep = a.model_copy(update={"repeat": 7}, deep=True)
    assert deep.trial_id == _fresh_id(deep) != a_id
    assert copy.copy(a).trial_id == copy.deepcopy(a).trial_id == pickle.loads(pickle.dumps(a)).trial_id == a_id
    uncached = TrialManifest.model_validate_json(a.model_dump_json())
    assert uncached == a and a == uncached  # one has its id cached, the other not yet
    assert "_trial_id" not in a.model_dump() and "_trial_id" not in a.model_dump_json()


def test_manifests_are_frozen() -> None:
    m = _manifests()[0]
    assert m.trial_id  # cached
    with pytest.raises(ValidationError):
        m.repeat = 3  # type: ignore[misc]
    with pytest.raises(ValidationError):
        m.load_point = _manifests()[1].load_point  # type: ignore[misc]


def test_batch_work_id_is_computed_once_and_matches_a_fresh_one(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from coordinator.leases import BatchWork

    batch = plan_grid(parse_spec(SPEC)).batches[1]
    work = BatchWork(batch, batch.trials)
    first = work.batch_id
    assert first == f"b{batch.index:04d}-{batch.config.config_id[:8]}"
    calls = []
    monkeypatch.setattr("servetune.manifest.sha256_json", lambda data: calls.append(data) or "x" * 64)
    assert work.batch_id == first and calls == []  # cached: no second hash
    again = dataclasses.replace(work, hardware_class="H100")  # a new instance: its batch's config id is cached
    assert again.batch_id == first and calls == []
    assert again == dataclasses.replace(work, hardware_class="H100")  # equality still by fields only
    fresh = BatchWork(dataclasses.replace(batch), batch.trials)  # a new batch computes its own, once
    assert fresh.batch_id == "b0001-xxxxxxxx" and fresh.batch_id == "b0001-xxxxxxxx" and len(calls) == 1
