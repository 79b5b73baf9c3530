"""``python -m coordinator validate CONFIG``: report every problem of a spec, or its plan in one line."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from coordinator.planning import plan_experiment
from servetune.errors import SpecError
from servetune.spec import ExperimentSpec, load_spec


def register(sub: Any) -> None:
    p = sub.add_parser("validate", help="check an experiment spec and exit non-zero on any problem")
    p.add_argument("config", help="experiment YAML")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        spec = load_spec(args.config)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return 2
    plan = plan_experiment(spec)
    n_configs = len(plan.configs())
    if plan.design == "adaptive":  # what comes after its first batch depends on its results
        print(f"ok: {spec.name}: {spec.planner.kind} planner (adaptive design, seed {spec.planner.seed}) over "
              f"{spec.engine.count()} engine configs; its first batch: {n_configs} engine config(s) x "
              f"{len(spec.load_points)} load point(s) x {spec.repeats} repeat(s) = {len(plan.trials())} trials in "
              f"{len(plan.batches)} server starts; {plan.estimate_text(spec.backend.kind)} for that batch, "
              f"then {_adaptive_rest(spec)}")
        for note in plan.notes:
            print(f"note: {note}")
        return 0
    sampled = ""
    if plan.design != "grid":
        n_sampled = len({b.config_id for b in plan.batches if not b.is_baseline})
        sampled = (f"{plan.design} design, seed {spec.planner.seed}: {n_sampled} of "
                   f"{spec.engine.count()} engine configs; ")
    print(
        f"ok: {spec.name}: {n_configs} engine config(s) x {len(spec.load_points)} load point(s) x "
        f"{spec.repeats} repeat(s){hardware_text(spec)} = {len(plan.trials())} trials in {len(plan.batches)} server starts"
        f"{' (' + sampled.removesuffix('; ') + ')' if sampled else ''}; {plan.estimate_text(spec.backend.kind)}"
    )
    for note in plan.notes:
        print(f"note: {note}")
    return 0


def hardware_text(spec: ExperimentSpec) -> str:
    """`` x N hardware target(s) (labels)`` when the spec names targets (each planned in full)."""
    if spec.hardware is None or not spec.hardware.targets:
        return ""
    return f" x {len(spec.hardware.targets)} hardware target(s) ({', '.join(spec.hardware.labels())})"


def _adaptive_rest(spec: ExperimentSpec) -> str:
    """What an adaptive planner measures after its first batch, as far as the spec says."""
    p = spec.planner
    if p.kind == "optuna":
        return f"batches of {p.batch or 1} chosen from the results, up to {p.n_trials} engine configs in all"
    if p.kind == "halving":
        from coordinator.planning.halving import HalvingPlanner

        h = HalvingPlanner(spec)
        later = sum(h.sizes[1:])
        return (f"{later} more engine config(s) on longer rungs, chosen from the results "
                f"({' -> '.join(map(str, h.sizes))} configs at fidelity {', '.join(f'{f:.3g}' for f in h.fidelities)})")
    return "more batches chosen from the results"
