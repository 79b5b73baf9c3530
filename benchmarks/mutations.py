"""Break promises on purpose and check that a test notices: a small mutation check (issue 13).

Each :class:`Mutation` replaces one exact piece of source text with a broken version (drop a field
from the trial-id hash, stop refusing unknown keys, judge the client against the nominal rate,
...) and names the tests that guard the promise. For each mutation, one at a time, the script:

1. copies the repository's working tree (tracked and untracked-but-not-ignored files, as they are
   now) into a temporary folder, once for the whole run; the real tree is never written to, so an
   interrupted run cannot leave it mutated;
2. applies the replacement in the copy (the pattern must occur exactly once), runs the named tests
   there (``python -m pytest -m "not vllm" -x -q``, the copy first on ``PYTHONPATH``), and puts
   the file back;
3. reports ``killed`` (a test failed: the promise is guarded), ``SURVIVED`` (every test passed:
   nothing guards it), or an error: ``pattern not found`` (the code changed; update the entry:
   never counted as killed), ``tests did not run`` (collection error, no tests selected), or
   ``timeout``.

A baseline run of every named test on the unmutated copy comes first: when it fails, mutation
results would mean nothing, and the script stops.

Usage, from the repository root::

    python -m benchmarks.mutations                  # every mutation
    python -m benchmarks.mutations --list           # ids and what each breaks
    python -m benchmarks.mutations --only client-vs-nominal-rate --only trial-id-drops-seed
    python -m benchmarks.mutations --json out.json  # also write the results as JSON

Exit status: 0 every mutation killed; 1 one survived; 3 none survived but some could not be
checked (pattern not found, tests did not run, timeout, baseline failed); 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: Default limit on one pytest run (seconds).
TIMEOUT_S = 900


@dataclass(frozen=True)
class Mutation:
    """One broken promise: replace ``pattern`` (exactly once) in ``path`` with ``replacement``;
    ``tests`` (pytest node ids or files) must then fail."""

    id: str
    promise: str
    path: str
    pattern: str
    replacement: str
    tests: tuple[str, ...]


MUTATIONS: tuple[Mutation, ...] = (
    # ---------------------------------------------------------------- trial ids, wire, store, design
    Mutation(
        "trial-id-drops-dataset-sha256", "a trial's id covers the dataset file's sha256",
        "servetune/manifest.py",
        '            data["load_point"]["dataset"].pop("path", None)\n',
        '            data["load_point"]["dataset"].pop("path", None)\n'
        '            data["load_point"]["dataset"].pop("sha256", None)\n',
        ("tests/test_guards.py",),
    ),
    Mutation(
        "trial-id-drops-seed", "a trial's id covers the load point's seed",
        "servetune/manifest.py",
        '            data["load_point"]["dataset"].pop("path", None)\n',
        '            data["load_point"]["dataset"].pop("path", None)\n'
        '            data["load_point"].pop("seed", None)\n',
        ("tests/test_guards.py",),
    ),
    Mutation(
        "encode-without-size-bound", "encode() refuses a message over MAX_MESSAGE_BYTES",
        "servetune/messages.py",
        "    data = msg.model_dump_json().encode(\"utf-8\")\n    if len(data) > MAX_MESSAGE_BYTES:\n",
        "    data = msg.model_dump_json().encode(\"utf-8\")\n    if False:\n",
        ("tests/test_guards.py::test_encode_refuses_a_message_over_the_size_bound", "tests/test_messages.py"),
    ),
    Mutation(
        "drop-in-current-spec", "trials of earlier spec versions stay in results.nc, in_current_spec False",
        "coordinator/dataset.py",
        'coords["in_current_spec"].append(trial_id in order)',
        'coords["in_current_spec"].append(True)',
        ("tests/test_guards.py::test_trials_of_an_earlier_spec_version_stay_in_results_nc",),
    ),
    Mutation(
        "randomized-always-true", "the design is recorded truthfully (randomized only when shuffled)",
        "servetune/manifest.py",
        "        randomized=spec.planner.randomize,\n",
        "        randomized=True,\n",
        ("tests/test_guards.py::test_the_design_is_recorded_truthfully",),
    ),
    Mutation(
        "report-test-unmarked", "a test that starts real vLLM carries the vllm marker",
        "tests/test_report.py",
        "@pytest.mark.vllm  # e2e_sweep starts a real vLLM server\n",
        "",
        ("tests/test_guards.py::test_every_test_that_starts_vllm_is_marked_vllm",),
    ),
    # ---------------------------------------------------------------- specs and sweeps (other owners:
    # these patterns may change as that code changes; a missing pattern is reported, never counted)
    Mutation(
        "rate-sweep-ignores-retry-failed", "--retry-failed re-runs failed rate-sweep follow-ups",
        "coordinator/sweep.py",
        "            if needs_run(latest.get(m.trial_id), retry_failed):",
        "            if needs_run(latest.get(m.trial_id), False):",
        ("tests/test_guards.py::test_retry_failed_reruns_failed_rate_sweep_followups", "tests/test_rate_sweep.py"),
    ),
    Mutation(
        "spec-ignores-unknown-keys", "unknown keys are refused in every spec section, not only engine.grid",
        "servetune/spec.py",
        '    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)\n',
        '    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)\n',
        ("tests/test_spec.py", "tests/test_spec_strict.py"),
    ),
    Mutation(
        "yaml-keeps-last-duplicate-key", "a spec with a key twice in one mapping is refused (YAML keeps the last)",
        "servetune/yamlsafe.py",
        "                    if key in first:\n",
        "                    if False:\n",
        ("tests/test_spec_strict.py::test_bad_yaml_and_values_refused_with_their_path",),
    ),
    Mutation(
        "spec-bool-as-number", "a YAML boolean where a number belongs is refused, not read as 1 or 0",
        "servetune/spec.py",
        '    if isinstance(value, bool):\n        raise ValueError(f"expected a number, got the boolean {value}',
        '    if False:\n        raise ValueError(f"expected a number, got the boolean {value}',
        ("tests/test_spec_strict.py::test_bad_yaml_and_values_refused_with_their_path",),
    ),
    Mutation(
        "spec-allows-inf-nan", "no number in a spec may be infinite or NaN (request_rate: .inf crashed sweep)",
        "servetune/spec.py",
        '    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)\n',
        '    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=True)\n',
        ("tests/test_spec_strict.py::test_bad_yaml_and_values_refused_with_their_path",),
    ),
    Mutation(
        "grid-limit-not-enforced", "a grid design over MAX_GRID_CONFIGS is refused, naming its size and the "
        "sampled designs",
        "servetune/spec.py",
        '    if size > MAX_GRID_CONFIGS and spec.planner.kind == "grid":\n',
        "    if False:\n",
        ("tests/test_planner_designs.py::test_a_grid_over_the_limit_is_refused_naming_its_size_and_the_sampled_designs",),
    ),
    Mutation(
        "file-size-not-checked-first", "a spec or dataset file over its size bound is refused by its size, before "
        "it is read",
        "servetune/yamlsafe.py",
        "        if info.st_size > max_bytes:\n",
        "        if False:\n",
        ("tests/test_spec_strict.py::test_oversized_spec_and_dataset_files_are_refused_by_size",),
    ),
    # ---------------------------------------------------------------- analysis (other owners, as above)
    Mutation(
        "importance-vs-zero", "importance is judged against the random probe, not against 0",
        "analysis/verdict.py",
        "    diff = percentile_interval(np.asarray(param, dtype=float) - np.asarray(probe, dtype=float))\n",
        "    diff = percentile_interval(np.asarray(param, dtype=float))\n",
        ("tests/test_analysis_importance.py",),
    ),
    Mutation(
        "ranking-blames-transport", "a trial lost to the daemon (transport) is never held against its config",
        "servetune/ranking.py",
        "r.n_failed > r.n_lost)",
        "r.n_failed > 0)",
        ("tests/test_ranking.py",),
    ),
    Mutation(
        "ranking-slo-per-trial", "the sweep table gates SLOs on the median over repeats, as analysis.rank does",
        "servetune/ranking.py",
        "        med = _median(values)\n",
        "        med = max((float(v) for v in values if v is not None), default=None)\n",
        ("tests/test_ranking.py",),
    ),
    Mutation(
        "pd-sentence-without-medians", "the PD sentence states the measured medians' change beside the model's",
        "analysis/effects.py",
        "    d, n_a, n_b = measured\n",
        "    return words\n",
        ("tests/test_analysis_effects.py::test_the_pd_sentence_states_the_model_estimate_beside_the_measured_medians",),
    ),
    Mutation(
        "pd-2d-forest-bands", "the 2-D partial dependence takes its bands from the pair regression where estimable",
        "analysis/effects.py",
        "    pair = pair_pd(sur, cols[0], cols[1], axes[0], axes[1]) if len(cols) == 2 else None\n",
        "    pair = None\n",
        ("tests/test_analysis_coverage.py::test_two_parameter_pd_bands_cover_the_planted_surface",),
    ),
    Mutation(
        "collapsed-bootstrap", "bootstrap refits resample (every fit the same resample collapses intervals)",
        "analysis/surrogate.py",
        "        rng = np.random.default_rng([self.seed, 1, i])\n",
        "        rng = np.random.default_rng([self.seed, 1, 0])\n",
        ("tests/test_analysis_importance.py",),
    ),
    Mutation(
        "interval-not-around-estimate", "a stated interval is built around, and holds, its own estimate",
        "analysis/common.py",
        "    half = float(np.quantile(np.abs(arr - estimate), level))\n"
        "    return Interval(float(estimate), max(lower, estimate - half), min(upper, estimate + half), level)\n",
        "    lo, hi = np.quantile(arr, [(1 - level) / 2, 1 - (1 - level) / 2])\n"
        "    return Interval(float(estimate), max(lower, float(lo)), min(upper, float(hi)), level)\n",
        ("tests/test_analysis_coverage.py", "tests/test_analysis_effects.py"),
    ),
    Mutation(
        "poor-fit-from-oob", "poor_fit reads R² held out by config, not the out-of-bag R² repeats inflate",
        "analysis/surrogate.py",
        "    r2 = grouped_r2(sur)\n    if not math.isfinite(r2) or r2 < POOR_FIT_R2:\n",
        "    r2 = sur.oob_r2\n    if not math.isfinite(r2) or r2 < POOR_FIT_R2:\n",
        ("tests/test_analysis_poor_fit.py", "tests/test_analysis_importance.py"),
    ),
    Mutation(
        "clustered-pooled-rate", "clustered fires only when every plausible reading of the regions contradicts "
        "independence (not against one pooled rate)",
        "analysis/failure.py",
        '    for name, cell in [("pooled", np.zeros(n_all, dtype=np.int64)), *partitions]:\n',
        '    for name, cell in [("pooled", np.zeros(n_all, dtype=np.int64))]:\n',
        ("tests/test_analysis_failure.py",),
    ),
    Mutation(
        "model-misfit-never-fires", "model_misfit flags a region the failure model misses",
        "analysis/failure.py",
        "    missed = [r for r, (e, v) in tested if v > 0 and (abs(r.failures - e) - 0.5) / math.sqrt(v) > crit]\n",
        "    missed: list[Any] = []\n",
        ("tests/test_analysis_failure.py",),
    ),
    Mutation(
        "analysis-rank-blames-transport", "analysis.rank never holds a trial lost to the daemon against its config",
        "analysis/ranking.py",
        "    lost = np.zeros(len(has), dtype=np.int64) if n_lost is None else n_lost\n",
        "    lost = np.zeros(len(has), dtype=np.int64)\n",
        ("tests/test_ranking.py", "tests/test_analysis_ranking.py"),
    ),
    Mutation(
        "analysis-rank-part-failing-not-last", "a config that fails some trials by its own fault ranks after every "
        "reliable config of its tier",
        "analysis/ranking.py",
        "    failing = (g.n_failed - lost) > 0\n",
        "    failing = np.zeros(len(has), dtype=bool)\n",
        ("tests/test_analysis_ranking.py",),
    ),
    Mutation(
        "interaction-no-interval-silent", "a pair the regression cannot fit (too few configs) says why it has no "
        "interval",
        "analysis/interactions.py",
        '            pair_notes.warn("no_interval",',
        '            Notes().warn("no_interval",',
        ("tests/test_analysis_coverage.py::test_small_experiments_warn_instead_of_claiming",),
    ),
    Mutation(
        "interaction-forest-interval-stated", "the forest's refit spread is never stated as an interaction's 95% "
        "interval (it covered a planted interaction in 0 of 20 experiments at 10 configs)",
        "analysis/interactions.py",
        "            strength = Interval(float(s_est[i]), math.nan, math.nan)\n",
        "            strength = Interval(float(s_est[i]), 0.0, 2.0 * float(s_est[i]))\n",
        ("tests/test_analysis_coverage.py::test_small_experiments_warn_instead_of_claiming",),
    ),
    Mutation(
        "pd-change-forest-interval-stated", "a PD change without the regression states no interval (the forest's "
        "refit spread, when it was stated, covered 82.9% of 140 planted changes at 10 configs)",
        "analysis/effects.py",
        "    return Interval(point, math.nan, math.nan)\n",
        "    return Interval(point, point - abs(point), point + abs(point))\n",
        ("tests/test_analysis_coverage.py::test_small_experiments_warn_instead_of_claiming",),
    ),
    Mutation(
        "pd-2d-forest-bands-without-pair", "a 2-D PD the pair regression cannot give states no bands",
        "analysis/effects.py",
        "        if n_boot > 0 and not regression and len(cols) == 1 else np.empty((0, len(grid)))",
        "        if n_boot > 0 and not regression else np.empty((0, len(grid)))",
        ("tests/test_analysis_coverage.py::test_small_experiments_warn_instead_of_claiming",),
    ),
    Mutation(
        "verdict-ignores-regression", "one verdict: a main effect whose interval excludes no change is never "
        "called noise (the PD sentence would contradict the verdict)",
        "analysis/verdict.py",
        "        regression = eff is not None and eff.change.excludes(0.0)\n",
        "        regression = False\n",
        ("tests/test_analysis_coverage.py::test_one_verdict_for_pd_importance_and_text",),
    ),
    Mutation(
        "warnings-not-deduplicated", "identical warnings are reported once (the summary printed 7 identical lines)",
        "analysis/report.py",
        "        if key not in seen:\n",
        "        if True:\n",
        ("tests/test_analysis_report.py::test_repeated_warnings_are_printed_once",),
    ),
    Mutation(
        "aliased-settings-unreported", "aliased settings are named in the design warnings, never dropped silently",
        "analysis/report.py",
        "           for a in aliases(ds)]\n",
        "           for a in aliases(ds)[:0]]\n",
        ("tests/test_analysis_report.py::test_aliased_settings_and_default_only_parameters_are_named_never_dropped_silently",),
    ),
    Mutation(
        "effect-badge-beside-poor-fit", "a green causal-effect badge never stands beside poor_fit",
        "dashboards/app/__init__.py",
        '_BADGE_YIELDS_TO = frozenset({"poor_fit"})\n',
        "_BADGE_YIELDS_TO: frozenset[str] = frozenset()\n",
        ("tests/test_analysis_report.py::test_the_effect_badge_yields_to_poor_fit",),
    ),
    Mutation(
        "knee-unnormalised", "the knee score is in units of the ideal corner's distance from the chord (1 = ideal)",
        "analysis/ranking.py",
        "    chord = np.array((u - ua) * nx + (v - va) * ny, dtype=float) / h\n",
        "    chord = np.array((u - ua) * nx + (v - va) * ny, dtype=float)\n",
        ("tests/test_ranking_knee.py",),
    ),
    Mutation(
        "knee-one-point-front-scores-0", "a one-point front's knee scores 1 (the ideal corner), not 0",
        "analysis/ranking.py",
        "    return np.asarray(np.where(point, (u + v) / 2.0, chord), dtype=float)\n",
        "    return np.asarray(np.where(point, (u + v) / 2.0 - 1.0, chord), dtype=float)\n",
        ("tests/test_ranking_knee.py",),
    ),
    Mutation(
        "knee-ties-by-config-id", "on a front without a knee the extreme nearer the ideal corner wins, not the "
        "lower config id",
        "analysis/ranking.py",
        "tiebreak=nearer_ideal, notes=notes)",
        "tiebreak=None, notes=notes)",
        ("tests/test_ranking_knee.py",),
    ),
    # ---------------------------------------------------------------- the client self-check
    Mutation(
        "client-vs-nominal-rate", "the client is judged against the rate its schedule asked for, not the nominal",
        "servetune/metrics.py",
        "achieved < 0.95 * scheduled and",
        "achieved < 0.95 * offered_rate and",
        ("tests/test_workload.py::test_a_perfect_client_is_not_flagged_behind_an_unnormalised_schedule",
         "tests/test_metrics.py"),
    ),
    Mutation(
        "client-scheduled-rate-from-sends", "scheduled_rate is the schedule's, not the sends' rate",
        "servetune/metrics.py",
        "_rate(sorted(s.scheduled_ns for s in sent))",
        "_rate(sends)",
        ("tests/test_metrics.py",),
    ),
    Mutation(
        "client-ignores-loop-lag", "a stalled event loop flags the client",
        "servetune/metrics.py",
        "        or (loop_lag is not None and loop_lag.p99_ms > lag_tolerance_ms)\n",
        "",
        ("tests/test_metrics.py", "tests/test_loadgen.py::test_a_blocked_event_loop_is_measured_and_flagged"),
    ),
    Mutation(
        "client-loop-probe-off", "the load generator measures its event-loop lag",
        "daemon/loadgen.py",
        "        self.probe = None if warmup else LoopProbe()",
        "        self.probe = None",
        ("tests/test_loadgen.py::test_a_blocked_event_loop_is_measured_and_flagged",),
    ),
    Mutation(
        "stream-counts-empty-final-chunk", "an empty chunk that finishes the stream is not a token",
        "daemon/stream.py",
        '    return bool(text) or choice.get("finish_reason") is None\n',
        "    return True\n",
        ("tests/test_loadgen.py::test_empty_finishing_chunk_is_not_a_token",
         "tests/test_loadgen.py::test_openai_style_final_empty_chunk_leaves_itl_unbiased"),
    ),
    Mutation(
        "stream-fast-path-counts-finishing-chunk", "the unparsed fast path never counts a finishing chunk",
        "daemon/stream.py",
        """_PARSE_MARKS = (b'"usage":{', b'"error"', b'"role"', b'"finish_reason":"')""",
        """_PARSE_MARKS = (b'"usage":{', b'"error"', b'"role"')""",
        ("tests/test_loadgen.py::test_empty_finishing_chunk_is_not_a_token",
         "tests/test_loadgen.py::test_openai_style_final_empty_chunk_leaves_itl_unbiased"),
    ),
    # ---------------------------------------------------------------- version-aware engine args
    Mutation(
        "engine-args-never-missing", "a config needing a flag the daemon's vLLM lacks is refused",
        "servetune/vllm_args.py",
        "    return [flag for flag in needed if flag not in accepted]\n",
        "    return []\n",
        ("tests/test_engine_args.py::test_a_config_no_connected_daemon_accepts_is_closed_as_a_config_failure_without_a_grant",
         "tests/test_engine_args.py::test_a_sweep_refuses_what_its_daemons_vllm_does_not_accept"),
    ),
    Mutation(
        "hello-sends-null-engine-args", "HELLO leaves unknown engine args out of its JSON (older peers decode it)",
        "servetune/messages.py",
        '            data.pop("engine_args", None)\n',
        "            pass\n",
        ("tests/test_engine_args.py::test_hello_leaves_unknown_engine_args_out_of_its_json",),
    ),
    Mutation(
        "engine-args-cache-never-read", "vLLM is asked once per version and interpreter, then the cache answers",
        "daemon/vllm_args.py",
        "        cached = self._load(version)\n",
        "        cached = None\n",
        ("tests/test_engine_args.py::test_the_cache_is_keyed_by_vllm_version_and_interpreter",),
    ),
    Mutation(
        "engine-args-refused-despite-a-willing-daemon", "a config waits for a connected daemon whose vLLM accepts it",
        "coordinator/control.py",
        "            if not any(self._may_run(e, work) for e in self.daemons.values() if e is not d):\n",
        "            if True:\n",
        ("tests/test_engine_args.py::test_a_config_waits_for_a_connected_daemon_whose_vllm_accepts_it",
         "tests/test_engine_args.py::test_a_daemon_that_did_not_say_is_not_checked_and_the_sweep_says_so"),
    ),
    Mutation(
        "engine-args-probe-kills-only-its-child", "a probe past its deadline takes its process group with it",
        "daemon/vllm_args.py",
        "                os.killpg(proc.pid, signal.SIGKILL)\n",
        "                proc.kill()\n",
        ("tests/test_engine_args.py::test_failing_or_hanging_vllm_gives_no_answer_and_says_why",),
    ),
    Mutation(
        "engine-args-probe-without-deadline", "asking vLLM for its flags has a deadline",
        "daemon/vllm_args.py",
        "            stdout, stderr = proc.communicate(timeout=self.timeout_s)\n",
        "            stdout, stderr = proc.communicate()\n",
        ("tests/test_engine_args.py::test_failing_or_hanging_vllm_gives_no_answer_and_says_why",),
    ),
    # ---------------------------------------------------------------- SLA search (servetune.sla)
    Mutation(
        "sla-verdict-by-point", "an SLA probe meets only when even its percentile's high rank bound is within the bound",
        "servetune/sla.py",
        '        if high is None or high > s["max_ms"]:\n',
        '        if s["value_ms"] > s["max_ms"]:\n',
        ("tests/test_sla_search.py::test_a_probe_meets_misses_or_is_unsure_by_the_interval_not_the_point",),
    ),
    Mutation(
        "sla-never-resolves", "a search stops once its bracket is within rel_tol",
        "servetune/sla.py",
        "    if lo is not None and hi is not None and hi <= lo * (1 + rel_tol):\n",
        "    if False:\n",
        ("tests/test_sla_search.py::test_bracketing_and_bisection_resolve_the_boundary_within_tolerance",),
    ),
    Mutation(
        "sla-runs-normal-not-t", "the interval over runs uses Student's t for its few runs",
        "servetune/sla.py",
        "    half = t975(r - 1) * math.sqrt(var / r)\n",
        "    half = 1.96 * math.sqrt(var / r)\n",
        ("tests/test_sla_search.py::test_the_interval_over_runs_covers_the_typical_runs_boundary_at_its_rate",),
    ),
    Mutation(
        "sla-no-next-round-on-result", "a finished round queues the next one",
        "coordinator/sweep.py",
        '        if DERIVED_MARK in manifest.load_point.name and (status == "ok" or kind != "transport"):\n',
        "        if False:\n",
        ("tests/test_sla_search.py::test_a_sweep_runs_round_after_round_then_resumes_to_the_same_answer",),
    ),
    Mutation(
        "sla-resume-skips-open-rounds", "a resumed sweep runs the rounds an earlier one recorded and did not finish",
        "coordinator/sweep.py",
        "        followups += expand_sla_searches(store, self.spec, self.plan, self.spec_hash, self.opts.retry_failed)\n",
        "        pass\n",
        ("tests/test_sla_search.py::test_a_sweep_runs_round_after_round_then_resumes_to_the_same_answer",),
    ),
    Mutation(
        "sla-too-few-requests-accepted", "a num_requests too small to show a percentile within its bound is refused",
        "servetune/spec.py",
        "                if lp.num_requests < need:\n",
        "                if False:\n",
        ("tests/test_sla_search.py::test_the_spec_rules_name_the_key",),
    ),
    Mutation(
        "sla-round-in-flight-requeued", "a round in flight is not queued again by each of its results (a probe runs once)",
        "coordinator/sla_search.py",
        "        if only is not None and any(m.trial_id in only for m in st.pending):\n            continue\n",
        "",
        ("tests/test_sla_search.py::test_a_sweep_runs_round_after_round_then_resumes_to_the_same_answer",),
    ),
    # ---------------------------------------------------------------- SLA decision (analysis.sla_decision)
    Mutation(
        "sla-decision-overlap-distinguishable", "an SLA winner is distinguishable only when its interval over runs "
        "lies wholly above the runner-up's",
        "analysis/sla_decision.py",
        "(lo_w > hi_r).all())",
        "(t.rate[win, used] > t.rate[run, used]).all())",
        ("tests/test_sla_decision.py",),
    ),
    Mutation(
        "sla-decision-rateless-candidate", "a config whose SLA search met no rate in every run is never recommended",
        "analysis/decision.py",
        "    feasible = np.isfinite(t.rate).all(axis=1)\n",
        "    feasible = np.isfinite(t.rate).any(axis=1) | True\n",
        ("tests/test_sla_decision.py",),
    ),
    Mutation(
        "sla-decision-record-ignored", "recommend decides an SLA search experiment on the record next to its dataset",
        "analysis/decision.py",
        "        sla = sla_of(ds, table)\n",
        "        sla = None\n",
        ("tests/test_sla_search.py::test_a_sweep_runs_round_after_round_then_resumes_to_the_same_answer",),
    ),
    Mutation(
        "sla-decision-stale-record", "an SLA search record from another spec is refused",
        "analysis/sla_decision.py",
        '    if str(doc.get("spec_hash", "")) != spec_hash:\n',
        '    if False:\n',
        ("tests/test_sla_decision.py",),
    ),
    Mutation(
        "sla-decision-malformed-probe-dropped", "a search whose probe trial ids are not strings is refused by name, "
        "not dropped as a search of another hardware class",
        "analysis/sla_decision.py",
        'not isinstance(p, dict) or not isinstance(p.get("trial_id"), str) or p["trial_id"] in classes',
        'isinstance(p, dict) and isinstance(p.get("trial_id"), str) and p["trial_id"] in classes',
        ("tests/test_sla_decision.py::test_a_malformed_probe_trial_id_on_disk_is_refused_by_name",),
    ),
    # ---------------------------------------------------------------- control core
    Mutation(
        "control-add-leased-twice", "a trial under a live lease is not queued again by ControlCore.add",
        "coordinator/control.py",
        " and self.leases.for_trial(t.trial_id) is None)",
        ")",
        ("tests/test_control.py::test_a_trial_already_queued_or_leased_is_not_queued_again",),
    ),
    # ---------------------------------------------------------------- preflight
    Mutation(
        "preflight-broken-vllm-blamed-on-the-config",
        "a vLLM that does not import, found after a failed server start, is a daemon error",
        "daemon/batch.py",
        "                if broken is not None:  # vLLM itself",
        "                if broken is None and False:  # vLLM itself",
        ("tests/test_preflight.py::test_a_vllm_that_does_not_import_is_a_daemon_error_after_the_failed_start_never_a_measurement",),
    ),
    Mutation(
        "preflight-import-before-every-batch", "a batch defers vLLM's import to its server start",
        "daemon/preflight.py",
        "        if defer_import:\n",
        "        if False:\n",
        ("tests/test_preflight.py::test_a_batch_defers_the_import_to_its_server_start_which_proves_it",),
    ),
    # ---------------------------------------------------------------- successive halving
    Mutation(
        'halving-screening-ranked', "the coordinator's ranking leaves a halving rung's screening trials out",
        'coordinator/summary.py',
        'if tid in planned and m.fidelity >= 1.0]',
        'if tid in planned]',
        ('tests/test_sweep_halving.py::test_a_halving_sweep_runs_each_rung_shortened_and_ranks_only_full_trials',),
    ),
    Mutation(
        'halving-screening-loaded', 'analysis.load leaves screening trials out unless asked',
        'analysis/load.py',
        'if fidelity == "full" and "fidelity" in loaded.coords:',
        'if False:',
        ('tests/test_sweep_halving.py::test_a_halving_sweep_runs_each_rung_shortened_and_ranks_only_full_trials',),
    ),
    Mutation(
        'halving-promotes-the-worst', 'a rung promotes its best configs',
        'coordinator/planning/halving.py',
        '            return (0, -values[0], order)',
        '            return (0, values[0], order)',
        ('tests/test_sweep_halving.py::test_the_best_third_meeting_the_slos_is_promoted_never_a_failed_config',),
    ),
    Mutation(
        'halving-rung-not-shortened', 'a rung below full fidelity runs shortened load points',
        'servetune/manifest.py',
        '                load_point=at_fidelity(lp, rung),',
        '                load_point=lp,',
        ('tests/test_sweep_halving.py::test_a_halving_sweep_runs_each_rung_shortened_and_ranks_only_full_trials',),
    ),
    Mutation(
        'halving-promotes-a-failed-config', 'a config that failed by its own fault is never promoted',
        'coordinator/planning/halving.py',
        '        usable = [i for i, tier in self._tiers(k) if tier < 2]',
        '        usable = [i for i, _ in self._tiers(k)]',
        ('tests/test_sweep_halving.py::test_a_rung_with_every_config_failed_ends_the_search',),
    ),
    Mutation(
        'halving-loop-pools-fidelities', "the loop tells a config once per fidelity, with that fidelity's trials only",
        'coordinator/adaptive_loop.py',
        '                     if not m.is_baseline and m.fidelity == fidelity]',
        '                     if not m.is_baseline]',
        ('tests/test_sweep_halving.py::test_a_halving_sweep_runs_each_rung_shortened_and_ranks_only_full_trials',),
    ),
    Mutation(
        'searchbench-screening-is-a-hit', 'the planner benchmark never takes a screening trial for a result',
        'benchmarks/search/run.py',
        '            if f < 1.0:\n                continue',
        '            if False:\n                continue',
        ('tests/test_search_bench.py::test_successive_halving_hits_only_on_a_full_trial_and_pays_its_screening',),
    ),
)


@dataclass
class Outcome:
    id: str
    status: str  # killed / SURVIVED / error
    detail: str
    seconds: float
    killed_by: tuple[str, ...] = ()  # the failing tests pytest named (it stops at the first: -x)


def copy_tree(dest: Path) -> None:
    """The working tree as it is now (tracked + untracked-but-not-ignored files) into ``dest``."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                         check=True, capture_output=True, timeout=60).stdout
    for name in filter(None, out.decode().split("\0")):
        src = REPO / name
        if not src.is_file():  # deleted in the working tree, or a submodule
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)


