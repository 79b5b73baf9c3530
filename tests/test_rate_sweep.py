"""Rate sweeps: @sync and @max first, then evenly spaced rates as new trials made at run time."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pytest

import analysis
from coordinator.planning import needs_run
from coordinator.store import Store
from coordinator.sweep import expand_rate_sweeps, select_work
from daemon.server import VLLMServer
from servetune.errors import SpecError
from servetune.manifest import TrialManifest, plan_grid, rate_sweep_rates
from servetune.spec import parse_spec
from tests.conftest import cli_env
from tests.test_openai_backend import _sweep

SPEC = textwrap.dedent(
    """
    name: rs
    engine: {{fixed: {{max_model_len: 256}}, grid: {{max_num_seqs: [2, 4]}}}}
    load_points:
      - {{name: sweep, rate_sweep: {{num_rates: {n}}}, num_requests: 8, input_len: 16, output_len: 8}}
    """
)


def test_rates_are_evenly_spaced_strictly_between() -> None:
    assert rate_sweep_rates(2.0, 10.0, 3) == [4.0, 6.0, 8.0]
    assert rate_sweep_rates(1.0, 2.0, 1) == [1.5]
    assert rate_sweep_rates(5.0, 5.0, 3) == [] and rate_sweep_rates(5.0, 4.0, 2) == []


def test_spec_rules() -> None:
    plan = plan_grid(parse_spec(SPEC.format(n=3)))
    names = sorted({m.load_point.name for m in plan.trials()})
    assert names == ["sweep@max", "sweep@sync"]
    by_name = {m.load_point.name: m.load_point for m in plan.trials()}
    assert by_name["sweep@sync"].max_concurrency == 1 and by_name["sweep@sync"].request_rate is None
    assert by_name["sweep@max"].max_concurrency == 256
    assert plan.followups_per_batch(plan.batches[0]) == 3
    with pytest.raises(SpecError, match="sets request_rate and max_concurrency itself"):
        parse_spec(SPEC.format(n=2).replace("rate_sweep:", "request_rate: 3, rate_sweep:"))
    with pytest.raises(SpecError, match="reserved for rate-sweep"):
        parse_spec(SPEC.format(n=2).replace("name: sweep,", "name: a@b,"))


def test_followups_made_once_from_seed_results(tmp_path: Path) -> None:
    spec = parse_spec(SPEC.format(n=3))
    plan = plan_grid(spec)
    store = Store.open(tmp_path / "rs")
    h = spec.spec_hash()
    store.record_plan(h, spec.model_dump(mode="json"), None, plan)
    batch = plan.batches[0]
    assert expand_rate_sweeps(store, spec, plan, h) == []  # no seed results yet
    for m, rps in zip(batch.trials, (None, None)):
        del rps
        a = store.begin_attempt(m.trial_id, daemon_id="d", batch_id="b", spec_hash=h)
        tput = 2.0 if m.load_point.name.endswith("sync") else 10.0
        store.finish_attempt(m.trial_id, a, status="ok", failure_kind=None, error=None, submission_id="s",
                             record={"m": m.trial_id}, metrics={"request_throughput": tput}, hardware_class=None)
    work = expand_rate_sweeps(store, spec, plan, h)
    assert len(work) == 1 and work[0].batch.config_id == batch.config_id
    rates = [m.load_point.request_rate for m in work[0].trials]
    assert rates == [4.0, 6.0, 8.0]
    assert [m.load_point.name for m in work[0].trials] == ["sweep@4rps", "sweep@6rps", "sweep@8rps"]
    assert all(m.repeat == batch.trials[0].repeat for m in work[0].trials)
    again = expand_rate_sweeps(store, spec, plan, h)
    assert [m.trial_id for m in again[0].trials] == [m.trial_id for m in work[0].trials]  # same manifests
    planned = store.planned_trial_ids(h)
    assert len(planned) == len(set(planned)) == 4 + 3
    # the other config's seeds have no results: select_work still runs them
    todo, _ = select_work(plan, store, retry_failed=False)
    assert [w.batch.index for w in todo] == [plan.batches[1].index]


@pytest.mark.vllm
def test_rate_sweep_end_to_end(vllm_server: VLLMServer, tmp_path: Path, tiny_cache: Path) -> None:
    """Against the session's vLLM server through the openai backend (no server start)."""
    text = textwrap.dedent(
        f"""
        name: rs-e2e
        model: {{source: tiny, served_name: tiny}}
        backend: {{kind: openai, base_url: "{vllm_server.base_url}"}}
        load_points:
          - {{name: sweep, rate_sweep: {{num_rates: 2, max_concurrency: 16}}, num_requests: 16, input_len: 16,
             output_len: 8}}
        """
    )
    proc = _sweep(tmp_path, text, cli_env(tiny_cache))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "queued 2 follow-up rate(s)" in proc.stderr
    ds = analysis.load("rs-e2e", results_root=tmp_path / "runs")
    names = [str(n) for n in ds.load_point.values]
    assert names[:2] == ["sweep@sync", "sweep@max"] or sorted(names[:2]) == ["sweep@max", "sweep@sync"]
    assert len(names) == 4 and all(str(s) == "ok" for s in ds.status.values)
    tput = {n: float(ds.request_throughput.values[i]) for i, n in enumerate(names)}
    rates = sorted(float(ds.request_rate.values[i]) for i, n in enumerate(names) if n.endswith("rps"))
    assert len(rates) == 2 and tput["sweep@sync"] < rates[0] < rates[1] < tput["sweep@max"]
    assert all(math.isnan(float(ds.request_rate.values[i])) for i, n in enumerate(names) if not n.endswith("rps"))


