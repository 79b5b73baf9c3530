"""SIMULATED is marked everywhere a simulated trial shows (dataset, analyze, recommend, exports, the
static report, the dashboard's banner), simulated and measured trials never share a ranking, front
or decision, and planted synthetic data is never taken for a simulator run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import analysis
from analysis.__main__ import main as analyze_main
from analysis.crosshw import compare_hardware
from analysis.decide_cli import main as recommend_main
from analysis.decision import recommend
from analysis.frame import AnalysisInputError
from analysis.hardware import simulated_of
from analysis.report import analyze
from analysis.synthetic import planted
from servetune.netcdf import write_netcdf
from servetune.simulated import SIMULATED, simulated_label

H100_LABEL = "SIMULATED (profile H100-80G: uncalibrated (from published specs))"


def _as_simulated(ds: xr.Dataset, classes: dict[str, str]) -> xr.Dataset:
    """A planted dataset relabelled the way a sim-backend run records its trials (backend ``sim``,
    class ``sim-<tp>x<profile>``) for the classes in ``classes`` (planted class -> sim class); the
    others stay measured-looking (backend ``vllm``). Not a simulator run: a dataset of its shape."""
    hw = np.asarray(ds.hardware_class.values, dtype=object)
    backend = np.array(["sim" if h in classes else "vllm" for h in hw], dtype=object)
    new_hw = np.array([classes.get(h, h) for h in hw], dtype=object)
    out = ds.assign_coords(backend=("trial", backend), hardware_class=("trial", new_hw))
    out.attrs = {**ds.attrs, "synthetic": 0, "hardware_classes": ",".join(sorted(set(new_hw.tolist())))}
    return out


@pytest.fixture(scope="module")
def sim_only() -> xr.Dataset:
    ds, _ = planted(n_configs=4, n_params=1, load_points=("lp",), fail_rate_region=0.0, fail_rate_base=0.0,
                    hardware_classes=("a",), seed=1)
    return _as_simulated(ds, {"a": "sim-1xH100-80G"})


@pytest.fixture(scope="module")
def mixed() -> xr.Dataset:
    ds, _ = planted(n_configs=4, n_params=1, load_points=("lp",), fail_rate_region=0.0, fail_rate_base=0.0,
                    hardware_classes=("a", "1xA100-80GB"), gpu_hour_prices={"a": 1.0, "1xA100-80GB": 1.0}, seed=2)
    return _as_simulated(ds, {"a": "sim-1xH100-80G"})


def test_planted_synthetic_data_is_not_a_simulator_run() -> None:
    ds, _ = planted(n_configs=6, n_params=2, seed=0)
    assert set(ds.backend.values.tolist()) == {"synthetic"} and simulated_of(ds) is None


def test_the_dataset_the_analysis_and_the_report_say_simulated(sim_only: xr.Dataset, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "simexp"
    folder.mkdir()
    write_netcdf(sim_only, folder / "results.nc")
    loaded = analysis.load(folder / "results.nc")
    assert loaded.attrs["simulated"] == H100_LABEL == simulated_label(["sim-1xH100-80G"])
    assert analyze_main(["analyze", str(folder / "results.nc"), "--n-boot", "0", "--out", str(tmp_path / "a.json")]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith(H100_LABEL + ": a model's expectation")
    doc = json.loads((tmp_path / "a.json").read_text())
    assert doc["simulated"] == H100_LABEL
    from dashboards.app import state
    from dashboards.app.marks import synthetic_html
    from dashboards.report import _title_html

    assert H100_LABEL in _title_html(doc)
    banner = synthetic_html(folder)  # the page banner reads the dataset through the dashboard's own cache
    assert H100_LABEL in banner and "SYNTHETIC" not in banner
    assert state.is_synthetic(folder) is False
    assert recommend_main([str(folder / "results.nc"), "--n-boot", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(H100_LABEL)
    assert f"{H100_LABEL}: " in out.split("\n\n", 1)[1], "the class's decision says it is simulated"
    serve = [line for line in out.splitlines() if "# servetune:" in line]
    assert serve and all("SIMULATED (profile H100-80G" in line for line in serve), "the export names the profile"


def test_measured_data_carries_no_simulated_mark(tmp_path: Path) -> None:
    ds, _ = planted(n_configs=6, n_params=2, hardware_classes=("1xH100-80GB",), seed=0)
    measured = _as_simulated(ds, {})
    assert simulated_of(measured) is None
    write_netcdf(measured, tmp_path / "results.nc")
    assert "simulated" not in analysis.load(tmp_path / "results.nc").attrs


def test_simulated_and_measured_never_share_a_ranking_front_or_decision(mixed: xr.Dataset) -> None:
    with pytest.raises(AnalysisInputError, match="simulated .* and measured trials never share a cross-hardware"):
        compare_hardware(mixed, "per_gpu")
    with pytest.raises(AnalysisInputError, match="never share a cross-hardware comparison"):
        analyze(mixed, cross_hardware="per_gpu", n_boot=0)
    with pytest.raises(AnalysisInputError, match="never share a decision"):
        recommend(mixed, cross_hardware="per_gpu", n_boot=0)
    doc = analyze(mixed, n_boot=0)  # without asking: kept apart, one document per class, only one simulated
    parts = {p["hardware_class"]: p for p in doc["per_hardware_class"]}
    assert parts["sim-1xH100-80G"]["simulated"] == H100_LABEL and parts["1xA100-80GB"]["simulated"] is None
    assert doc["ranking"].get("skipped") and doc["pareto"].get("skipped")
    decision = recommend(mixed, n_boot=0)
    assert {c.hardware_class for c in decision.classes} == {"sim-1xH100-80G", "1xA100-80GB"}
    assert SIMULATED in doc["simulated"]


def _serve_lines(commands: dict[str, str]) -> list[str]:
    return [line for text in commands.values() for line in text.splitlines() if "# servetune:" in line]


def test_the_reports_exported_commands_say_simulated(sim_only: xr.Dataset) -> None:
    from dashboards.report import decision, decision_commands, winner_commands

    doc = analyze(sim_only, n_boot=0)
    doc["decision"] = decision(sim_only)
    assert doc["decision"].get("classes"), "the simulated experiment has a decision"
    for commands in (winner_commands(sim_only, doc), decision_commands(sim_only, doc)):
        lines = _serve_lines(commands)
        assert lines and all(line.startswith(f"# servetune: {H100_LABEL}, ") for line in lines), lines


def test_the_decide_cli_export_says_simulated(sim_only: xr.Dataset, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    write_netcdf(sim_only, tmp_path / "results.nc")
    assert recommend_main([str(tmp_path / "results.nc"), "--n-boot", "0", "--json"]) == 0
    commands = json.loads(capsys.readouterr().out)["serve_commands"]
    lines = _serve_lines(commands)
    assert lines and all(line.startswith(f"# servetune: {H100_LABEL}, ") for line in lines), lines


def test_the_dashboards_exported_command_says_simulated(sim_only: xr.Dataset, tmp_path: Path) -> None:
    from dashboards.app import state

    folder = tmp_path / "simexp"
    folder.mkdir()
    write_netcdf(sim_only, folder / "results.nc")
    ds, df = state.dataset(folder), state.table(folder)
    cid = str(df["config_id"].iloc[0])
    first = state.serve_command(folder, ds, df, cid).splitlines()[0]
    assert first.startswith(f"# servetune: {H100_LABEL}, "), first


def test_measured_exports_carry_no_simulated_label(tmp_path: Path) -> None:
    from dashboards.report import winner_commands

    ds, _ = planted(n_configs=4, n_params=1, load_points=("lp",), hardware_classes=("1xH100-80GB",), seed=0)
    measured = _as_simulated(ds, {})
    lines = _serve_lines(winner_commands(measured, analyze(measured, n_boot=0)))
    assert lines and not any(SIMULATED in line for line in lines)
