"""``restart_per_repeat``: one server start per (config, repeat) by default, or one per config whose
repeats then share it, and the caveat every interval over repeats carries in that case.

The sweep runs on the SIMULATED backend (no vLLM) through the real coordinator and a child daemon;
the batch each attempt ran in (one batch = one server start) comes from the store."""

from __future__ import annotations

import sqlite3
import subprocess
import textwrap
from pathlib import Path

import pytest

import analysis
from analysis.compare import compare
from analysis.decision import recommend
from analysis.load import combine
from analysis.ranking import rank
from coordinator.cli import main
from servetune.errors import SpecError
from servetune.manifest import plan_grid
from servetune.spec import parse_spec
from tests.conftest import cli_env, coordinator_cmd

SPEC = textwrap.dedent(
    """
    name: sharedstart
    model: {source: tiny}
    backend: {kind: sim}
    engine:
      grid: {max_num_seqs: [4, 32]}
    load_points:
      - {name: c32, max_concurrency: 32, num_requests: 48, input_len: 128, output_len: 32}
      - {name: r8, request_rate: 8, num_requests: 24, input_len: 128, output_len: 32}
    slos:
      - {metric: ttft_ms, percentile: 99, max_ms: 60000}
    repeats: 3
    """
)
SHARED = SPEC + "restart_per_repeat: false\n"


def test_shared_starts_plan_one_batch_per_config_holding_the_same_trials() -> None:
    fresh, shared = plan_grid(parse_spec(SPEC)), plan_grid(parse_spec(SHARED))
    assert len(fresh.batches) == 6 and len(shared.batches) == 2, "one server start per config, not per repeat"
    for b in shared.batches:
        assert sorted((t.load_point.name, t.repeat) for t in b.trials) == [
            (lp, r) for lp in ("c32", "r8") for r in range(3)]
        assert len({t.config_id for t in b.trials}) == 1
    # the same trials (identity = manifest), only batched differently; the order inside is shuffled
    assert {m.trial_id for m in shared.trials()} == {m.trial_id for m in fresh.trials()}
    orders = [[(t.load_point.name, t.repeat) for t in b.trials] for b in shared.batches]
    as_written = [(lp, r) for r in range(3) for lp in ("c32", "r8")]
    assert all(o != as_written for o in orders), "randomize shuffles a shared start's trials together"


def test_the_default_keeps_the_spec_hash_and_the_key_is_strict() -> None:
    # the hash SPEC had before the key existed (computed at 10b887c): experiments recorded then resume
    before = "a6391fa22ce6c8153120681978a98cfe99ea404bdbd030a2bc9128df328ad80f"
    assert parse_spec(SPEC).spec_hash() == before
    assert parse_spec(SPEC + "restart_per_repeat: true\n").spec_hash() == before
    assert parse_spec(SHARED).spec_hash() != parse_spec(SPEC).spec_hash()
    with pytest.raises(SpecError, match="restart_per_repeat"):
        parse_spec(SPEC + "restart_per_repeat: 0\n")


def test_a_rate_sweep_with_shared_starts_is_refused_naming_the_key(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    text = SHARED.replace("{name: r8, request_rate: 8,", "{name: r8, rate_sweep: {num_rates: 2},")
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "load_points[1].rate_sweep" in err and "restart_per_repeat" in err, err


def _sweep(tmp_path: Path, text: str, tiny_cache: Path) -> tuple[object, dict[str, set[str]]]:
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    root = tmp_path / "runs"
    proc = subprocess.run(coordinator_cmd("sweep", str(spec), "--results-root", str(root)),
                          capture_output=True, text=True, timeout=300, env=cli_env(tiny_cache))
    assert proc.returncode == 0, proc.stderr[-3000:]
    conn = sqlite3.connect(root / "sharedstart" / "experiment.sqlite")
    batches: dict[str, set[str]] = {}
    for trial_id, batch_id in conn.execute("SELECT trial_id, batch_id FROM attempts WHERE status='ok'"):
        batches.setdefault(str(batch_id), set()).add(str(trial_id))
    conn.close()
    return analysis.load("sharedstart", results_root=root), batches


@pytest.mark.parametrize("shared", [True, False], ids=["shared-start", "start-per-repeat"])
def test_a_sweep_runs_what_it_planned_and_the_analysis_says_so(shared: bool, tmp_path: Path,
                                                               tiny_cache: Path) -> None:
    ds, batches = _sweep(tmp_path, SHARED if shared else SPEC, tiny_cache)
    assert ds.sizes["trial"] == 12 and set(ds.status.values.tolist()) == {"ok"}
    assert len(batches) == (2 if shared else 6), batches
    assert all(len(ids) == (6 if shared else 2) for ids in batches.values())
    assert int(ds.attrs["restart_per_repeat"]) == (0 if shared else 1)
    configs = sorted(set(ds.config_id.values.tolist()))
    results = {"recommend": recommend(ds), "rank": rank(ds), "compare": compare(ds, configs[0], configs[1], load_point="c32")}
    for what, result in results.items():
        codes = [w.code for w in result.warnings]  # type: ignore[attr-defined]
        assert ("repeats_share_server" in codes) == shared, (what, codes)
    # combined with an experiment whose repeats each had a start, the caveat still holds for the whole
    other = ds.copy()
    other.attrs.update(restart_per_repeat=1, experiment="other")
    both = combine([other, ds])
    assert int(both.attrs["restart_per_repeat"]) == (0 if shared else 1)
    assert ("repeats_share_server" in [w.code for w in rank(both).warnings]) == shared
    # an unreadable attribute (a hand-edited or hostile results.nc) is taken as absent, never a crash
    odd = ds.copy()
    odd.attrs.update(restart_per_repeat="yes", experiment="odd")
    assert int(combine([odd, other]).attrs["restart_per_repeat"]) == 1
    assert "repeats_share_server" not in [w.code for w in rank(odd).warnings]
