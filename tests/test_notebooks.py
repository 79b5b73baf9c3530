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

Offline (issue 14): every clean run is exported to HTML with nbconvert; the export must embed BokehJS
and fetch none of BokehJS, Panel or HoloViews from a CDN (the notebooks call
``hv.extension("bokeh", inline=True)``). A browser test opens each export in Debian's chromium with
every request that is not a file or localhost aborted and checks that every plot cell drew
data-coloured pixels, reusing the exports of the runs above (or running the notebook on planted data
when run alone). Notebook 03 must run with its defaults and, without experiment B, stop with the
command to run first and no traceback.

Runtime: the 10 notebook runs take 3-5.5 minutes on a busy 2-core machine (20-35 s each, of which
about 10 s is the kernel start and the HoloViews/Panel imports; 10-20 s each on an idle one), plus the
shared sweep when no other test has run it yet, plus the browser checks (about 30-60 s per notebook).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bokeh
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
    """An executed notebook: the notebook with its outputs, the error text if a cell raised, the
    JSON summary its last cell printed (None when it never got there), and its HTML export."""

    nb: Any
    error: str | None
    summary: dict[str, Any] | None
    html: str = ""


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
    html = export_html(nb, out / f"{artifact}.html")
    if error is None:
        EXPORTS[name] = out / f"{artifact}.html"
    return Executed(nb, error, _summary(nb), html)


def export_html(nb: Any, path: Path) -> str:
    """``jupyter nbconvert --to html`` of the executed notebook (nbconvert's HTMLExporter), saved at ``path``."""
    from nbconvert import HTMLExporter

    html, _ = HTMLExporter().from_notebook_node(nb)
    path.write_text(html, encoding="utf-8")
    return str(html)


#: a <script> that fetches JavaScript from a network address (a CDN), as opposed to one written inline
NETWORK_SCRIPT = re.compile(r"""<script\b[^>]*\bsrc\s*=\s*["']?((?:https?:)?//[^"' >]+)""", re.IGNORECASE)
#: what the embedded BokehJS defines (bokeh.min.js), found only when its source is in the page
BOKEHJS_SOURCE = re.compile(r'version\s*=\s*"' + re.escape(bokeh.__version__) + '"')


def bokeh_network_scripts(html: str) -> list[str]:
    """The script URLs in an exported page that load BokehJS, Panel or HoloViews code from the network.

    Includes the URLs the notebook's autoload script would fetch (its ``js_urls``). nbconvert's own
    template references require.js and MathJax on cdnjs; neither draws a plot (the offline browser
    check below shows the plots drawn without them), so they are not counted."""
    urls = NETWORK_SCRIPT.findall(html)
    urls += re.findall(r"""https?://[^"'\s\\]*(?:bokeh|panel|holoviews|pyviz)[^"'\s\\]*\.js""", html, re.IGNORECASE)
    return sorted({u for u in urls if re.search(r"bokeh|panel|holoviews|pyviz|holoviz", u, re.IGNORECASE)})


def assert_offline_plots(run: Executed) -> None:
    """The export embeds BokehJS and fetches none of it (nor Panel's or HoloViews' code) from a CDN."""
    assert run.html, "the notebook was not exported"
    outside = bokeh_network_scripts(run.html)
    assert outside == [], f"the exported notebook loads plotting code from the network: {outside}"
    assert BOKEHJS_SOURCE.search(run.html), "BokehJS is not embedded in the exported notebook"


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
    assert_offline_plots(run)
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


def test_compare_with_its_defaults_says_what_to_run_first(kernel_specs: KernelSpecManager, tmp_path: Path) -> None:
    """Only ``quickstart`` exists: 03's default B (``random-design``) is missing, and the notebook must
    stop with a message saying exactly which sweep to run, shown without a traceback."""
    root = tmp_path / "runs"
    ds, _ = planted(n_configs=10, n_params=3, repeats=2, fail_rate_region=0.0, fail_rate_base=0.0, seed=23)
    write_experiment(ds, root / "quickstart" / "results.nc", "quickstart")
    run = run_notebook(kernel_specs, COMPARE, "03-compare-defaults-without-b-MUST-FAIL", SERVETUNE_RESULTS_ROOT=str(root))
    assert run.error is not None and run.summary is None, "03 ran to the end without its experiment B"
    errors = [o for c in run.nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert len(errors) == 1, errors
    err = errors[0]
    assert err["ename"] == "MissingExperimentError", err
    assert err["traceback"] == [f"MissingExperimentError: {err['evalue']}"], "a message, not a traceback"
    assert f"run `python -m coordinator sweep configs/random-design.yaml --results-root {root.resolve()}`" \
        in err["evalue"], err["evalue"]
    assert "SERVETUNE_EXPERIMENT_B='random-design'" in err["evalue"] and (REPO / "configs" / "random-design.yaml").is_file()


def test_compare_runs_with_its_defaults(kernel_specs: KernelSpecManager, tmp_path: Path) -> None:
    """``quickstart`` and ``random-design`` under the results root, as folders holding only a
    ``results.nc`` (what the dashboard lists): 03 runs with no input but the results root."""
    root = tmp_path / "runs"
    for seed, name in ((24, "quickstart"), (25, "random-design")):
        ds, _ = planted(n_configs=12, n_params=3, repeats=3, fail_rate_region=0.0, fail_rate_base=0.0, seed=seed)
        write_experiment(ds, root / name / "results.nc", name)
    summary = ran_clean(run_notebook(kernel_specs, COMPARE, "03-compare-defaults", SERVETUNE_RESULTS_ROOT=str(root)))
    assert summary["experiments"] == ["quickstart", "random-design"]
    assert summary["claim"] == "association"


# --------------------------------------------------------------------------- offline, in a browser

#: HTML exports of the notebooks run above (by notebook), reused by the browser check below
EXPORTS: dict[str, Path] = {}
#: a pixel of data colour: crimson fronts, steelblue/orange bars, Category10 boxes (axes, grid, text
#: and the gray "all configs" points are colourless)
MIN_CHROMA = 80
MIN_DATA_PIXELS = 30


def _data_pixels(png: bytes) -> int:
    import io

    from PIL import Image

    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=int)
    return int(((rgb.max(axis=2) - rgb.min(axis=2)) > MIN_CHROMA).sum())


