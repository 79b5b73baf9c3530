"""Planning in one home: the planner contract (:class:`Planner`), the registry keyed by
``planner.kind``, and every design (:mod:`.fixed`: grid, random, quasi-random; :mod:`.adaptive`:
optuna; :mod:`.halving`: successive halving). :func:`plan_experiment` is what every command uses to see a plan before any result."""

from coordinator.planning import adaptive, fixed, halving  # noqa: F401 - registers the designs
from coordinator.planning._base import (
    Planner,
    create_planner,
    known_kinds,
    needs_run,
    plan_experiment,
    planner_class,
    register,
)
from coordinator.planning.fixed import MAX_SOBOL_POINTS, sample_count, sample_large_space, sobol_levels

__all__ = ["MAX_SOBOL_POINTS", "Planner", "create_planner", "known_kinds", "needs_run", "plan_experiment",
           "planner_class", "register", "sample_count", "sample_large_space", "sobol_levels"]
