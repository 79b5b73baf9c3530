"""Planner designs beyond the full grid (random, quasi-random), recorded with the results; and the
optional GPU-hour prices, carried into the dataset. No vLLM: plans, the store and the dataset only."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from coordinator.dataset import build_dataset
from coordinator.planning import plan_experiment
from coordinator.store import Store
from servetune.canonical import sha256_json
from servetune.manifest import Plan, plan_grid
from servetune.spec import ExperimentSpec, config_key, load_spec, parse_spec
from tests.test_spec import _issues

REPO = Path(__file__).resolve().parents[1]

# 3 x 3 x 2 x 2 = 36 configs.
SPEC = textwrap.dedent(
    """
    name: designs
    engine:
      fixed: {max_model_len: 512}
      grid:
        max_num_seqs: [2, 4, 8]
        max_num_batched_tokens: [512, 1024, 2048]
        enable_prefix_caching: [true, false]
      env_grid: {VLLM_CPU_KVCACHE_SPACE: [1, 2]}
    load_points:
      - {name: a, request_rate: 4, num_requests: 8, input_len: 32, output_len: 16}
      - {name: b, max_concurrency: 4, num_requests: 8, input_len: 32, output_len: 16}
    repeats: 2
    """
)


def _spec(planner: str, extra: str = "") -> ExperimentSpec:
    return parse_spec(SPEC + f"planner: {planner}\n" + extra)


def _config_ids(plan: Plan) -> list[str]:
    """The non-baseline configs a plan runs, in order of first appearance."""
    return list(dict.fromkeys(b.config_id for b in plan.batches if not b.is_baseline))


@pytest.mark.parametrize("kind", ["random", "quasi-random"])
def test_sampled_design_plans_n_distinct_configs_reproducibly(kind: str) -> None:
    spec = _spec(f"{{kind: {kind}, n_configs: 5, seed: 3}}")
    plan = plan_experiment(spec)
    grid_ids = set(_config_ids(plan_grid(spec)))
    ids = _config_ids(plan)
    assert len(ids) == len(set(ids)) == 5
    assert set(ids) <= grid_ids, "a sampled config must be one the engine space describes"
    assert len(plan.batches) == 5 * 2 and len(plan.trials()) == 5 * 2 * 2  # configs x repeats, x load points
    assert plan.design == kind and plan.seed == 3 and plan.notes == ()
    again = plan_experiment(_spec(f"{{kind: {kind}, n_configs: 5, seed: 3}}"))
    assert [t.trial_id for t in again.trials()] == [t.trial_id for t in plan.trials()]
    other = plan_experiment(_spec(f"{{kind: {kind}, n_configs: 5, seed: 5}}"))
    assert set(_config_ids(other)) != set(ids)
    # Another seed is another sample (on a coarse grid two seeds can happen to pick the same set).
    samples = {frozenset(_config_ids(plan_experiment(_spec(f"{{kind: {kind}, n_configs: 5, seed: {s}}}"))))
               for s in range(10)}
    assert len(samples) >= 8


@pytest.mark.parametrize("kind", ["random", "quasi-random"])
def test_sampled_configs_share_the_grid_trial_ids(kind: str) -> None:
    """A config picked by a design is the same trial as in the grid: results carry over between designs."""
    spec = _spec(f"{{kind: {kind}, n_configs: 4, randomize: false}}")
    grid_ids = {t.trial_id for t in plan_grid(spec).trials()}
    assert {t.trial_id for t in plan_experiment(spec).trials()} <= grid_ids


def test_grid_design_is_unchanged() -> None:
    spec = parse_spec(SPEC)
    assert spec.planner.kind == "grid" and spec.planner.n_configs is None
    plan = plan_experiment(spec)
    assert plan.design == "grid"
    assert [t.trial_id for t in plan.trials()] == [t.trial_id for t in plan_grid(spec).trials()]
    assert len(_config_ids(plan)) == 36


def test_random_design_keeps_the_engine_space_order_without_randomize() -> None:
    spec = _spec("{kind: random, n_configs: 6, randomize: false, seed: 11}")
    order = {config_key(a, e): i for i, (a, e) in enumerate(spec.engine.expand())}
    plan = plan_experiment(spec)
    keys = [config_key(b.config.args, b.config.env) for b in plan.batches if b.trials[0].repeat == 0]
    positions = [order[k] for k in keys]
    assert positions == sorted(positions) and len(positions) == 6


@pytest.mark.parametrize("seed", range(6))
def test_quasi_random_covers_every_level_evenly(seed: int) -> None:
    """The first 2^m points of a scrambled Sobol sequence fill each axis's 2^m equal slices once each:
    4 configs over axes of 4 and 2 levels use every level of the first once and each of the second twice."""
    spec = parse_spec(textwrap.dedent(
        f"""
        name: sobol
        engine:
          grid: {{max_num_seqs: [2, 4, 8, 16], enable_prefix_caching: [true, false]}}
          env_grid: {{VLLM_CPU_KVCACHE_SPACE: [1, 2, 3, 4]}}
        load_points: [{{name: a, request_rate: 1, num_requests: 2, input_len: 8, output_len: 8}}]
        planner: {{kind: quasi-random, n_configs: 4, seed: {seed}}}
        """
    ))
    plan = plan_experiment(spec)
    configs = list(plan.configs().values())
    assert len(configs) == 4
    assert Counter(c.args.max_num_seqs for c in configs) == Counter({2: 1, 4: 1, 8: 1, 16: 1})
    assert sorted(Counter(c.args.enable_prefix_caching for c in configs).values()) == [2, 2]
    assert sorted(c.env["VLLM_CPU_KVCACHE_SPACE"] for c in configs) == ["1", "2", "3", "4"]


def test_quasi_random_deduplicates_repeated_grid_values() -> None:
    spec = parse_spec(SPEC.replace("max_num_seqs: [2, 4, 8]", "max_num_seqs: [2, 2, 2, 8]")
                      + "planner: {kind: quasi-random, n_configs: 24, seed: 5}\n")
    assert len(spec.engine.expand()) == 24
    ids = _config_ids(plan_experiment(spec))
    assert len(ids) == len(set(ids)) == 24


@pytest.mark.parametrize("kind", ["random", "quasi-random"])
def test_more_configs_than_the_space_holds_plans_all_with_a_note(kind: str) -> None:
    spec = _spec(f"{{kind: {kind}, n_configs: 50}}")
    plan = plan_experiment(spec)
    assert set(_config_ids(plan)) == set(_config_ids(plan_grid(spec)))
    assert plan.design == kind
    assert len(plan.notes) == 1 and "n_configs (50) exceeds the 36" in plan.notes[0]


def test_baseline_batches_are_not_sampled() -> None:
    spec = _spec("{kind: random, n_configs: 3}", "baseline: {engine: {max_num_seqs: 3}, every_batches: 2}\n")
    plan = plan_experiment(spec)
    assert len(_config_ids(plan)) == 3
    assert plan.batches[0].is_baseline and plan.batches[-1].is_baseline


@pytest.mark.parametrize(
    "planner,needle",
    [
        ("{kind: random}", "planner.n_configs: planner.n_configs is required when planner.kind is 'random'"),
        ("{kind: quasi-random}", "planner.n_configs: planner.n_configs is required when planner.kind is 'quasi-random'"),
        ("{kind: grid, n_configs: 4}", "planner.n_configs: planner.n_configs only applies to planner.kind 'random'"),
        ("{n_configs: 4}", "planner.n_configs: planner.n_configs only applies"),
        ("{kind: random, n_configs: 0}", "planner.n_configs: Input should be greater than or equal to 1"),
        ("{kind: random, n_configs: some}", "planner.n_configs: Input should be a valid integer"),
        ("{kind: sobol, n_configs: 4}", "planner.kind: unknown planner kind 'sobol'; known kinds: grid, halving, optuna, quasi-random, random"),
    ],
)
def test_planner_errors_name_the_yaml_path(planner: str, needle: str) -> None:
    issues = _issues(SPEC + f"planner: {planner}\n")
    assert any(needle in i for i in issues), issues


def test_quasi_random_refuses_explicit_configs() -> None:
    text = SPEC.replace("env_grid:", "configs: [{max_num_seqs: 16}]\n  env_grid:")
    assert parse_spec(text + "planner: {kind: random, n_configs: 3}\n")  # random samples them too
    issues = _issues(text + "planner: {kind: quasi-random, n_configs: 3}\n")
    assert any(i.startswith("engine.configs:") and "quasi-random" in i for i in issues), issues


def test_new_defaults_leave_the_spec_hash_alone() -> None:
    spec = parse_spec(SPEC)
    old_dump = spec.model_dump(mode="json")
    del old_dump["gpu_hour_prices"]
    del old_dump["hardware"]
    assert old_dump.pop("restart_per_repeat") is True
    for added in ("n_configs", "n_trials", "sampler", "batch", "eta", "min_fidelity"):  # planner options, None unless their kind takes them
        del old_dump["planner"][added]
    for added in ("profile", "model_shape", "noise"):  # the sim backend's fields, None for every other kind
        del old_dump["backend"][added]
    old_dump["backend"].update(python=None, launch=None)  # removed since: every old spec held them as null
    for lp in old_dump["load_points"]:
        assert lp.pop("sla_search") is None
    assert spec.spec_hash() == sha256_json(old_dump)
    assert _spec("{kind: random, n_configs: 3}").spec_hash() != spec.spec_hash()
    assert parse_spec(SPEC + "gpu_hour_prices: {1xH100-80GB: 2.5}\n").spec_hash() != spec.spec_hash()


def _dataset_attrs(tmp_path: Path, spec: ExperimentSpec, text: str) -> dict[str, object]:
    plan = plan_experiment(spec)
    store = Store.open(tmp_path / "exp")
    try:
        store.record_plan(spec.spec_hash(), spec.model_dump(mode="json"), text, plan)
        assert store.spec_meta(spec.spec_hash())["design"] == plan.design
        ds = build_dataset(store)
        assert ds.sizes["trial"] == len(plan.trials())
        return dict(ds.attrs)
    finally:
        store.close()


@pytest.mark.parametrize("kind", ["grid", "random", "quasi-random"])
def test_design_and_prices_are_recorded_in_the_dataset(tmp_path: Path, kind: str) -> None:
    planner = "{kind: grid, seed: 2}" if kind == "grid" else f"{{kind: {kind}, n_configs: 4, seed: 2}}"
    text = SPEC + f"planner: {planner}\n"
    attrs = _dataset_attrs(tmp_path, parse_spec(text), text)
    assert attrs["design"] == kind and int(str(attrs["randomized"])) == 1 and int(str(attrs["planner_seed"])) == 2
    assert attrs["gpu_hour_prices"] == "{}"


def test_gpu_hour_prices_reach_the_dataset(tmp_path: Path) -> None:
    text = SPEC + "gpu_hour_prices: {1xH100-80GB: 2.49, cpu-16c-AVX512: 0.1, 2xA100-80GB+1xT4-15GB: 3}\n"
    spec = parse_spec(text)
    assert spec.gpu_hour_prices == {"1xH100-80GB": 2.49, "cpu-16c-AVX512": 0.1, "2xA100-80GB+1xT4-15GB": 3.0}
    attrs = _dataset_attrs(tmp_path, spec, text)
    assert json.loads(str(attrs["gpu_hour_prices"])) == spec.gpu_hour_prices


def test_random_design_example_validates_and_dry_runs(tmp_path: Path) -> None:
    example = REPO / "configs" / "random-design.yaml"
    spec = load_spec(example)
    assert spec.planner.kind == "random" and spec.planner.n_configs is not None
    assert len(spec.engine.expand()) > spec.planner.n_configs
    proc = subprocess.run([sys.executable, "-m", "coordinator", "validate", str(example)],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0 and "random design" in proc.stdout, proc.stdout + proc.stderr
    assert f"{spec.planner.n_configs} of {len(spec.engine.expand())} engine configs" in proc.stdout
    proc = subprocess.run(
        [sys.executable, "-m", "coordinator", "sweep", str(example), "--dry-run", "--results-root", str(tmp_path / "r")],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    assert "random design" in proc.stdout and "nothing was started" in proc.stdout
    assert f"{spec.planner.n_configs} server starts" in proc.stdout
    assert not (tmp_path / "r").exists()


#: Picks recorded with the code before large spaces were sampled lazily (commit ac5f5e1): config ids
#: (first 12 hex digits) in order of first appearance in the plan. Under the grid-size limit a seed
#: must keep choosing the same configs in the same order, or resumed experiments would change.
PINNED_PICKS = [
    (("random", 0), ['cfded296d042', '511485d088a3', 'bae3367f0273', '34d9f3191b59', 'f88ca7ae258d']),
    (("random", 7), ['4308e5f128ac', '50a233951bf2', 'f88ca7ae258d', '864a99041abc', '73d440af89b8']),
    (("quasi-random", 0), ['bae3367f0273', '2158f7d3d0f1', 'b1d8b3661c19', '00d31396eb92', '73d440af89b8']),
    (("quasi-random", 7), ['f88ca7ae258d', '350b1502d512', 'd543a63c179a', 'f7cda1234034', '630d5c932bd1']),
]


@pytest.mark.parametrize("design,picks", PINNED_PICKS)
def test_seeds_keep_their_picks_under_the_grid_limit(design: tuple[str, int], picks: list[str]) -> None:
    kind, seed = design
    text = SPEC.replace("      - {name: b, max_concurrency: 4, num_requests: 8, input_len: 32, output_len: 16}\n", "")
    text = text.replace("repeats: 2\n", "") + f"planner: {{kind: {kind}, n_configs: 5, seed: {seed}}}\n"
    plan = plan_experiment(parse_spec(text))
    assert [c[:12] for c in _config_ids(plan)] == picks


#: 10 x 10 x 10 x 10 x 10 x 2 x 5 = 1,000,000 engine configs.
BIG = textwrap.dedent(
    """
    name: big
    engine:
      fixed: {max_model_len: 512}
      grid:
        max_num_seqs: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
        max_num_batched_tokens: [512, 1024, 1536, 2048, 2560, 3072, 3584, 4096, 4608, 5120]
        gpu_memory_utilization: [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95]
        seed: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
        block_size: [1, 8, 16, 32, 64, 128, 256, 8, 16, 32]
        enable_prefix_caching: [true, false]
      env_grid: {VLLM_X: [a, b, c, d, e]}
    load_points:
      - {name: a, request_rate: 4, num_requests: 8, input_len: 32, output_len: 16}
    """
)


def test_a_grid_over_the_limit_is_refused_naming_its_size_and_the_sampled_designs() -> None:
    # block_size repeats 8, 16 and 32: 7 distinct values, so 700,000 distinct configs.
    issues = _issues(BIG)
    assert len(issues) == 1, issues
    assert issues[0].startswith("engine: the engine space describes 700,000 configs (10 max_num_seqs x "), issues
    assert "more than the 10,000 a grid design may run" in issues[0] and "{kind: quasi-random" in issues[0]
    issues = _issues(BIG + "planner: {kind: random, n_configs: 10001}\n")
    assert any(i.startswith("planner.n_configs: Input should be less than or equal to 10000") for i in issues), issues


def test_refused_combinations_are_found_in_a_space_too_large_to_list() -> None:
    """A space too large to list whose every config vLLM refuses is refused; one with some corners
    refused is accepted, and a sampled design prunes the refused configs it draws, with the reason."""
    bad = BIG.replace("fixed: {max_model_len: 512}", "fixed: {max_model_len: 6000, enable_chunked_prefill: false}")
    issues = _issues(bad + "planner: {kind: random, n_configs: 3}\n")
    assert any("max_num_batched_tokens (512) < max_model_len (6000) with chunked prefill off" in i for i in issues), issues
    partly = BIG.replace("[512, 1024,", "[8, 1024,") + "planner: {kind: random, n_configs: 400, seed: 1}\n"
    plan = plan_experiment(parse_spec(partly))
    assert plan.pruned, "some drawn config has max_num_batched_tokens 8 below max_num_seqs 9 or 10"
    for p in plan.pruned:
        assert p.config.args.max_num_batched_tokens == 8 and (p.config.args.max_num_seqs or 0) > 8
        assert f"max_num_batched_tokens (8) < max_num_seqs ({p.config.args.max_num_seqs}): vLLM refuses" in p.reason
    assert len(_config_ids(plan)) + len(plan.pruned) == 400
    assert all(b.config.args.max_num_batched_tokens != 8 or (b.config.args.max_num_seqs or 0) <= 8
               for b in plan.batches)


@pytest.mark.parametrize("kind", ["random", "quasi-random"])
def test_a_large_space_is_sampled_without_listing_it(kind: str) -> None:
    """The configs a sampled design draws from a 700,000-config space are distinct, lie on the
    grid, come in the engine space's order, and depend on the seed only."""
    spec = parse_spec(BIG + f"planner: {{kind: {kind}, n_configs: 40, seed: 4}}\n")
    plan = plan_experiment(spec)
    configs = [b.config for b in plan.batches]
    assert len({c.config_id for c in configs}) == 40 and plan.notes == ()
    axes = dict(spec.engine.unique_axes())
    for c in configs:
        assert all(getattr(c.args, name) in values for name, values in axes.items() if not name.startswith("env."))
        assert c.env["VLLM_X"] in axes["env.VLLM_X"] and c.args.max_model_len == 512
    again = plan_experiment(parse_spec(BIG + f"planner: {{kind: {kind}, n_configs: 40, seed: 4}}\n"))
    assert [b.config_id for b in again.batches] == [c.config_id for c in configs]
    other = plan_experiment(parse_spec(BIG + f"planner: {{kind: {kind}, n_configs: 40, seed: 5}}\n"))
    assert {b.config_id for b in other.batches} != {c.config_id for c in configs}
    unshuffled = plan_experiment(parse_spec(BIG + f"planner: {{kind: {kind}, n_configs: 40, seed: 4, randomize: false}}\n"))
    order = [tuple(axes[n].index(getattr(b.config.args, n)) for n in axes if not n.startswith("env."))
             + (axes["env.VLLM_X"].index(b.config.env["VLLM_X"]),) for b in unshuffled.batches]
    assert order == sorted(order)


