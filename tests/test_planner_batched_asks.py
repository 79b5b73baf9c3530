"""Batched asks of the Optuna planner are reproducible under a seed: many daemons finish a batch in any
order, and the next batch depends only on the results and ``planner.seed`` (constant liar inside a
batch keeps its configs apart). Pure planner calls, no sockets: a planted objective is told directly."""

from __future__ import annotations

import random
import textwrap

import pytest

from coordinator.planning import create_planner
from servetune.manifest import EngineConfig
from servetune.ranking import TrialSummary
from servetune.spec import ExperimentSpec, parse_spec

BATCH, N_TRIALS = 4, 24


def _spec(seed: int, sampler: str) -> ExperimentSpec:
    return parse_spec(textwrap.dedent(f"""
        name: asks
        backend: {{kind: sim}}
        engine:
          grid:
            max_num_seqs: [4, 8, 16, 32, 64, 128]
            max_num_batched_tokens: [512, 1024, 2048, 4096, 8192]
            enable_prefix_caching: [true, false]
        load_points:
          - {{name: c8, max_concurrency: 8, num_requests: 16, input_len: 64, output_len: 16}}
        slos:
          - {{metric: ttft_ms, percentile: 99, max_ms: 500}}
        planner: {{kind: optuna, n_trials: {N_TRIALS}, batch: {BATCH}, seed: {seed}, sampler: {sampler}}}
        """))


def _result(config: EngineConfig) -> list[TrialSummary]:
    """A planted surface: throughput grows with max_num_seqs up to 32, TTFT p99 with the batch budget."""
    a = config.args
    assert a.max_num_seqs is not None and a.max_num_batched_tokens is not None
    throughput = 100.0 * min(a.max_num_seqs, 32) + a.max_num_batched_tokens / 64 + (7 if a.enable_prefix_caching else 0)
    ttft = 50.0 + a.max_num_batched_tokens / 16
    return [TrialSummary(trial_id=f"t-{config.config_id}", config_id=config.config_id, config_label="",
                         load_point="c8", status="ok", failure_kind=None,
                         metrics={"output_throughput": throughput,
                                  "slos": [{"metric": "ttft_ms", "percentile": 99, "value_ms": ttft}]})]


def _search(seed: int, sampler: str, tell_order: random.Random | None = None) -> list[list[str]]:
    """The batches asked, told each batch's results in ask order or in a shuffled order."""
    planner, batches = create_planner(_spec(seed, sampler)), []
    while not planner.done:
        batch = planner.ask()
        assert batch, "the planner must ask while it is not done"
        batches.append([c.config_id for c in batch])
        told = list(batch)
        if tell_order is not None:
            tell_order.shuffle(told)
        for c in told:
            planner.tell(c, _result(c))
    return batches


@pytest.mark.parametrize("sampler", ["tpe", "nsga2"])  # gp: the same code path, and about 10x slower
def test_batched_asks_depend_on_the_seed_and_the_results_not_the_finishing_order(sampler: str) -> None:
    first = _search(1, sampler)
    assert [len(b) for b in first] == [BATCH] * (N_TRIALS // BATCH)
    flat = [c for b in first for c in b]
    assert len(set(flat)) == N_TRIALS, "no config is asked twice, inside a batch or across batches"
    assert _search(1, sampler, random.Random(5)) == first, \
        "the same seed, with each batch told in another order (daemons finishing differently), asks the same batches"
    assert _search(2, sampler) != first, "another seed asks differently"


@pytest.mark.parametrize("sampler", ["tpe"])
def test_the_optuna_planner_never_asks_a_config_vllm_would_refuse_and_records_it(sampler: str) -> None:
    """Chunked prefill off with max_num_batched_tokens below max_model_len (2048) cannot start:
    with n_trials the whole grid, every config that can start is asked, none that cannot, and each
    of those is reported pruned with vLLM's reason (for the sweep to record)."""
    text = _spec(0, sampler).model_dump(mode="json", exclude_none=True)
    text["engine"]["grid"]["enable_chunked_prefill"] = [True, False]
    text["engine"]["fixed"] = {"max_model_len": 2048}
    text["planner"] = {"kind": "optuna", "n_trials": 120, "batch": 4, "seed": 0, "sampler": sampler}
    spec = ExperimentSpec.model_validate(text)
    planner = create_planner(spec)
    asked: list[EngineConfig] = []
    while not planner.done:
        batch = planner.ask()
        assert batch, "the planner must ask while it is not done"
        asked += batch
        for c in batch:
            planner.tell(c, _result(c))
    refused = {c.config_id for c in asked if c.args.enable_chunked_prefill is False
               and (c.args.max_num_batched_tokens or 0) < 2048}
    assert not refused, "a config vLLM refuses to start was asked"
    pruned = planner.take_pruned()
    assert len(asked) + len(pruned) == 6 * 5 * 2 * 2
    assert len(pruned) == 6 * 2 * 2  # max_num_batched_tokens 512 and 1024 with chunked prefill off
    assert all("with chunked prefill off: vLLM refuses to start" in p.reason for p in pruned)
    assert planner.take_pruned() == (), "each pruned config is reported once"
