"""What a person reads at the end of a command: the plan, the ranked table, what changed."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from coordinator.store import Store
from servetune.manifest import Plan, sweep_parent, swept_names
from servetune.ranking import RankedConfig, TrialSummary, rank
from servetune.sim.profiles import DEFAULT_SIM_PROFILE
from servetune.simulated import simulated_label
from servetune.spec import ExperimentSpec


def output_console() -> Console:
    """Where tables go: stdout, wide enough for the ranked table even when piped."""
    return Console(width=None if sys.stdout.isatty() else 160)


def print_plan(plan: Plan, spec: ExperimentSpec, console: Console) -> None:
    """``sweep --dry-run``: configs, trials, server starts and estimated time; runs nothing."""
    configs = plan.configs()
    trials = plan.trials()
    swept = swept_names([*configs.values(), *(p.config for p in plan.pruned)]) or None
    sampled = ""
    if plan.design != "grid":
        n_sampled = len({b.config_id for b in plan.batches if not b.is_baseline})
        sampled = f" ({n_sampled} of {spec.engine.count()} engine configs, seed {spec.planner.seed})"
    table = Table(title=f"plan for {spec.name}: {plan.design} design{sampled}, order "
                        + (f"randomised (seed {plan.seed})" if plan.randomized else "as written"))
    table.add_column("#", justify="right")
    table.add_column("config_id")
    table.add_column("engine config" + (" (swept args)" if swept else ""))
    shared = not spec.restart_per_repeat and spec.repeats > 1
    table.add_column("load points (run order" + (", #repeat" if shared else "") + ")")
    table.add_column("repeat" + ("s (one server start)" if shared else ""), justify="right")
    for b in plan.batches:
        repeats = sorted({t.repeat for t in b.trials})
        table.add_row(
            str(b.index),
            b.config_id[:12],
            b.config.label(swept) + (" [baseline]" if b.is_baseline else ""),
            ", ".join(t.load_point.name + (f" #{t.repeat}" if len(repeats) > 1 else "") for t in b.trials),
            str(repeats[0]) if len(repeats) == 1 else f"{repeats[0]}-{repeats[-1]}",
        )
    console.print(table)
    followups = sum(plan.followups_per_batch(b) for b in plan.batches)
    follow_text = (
        f" + {followups} rate-sweep follow-up trial(s) in {sum(plan.followup_starts(b) for b in plan.batches)}"
        " more server start(s), planned once their @sync and @max results are in"
        if followups else ""
    )
    external = spec.backend.kind == "openai"
    starts = f"no server starts (backend openai: {spec.backend.base_url})" if external else (
        f"{len(plan.batches)} server starts")
    console.print(
        f"{len(configs)} engine config(s), {len(spec.load_points)} load point(s), {spec.repeats} repeat(s): "
        f"{len(trials)} trials, {starts}{follow_text}; {plan.estimate_text(spec.backend.kind)}"
    )
    for note in plan.notes:
        console.print(f"note: {note}")
    print_pruned(plan, console, swept)
    single = plan.single_seat_sweeps()
    if single:
        console.print(f"note: {single} rate sweep(s) add no follow-ups: with max_num_seqs or the sweep's "
                      "max_concurrency 1, @max runs one request at a time like @sync and cannot beat its "
                      "throughput but by noise, so the sweep plans none for them")
    console.print("dry run: nothing was started or written")


def print_pruned(plan: Plan, console: Console, swept: list[str] | None = None, notes: bool = True) -> None:
    """The configs planning left out before any trial, each with its reason, and (``notes``) where
    the memory check could prune nothing, why."""
    for note in plan.prune_notes if notes else ():
        console.print(f"note: {escape(note)}")
    if not plan.pruned:
        return
    if swept is None:
        swept = swept_names([*plan.configs().values(), *(p.config for p in plan.pruned)]) or None
    console.print(f"pruned before any trial: {len(plan.pruned)} engine config(s) that cannot run (no trial is "
                  "planned for them):")
    for p in plan.pruned:
        where = f" on {p.hardware_target}" if p.hardware_target else ""
        console.print(f"  pruned {p.config_id[:12]} {escape(p.config.label(swept))}"
                      f"{' [baseline]' if p.is_baseline else ''}{escape(where)}: {escape(p.reason)}")


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def collect_summaries(store: Store) -> list[TrialSummary]:
    """The current spec's full-fidelity trials with their latest finished attempt (holes included).
    A successive-halving rung's shorter trials (fidelity < 1) are screening, never ranked with full
    ones: :func:`screening_count` counts them."""
    current = store.current_spec_hash()
    planned = set(store.planned_trial_ids(current)) if current else set()
    latest = store.latest_finished()
    trials = [(tid, m) for tid, m, _ in store.trials() if tid in planned and m.fidelity >= 1.0]
    swept = swept_names(m.engine for _, m in trials) or None
    out = []
    for trial_id, m in trials:
        att = latest.get(trial_id)
        out.append(
            TrialSummary(
                trial_id=trial_id,
                config_id=m.config_id,
                config_label=m.engine.label(swept) if m.backend != "openai" else f"endpoint {m.target}",
                load_point=m.load_point.name,
                status=att.status if att else "hole",
                failure_kind=att.failure_kind if att else None,
                metrics=(att.metrics or {}) if att else {},
                is_baseline=m.is_baseline,
            )
        )
    return out


def screening_count(store: Store) -> dict[float, int]:
    """The current spec's trials below full fidelity (successive-halving rungs), per fidelity."""
    current = store.current_spec_hash()
    planned = set(store.planned_trial_ids(current)) if current else set()
    out: dict[float, int] = {}
    for tid, m, _ in store.trials():
        if tid in planned and m.fidelity < 1.0:
            out[m.fidelity] = out.get(m.fidelity, 0) + 1
    return dict(sorted(out.items()))


