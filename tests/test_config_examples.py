"""``configs/`` has a worked example per planner kind, each validates, the sampled ones dry-run, and the
examples on the SIMULATED backend run from YAML through the coordinator and a child daemon; the
estimate ``validate`` prints says what it is (real vLLM, an endpoint with no server starts, or the
simulator, which runs in seconds)."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

import analysis
from coordinator.cli import main
from coordinator.planning import known_kinds
from servetune.spec import load_spec
from tests.conftest import cli_env, coordinator_cmd

REPO = Path(__file__).resolve().parents[1]
#: The experiment specs (``fleet.yaml`` holds the coordinator's fleet settings, not an experiment).
CONFIGS = sorted(p for p in (REPO / "configs").glob("*.yaml") if p.name != "fleet.yaml")


def test_every_planner_kind_has_an_example_that_validates(capsys: pytest.CaptureFixture[str]) -> None:
    kinds: dict[str, list[str]] = {}
    for path in CONFIGS:
        kinds.setdefault(load_spec(path).planner.kind, []).append(path.name)
    assert sorted(kinds) == known_kinds(), f"examples per kind: {kinds}"
    for names in kinds.values():
        for name in names:
            assert main(["validate", str(REPO / "configs" / name)]) == 0, capsys.readouterr().err


def test_the_estimate_names_what_it_estimates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(REPO / "configs" / "quasi-random-sim.yaml")]) == 0
    sim = capsys.readouterr().out
    assert "SIMULATED: runs in seconds; on real vLLM about" in sim and "; estimated" not in sim, sim
    assert main(["validate", str(REPO / "configs" / "quickstart.yaml")]) == 0
    real = capsys.readouterr().out
    assert "estimated 4 min" in real and "SIMULATED" not in real, real
    spec = tmp_path / "openai.yaml"
    spec.write_text(textwrap.dedent("""
        name: ext
        backend: {kind: openai, base_url: "http://127.0.0.1:9"}
        load_points: [{name: c1, max_concurrency: 1, num_requests: 4, input_len: 8, output_len: 8}]
        """))
    assert main(["validate", str(spec)]) == 0
    assert "(no server starts)" in capsys.readouterr().out
    assert main(["sweep", str(spec), "--dry-run", "--results-root", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "no server starts (backend openai" in out and "(no server starts)" in out and "50 s per" not in out, out


def test_the_quasi_random_example_runs_on_the_simulator(tmp_path: Path, tiny_cache: Path) -> None:
    root = tmp_path / "runs"
    example = REPO / "configs" / "quasi-random-sim.yaml"
    proc = subprocess.run(coordinator_cmd("sweep", str(example), "--results-root", str(root)),
                          capture_output=True, text=True, timeout=300, env=cli_env(tiny_cache))
    assert proc.returncode == 0, proc.stderr[-3000:]
    ds = analysis.load("quasi-random-sim", results_root=root)
    spec = load_spec(example)
    assert ds.attrs["design"] == "quasi-random" and int(ds.attrs["randomized"]) == 1
    assert spec.planner.n_configs is not None
    assert len(set(ds.config_id.values.tolist())) == spec.planner.n_configs
    assert ds.sizes["trial"] == spec.planner.n_configs * len(spec.load_points) * spec.repeats
    assert set(ds.status.values.tolist()) == {"ok"}
    # the ETA before the first trial: the simulator's pace is unknown, never real vLLM's minutes
    first = [line for line in proc.stderr.splitlines() if line.startswith("[0/")]
    assert first and all(line.endswith("ETA --)") for line in first), first