def failed_tests(output: str) -> tuple[str, ...]:
    """The node ids of pytest's ``FAILED`` / ``ERROR`` summary lines in ``output``."""
    out = []
    for line in output.splitlines():
        for mark in ("FAILED ", "ERROR "):
            if line.startswith(mark):
                out.append(line[len(mark):].split()[0] if line[len(mark):].split() else "")
    return tuple(dict.fromkeys(t for t in out if t))


def run_tests(root: Path, tests: Sequence[str], timeout_s: float) -> tuple[int | None, str]:
    """pytest's exit code (None on timeout) and its output's ``FAILED`` lines plus its last lines."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    cmd = [sys.executable, "-m", "pytest", "-m", "not vllm", "-x", "-q", "-p", "no:cacheprovider", *tests]
    try:
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None, f"over {timeout_s:.0f} s"
    text = proc.stdout + proc.stderr
    lines = [ln for ln in text.splitlines() if ln.strip()]
    failed = "".join(f"FAILED {t}\n" for t in failed_tests(text))
    return proc.returncode, failed + " | ".join(lines[-3:])[-400:]


def check(root: Path, m: Mutation, timeout_s: float) -> Outcome:
    t0 = time.monotonic()
    path = root / m.path
    try:
        original = path.read_text(encoding="utf-8")
    except OSError as exc:
        return Outcome(m.id, "error", f"pattern not found: cannot read {m.path}: {exc}", 0.0)
    count = original.count(m.pattern)
    if count != 1:
        what = "pattern not found" if count == 0 else f"pattern found {count} times (needs exactly 1)"
        return Outcome(m.id, "error", f"{what} in {m.path}: update this entry", 0.0)
    path.write_text(original.replace(m.pattern, m.replacement), encoding="utf-8")
    try:
        code, tail = run_tests(root, m.tests, timeout_s)
    finally:
        path.write_text(original, encoding="utf-8")
    took = time.monotonic() - t0
    if code is None:
        return Outcome(m.id, "error", f"timeout: {tail}", took)
    if code == 0:
        return Outcome(m.id, "SURVIVED", f"every test passed: {tail}", took)
    if code == 1:
        return Outcome(m.id, "killed", tail.splitlines()[-1], took, failed_tests(tail))
    return Outcome(m.id, "error", f"tests did not run (pytest exit {code}): {tail}", took)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.mutations", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], metavar="ID", help="run just this mutation (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="limit on one pytest run, seconds")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run of the tests")
    args = parser.parse_args(argv)
    known = {m.id: m for m in MUTATIONS}
    unknown = [i for i in args.only if i not in known]
    if unknown:
        parser.error(f"unknown mutation id(s) {', '.join(unknown)}; known: {', '.join(known)}")
    if args.list:
        for m in MUTATIONS:
            print(f"{m.id:42} {m.path:28} {m.promise}")
        return 0
    chosen = [known[i] for i in args.only] if args.only else list(MUTATIONS)
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="servetune-mutations-") as tmp:
        root = Path(tmp) / "repo"
        copy_tree(root)
        if not args.no_baseline:
            named = {t for m in chosen for t in m.tests if (root / t.split("::")[0]).exists()}
            tests = sorted(t for t in named if "::" not in t or t.split("::")[0] not in named)  # no test twice
            code, tail = run_tests(root, tests, args.timeout * 2)
            print(f"baseline (unmutated): pytest exit {code}: {tail}", flush=True)
            if code != 0:
                print("the named tests fail without any mutation: fix that first", file=sys.stderr)
                return 3
        for m in chosen:
            outcome = check(root, m, args.timeout)
            outcomes.append(outcome)
            by = f"  by {', '.join(outcome.killed_by)}" if outcome.killed_by else ""
            print(f"{outcome.status:9} {m.id:42} {outcome.seconds:6.1f} s{by}  {outcome.detail}", flush=True)
    survived = [o.id for o in outcomes if o.status == "SURVIVED"]
    errors = [o.id for o in outcomes if o.status == "error"]
    print(f"\n{len(outcomes) - len(survived) - len(errors)} killed, {len(survived)} survived"
          f"{' (' + ', '.join(survived) + ')' if survived else ''}, {len(errors)} not checked"
          f"{' (' + ', '.join(errors) + ')' if errors else ''}")
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=2) + "\n", encoding="utf-8")
    return 1 if survived else 3 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
