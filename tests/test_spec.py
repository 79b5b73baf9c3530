"""Experiment spec: parsing, every kind of bad input refused with its YAML path, and nothing written."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from servetune.errors import SpecError
from servetune.manifest import EngineConfig, plan_grid
from servetune.spec import EngineArgs, load_spec, parse_spec

REPO = Path(__file__).resolve().parents[1]

GOOD = textwrap.dedent(
    """
    name: spec-test
    model: {source: tiny}
    engine:
      fixed: {max_model_len: 512}
      grid:
        max_num_seqs: [2, 8]
        enable_prefix_caching: [true, false]
      env: {VLLM_CPU_KVCACHE_SPACE: 1}
    load_points:
      - {name: a, request_rate: 4, num_requests: 8, input_len: 32, output_len: 16}
      - {name: b, max_concurrency: 4, num_requests: 8, input_len: 32, output_len: 16}
    slos:
      - {metric: ttft_ms, percentile: 99, max_ms: 500}
    repeats: 2
    """
)


def _issues(text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec(text, source="t.yaml")
    return [str(i) for i in info.value.issues]


def test_good_spec_expands_to_grid() -> None:
    spec = parse_spec(GOOD)
    configs = spec.engine.expand()
    assert len(configs) == 4
    assert all(a.max_model_len == 512 for a, _ in configs)
    assert all(e == {"VLLM_CPU_KVCACHE_SPACE": "1"} for _, e in configs)
    plan = plan_grid(spec)
    assert len(plan.trials()) == 4 * 2 * 2
    assert len(plan.batches) == 4 * 2  # one server start per config and repeat


def test_unknown_key_named_with_path_and_allowed_keys() -> None:
    issues = _issues(GOOD.replace("max_num_seqs: [2, 8]", "max_num_seqz: [2, 8]"))
    assert any("engine.grid.max_num_seqz" in i and "unknown key" in i and "max_num_seqs" in i for i in issues), issues
    issues = _issues(GOOD + "colour: blue\n")
    assert any(i.startswith("colour: unknown key") and "load_points" in i for i in issues), issues


def test_wrong_type_and_out_of_range() -> None:
    issues = _issues(GOOD.replace("repeats: 2", "repeats: many"))
    assert any(i.startswith("repeats:") and "integer" in i for i in issues), issues
    issues = _issues(GOOD.replace("max_num_seqs: [2, 8]", "max_num_seqs: [2, 0]"))
    assert any(i.startswith("engine.grid.max_num_seqs[1]") and "greater than or equal to 1" in i for i in issues), issues
    issues = _issues(GOOD.replace("metric: ttft_ms", "metric: latency"))
    assert any(i.startswith("slos[0].metric") and "'ttft_ms'" in i for i in issues), issues


def test_a_grid_corner_vllm_refuses_is_pruned_with_its_reason_not_run() -> None:
    """max_num_seqs 8 with max_num_batched_tokens 4 cannot start; max_num_seqs 2 can: the spec is
    accepted, the corner is pruned when planned (recorded with vLLM's reason), the rest planned."""
    spec = parse_spec(GOOD.replace("fixed: {max_model_len: 512}", "fixed: {max_model_len: 512, max_num_batched_tokens: 4}"))
    plan = plan_grid(spec)
    assert {b.config.args.max_num_seqs for b in plan.batches} == {2}
    assert [p.config.args.max_num_seqs for p in plan.pruned] == [8, 8]  # prefix caching on and off
    assert "max_num_batched_tokens (4) < max_num_seqs (8): vLLM refuses to start" in plan.pruned[0].reason
    # the same args as an explicit config are refused, not pruned
    explicit = GOOD.replace("fixed: {max_model_len: 512}", "fixed: {max_model_len: 512}\n  configs:\n"
                            "    - {max_num_seqs: 8, max_num_batched_tokens: 4}")
    assert any(i.startswith("engine (config") and "max_num_batched_tokens (4) < max_num_seqs (8)" in i
               for i in _issues(explicit))


def test_incompatible_combinations_refused_with_reason() -> None:
    bad = GOOD.replace(
        "fixed: {max_model_len: 512}",
        "fixed: {max_model_len: 512, enable_chunked_prefill: false, max_num_batched_tokens: 256}",
    )
    issues = _issues(bad)
    assert any("max_num_batched_tokens (256) < max_model_len (512) with chunked prefill off" in i for i in issues), issues
    bad = GOOD.replace("fixed: {max_model_len: 512}", "fixed: {max_model_len: 512, max_num_batched_tokens: 1}")
    issues = _issues(bad)  # no config of the grid left: refused
    assert any("max_num_batched_tokens (1) < max_num_seqs (2)" in i for i in issues), issues
    assert any("max_num_batched_tokens (1) < max_num_seqs (8)" in i for i in issues), issues
    bad = GOOD.replace("fixed: {max_model_len: 512}", "fixed: {max_model_len: 512, tensor_parallel_size: 3}")
    assert any("not divisible by tensor_parallel_size (3)" in i for i in _issues(bad))
    bad = GOOD.replace("input_len: 32, output_len: 16}\nslos", "input_len: 500, output_len: 16}\nslos")
    assert any(i.startswith("load_points[1]") and "exceeds max_model_len (512)" in i for i in _issues(bad))


def test_missing_model_path_and_malformed_yaml(tmp_path: Path) -> None:
    issues = _issues(GOOD.replace("model: {source: tiny}", f"model: {{source: path, path: {tmp_path / 'nope'}}}"))
    assert any(i.startswith("model.path") and "does not exist" in i for i in issues), issues
    issues = _issues("name: x\nload_points: [\n")
    assert issues and "malformed YAML at line" in issues[0]


def test_gpu_hour_prices_optional_and_checked() -> None:
    assert parse_spec(GOOD).gpu_hour_prices == {}
    spec = parse_spec(GOOD + "gpu_hour_prices: {1xH100-80GB: 2.49, cpu-16c-AVX512: 1}\n")
    assert spec.gpu_hour_prices == {"1xH100-80GB": 2.49, "cpu-16c-AVX512": 1.0}
    bad = GOOD + (
        "gpu_hour_prices: {1xH100-80GB: 0, 1xA100-80GB: -1.5, 1xL4-24GB: cheap, 1xT4-15GB: '2.5', "
        "1xA10-24GB: true, 1xB200-180GB: .inf, 1xH200-141GB: null, 'two words': 1}\n"
    )
    issues = _issues(bad)
    assert len(issues) == 8, issues
    expected = {
        "gpu_hour_prices.1xH100-80GB: Input should be greater than 0",
        "gpu_hour_prices.1xA100-80GB: Input should be greater than 0",
        "gpu_hour_prices.1xL4-24GB: must be a number of US dollars per GPU-hour, got 'cheap'",
        "gpu_hour_prices.1xT4-15GB: must be a number of US dollars per GPU-hour, got '2.5'",
        "gpu_hour_prices.1xA10-24GB: must be a number of US dollars per GPU-hour, got True",
        "gpu_hour_prices.1xB200-180GB: Input should be a finite number",
        "gpu_hour_prices.1xH200-141GB: must be a number of US dollars per GPU-hour, got None",
        "gpu_hour_prices.two words: 'two words' is not a hardware class name",
    }
    for needle in expected:
        assert any(i.startswith(needle) for i in issues), (needle, issues)
    issues = _issues(GOOD + "gpu_hour_prices: [2.5]\n")
    assert any(i.startswith("gpu_hour_prices: Input should be a valid dictionary") for i in issues), issues
    issues = _issues(GOOD + "gpu_hour_price: {1xH100-80GB: 2}\n")
    assert any(i.startswith("gpu_hour_price: unknown key") and "gpu_hour_prices" in i for i in issues), issues


def test_every_problem_reported_at_once() -> None:
    bad = GOOD.replace("repeats: 2", "repeats: 0").replace("metric: ttft_ms", "metric: nope")
    assert len(_issues(bad)) >= 2


def test_engine_args_argv_is_a_list_of_flags() -> None:
    args = EngineArgs(max_num_seqs=8, enable_chunked_prefill=False, enable_prefix_caching=True, dtype="bfloat16")
    assert args.cli_args() == [
        "--max-num-seqs", "8", "--no-enable-chunked-prefill", "--enable-prefix-caching", "--dtype", "bfloat16",
    ]


def test_trial_ids_are_stable_and_name_the_model_not_a_path(tmp_path: Path) -> None:
    spec = parse_spec(GOOD)
    a = [m.trial_id for m in plan_grid(spec).trials()]
    b = [m.trial_id for m in plan_grid(parse_spec(GOOD)).trials()]
    assert a == b and len(set(a)) == len(a)
    m = plan_grid(spec).trials()[0]
    assert m.model == {"source": "tiny", "version": "1"}
    model_dir = tmp_path / "my-model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text('{"vocab_size": 100, "max_position_embeddings": 4096}')
    spec2 = parse_spec(GOOD.replace("model: {source: tiny}", f"model: {{source: path, path: {model_dir}}}"))
    ident = plan_grid(spec2).trials()[0].model
    assert ident["name"] == "my-model" and str(tmp_path) not in str(ident)
    assert EngineConfig(args=EngineArgs(max_num_seqs=2)).config_id != EngineConfig(args=EngineArgs(max_num_seqs=3)).config_id


def test_randomised_order_is_seeded() -> None:
    spec = parse_spec(GOOD)
    order1 = [m.trial_id for m in plan_grid(spec).trials()]
    assert order1 == [m.trial_id for m in plan_grid(spec).trials()]
    unshuffled = parse_spec(GOOD + "planner: {randomize: false}\n")
    assert sorted(order1) == sorted(m.trial_id for m in plan_grid(unshuffled).trials())
    assert order1 != [m.trial_id for m in plan_grid(unshuffled).trials()]


def test_baseline_batches_first_every_k_and_last() -> None:
    spec = parse_spec(GOOD + "baseline:\n  engine: {max_num_seqs: 4}\n  every_batches: 3\n")
    flags = [b.is_baseline for b in plan_grid(spec).batches]
    assert flags[0] and flags[-1]
    assert flags == [True, False, False, False, True, False, False, False, True, False, False, True]


BAD_SPECS: list[tuple[tuple[str, str], str]] = [
    (("max_num_seqs: [2, 8]", "max_num_seqz: [2, 8]"), "engine.grid.max_num_seqz: unknown key"),
    (("repeats: 2", "repeats: lots"), "repeats:"),
    (("repeats: 2", "repeats: -1"), "repeats: Input should be greater than or equal to 1"),
    (("fixed: {max_model_len: 512}", "fixed: {max_model_len: 512, max_num_batched_tokens: 1}"), "max_num_seqs"),
    (("model: {source: tiny}", "model: {source: path, path: /nonexistent/model}"), "model.path"),
    (("load_points:", "load_points: ["), "malformed YAML"),
    (("repeats: 2", "repeats: 2\ngpu_hour_prices: {1xH100-80GB: -3}"),
     "gpu_hour_prices.1xH100-80GB: Input should be greater than 0"),
    (("repeats: 2", "repeats: 2\nplanner: {kind: random}"), "planner.n_configs: planner.n_configs is required"),
    (("repeats: 2", "repeats: 2\nbackend: {python: /usr/bin/python3}"),
     "backend: backend.python is no longer a spec key: a coordinator never tells a daemon what to run; it moved "
     "to the daemon's own flag `daemon start --vllm-python PATH`"),
    (("repeats: 2", "repeats: 2\nbackend: {launch: [/bin/sh, -c, id]}"),
     "backend.launch is no longer a spec key"),
]


@pytest.mark.parametrize("mutation,needle", BAD_SPECS)
def test_cli_refuses_bad_specs_and_writes_nothing(tmp_path: Path, mutation: tuple[str, str], needle: str,
                                                  capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from coordinator.cli import main

    spec_file = tmp_path / "bad.yaml"
    spec_file.write_text(GOOD.replace(*mutation))
    root = tmp_path / "runs"
    monkeypatch.chdir(REPO)
    for cmd in (["validate", str(spec_file)], ["sweep", str(spec_file), "--results-root", str(root)]):
        # in-process through the CLI's entry function; the first case also as a real `python -m coordinator`
        if mutation == BAD_SPECS[0][0]:
            proc = subprocess.run(
                [sys.executable, "-m", "coordinator", *cmd], capture_output=True, text=True, timeout=60, cwd=REPO
            )
            code, err = proc.returncode, proc.stderr
        else:
            code, err = main(cmd), capsys.readouterr().err
        assert code == 2, err
        assert needle in err, err
    assert not root.exists(), "an invalid spec must not create anything"


def test_cli_validate_and_dry_run_accept_the_quickstart(tmp_path: Path) -> None:
    quick = REPO / "configs" / "quickstart.yaml"
    proc = subprocess.run([sys.executable, "-m", "coordinator", "validate", str(quick)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "18 trials" in proc.stdout, proc.stdout + proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "coordinator", "sweep", str(quick), "--dry-run", "--results-root", str(tmp_path / "r")],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "3 server starts" in proc.stdout and "nothing was started" in proc.stdout
    assert not (tmp_path / "r").exists()
    spec = load_spec(quick)
    assert len(spec.engine.expand()) == 3
    assert spec.repeats == 3 and not spec.restart_per_repeat