def _plot_cells(nb: Any) -> int:
    """Code cells whose result is a HoloViews plot (``hv.extension``'s own output is display data)."""
    return sum(any(o.get("output_type") == "execute_result" and "application/vnd.holoviews_exec.v0+json" in o["data"]
                   for o in c.get("outputs", [])) for c in nb.cells if c.cell_type == "code")


def _export_for(ksm: KernelSpecManager, name: str, tmp: Path) -> tuple[Path, int]:
    """The HTML export of ``name`` executed on SYNTHETIC planted data (the one a test above made when it ran)."""
    if name not in EXPORTS:
        if name == COMPARE:
            for seed, exp in ((21, "exp-a"), (22, "exp-b")):
                ds, _ = planted(n_configs=20, n_params=3, repeats=3, fail_rate_region=0.0, fail_rate_base=0.0, seed=seed)
                write_experiment(ds, tmp / exp / "results.nc", exp)
            inputs = {"SERVETUNE_EXPERIMENT": "exp-a", "SERVETUNE_EXPERIMENT_B": "exp-b"}
        else:
            ds, _ = planted(n_configs=150 if name == PARAMETERS else 40, n_params=6 if name == PARAMETERS else 4,
                            repeats=2, load_points=("c8", "c32"), seed=7)
            write_experiment(ds, tmp / "planted" / "results.nc", "planted")
            inputs = {"SERVETUNE_EXPERIMENT": "planted", "SERVETUNE_N_BOOT": "20"}
        ran_clean(run_notebook(ksm, name, f"browser-{name.removesuffix('.ipynb')}", SERVETUNE_RESULTS_ROOT=str(tmp),
                               **inputs))
    path = EXPORTS[name]
    return path, _plot_cells(nbformat.read(path.with_suffix(".ipynb"), as_version=4))


@pytest.mark.parametrize("name", ALL_NOTEBOOKS)
def test_exported_notebook_draws_its_plots_with_the_network_blocked(
        kernel_specs: KernelSpecManager, tmp_path: Path, name: str) -> None:
    """The notebook's HTML export, opened as a file in Debian's chromium with every request that is
    not a file or localhost aborted: each plot cell draws a canvas with data-coloured pixels (not
    axes alone). Browser test, about 30-60 s per notebook on 2 cores (plus its run when no test above
    ran it); screenshots go to test-artifacts/notebooks/."""
    from playwright.sync_api import Route, sync_playwright

    path, n_plots = _export_for(kernel_specs, name, tmp_path)
    assert n_plots > 0, f"{name} shows no plot"
    blocked: list[str] = []
    page_errors: list[str] = []

    def route(r: Route) -> None:
        url = r.request.url
        if url.startswith("file:") or re.match(r"https?://(localhost|127\.0\.0\.1)[:/]", url):
            r.continue_()
        else:
            blocked.append(url)
            r.abort()

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"], timeout=60_000)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            context.route("**/*", route)
            page = context.new_page()
            page.on("pageerror", lambda e: page_errors.append(str(e)))
            page.goto(path.resolve().as_uri(), wait_until="load", timeout=120_000)
            cells = page.locator(".jp-OutputArea").filter(has=page.locator("canvas"))
            deadline = time.monotonic() + 60  # canvases live in Bokeh's shadow DOM: locators see them
            while cells.count() < n_plots and time.monotonic() < deadline:
                page.wait_for_timeout(500)
            page.wait_for_timeout(3000)  # BokehJS draws after the document loads
            page.screenshot(path=str(path.with_suffix(".png")), full_page=True, timeout=60_000)
            drawn = []
            for i in range(cells.count()):
                canvases = [c for c in cells.nth(i).locator("canvas").all()
                            if (box := c.bounding_box()) and box["width"] > 10 and box["height"] > 10]
                drawn.append(max([_data_pixels(c.screenshot(timeout=30_000)) for c in canvases], default=0))
        finally:
            browser.close()
    detail = f"data pixels per plotted cell {drawn}; blocked {blocked[:8]}; page errors {page_errors[:5]}"
    assert len(drawn) >= n_plots, f"{name}: {len(drawn)} of {n_plots} plot cells drew a canvas ({detail})"
    assert sum(d >= MIN_DATA_PIXELS for d in drawn) >= n_plots, f"{name}: a plot drew no data ({detail})"