def test_config_by_index_matches_the_listed_space() -> None:
    """Indexing a space without listing it gives what listing it gives, explicit configs included."""
    space = parse_spec(SPEC.replace("env_grid:", "configs: [{max_num_seqs: 16}, {max_num_seqs: 32, env: {VLLM_Y: '1'}}]\n"
                                                 "  env_grid:")).engine
    listed = space.expand()
    assert space.size() == len(listed) == space.count() == 36 + 2 * 2
    assert [config_key(*space.config_by_index(i)) for i in range(space.size())] == [config_key(*c) for c in listed]


@pytest.mark.parametrize("mode", [["--dry-run"], ["--preview"]])
def test_sweep_refuses_to_preview_an_adaptive_plan(tmp_path: Path, mode: list[str]) -> None:
    """``planner.kind: optuna`` runs (tests/test_sweep_adaptive.py), but its plan depends on its results:
    --dry-run and --preview, which show plans fixed in advance, refuse it (exit 2, naming the key and
    the mode), writing nothing."""
    cfg = tmp_path / "optuna.yaml"
    cfg.write_text(SPEC + "planner: {kind: optuna, n_trials: 6, seed: 1}\n")
    assert parse_spec(cfg.read_text()).planner.kind == "optuna"
    out = subprocess.run([sys.executable, "-m", "coordinator", "sweep", str(cfg), "--results-root", str(tmp_path / "runs"),
                          *mode], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 2, out
    assert "planner.kind" in out.stderr and "'optuna' is an adaptive planner" in out.stderr, out.stderr
    assert f"so {mode[0]} cannot show its plan" in out.stderr, out.stderr
    assert not (tmp_path / "runs").exists(), "nothing written"
