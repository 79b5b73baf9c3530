"""Tests that guard promises a mutation check found unprotected (issue 13; ``benchmarks/mutations.py``
breaks each one on purpose and expects a test here, or elsewhere, to fail):

- a trial's id covers every manifest field: changing any field, found by walking the manifest
  recursively, changes the id (dropping the dataset file's sha256 or the load point's seed from
  the hash must fail here);
- :func:`servetune.wire.encode` refuses a message over its size bound;
- trials planned by an earlier version of the spec stay in ``results.nc`` with
  ``in_current_spec`` False;
- the design is recorded truthfully: ``randomized`` is 1 only for a plan whose order was shuffled;
- ``--retry-failed`` re-runs failed rate-sweep follow-ups as it re-runs planned trials;
- every test that starts a real vLLM server (through the ``vllm_server`` or ``e2e_sweep``
  fixtures) carries the ``vllm`` marker, so ``-m "not vllm"`` never starts one.

All fast and offline: no daemon, no server.
"""

from __future__ import annotations

import ast
import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import xarray as xr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from coordinator.dataset import write_dataset
from coordinator.store import Store
from coordinator.sweep import expand_rate_sweeps
from servetune.errors import ProtocolError
from servetune.manifest import TrialManifest, plan_grid
from servetune.messages import MAX_MESSAGE_BYTES, Result, encode
from servetune.result import RequestSample, TrialOutcome
from servetune.spec import ExperimentSpec, parse_spec

REPO = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------- trial ids