def _finish(store: Store, m: TrialManifest, h: str, status: str, kind: str | None, tput: float = 1.0) -> None:
    a = store.begin_attempt(m.trial_id, daemon_id="d", batch_id="b", spec_hash=h)
    store.finish_attempt(m.trial_id, a, status=status, failure_kind=kind, error=None if kind is None else "e",
                         submission_id=f"s-{m.trial_id[:8]}-{a}", record={"m": m.trial_id},
                         metrics={"request_throughput": tput} if status == "ok" else None, hardware_class=None)


#: Latest attempt of a trial -> run again without / with --retry-failed (None: never run, a hole).
RESUME_RULE = [
    (None, (True, True)),
    (("ok", None), (False, False)),
    (("failed", "transport"), (True, True)),
    (("failed", "measurement"), (False, True)),
]


@pytest.mark.parametrize("retry_failed", [False, True])
def test_retry_failed_is_one_rule_for_planned_trials_and_rate_sweep_followups(tmp_path: Path, retry_failed: bool) -> None:
    """The four outcomes a trial can have, once as planned trials (select_work) and once as
    follow-up rates (expand_rate_sweeps): both run exactly the trials the rule says."""
    spec = parse_spec(SPEC.format(n=4))
    plan = plan_grid(spec)
    store = Store.open(tmp_path / "rs")
    h = spec.spec_hash()
    store.record_plan(h, spec.model_dump(mode="json"), None, plan)
    first, second = plan.batches
    for m in first.trials:  # ok seeds, so follow-ups exist
        _finish(store, m, h, "ok", None, 2.0 if m.load_point.name.endswith("sync") else 10.0)
    followups = expand_rate_sweeps(store, spec, plan, h)[0].trials
    assert len(followups) == 4
    # The second batch's two seeds and the four follow-ups get the outcomes of RESUME_RULE.
    planned = {second.trials[0].trial_id: RESUME_RULE[2], second.trials[1].trial_id: RESUME_RULE[3]}
    for m, (latest, _) in zip(second.trials, (RESUME_RULE[2], RESUME_RULE[3])):
        _finish(store, m, h, *latest)  # type: ignore[misc]
    for m, (latest, _) in zip(followups, RESUME_RULE):
        if latest is not None:
            _finish(store, m, h, *latest)
    expected = {m.trial_id for m, (_, runs) in zip(followups, RESUME_RULE) if runs[retry_failed]}
    work = expand_rate_sweeps(store, spec, plan, h, retry_failed=retry_failed)
    assert {m.trial_id for w in work for m in w.trials} == expected
    todo, _ = select_work(plan, store, retry_failed=retry_failed)
    assert {m.trial_id for w in todo for m in w.trials} == {t for t, (_, runs) in planned.items() if runs[retry_failed]}
    latest = store.latest_finished()
    for m, (_, runs) in zip(followups, RESUME_RULE):
        assert needs_run(latest.get(m.trial_id), retry_failed) is runs[retry_failed]


TWO_SWEEPS = textwrap.dedent(
    """
    name: rs2
    engine: {fixed: {max_model_len: 256}, grid: {max_num_seqs: [1, 4]}}
    load_points:
      - {name: a, rate_sweep: {num_rates: 3}, num_requests: 8, input_len: 16, output_len: 8}
      - {name: b, rate_sweep: {num_rates: 2}, num_requests: 8, input_len: 16, output_len: 8}
    repeats: 2
    planner: {kind: grid, randomize: false}
    """
)


def test_dry_run_counts_the_follow_up_starts_the_sweep_makes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One more server start per (batch, rate sweep) with follow-ups, none for a config whose @max runs
    one request at a time (max_num_seqs 1): what expand_rate_sweeps queues once every seed is ok."""
    from coordinator.summary import print_plan

    spec = parse_spec(TWO_SWEEPS)
    plan = plan_grid(spec)
    store = Store.open(tmp_path / "rs2")
    h = spec.spec_hash()
    store.record_plan(h, spec.model_dump(mode="json"), None, plan)
    for m in plan.trials():  # every seed ok, @max well above @sync: the sweep adds all it can
        a = store.begin_attempt(m.trial_id, daemon_id="d", batch_id="b", spec_hash=h)
        tput = 2.0 if m.load_point.name.endswith("sync") else 10.0
        store.finish_attempt(m.trial_id, a, status="ok", failure_kind=None, error=None, submission_id="s",
                             record={"m": m.trial_id}, metrics={"request_throughput": tput}, hardware_class=None)
    work = expand_rate_sweeps(store, spec, plan, h)
    assert len(work) == 2 * 2, "two sweeps x two repeats of the max_num_seqs=4 config, one start each"
    assert all(w.batch.config.args.max_num_seqs == 4 for w in work)
    n_trials = sum(len(w.trials) for w in work)
    assert n_trials == (3 + 2) * 2
    assert sum(plan.followup_starts(b) for b in plan.batches) == len(work)
    assert sum(plan.followups_per_batch(b) for b in plan.batches) == n_trials
    from rich.console import Console

    print_plan(plan, spec, Console(width=400))
    out = capsys.readouterr().out
    assert f"+ {n_trials} rate-sweep follow-up trial(s) in {len(work)} more server start(s)" in out, out
    assert "4 rate sweep(s) add no follow-ups" in out
