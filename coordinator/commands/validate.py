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
