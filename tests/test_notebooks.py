"""The notebooks in ``notebooks/`` run top to bottom on data the tests generate, and their asserts bite.

Each notebook is executed with nbclient in a fresh IPython kernel whose kernelspec is written for this
interpreter (``ipykernel.kernelspec.install`` into a temporary prefix, so the kernel is this
``.venv``'s python whatever kernelspecs the machine has), with the kernel's working folder set to
``notebooks/`` as when a user opens them in Jupyter and the repository root first on ``PYTHONPATH``
(what pytest imports). Inputs travel as the environment variables the notebooks document. Every
executed notebook, outputs and errors included, is saved under ``test-artifacts/notebooks/``.

Data: the quickstart runs on the shared REAL vLLM CPU sweep (``e2e_sweep``, marked ``vllm``) and on
a synthetic planted experiment; the parameter analysis and the comparison run on SYNTHETIC planted
experiments (``analysis.synthetic.planted``, written to ``results.nc`` files), since the real sweep
is far too small for parameter analysis. What the notebooks print is checked against the analyses
called directly and against the planted truth; one test points the quickstart at an experiment in
which every trial failed and checks that the notebook fails at its "front is not empty" assert.

Runtime: the 8 notebook runs take 2.5-4.5 minutes on a busy 2-core machine (20-35 s each, of which
about 10 s is the kernel start and the HoloViews/Panel imports; 10-20 s each on an idle one), plus the
shared sweep when no other test has run it yet.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import numpy as np
import pytest
import xarray as xr
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

import analysis
from analysis.synthetic import INTERACTION, log_throughput, planted
from servetune.netcdf import write_netcdf
from tests.conftest import ARTIFACTS, REPO, SweepRun

log = logging.getLogger(__name__)

NOTEBOOKS = REPO / "notebooks"
QUICKSTART = "01-quickstart.ipynb"
PARAMETERS = "02-parameter-analysis.ipynb"
COMPARE = "03-compare-experiments.ipynb"
ALL_NOTEBOOKS = (QUICKSTART, PARAMETERS, COMPARE)
KERNEL = "servetune-notebook-tests"
CELL_TIMEOUT_S = 300
SUMMARY_MARK = "NOTEBOOK_SUMMARY "
ENV_READ = re.compile(r"""os\.environ\.get\(\s*["'](SERVETUNE_[A-Z_]+)["']""")


@dataclass
class Executed:
    """An executed notebook: the notebook with its outputs, the error text if a cell raised, and the
    JSON summary its last cell printed (None when it never got there)."""

    nb: Any
    error: str | None
    summary: dict[str, Any] | None


@pytest.fixture(scope="module")
def kernel_specs(tmp_path_factory: pytest.TempPathFactory) -> KernelSpecManager:
    """A kernelspec for THIS interpreter in a private folder (never the user's or the system's)."""
    import ipykernel.kernelspec

    prefix = tmp_path_factory.mktemp("kernelspec")
    ipykernel.kernelspec.install(kernel_name=KERNEL, prefix=str(prefix), display_name="servetune tests")
    ksm = KernelSpecManager(kernel_dirs=[str(prefix / "share" / "jupyter" / "kernels")])
    spec = ksm.get_kernel_spec(KERNEL)
    assert Path(spec.argv[0]) == Path(sys.executable), f"the test kernel would run {spec.argv[0]}, not {sys.executable}"
    return ksm


def notebook_env(**inputs: str) -> dict[str, str]:
    """The kernel's environment: ours without any notebook input we did not give, plus ``inputs``."""
    env = {k: v for k, v in os.environ.items() if k not in documented_inputs()}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.update(inputs)
    return env


def documented_inputs() -> set[str]:
    names: set[str] = set()
    for name in ALL_NOTEBOOKS:
        nb = nbformat.read(NOTEBOOKS / name, as_version=4)
        for cell in nb.cells:
            names.update(ENV_READ.findall(cell.source))
    return names


def run_notebook(ksm: KernelSpecManager, name: str, artifact: str, **inputs: str) -> Executed:
    """Execute ``notebooks/<name>`` top to bottom with ``inputs`` as environment variables; save it as
    ``test-artifacts/notebooks/<artifact>.ipynb`` whatever happens."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    km = KernelManager(kernel_name=KERNEL, kernel_spec_manager=ksm)
    client = NotebookClient(nb, km=km, kernel_name=KERNEL, timeout=CELL_TIMEOUT_S, startup_timeout=120,
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    error: str | None = None
    try:
        client.execute(env=notebook_env(**inputs), cleanup_kc=True)
    except CellExecutionError as exc:
        error = str(exc)
    finally:
        if km.has_kernel:
            km.shutdown_kernel(now=True)
        out = ARTIFACTS / "notebooks"
        out.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out / f"{artifact}.ipynb")
    return Executed(nb, error, _summary(nb))


def _summary(nb: Any) -> dict[str, Any] | None:
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            text = output.get("text", "") if output.get("output_type") == "stream" else ""
            for line in text.splitlines():
                if line.startswith(SUMMARY_MARK):
                    return dict(json.loads(line[len(SUMMARY_MARK):]))
    return None


def ran_clean(run: Executed) -> dict[str, Any]:
    assert run.error is None, f"the notebook failed:\n{run.error[-4000:] if run.error else ''}"
    assert run.summary is not None, "the notebook ran but printed no summary"
    return run.summary


def write_experiment(ds: xr.Dataset, path: Path, name: str) -> Path:
    """Write a (synthetic) dataset as a ``results.nc`` the way the coordinator does, named ``name``."""
    ds = ds.assign_coords(experiment=("trial", np.full(ds.sizes["trial"], name, dtype=object)))
    ds.attrs["experiment"] = name
    path.parent.mkdir(parents=True, exist_ok=True)
    write_netcdf(ds, path)
    return path


# --------------------------------------------------------------------------- stored notebooks


@pytest.mark.parametrize("name", ALL_NOTEBOOKS)
def test_notebook_is_stored_without_outputs_and_documents_its_inputs(name: str) -> None:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, f"{name} has no code"
    for cell in code:
        assert cell.get("outputs") == [] and cell.get("execution_count") is None, \
            f"{name} is stored with outputs (clear them before committing): {cell.source[:80]!r}"
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    reads = {var for cell in code for var in ENV_READ.findall(cell.source)}
    assert {"SERVETUNE_RESULTS_ROOT", "SERVETUNE_EXPERIMENT"} <= reads, f"{name} must take its inputs from the environment"
    assert set(ENV_READ.findall(code[0].source)) == reads, f"{name} reads inputs outside its first code cell"
    first_md = next(c for c in nb.cells if c.cell_type == "markdown")
    readme = (NOTEBOOKS / "README.md").read_text()
    for var in reads:
        assert f"`{var}`" in first_md.source, f"{name}'s first cell does not document {var}"
        assert f"`{var}`" in readme, f"notebooks/README.md does not document {var}"
    assert name in readme, f"notebooks/README.md does not list {name}"


# --------------------------------------------------------------------------- 01 quickstart


def _front_and_winners(ds: xr.Dataset) -> tuple[list[list[str]], dict[tuple[str, str], str]]:
    front = ds.sweep.front(("output_throughput", "ttft_ms_p99"))
    on = sorted([g.group["load_point"], g.group["hardware_class"], p.config_id]
                for g in front.groups for p in g.points if p.on_front)
    ranking = ds.sweep.rank("slo_throughput")
    winners = {(g.group["load_point"], g.group["hardware_class"]): g.rows[0].config_id
               for g in ranking.groups if g.rows and math.isfinite(g.rows[0].score.estimate)}
    return on, winners


def _check_quickstart(summary: dict[str, Any], ds: xr.Dataset) -> None:
    front, winners = _front_and_winners(ds)
    assert summary["n_front"] > 0 and summary["front"] == front, "the notebook's front differs from ds.sweep.front"
    assert summary["n_plotted"] >= summary["n_points"] + summary["n_front"]
    shown = {(w["group"]["load_point"], w["group"]["hardware_class"]): w["config_id"] for w in summary["winners"]}
    assert shown == winners, "the notebook's winners differ from ds.sweep.rank's #1"
    for w in summary["winners"]:
        assert w["vllm_serve"], f"no vllm serve flags for the winner {w['label']}"


@pytest.mark.vllm
def test_quickstart_on_the_real_sweep(kernel_specs: KernelSpecManager, e2e_sweep: SweepRun) -> None:
    assert (e2e_sweep.folder / "results.nc").exists(), f"the shared sweep wrote no results:\n{e2e_sweep.proc.stderr[-3000:]}"
    run = run_notebook(kernel_specs, QUICKSTART, "01-quickstart-real-e2e",
                       SERVETUNE_RESULTS_ROOT=str(e2e_sweep.root), SERVETUNE_EXPERIMENT="e2e")
    summary = ran_clean(run)
    ds = analysis.load("e2e", e2e_sweep.root)
    assert summary["experiment"] == "e2e" and summary["n_trials"] == ds.sizes["trial"]
    _check_quickstart(summary, ds)
    table = ds.sweep.table()
    broken = set(table.loc[table["status"] == "failed", "config_id"])
    assert broken, "the e2e spec plants a config that cannot start"
    assert not broken & {w["config_id"] for w in summary["winners"]}, "a config that failed every trial won"
    assert all("--max-num-seqs" in w["vllm_serve"] for w in summary["winners"])


def test_quickstart_on_a_synthetic_experiment(kernel_specs: KernelSpecManager, tmp_path: Path) -> None:
    ds, _ = planted(n_configs=60, n_params=4, repeats=3, load_points=("c8", "c32"), seed=11)
    path = write_experiment(ds, tmp_path / "runs" / "planted-quick" / "results.nc", "planted-quick")
    run = run_notebook(kernel_specs, QUICKSTART, "01-quickstart-synthetic",
                       SERVETUNE_RESULTS_ROOT=str(tmp_path / "runs"), SERVETUNE_EXPERIMENT=str(path))
    summary = ran_clean(run)
    assert len(summary["winners"]) == 2, "one winner per load point"
    _check_quickstart(summary, analysis.load(path))


def test_quickstart_fails_when_the_front_is_empty(kernel_specs: KernelSpecManager, tmp_path: Path) -> None:
    """Every trial failed: the notebook must stop at its front assert, not draw an empty plot."""
    ds, _ = planted(n_configs=12, n_params=3, repeats=2, fail_rate_region=1.0, fail_rate_base=1.0, seed=2)
    assert (ds["output_throughput"].isnull()).all()
    path = write_experiment(ds, tmp_path / "all-failed.nc", "all-failed")
    run = run_notebook(kernel_specs, QUICKSTART, "01-quickstart-all-failed-MUST-FAIL",
                       SERVETUNE_RESULTS_ROOT=str(tmp_path), SERVETUNE_EXPERIMENT=str(path))
    assert run.error is not None, "the quickstart ran to the end on an experiment where every trial failed"
    assert "AssertionError" in run.error and "the Pareto front is empty" in run.error, run.error[-3000:]
    assert run.summary is None
    code = [c for c in run.nb.cells if c.cell_type == "code"]
    failed = [i for i, c in enumerate(code) if any(o.get("output_type") == "error" for o in c.get("outputs", []))]
    assert len(failed) == 1 and "ds.sweep.front(" in code[failed[0]].source, "the front cell must be the one that fails"
    assert all(c.get("execution_count") is None for c in code[failed[0] + 1:]), "cells after the failure ran"


# --------------------------------------------------------------------------- 02 parameter analysis


def test_parameter_analysis_recovers_the_planted_truth(kernel_specs: KernelSpecManager, tmp_path: Path) -> None:
    ds, truth = planted(n_configs=150, n_params=6, repeats=2, seed=7)
    path = write_experiment(ds, tmp_path / "planted-params.nc", "planted-params")
    run = run_notebook(kernel_specs, PARAMETERS, "02-parameter-analysis-synthetic",
                       SERVETUNE_RESULTS_ROOT=str(tmp_path), SERVETUNE_EXPERIMENT=str(path), SERVETUNE_N_BOOT="40")
    summary = ran_clean(run)
    verdicts = {p["name"]: p["verdict"] for p in summary["importance"]}
    assert set(verdicts) == set(truth.params)
    assert summary["importance"][0]["name"] == "max_num_seqs" == summary["pd_parameter"], "the strongest planted effect"
    assert verdicts["max_num_seqs"] == "important"
    for name in truth.null:
        assert verdicts[name] == "indistinguishable from noise", f"{name} has no planted effect"
    assert summary["claim"] == "effect" and summary["pd_sentence"].startswith("setting max_num_seqs from 4 to 256")
    assert set(INTERACTION) in [set(p) for p in summary["top_pairs"]], "the planted interaction is among the top pairs"
    worst = summary["worst_region"]
    assert "max_num_seqs" in worst and "gpu_memory_utilization=0.95" in worst, f"planted failure region, got {worst}"


def test_parameter_analysis_words_an_adaptive_design_as_associations(
        kernel_specs: KernelSpecManager, tmp_path: Path) -> None:
    ds, _ = planted(n_configs=100, n_params=4, repeats=2, design="adaptive", seed=8)
    path = write_experiment(ds, tmp_path / "adaptive.nc", "adaptive")
    run = run_notebook(kernel_specs, PARAMETERS, "02-parameter-analysis-adaptive",
                       SERVETUNE_RESULTS_ROOT=str(tmp_path), SERVETUNE_EXPERIMENT=str(path), SERVETUNE_N_BOOT="20")
    summary = ran_clean(run)
    assert summary["claim"] == "association"
    assert "an association, not an effect" in summary["pd_sentence"] and "adaptive" in summary["pd_sentence"]


# --------------------------------------------------------------------------- 03 compare experiments


@pytest.fixture
def two_experiments(tmp_path: Path) -> tuple[Path, Path]:
    """Experiment A sweeps four parameters, B the same four and block_size (so no config is shared)."""
    base = ["max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill", "gpu_memory_utilization"]
    a, _ = planted(n_configs=40, params=base, repeats=3, fail_rate_region=0.0, fail_rate_base=0.0, seed=21)
    b, _ = planted(n_configs=40, params=[*base, "block_size"], repeats=3, fail_rate_region=0.0, fail_rate_base=0.0,
                   seed=22)
    return (write_experiment(a, tmp_path / "runs" / "exp-a" / "results.nc", "exp-a"),
            write_experiment(b, tmp_path / "runs" / "exp-b" / "results.nc", "exp-b"))


def _repeats(path: Path, config_id: str) -> np.ndarray:
    t = analysis.load(path).sweep.table()
    return t.loc[(t["config_id"] == config_id) & (t["status"] == "ok"), "output_throughput"].to_numpy(dtype=float)


def test_compare_the_two_winners(kernel_specs: KernelSpecManager, two_experiments: tuple[Path, Path]) -> None:
    path_a, path_b = two_experiments
    run = run_notebook(kernel_specs, COMPARE, "03-compare-winners-synthetic", SERVETUNE_RESULTS_ROOT=str(path_a.parents[1]),
                       SERVETUNE_EXPERIMENT=str(path_a), SERVETUNE_EXPERIMENT_B=str(path_b))
    summary = ran_clean(run)
    assert summary["experiments"] == ["exp-a", "exp-b"]
    for path, key in ((path_a, "config_a"), (path_b, "config_b")):
        _, winners = _front_and_winners(analysis.load(path))
        assert summary[key] == winners[("lp", "sim-gpu-a")], f"{key} is not its experiment's #1"
    a, b = _repeats(path_a, summary["config_a"]), _repeats(path_b, summary["config_b"])
    assert (summary["n_a"], summary["n_b"]) == (len(a), len(b)) == (3, 3)
    assert summary["ratio"][0] == pytest.approx(float(np.median(b) / np.median(a)), rel=1e-9)
    assert summary["ratio"][1] <= summary["ratio"][0] <= summary["ratio"][2]
    assert summary["claim"] == "association" and "an association, not an effect" in summary["sentence"]


def test_compare_chosen_configs_finds_the_planted_difference(
        kernel_specs: KernelSpecManager, two_experiments: tuple[Path, Path]) -> None:
    """A's slowest and B's fastest config by the planted formula, named by label (A) and id (B): the
    planted ratio is large, so the verdict must be "b better" and the ratio near the truth."""
    path_a, path_b = two_experiments
    picks = []
    for path, pick in ((path_a, min), (path_b, max)):
        t = analysis.load(path).sweep.table().drop_duplicates("config_id")
        params = [c for c in t.columns if c.startswith("param_")]
        truth = {r.config_id: log_throughput({p.removeprefix("param_"): getattr(r, p) for p in params})
                 for r in t[["config_id", *params]].itertuples(index=False)}
        best = pick(truth, key=truth.__getitem__)
        picks.append((best, truth[best], t.loc[t["config_id"] == best, "config_label"].iloc[0]))
    (id_a, log_a, label_a), (id_b, log_b, _) = picks
    planted_ratio = math.exp(log_b - log_a)
    assert planted_ratio > 2.0, "the picks must differ by far more than the minimum effect"
    run = run_notebook(kernel_specs, COMPARE, "03-compare-chosen-synthetic", SERVETUNE_RESULTS_ROOT=str(path_a.parents[1]),
                       SERVETUNE_EXPERIMENT=str(path_a), SERVETUNE_EXPERIMENT_B=str(path_b),
                       SERVETUNE_CONFIG_A=label_a, SERVETUNE_CONFIG_B=id_b, SERVETUNE_MIN_EFFECT="0.1")
    summary = ran_clean(run)
    assert (summary["config_a"], summary["config_b"]) == (id_a, id_b)
    assert summary["verdict"] == "b better"
    assert summary["ratio"][0] == pytest.approx(planted_ratio, rel=0.15)
    assert "b is better by more than the 10% that matters" in summary["sentence"]
