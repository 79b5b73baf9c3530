"""The experiments page switches experiment without new Bokeh models (no browser).

The periodic tick switches the chosen experiment when a sweep's experiment appears. If that switch
built new models, the browser could get a message that refers to one of them before the message
that defines it (Bokeh's and Panel's writes to one socket can cross), and the page errors with
"reference pNNNN isn't known" (seen in CI on ``test_live_status_follows_a_running_sweep``).
"""

from __future__ import annotations

from pathlib import Path

import pytest


def _planted(folder: Path, seed: int) -> None:
    from analysis.synthetic import planted
    from tests.test_dashboard import write_dataset

    ds, _ = planted(n_configs=6, n_params=2, repeats=1, load_points=("short",), seed=seed)
    write_dataset(ds, folder, folder.name)


def test_switching_experiment_on_the_experiments_page_makes_no_new_models(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from bokeh.document import Document
    from panel.io.state import set_curdoc

    from dashboards import app

    for i, name in enumerate(("alpha", "beta")):
        _planted(tmp_path / name, seed=i)
    monkeypatch.setenv("SERVETUNE_RESULTS_ROOT", str(tmp_path))
    doc = Document()
    with set_curdoc(doc):
        shell = app.App({"page": "experiments", "experiment": "alpha"}, live=False)
        shell.template().server_doc(doc)
        # the first change of any pane brings the template's theme stylesheets (made with the
        # template) into the graph: make one here
        shell.current.live.object = "<div>warm-up</div>"
        shell.current.show(shell._context())
        before = {m.id for m in doc.models}
        page = shell.current
        shell.experiment.value = "beta"
        assert shell.current is page, "the experiments page was rebuilt for another experiment"
        after = {m.id: m for m in doc.models}
        new = sorted(f"{after[i].__class__.__name__} {i}" for i in set(after) - before)
        assert not new, f"switching experiment made new Bokeh models: {new}"
        assert "beta" in shell.title.object
        shell.nav.value = "ranking"  # another page is still built anew
        assert shell.current is not page