_BASE: dict[str, Any] = {
    "experiment": "guards",
    "model": {"source": "tiny", "name": "tiny-llama", "generator": "3"},
    "backend": "vllm",
    "target": None,
    "config_id": "c" * 64,
    "engine": {"args": {"max_num_seqs": 8, "enable_prefix_caching": True}, "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}},
    "repeat": 1,
    "baseline_run": None,
}
#: One load point per dataset kind, so every dataset model's fields are walked.
_LOAD_POINTS: dict[str, dict[str, Any]] = {
    "file": {"name": "lp", "request_rate": 4.0, "num_requests": 20, "seed": 3, "warmup_requests": 2,
             "dataset": {"kind": "jsonl", "path": "/data/p.jsonl", "sha256": "a" * 64, "max_input_len": 100,
                         "output_len_from": "load_point"}},
    "shared_prefix": {"name": "lp", "max_concurrency": 4, "duration_s": 5.0, "input_len": 64,
                      "output_len": {"dist": "uniform", "min": 4, "max": 16},
                      "dataset": {"kind": "shared_prefix", "num_prefixes": 2, "suffixes_per_prefix": 3,
                                  "prefix_len": 16}},
    "random": {"name": "lp", "request_rate": 2.0, "arrival": "gamma", "burstiness": 2.0, "num_requests": 10,
               "input_len": {"dist": "normal", "mean": 50.0, "std": 5.0, "min": 10, "max": 90},
               "rate_sweep": None, "stop": {"max_errors": 3, "over_saturation": True}},
    "rate_sweep": {"name": "lp", "rate_sweep": {"num_rates": 3, "max_concurrency": 16}, "num_requests": 10,
                   "endpoint": "chat"},
    "sla_search": {"name": "lp", "sla_search": {"min_rps": 1.0, "max_rps": 8.0, "rates_per_round": 3, "rel_tol": 0.05,
                                                "max_rounds": 6}, "num_requests": 400},
}
#: Leaves deliberately left out of the id (see TrialManifest.trial_id): where the file lies on this node.
_NOT_HASHED = {("load_point", "dataset", "path")}
#: Values tried for a leaf that holds None (an unset optional field) until one validates.
_PALETTE: tuple[Any, ...] = (2, 7, 16, 2048, 0.5, 0.85, True, "x", "auto", "fp8", "mp", [1], {"x": "1"},
                             {"dist": "fixed", "value": 5}, {"num_rates": 2}, ["failover-from:x"])


def _manifest(kind: str) -> dict[str, Any]:
    doc = copy.deepcopy(_BASE)
    doc["load_point"] = copy.deepcopy(_LOAD_POINTS[kind])
    return TrialManifest.model_validate(doc).model_dump(mode="json")  # every field, defaults included


def _leaves(node: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    """Every leaf of a JSON value (an empty dict or list is a leaf too)."""
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(node, list) and node:
        for i, value in enumerate(node):
            yield from _leaves(value, (*path, i))
    else:
        yield path


def _get(doc: Any, path: tuple[str | int, ...]) -> Any:
    for key in path:
        doc = doc[key]  # type: ignore[index]
    return doc


def _with(doc: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    node: Any = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def _candidates(value: Any) -> list[Any]:
    """Other values of the same shape, to try in order."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, value + 2, max(1, value - 1), 1, 2]
    if isinstance(value, float):
        return [value * 1.5, value * 0.5, value + 1.0, 0.5]
    if isinstance(value, str):
        return [value + "x", value[:-1] + ("b" if value[-1:] != "b" else "c"), "poisson", "constant", "chat",
                "sharegpt", "dataset", "fixed", "normal", "openai"]
    if value == {}:
        return [{"X": "1"}, {"x": "1"}]
    return list(_PALETTE)


def _valid(doc: dict[str, Any]) -> TrialManifest | None:
    try:
        return TrialManifest.model_validate(doc)
    except (ValidationError, ValueError, TypeError):
        return None


def test_changing_any_manifest_field_changes_the_trial_id() -> None:
    """Walk the manifest (every field of every nested model, defaults included; one manifest per
    dataset kind) and change each leaf to another valid value: the trial id must change, except for
    the dataset's local path. A leaf that cannot change alone in one manifest (``burstiness`` needs
    gamma arrivals) must be changed in another."""
    unchanged, untried, tried = [], set(), set()
    for kind in sorted(_LOAD_POINTS):
        doc = _manifest(kind)
        base_id = TrialManifest.model_validate(doc).trial_id
        for path in _leaves(doc):
            old = _get(doc, path)
            edits = [(path, v) for v in _candidates(old)]
            edits += [(path[:-1], v) for v in _PALETTE] if len(path) > 1 else []  # or its parent
            for at, value in edits:
                changed = _valid(_with(doc, at, value))
                if changed is not None and changed.model_dump(mode="json") != doc:
                    break
            else:
                untried.add(path)
                continue
            tried.add(path)
            if (changed.trial_id == base_id) != (path in _NOT_HASHED):
                unchanged.append((kind, path, old, value))
    assert not unchanged, f"fields whose change leaves the trial id as it was (or hashes a local path): {unchanged}"
    # an unset model (rate_sweep: None) is walked where it is set, in another manifest
    missed = {u for u in untried if not any(t[:len(u)] == u for t in tried)}
    assert not missed, f"leaves the walk found no other valid value for (add candidates): {missed}"
    assert len(tried) > 60, len(tried)  # the walk reaches the engine args, not just the top level


def test_the_walk_reaches_the_fields_the_mutations_drop() -> None:
    """The two promises the mutation check found unguarded are among the walked leaves."""
    walked = {p for kind in _LOAD_POINTS for p in _leaves(_manifest(kind))}
    assert ("load_point", "dataset", "sha256") in walked and ("load_point", "seed") in walked
    assert ("engine", "env", "VLLM_CPU_KVCACHE_SPACE") in walked and ("repeat",) in walked


_LEAVES = {kind: list(_leaves(_manifest(kind))) for kind in _LOAD_POINTS}


@st.composite
def _edit(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any], tuple[str | int, ...]]:
    kind = draw(st.sampled_from(sorted(_LEAVES)))
    doc = _manifest(kind)
    path = draw(st.sampled_from(_LEAVES[kind]))
    old = _get(doc, path)
    if isinstance(old, bool):
        value: Any = not old
    elif isinstance(old, int):
        value = draw(st.integers(min_value=0, max_value=10**6))
    elif isinstance(old, float):
        value = draw(st.floats(min_value=1e-3, max_value=1e4, allow_nan=False))
    elif isinstance(old, str):
        value = draw(st.one_of(st.text(alphabet="abcdefxyz0123456789_-", min_size=1, max_size=12),
                               st.sampled_from(_candidates(old))))
    else:
        value = draw(st.sampled_from(_candidates(old)))
    return doc, _with(doc, path, value), path


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_edit())
def test_property_any_valid_edit_of_a_manifest_changes_its_id(
    edit: tuple[dict[str, Any], dict[str, Any], tuple[str | int, ...]],
) -> None:
    """Hypothesis: a random valid edit of any one leaf changes the trial id iff the manifest changed
    (the dataset's local path aside)."""
    doc, edited, path = edit
    after = _valid(edited)
    if after is None or path in _NOT_HASHED:
        return
    before = TrialManifest.model_validate(doc)
    same = after.model_dump(mode="json") == before.model_dump(mode="json")
    assert (after.trial_id == before.trial_id) == same, (path, _get(doc, path), _get(edited, path))


# --------------------------------------------------------------------------- message size bound


def _result_of(n_samples: int) -> Result:
    error = "e" * 65_536  # the longest error a sample may carry (servetune.bounds.Text)
    sample = RequestSample(index=0, scheduled_ns=0, send_ns=0, end_ns=1, error=error)
    outcome = TrialOutcome(status="ok", samples=[sample] * n_samples, window_s=1.0, started_at_us=0, finished_at_us=1)
    return Result(session_nonce="n", batch_id="b", trial_id="t", epoch=1, submission_id="s", outcome=outcome)


def test_encode_refuses_a_message_over_the_size_bound() -> None:
    """A RESULT whose every field is within its own bound can still add up to more than one frame
    may hold: encode() refuses it, naming the bound, instead of sending what the peer's libzmq
    would drop with the connection. Just under the bound it encodes."""
    under = encode(_result_of(1000))
    assert MAX_MESSAGE_BYTES - 3_000_000 < len(under) <= MAX_MESSAGE_BYTES
    with pytest.raises(ProtocolError, match=rf"Result is \d+ bytes, over the {MAX_MESSAGE_BYTES}-byte bound"):
        encode(_result_of(1030))


# --------------------------------------------------------------------------- results.nc: spec versions, design

QUICKSTART = (REPO / "configs" / "quickstart.yaml").read_text(encoding="utf-8")


def _spec(randomize: bool, drop_config: bool = False) -> tuple[ExperimentSpec, str]:
    text = QUICKSTART.replace("planner: {kind: grid, randomize: true, seed: 7}",
                              f"planner: {{kind: grid, randomize: {str(randomize).lower()}, seed: 7}}")
    if drop_config:  # a later version of the experiment: the max_num_seqs 4 config taken out
        text = text.replace("    - {max_num_seqs: 4,  max_num_batched_tokens: 2048, enable_chunked_prefill: true}\n", "")
    assert text != QUICKSTART or randomize
    return parse_spec(text), text


def _record(store: Store, spec: ExperimentSpec, text: str) -> list[str]:
    store.record_plan(spec.spec_hash(), spec.model_dump(mode="json"), text, plan_grid(spec))
    return store.planned_trial_ids(spec.spec_hash())


def _finish_ok(store: Store, trial_id: str, throughput: float) -> None:
    attempt = store.begin_attempt(trial_id, daemon_id="d", batch_id="b", spec_hash="h")
    store.finish_attempt(trial_id, attempt, status="ok", failure_kind=None, error=None, submission_id="s",
                         record={"x": 1}, metrics={"output_throughput": throughput}, hardware_class="cpu")


def test_trials_of_an_earlier_spec_version_stay_in_results_nc(tmp_path: Path) -> None:
    """An edited spec that drops a config keeps the trials (and results) of the first version in
    results.nc, marked ``in_current_spec`` False; the new version's trials are True."""
    store = Store.open(tmp_path / "exp")
    try:
        v1, text1 = _spec(randomize=False)
        first = _record(store, v1, text1)
        _finish_ok(store, first[0], 123.0)  # measured under version 1: a max_num_seqs=4 trial
        v2, text2 = _spec(randomize=False, drop_config=True)
        second = _record(store, v2, text2)
        dropped = set(first) - set(second)
        # the dropped config's 2 load points x its repeats
        assert first[0] in dropped and len(dropped) == 2 * v1.repeats and set(second) < set(first)
        ds = xr.load_dataset(write_dataset(store))
    finally:
        store.close()
    rows = {str(t): i for i, t in enumerate(ds["trial_id"].values)}
    assert set(rows) == set(first), "every trial ever planned has a row"
    in_current = {t: bool(ds["in_current_spec"].values[i]) for t, i in rows.items()}
    assert {t for t, cur in in_current.items() if not cur} == dropped
    old = rows[first[0]]
    assert ds["status"].values[old] == "ok" and float(ds["output_throughput"].values[old]) == 123.0
    assert str(ds["spec_hash"].values[old]) == v1.spec_hash() and ds.attrs["spec_hash"] == v2.spec_hash()


@pytest.mark.parametrize("randomize", [False, True])
def test_the_design_is_recorded_truthfully(tmp_path: Path, randomize: bool) -> None:
    """``randomized`` in results.nc (and in the plan and the store) is 1 exactly when the run order
    was shuffled: an unrandomised plan runs the configs and load points as written."""
    spec, text = _spec(randomize=randomize)
    plan = plan_grid(spec)
    assert not spec.restart_per_repeat  # the quickstart's repeats share a server start: one batch per config
    written = [(a.model_dump(exclude_none=True), lp.name) for a, _ in spec.engine.expand()
               for _r in range(spec.repeats) for lp in spec.load_points]
    ran = [(b.config.args.model_dump(exclude_none=True), m.load_point.name) for b in plan.batches for m in b.trials]
    assert sorted(map(repr, ran)) == sorted(map(repr, written))
    assert (ran != written) is randomize, "the order is shuffled exactly when the spec asks for it"
    assert plan.randomized is randomize and plan.design == "grid"
    store = Store.open(tmp_path / "exp")
    try:
        _record(store, spec, text)
        assert store.spec_meta(spec.spec_hash())["randomized"] == int(randomize)
        ds = xr.load_dataset(write_dataset(store))
    finally:
        store.close()
    assert ds.attrs["randomized"] == int(randomize) and ds.attrs["design"] == "grid"
    assert json.loads(ds.attrs["run_order"]) == [m.trial_id for b in plan.batches for m in b.trials]


# --------------------------------------------------------------------------- the vllm marker

#: The fixtures that start a real vLLM server (tests/conftest.py).
_VLLM_FIXTURES = {"vllm_server", "e2e_sweep"}


def _marks_vllm(decorators: list[ast.expr]) -> bool:
    return any("mark.vllm" in ast.unparse(d) for d in decorators)


def _is_fixture(fn: ast.FunctionDef) -> bool:
    return any("fixture" in ast.unparse(d) for d in fn.decorator_list)


def test_every_test_that_starts_vllm_is_marked_vllm() -> None:
    """``-m "not vllm"`` must never start a vLLM server: a test asking (through any chain of
    fixtures) for ``vllm_server`` or ``e2e_sweep`` carries the ``vllm`` marker, on itself or on its module."""
    modules = {p: ast.parse(p.read_text(encoding="utf-8")) for p in sorted((REPO / "tests").glob("*.py"))}
    fixtures: dict[str, set[str]] = {}
    for tree in modules.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and _is_fixture(node):
                fixtures[node.name] = {a.arg for a in node.args.args}
    starts = set(_VLLM_FIXTURES)
    while True:  # fixtures that depend on one that starts vLLM start it too
        more = {name for name, deps in fixtures.items() if deps & starts} - starts
        if not more:
            break
        starts |= more
    unmarked, found = [], 0
    for path, tree in modules.items():
        module_marked = any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
                            and "mark.vllm" in ast.unparse(n.value) for n in tree.body)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                if {a.arg for a in node.args.args} & starts:
                    found += 1
                    if not (module_marked or _marks_vllm(node.decorator_list)):
                        unmarked.append(f"{path.name}::{node.name}")
    assert found >= 10, found  # the scan sees the real-vLLM tests
    assert not unmarked, f"tests that start vLLM without the vllm marker: {unmarked}"


# --------------------------------------------------------------------------- --retry-failed in rate sweeps

RATE_SWEEP_SPEC = """
name: rs
engine: {fixed: {max_model_len: 256}, grid: {max_num_seqs: [2, 4]}}
load_points:
  - {name: sweep, rate_sweep: {num_rates: 2}, num_requests: 8, input_len: 16, output_len: 8}
"""


def _finish(store: Store, trial_id: str, status: str, kind: str | None, metrics: dict[str, float]) -> None:
    attempt = store.begin_attempt(trial_id, daemon_id="d", batch_id="b", spec_hash="h")
    store.finish_attempt(trial_id, attempt, status=status, failure_kind=kind, error=None if status == "ok" else "x",
                         submission_id="s", record={"t": trial_id, "a": attempt}, metrics=metrics,
                         hardware_class=None)


def test_retry_failed_reruns_failed_rate_sweep_followups(tmp_path: Path) -> None:
    """Follow-up rates of a rate sweep obey the same rule as planned trials: a measurement failure
    is re-run only with --retry-failed, a transport failure always."""
    spec = parse_spec(RATE_SWEEP_SPEC)
    plan = plan_grid(spec)
    h = spec.spec_hash()
    store = Store.open(tmp_path / "rs")
    try:
        store.record_plan(h, spec.model_dump(mode="json"), None, plan)
        for m in plan.batches[0].trials:  # the seeds of the first config: @sync and @max
            _finish(store, m.trial_id, "ok", None, {"request_throughput": 2.0 if "sync" in m.load_point.name else 8.0})
        followups = expand_rate_sweeps(store, spec, plan, h)[0].trials
        assert len(followups) == 2
        _finish(store, followups[0].trial_id, "failed", "measurement", {})
        _finish(store, followups[1].trial_id, "failed", "transport", {})
        plain = expand_rate_sweeps(store, spec, plan, h, retry_failed=False)
        retried = expand_rate_sweeps(store, spec, plan, h, retry_failed=True)
    finally:
        store.close()
    assert [m.trial_id for w in plain for m in w.trials] == [followups[1].trial_id]
    assert [m.trial_id for w in retried for m in w.trials] == [m.trial_id for m in followups]
