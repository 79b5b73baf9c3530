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


RATE_SWEEP_SPEC = """
name: rs
model: {source: hub, id: meta-llama/Meta-Llama-3-8B-Instruct}
engine:
  fixed: {max_model_len: 2048}
  grid: {max_num_seqs: [1, 16]}
load_points:
  - {name: sweep, rate_sweep: {num_rates: 3, max_concurrency: 64}, num_requests: 64, input_len: 256, output_len: 64}
  - {name: c8, max_concurrency: 8, num_requests: 32, input_len: 256, output_len: 64}
slos: [{metric: ttft_ms, percentile: 99, max_ms: 500}]
repeats: 2
planner: {kind: grid, randomize: false}
hardware: {targets: [{hardware_class: 1xH100-80GB}]}
gpu_hour_prices: {1xH100-80GB: 4.0}
"""


def test_rate_sweeps_are_played_with_the_followups_the_sweep_would_add() -> None:
    from servetune.manifest import rate_sweep_rates

    spec = parse_spec(RATE_SWEEP_SPEC)
    plan = plan_experiment(spec)
    (pv,) = preview(spec)
    labels = {"max_num_seqs=1", "max_num_seqs=16"}
    for lp in ("sweep@sync", "sweep@max", "c8"):
        assert {r.config_label for r in pv.ranked[lp] if r.n_ok} == labels, lp
    sweeps = {s["config_label"]: s for s in pv.rate_sweeps}
    assert set(sweeps) == labels, "a config that does not start plays no seed and gets no follow-up"
    for label, s in sweeps.items():
        sync = next(r for r in pv.ranked["sweep@sync"] if r.config_label == label).values["request_throughput"]
        top = next(r for r in pv.ranked["sweep@max"] if r.config_label == label).values["request_throughput"]
        assert s["sync_rps"] == sync and s["max_rps"] == top
        assert s["rates"] == rate_sweep_rates(sync, top, 3), "the sweep's own rule picks the rates"
    # one seat: @max cannot beat @sync, so the sweep adds nothing, and the preview says so
    assert sweeps["max_num_seqs=1"]["rates"] == []
    assert any("rate sweep sweep of max_num_seqs=1" in n and "adds no follow-up" in n for n in pv.notes)
    rates = sweeps["max_num_seqs=16"]["rates"]
    assert len(rates) == 3
    for rate in rates:  # each follow-up is its own load point, played open loop at its rate
        (row,) = pv.ranked[f"sweep@{rate:g}rps"]
        assert row.config_label == "max_num_seqs=16" and row.n_ok == spec.repeats
        assert row.values["request_throughput"] == pytest.approx(rate, rel=0.25)
        assert pv.followup_of[f"sweep@{rate:g}rps"] == "sweep"
    # cost: one more server start per (batch, rate sweep) that gets follow-ups, as the sweep adds them
    assert pv.followup_starts == spec.repeats and pv.followup_trials == 3 * spec.repeats
    assert pv.server_starts == len(plan.batches) + spec.repeats
    assert pv.trials == len(plan.trials())


def _json_and_text(tmp_path: Path, spec_text: str, capsys: pytest.CaptureFixture[str]) -> tuple[dict, str]:
    import json

    path = tmp_path / "spec.yaml"
    path.write_text(textwrap.dedent(spec_text))
    assert main(["sweep", str(path), "--preview", "--json", "--results-root", str(tmp_path / "runs")]) == 0
    doc = json.loads(capsys.readouterr().out)  # the whole of stdout is one document
    assert main(["sweep", str(path), "--preview", "--results-root", str(tmp_path / "runs")]) == 0
    return doc, capsys.readouterr().out


def test_preview_json_follows_its_schema_and_says_what_the_text_says(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    import jsonschema

    from coordinator.preview import _duration
    from coordinator.preview_json import SCHEMA_PATH

    doc, text = _json_and_text(tmp_path, RATE_SWEEP_SPEC, capsys)
    jsonschema.validate(doc, json.loads(SCHEMA_PATH.read_text()))
    assert not (tmp_path / "runs").exists()
    (target,) = doc["targets"]
    uncal = "uncalibrated (from published specs)"
    marked = [target, target["cost"], *target["load_points"], *target["failures"], *target["rate_sweeps"]]
    assert all((m["simulated"], m["profile"], m["calibration"]) == ("SIMULATED", "H100-80G", uncal) for m in marked)
    kinds = {lp["load_point"]: lp["kind"] for lp in target["load_points"]}
    assert kinds["c8"] == "planned" and kinds["sweep@sync"] == kinds["sweep@max"] == "rate_sweep_seed"
    follow = [lp for lp in target["load_points"] if lp["kind"] == "rate_sweep_followup"]
    assert len(follow) == 3 and all(lp["rate_sweep"] == "sweep" for lp in follow)
    for lp in target["load_points"]:  # the winner (or its absence) of every load point, as the text states it
        win = lp["winner"]
        name = lp["load_point"]
        if win is not None:
            assert f"SIMULATED expected winner at {name} on H100-80G: {win['config_label']} (" in text
        else:
            assert f"SIMULATED at {name} on H100-80G: no config is expected to meet every SLO" in text
    assert {lp["load_point"]: (lp["winner"] or {}).get("config_label") for lp in target["load_points"]}["c8"] == \
        "max_num_seqs=16"
    for f in target["failures"]:
        assert f"SIMULATED would not start on H100-80G: {f['config_label']}: {f['reason']}" in text
    cost = target["cost"]
    assert (f"SIMULATED cost on H100-80G: {cost['server_starts']} server starts ({cost['followup_server_starts']} for "
            f"{cost['followup_trials']} rate-sweep follow-up trials), about {_duration(cost['wall_s'])} wall-clock, "
            f"{cost['gpu_hours']:.2f} GPU-hours; ${cost['cost_usd']:,.2f} at the spec's price") in text
    assert cost["cost_usd"] == pytest.approx(cost["gpu_hours"] * 4.0)


def test_preview_json_on_bad_input_writes_nothing_to_stdout(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = str(REPO / "configs" / "quickstart.yaml")
    assert main(["sweep", spec, "--preview", "--json", "--profile", "B300"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "--profile 'B300' is not a sim profile" in err
    assert main(["sweep", spec, "--json"]) == 2
    assert "only apply with --preview" in capsys.readouterr().err
