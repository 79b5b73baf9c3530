"""``python -m coordinator sweep CONFIG --preview``: the plan on the simulator (SIMULATED), on every
example config, writing nothing; bad input exits 2 naming the key."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from coordinator.cli import main
from coordinator.planning import plan_experiment
from coordinator.preview import PreviewInputError, pareto_front, preview, resolve_targets
from servetune.ranking import RankedConfig
from servetune.spec import ExperimentSpec, load_spec, parse_spec

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = ["quickstart.yaml", "random-design.yaml", "workloads.yaml", "fleet-example.yaml"]


@pytest.fixture(autouse=True)
def _no_tiny_tokenizer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty model cache: the preview must not depend on (or generate) the tiny model."""
    monkeypatch.setenv("SERVETUNE_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_preview_runs_on_every_example_config_and_writes_nothing(
        name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "runs"
    assert main(["sweep", str(REPO / "configs" / name), "--preview", "--results-root", str(root)]) == 0
    out = capsys.readouterr().out
    assert not root.exists() and not (tmp_path / "cache").exists(), "a preview writes nothing"
    spec = load_spec(REPO / "configs" / name)
    plan = plan_experiment(spec)
    gpu = spec.model.source != "tiny"
    for lp in spec.load_points:
        assert f"load point {lp.name}: ranked by" in out and f"SIMULATED {labels_profile(spec)} load point {lp.name}" in out
        assert f"SIMULATED front (output_throughput vs TTFT p99) at {lp.name}:" in out
    labels = spec.hardware.labels() if spec.hardware else [None]
    starts = len(plan.batches) // len(labels)
    assert out.count(f"{starts} server starts") == len(labels)
    if gpu:
        assert out.count("uncalibrated (from published specs)") >= len(labels) * (1 + len(spec.load_points))
        assert "GPU-hours" in out and "no GPU-hours" not in out
    else:
        assert "[cpu-tiny, uncalibrated (rough figures" in out and "no GPU-hours (CPU profile)" in out
    for line in out.splitlines():  # every line that carries a figure says what it is
        if any(w in line for w in ("expected winner", "front (", "cost on", "would not start", ": model shape ")):
            assert line.strip().startswith("SIMULATED"), line


def labels_profile(spec: ExperimentSpec) -> str:
    return "cpu-tiny" if spec.model.source == "tiny" else "H100-80G"


def test_the_fleet_file_is_not_an_experiment(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", str(REPO / "configs" / "fleet.yaml"), "--preview"]) == 2
    assert "name: Field required" in capsys.readouterr().err


def test_expected_winner_front_failures_and_cost(tmp_path: Path) -> None:
    spec = parse_spec(textwrap.dedent("""
        name: pv
        model: {source: hub, id: meta-llama/Meta-Llama-3-70B-Instruct}
        engine:
          fixed: {max_model_len: 4096}
          grid: {tensor_parallel_size: [1, 2, 4], max_num_seqs: [8, 128]}
        load_points:
          - {name: c128, max_concurrency: 128, num_requests: 256, input_len: 256, output_len: 64}
        slos: [{metric: ttft_ms, percentile: 99, max_ms: 20000}]
        repeats: 2
        planner: {kind: grid, randomize: false}
        hardware: {targets: [{hardware_class: 4xH100-80GB}]}
        gpu_hour_prices: {4xH100-80GB: 10.0}
        """))
    (pv,) = preview(spec)
    assert pv.target.profile == "H100-80G" and pv.target.shape == "llama-3-70b"
    assert pv.calibration == "uncalibrated (from published specs)"
    # 70B weights (141 GB) do not fit one 80 GB device; on two, 128 seats' activations leave too little
    # KV cache for max_model_len: vLLM's own wording for each
    assert pv.failures == {
        "max_num_seqs=8 tp=1": "no memory left for the KV cache (No available memory for the cache blocks)",
        "max_num_seqs=128 tp=1": "no memory left for the KV cache (No available memory for the cache blocks)",
        "max_num_seqs=128 tp=2": "KV cache too small for max_model_len (4096): the estimated maximum model length is 3856"}
    rows = pv.ranked["c128"]
    assert rows[0].n_ok and rows[0].config_label == "max_num_seqs=128 tp=4", "more seats and devices win a closed loop of 128"
    assert [r.status for r in rows[-3:]] == ["failed"] * 3
    assert pv.fronts["c128"] and all(r.n_ok for r in pv.fronts["c128"])
    assert pv.server_starts == 12, "6 configs x 2 repeats, each a server start"
    tp_weighted = pv.gpu_hours * 3600
    assert pv.wall_s < tp_weighted < 4 * pv.wall_s, "GPU-hours count the devices of each config"
    assert pv.cost_usd == pytest.approx(pv.gpu_hours * 10.0)


def test_pareto_front_keeps_only_undominated_configs() -> None:
    def row(cid: str, thr: float, ttft: float) -> RankedConfig:
        return RankedConfig(rank=0, config_id=cid, config_label=cid, load_point="lp", n_ok=1, n_failed=0, n_holes=0,
                            values={"output_throughput": thr, "ttft_p99_ms": ttft})

    rows = [row("a", 100, 50), row("b", 80, 40), row("c", 70, 60), row("d", 100, 70),
            RankedConfig(rank=0, config_id="e", config_label="e", load_point="lp", n_ok=0, n_failed=1, n_holes=0)]
    assert [r.config_id for r in pareto_front(rows, "output_throughput")] == ["a", "b"]


@pytest.mark.parametrize(("args", "extra_yaml", "named"), [
    (["--profile", "B300"], "", "--profile 'B300' is not a sim profile"),
    (["--model-shape", "gpt-5"], "", "--model-shape 'gpt-5' is not a sim model shape"),
    ([], "model: {source: hub, id: org/mystery-model}\n", "model.id 'org/mystery-model': no sim model shape"),
    ([], "model: {source: hub, id: org/x-8b}\nhardware: {targets: [{hardware_class: 1xB200-180GB}]}\n",
     "hardware.targets[0].hardware_class '1xB200-180GB': no sim profile matches"),
])
def test_bad_preview_input_exits_2_naming_the_key(args: list[str], extra_yaml: str, named: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    text = (REPO / "configs" / "quickstart.yaml").read_text()
    if extra_yaml:
        text = text.replace("model:\n  source: tiny            # tiny | path | hub\n", extra_yaml)
        assert extra_yaml in text
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    assert main(["sweep", str(path), "--preview", "--results-root", str(tmp_path / "runs"), *args]) == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_preview_options_need_preview_and_exclude_dry_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = str(REPO / "configs" / "quickstart.yaml")
    assert main(["sweep", spec, "--profile", "H200"]) == 2
    assert "only apply with --preview" in capsys.readouterr().err
    assert main(["sweep", spec, "--preview", "--dry-run"]) == 2
    assert "give one" in capsys.readouterr().err


def test_profile_resolution_follows_the_spec() -> None:
    quick = load_spec(REPO / "configs" / "quickstart.yaml")
    assert [(t.profile, t.shape) for t in resolve_targets(quick)] == [("cpu-tiny", "tiny")]
    assert [(t.profile, t.shape) for t in resolve_targets(quick, "H200")] == [("H200", "tiny")]
    fleet = load_spec(REPO / "configs" / "fleet-example.yaml")
    assert [(t.label, t.profile, t.shape) for t in resolve_targets(fleet)] == [
        ("1xH100-80GB", "H100-80G", "llama-3-8b"), ("filter:a100-80g", "A100-80G", "llama-3-8b")]
    openai = parse_spec(textwrap.dedent("""
        name: ext
        backend: {kind: openai, base_url: "http://127.0.0.1:9"}
        load_points: [{name: c1, max_concurrency: 1, num_requests: 4, input_len: 8, output_len: 8}]
        """))
    with pytest.raises(PreviewInputError, match="backend.kind 'openai'"):
        preview(openai)
