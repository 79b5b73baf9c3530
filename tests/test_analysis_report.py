"""The full analysis document: ``analyze`` on planted data and ``coordinator analyze --json`` on a
real vLLM sweep, both checked against the JSON Schema kept in the repo."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import jsonschema
import pytest
import xarray as xr

import analysis
from analysis.report import SCHEMA_PATH, analyze, validate_report
from analysis.synthetic import planted
from tests.conftest import SweepRun, coordinator_cmd

SECTIONS = ("pareto", "ranking", "importance", "partial_dependence", "interactions", "failure", "drift")


@pytest.fixture(scope="module")
def planted_doc() -> dict:
    ds, _ = planted(n_configs=80, n_params=6, repeats=2, baseline_every=12, drift_at=0.7, seed=5)
    return ds.sweep.analyze(n_boot=20, seed=1)


def test_schema_is_a_valid_json_schema() -> None:
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)


def test_planted_document_matches_schema_and_finds_the_truth(planted_doc: dict) -> None:
    validate_report(planted_doc)
    assert planted_doc["synthetic"] is True
    assert planted_doc["design"]["claim"]["kind"] == "effect"
    for name in SECTIONS:
        assert "skipped" not in planted_doc[name], (name, planted_doc[name])
    verdicts = {p["name"]: p["verdict"] for p in planted_doc["importance"]["parameters"]}
    assert verdicts["max_num_seqs"] == "important"
    assert planted_doc["drift"]["charts"] and planted_doc["drift"]["alarm"], "baseline re-runs and a drift were planted"
    json.dumps(planted_doc, allow_nan=False)  # strict JSON: no NaN


def test_schema_rejects_a_document_missing_a_section(planted_doc: dict) -> None:
    broken = {k: v for k, v in planted_doc.items() if k != "importance"}
    with pytest.raises(jsonschema.ValidationError):
        validate_report(broken)


def test_sections_the_data_cannot_support_are_skipped_with_a_reason() -> None:
    ds, _ = planted(n_configs=12, n_params=1, seed=3)
    doc = analyze(ds, n_boot=5)
    validate_report(doc)
    assert "two parameters" in doc["interactions"]["skipped"]
    assert "baseline" in json.dumps(doc["drift"])  # no baseline runs: said, not invented


def test_analyze_does_not_modify_the_dataset() -> None:
    ds, _ = planted(n_configs=30, n_params=4, repeats=2, seed=4)
    before = ds.copy(deep=True)
    analyze(ds, n_boot=5)
    xr.testing.assert_identical(ds, before)


def test_unknown_metric_is_named() -> None:
    ds, _ = planted(n_configs=10, n_params=2, seed=1)
    with pytest.raises(ValueError, match="not_a_metric"):
        analyze(ds, metric="not_a_metric")


@pytest.mark.vllm
def test_coordinator_analyze_json_on_a_real_sweep(e2e_sweep: SweepRun, tmp_path: Path) -> None:
    out = tmp_path / "analysis.json"
    proc = subprocess.run(
        coordinator_cmd("analyze", "e2e", "--results-root", str(e2e_sweep.root), "--json", "--n-boot", "10",
                        "--out", str(out)),
        capture_output=True, text=True, timeout=600, env=e2e_sweep.env,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    validate_report(doc)
    assert json.loads(out.read_text()) == doc
    assert doc["experiment"] == "e2e" and doc["synthetic"] is False
    assert doc["counts"]["failed"] >= 2  # the config whose server refuses to start, at both load points
    assert "analysis [" in proc.stderr  # progress on stderr, JSON alone on stdout
    # two working configs and one failed, one repeat, no baseline: too little data for importance
    # and effects (skipped, with the count), and the output says what else it cannot support
    assert "need at least" in doc["importance"]["skipped"], doc["importance"]
    codes = {w["code"] for w in doc["warnings"]}
    assert {"single_repeat", "few_events", "no_baseline"} <= codes, codes
    ranking = doc["ranking"]
    assert ranking["groups"] and all(g["rows"] for g in ranking["groups"])


@pytest.mark.vllm
def test_coordinator_analyze_bad_input_exits_2(e2e_sweep: SweepRun) -> None:
    for extra, needle in ((["--metric", "bogus_metric"], "bogus_metric"),
                          (["--load-point", "nope"], "nope"),
                          (["--policy", "no_such_policy"], "no_such_policy")):
        proc = subprocess.run(
            coordinator_cmd("analyze", "e2e", "--results-root", str(e2e_sweep.root), "--json", *extra),
            capture_output=True, text=True, timeout=300, env=e2e_sweep.env,
        )
        assert proc.returncode == 2 and needle in proc.stderr, (extra, proc.returncode, proc.stderr[-500:])
        assert proc.stdout == ""
    proc = subprocess.run(coordinator_cmd("analyze", "no_such_experiment", "--json"), capture_output=True,
                          text=True, timeout=120, env=e2e_sweep.env, cwd=e2e_sweep.root)
    assert proc.returncode == 2 and "no_such_experiment" in proc.stderr


def test_accessor_is_registered() -> None:
    ds, _ = planted(n_configs=10, n_params=2, seed=1)
    assert hasattr(ds, "sweep") and analysis.load is not None
    assert ds.sweep.filter(status="ok").sizes["trial"] <= ds.sizes["trial"]


def _quickstart_like() -> xr.Dataset:
    """SYNTHETIC: as in the quick start, prefix caching is set (off) only where chunked prefill is off
    and left at vLLM's default everywhere else: the two are aliased, and prefix caching has a single
    explicit level."""
    import numpy as np

    ds, _ = planted(params=["max_num_seqs", "enable_chunked_prefill"], design="grid", repeats=2, seed=2)
    chunked = np.asarray(ds["param_enable_chunked_prefill"].values, dtype=bool)
    prefix = np.array([None if c else False for c in chunked.tolist()], dtype=object)
    return ds.assign_coords(param_enable_prefix_caching=("trial", prefix))


def test_aliased_settings_and_default_only_parameters_are_named_never_dropped_silently() -> None:
    from analysis.__main__ import summary_text
    from analysis.frame import aliases

    ds = _quickstart_like()
    found = aliases(ds)
    assert [(a.a, a.a_level, a.b, a.b_level) for a in found] == [
        ("enable_chunked_prefill", "False", "enable_prefix_caching", "False")]
    assert found[0].n_configs == 7 and found[0].of_configs == 14
    doc = analyze(ds, n_boot=5)
    validate_report(doc)
    by_code = {w["code"]: w for w in doc["warnings"] if w["section"] == "design"}
    assert "enable_chunked_prefill=False" in by_code["aliased"]["message"]
    assert "enable_prefix_caching=False" in by_code["aliased"]["message"]
    assert by_code["default_only"]["subject"] == "enable_prefix_caching"
    assert "enable_prefix_caching" not in doc["parameters"]  # left out of the analyses, but said so
    text = summary_text(doc)
    assert "enable_prefix_caching=False" in text
    # an unaliased design says nothing of the kind
    plain, _ = planted(params=["max_num_seqs", "enable_chunked_prefill"], design="grid", repeats=1, seed=2)
    assert aliases(plain) == []


def test_repeated_warnings_are_printed_once() -> None:
    from analysis.__main__ import summary_text
    from analysis.report import dedupe_warnings

    ds, _ = planted(n_configs=12, n_params=2, seed=3)
    doc = analyze(ds, n_boot=5)
    same = {"code": "too_few_trials", "message": "only 12 trials for 2 parameters", "section": "importance"}
    doc["warnings"] = [same] * 7 + [{**same, "section": "partial_dependence", "subject": "max_num_seqs"}]
    assert len(dedupe_warnings(doc["warnings"])) == 2
    text = summary_text(doc)
    assert text.count("only 12 trials for 2 parameters") == 2  # once per section
    assert "(x7)" in text


def test_a_partial_dependence_sentence_says_what_was_modelled_and_what_was_measured() -> None:
    """The modelled change (the surrogate's partial dependence) is labelled as such, and beside it
    stands the measured change of the medians, which matches the trial table."""
    import numpy as np

    from analysis.common import jsonable
    from analysis.effects import partial_dependence
    from analysis.frame import trial_table
    from analysis.report import _with_measured

    ds, _ = planted(params=["max_num_seqs", "enable_chunked_prefill"], design="grid", repeats=2, seed=2,
                    fail_rate_region=0.0, fail_rate_base=0.0)
    df = trial_table(ds)
    pd_mns = _with_measured(jsonable(partial_dependence(ds, "max_num_seqs", n_boot=5)), df)
    m = pd_mns["measured"]
    ok = df[df.status == "ok"]
    want_a = float(np.median(ok[ok.param_max_num_seqs == m["from"]]["output_throughput"]))
    want_b = float(np.median(ok[ok.param_max_num_seqs == m["to"]]["output_throughput"]))
    assert (m["median_from"], m["median_to"]) == (pytest.approx(want_a), pytest.approx(want_b))
    assert m["change"] == pytest.approx(want_b / want_a - 1)
    assert "modelled" in pd_mns["sentence"] and f"{100 * m['change']:+.3g}%" in pd_mns["sentence"]


def test_the_effect_badge_yields_to_poor_fit() -> None:
    """A green "causal effect" badge never stands beside poor_fit: the dashboard shows an amber one."""
    from analysis.common import Caveat, Claim
    from dashboards.app import claim_html

    effect = Claim("effect", "randomised design")
    assert "st-claim-effect" in claim_html(effect) and "causal effect" in claim_html(effect)
    weak = claim_html(effect, [Caveat("poor_fit", "held-out R² -0.92")])
    assert "st-claim-effect" not in weak and "causal effect" not in weak and "fits poorly" in weak
    assert "st-claim-effect" in claim_html(effect, [Caveat("too_few_trials", "12 trials")])
    assert "association" in claim_html(Claim("association", "adaptive design"), [Caveat("poor_fit", "x")])