def print_ranking(store: Store, spec: ExperimentSpec, console: Console, dataset_path: Path | None) -> dict[str, list[RankedConfig]]:
    """The ranked table per load point, under the spec's ranking policy, and where the results are."""
    ranked = rank(collect_summaries(store), spec.ranking)
    screening = screening_count(store)
    policy = spec.ranking
    gate = ", configs meeting every SLO first" if policy.require_slos and spec.slos else ""
    slo_text = "; ".join(f"{s.metric} p{s.percentile:g} <= {s.max_ms:g} ms" for s in spec.slos) or "none"
    sim = simulated_label([f"sim-1x{spec.backend.profile or DEFAULT_SIM_PROFILE}"]) if spec.backend.kind == "sim" else ""
    if sim:
        console.print(f"{sim}: every figure below is the simulated vLLM's, nothing was measured", markup=False)
    searched = {lp.name for lp in spec.load_points if lp.sla_search is not None}
    probes = [lp for lp in ranked if sweep_parent(lp) in searched]
    for lp, rows in ranked.items():
        if lp in probes:
            continue  # an SLA search's rates: the SLA search table sums them up (coordinator.sla_search)
        table = Table(title=escape(f"{sim + ' ' if sim else ''}load point {lp}: ranked by {policy.objective}{gate} "
                                   f"(SLOs: {slo_text})"))
        for col, justify in [
            ("rank", "right"), ("engine config", "left"), ("req/s", "right"), ("out tok/s", "right"),
            ("TTFT p50", "right"), ("TTFT p99", "right"), ("TPOT p50", "right"), ("TPOT p99", "right"),
            ("errors", "right"), ("SLO attain.", "right"), ("status", "left"),
        ]:
            table.add_column(col, justify=justify)  # type: ignore[arg-type]
        for r in rows:
            v = r.values
            status = r.status if not r.failure else f"failed ({r.failure})"
            for flag in r.flags:  # stopped early, client fell behind: shown, never hidden in the rank
                status += f", {flag}"
            if r.slos_met is False:
                status += ", misses SLO"
            if r.n_ok and (r.n_failed or r.n_holes):
                lost = f", {r.n_lost} lost to the daemon or connection, not held against it" if r.n_lost else ""
                status += f" ({r.n_failed} failed{lost}, {r.n_holes} holes)"
            attain = v.get("slo_attainment")
            table.add_row(
                str(r.rank), r.config_label, _fmt(v.get("request_throughput"), 2), _fmt(v.get("output_throughput")),
                _fmt(v.get("ttft_p50_ms")), _fmt(v.get("ttft_p99_ms")), _fmt(v.get("tpot_p50_ms")),
                _fmt(v.get("tpot_p99_ms")), _fmt(v.get("n_errors"), 0),
                f"{attain * 100:.0f}%" if isinstance(attain, (int, float)) and not math.isnan(attain) else "-",
                status,
            )
        console.print(table)
    if probes:
        console.print(f"{len(probes)} SLA-search rate(s) ranked in the dataset, not shown here: the SLA search "
                      "table below sums them up")
    console.print("latencies in ms; throughput per second; medians over repeats")
    if screening:
        console.print(f"successive halving: {sum(screening.values())} screening trial(s) on shortened load points ("
                      + ", ".join(f"{n} at fidelity {f:.3g}" for f, n in screening.items())
                      + ") chose the configs above; they are not ranked (fewer requests each). In the dataset with "
                        "their fidelity: analysis.load(NAME, fidelity='all')")
    if dataset_path is not None:
        console.print(f"results: {dataset_path}  (load with: analysis.load({spec.name!r}))")
    return ranked


def spec_changes(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted paths that differ between two spec dumps, as ``path: old -> new`` lines."""
    lines: list[str] = []
    for key in sorted(set(old) | set(new)):
        path = f"{prefix}.{key}" if prefix else str(key)
        a, b = old.get(key, "<absent>"), new.get(key, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            lines += spec_changes(a, b, path)
        elif a != b:
            lines.append(f"{path}: {a!r} -> {b!r}")
    return lines
