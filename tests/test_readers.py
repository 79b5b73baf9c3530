"""Every reader accepts what the dashboard lists (issue 14).

The dashboard lists an experiment folder under the results root when it holds a sweep's store
(``experiment.sqlite``) or only a ``results.nc`` (a dataset copied out of its experiment, or a
SYNTHETIC one). ``analysis.load``, ``python -m coordinator report`` and ``analyze`` (and the
notebooks, through ``analysis.load``) must open each such experiment by the name the dashboard shows,
by its folder and by a spec file naming it; an experiment that is not there is refused with a message
naming what was looked for (exit 2 from the CLI, nothing written), shown in Jupyter without a
traceback. Data: small SYNTHETIC planted experiments (``analysis.synthetic.planted``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import analysis
from analysis.load import MissingExperimentError
from analysis.synthetic import planted
from coordinator.store import Store
from dashboards.app import state
from servetune.errors import ExperimentNotFoundError
from tests.test_dashboard import write_dataset


@pytest.fixture(scope="module")
def built_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results root as the dashboard sees it: two dataset-only experiments and one store with no dataset yet.

    Built once per module (writing the netCDF files is the slow part); each test gets its own copy (``root``)."""
    base = tmp_path_factory.mktemp("readers") / "runs"
    for i, name in enumerate(("copied", "synthetic-b")):
        ds, _ = planted(n_configs=8, n_params=2, repeats=2, load_points=("lp",), seed=30 + i)
        write_dataset(ds, base / name, name)
    Store.open(base / "starting").close()  # a sweep that has written no result yet
    return base


@pytest.fixture
def root(built_root: Path, tmp_path: Path) -> Path:
    """This test's own copy of ``built_root`` (tests write spec files and decision records into it)."""
    return Path(shutil.copytree(built_root, tmp_path / "runs"))


def _listed(root: Path) -> dict[str, state.ExperimentInfo]:
    return {info.name: info for info in state.list_experiments(root)}


def test_load_opens_every_experiment_the_dashboard_lists(root: Path) -> None:
    listed = _listed(root)
    assert set(listed) == {"copied", "synthetic-b", "starting"}
    for name, info in listed.items():
        if not info.has_dataset:
            with pytest.raises(MissingExperimentError, match=r"has no results\.nc yet"):
                analysis.load(name, root)
            continue
        assert not info.has_store, "the fixture's datasets have no store: the case today's readers refused"
        by_name = analysis.load(name, root)
        n = sum(v for k, v in info.counts.items() if k != "running")
        assert by_name.sizes["trial"] == n > 0
        assert by_name.attrs["experiment"] == name
        assert analysis.load(root / name).identical(by_name), "by folder"
        spec = root.parent / f"{name}.yaml"
        spec.write_text(f"name: {name}\n", encoding="utf-8")
        assert analysis.load(spec, root).identical(by_name), "by a spec file naming it"


def test_load_many_combines_dataset_only_experiments(root: Path) -> None:
    both = analysis.load_many(["copied", "synthetic-b"], root)
    assert json.loads(both.attrs["experiments"]) == ["copied", "synthetic-b"]
    parts = [analysis.load(n, root) for n in ("copied", "synthetic-b")]
    assert both.sizes["trial"] == sum(p.sizes["trial"] for p in parts)


def test_an_unknown_experiment_names_what_was_looked_for(root: Path) -> None:
    with pytest.raises(ExperimentNotFoundError) as err:
        analysis.load("nowhere", root)
    text = str(err.value)
    assert "'nowhere'" in text and f"{root / 'nowhere'}/experiment.sqlite" in text
    assert f"{root / 'nowhere'}/results.nc" in text
    # in IPython / Jupyter: the message alone, no traceback (it is the user's input, not a bug)
    assert isinstance(err.value, MissingExperimentError)
    assert err.value._render_traceback_() == [f"MissingExperimentError: {text}"]


# ``python -m coordinator report`` / ``analyze`` hand their whole command line to ``python -m dashboards
# report`` / ``python -m analysis analyze`` (coordinator.commands.delegate); the readers are called here
# in-process through those entry functions. The real child-process chain, ``--results-root`` and exit 2
# passed through, is run by tests/test_report.py::test_bad_experiment_exits_2_naming_it_and_writes_nothing
# and tests/test_analysis_report.py.


def test_report_writes_a_dataset_only_experiment_by_name(root: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from dashboards.report import main as report_main

    out = tmp_path / "copied.html"
    code = report_main(["copied", "--results-root", str(root), "--out", str(out), "--n-boot", "0"])
    assert code == 0, capsys.readouterr().err[-3000:]
    assert out.is_file() and "copied" in out.read_text(encoding="utf-8")


def test_report_refuses_an_unknown_experiment_with_exit_2(root: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from dashboards.report import main as report_main

    out = tmp_path / "none.html"
    code = report_main(["nowhere", "--results-root", str(root), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err[-3000:]
    assert "no experiment 'nowhere'" in err and "results.nc" in err
    assert "Traceback" not in err and not out.exists()


def test_analyze_reads_a_dataset_only_experiment_by_name(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from analysis.__main__ import main as analysis_main

    code = analysis_main(["analyze", "synthetic-b", "--results-root", str(root), "--json", "--n-boot", "0"])
    out = capsys.readouterr()
    assert code == 0, out.err[-3000:]
    doc = json.loads(out.out)
    assert doc and "synthetic-b" in out.out, "the analysis does not name the experiment it read"


def test_recommend_decides_a_dataset_only_experiment_by_name(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from analysis.decide_cli import main

    code = main(["copied", "--results-root", str(root), "--json", "--n-boot", "50"])
    out = capsys.readouterr()
    assert code == 0, out.err[-3000:]
    doc = json.loads(out.out)
    assert doc["serve_commands"] and doc["inputs"]["experiment"] == "copied", out.out[-2000:]
    assert (root / "copied" / "decision.json").is_file()


def test_a_spec_path_is_read_with_the_bounded_loader(tmp_path: Path) -> None:
    """Naming an experiment by its spec file goes through the spec's bounded YAML loader: an alias
    bomb is refused by what it would expand to, not built."""
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    spec = tmp_path / "bomb.yaml"
    spec.write_text("\n".join(lines) + "\nname: copied\n")
    with pytest.raises(ExperimentNotFoundError, match="aliases"):
        analysis.load(str(spec), tmp_path)
