"""Optuna's importance evaluators on a servetune dataset: the study they need, and their rankings.

The study holds one COMPLETE trial per ``ok`` non-baseline trial of the chosen load point, with the
same target our :func:`analysis.importance.importance` models: the natural log of
``output_throughput`` (direction "maximize"). Parameters map to Optuna distributions as a user would
write them: bool and string parameters as :class:`~optuna.distributions.CategoricalDistribution`,
numeric ones as :class:`~optuna.distributions.IntDistribution` (integer levels) or
:class:`~optuna.distributions.FloatDistribution`, on a log scale when every level is positive and
they span a ratio of 4 or more (batch sizes, token budgets, block sizes: powers of two).
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
import xarray as xr
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from analysis.frame import Parameter, filter_trials, parameters, trial_table

#: Optuna evaluators compared, by the name the tables use.
EVALUATORS = ("Optuna fANOVA", "Optuna PED-ANOVA")


@dataclass
class OptunaResult:
    """One evaluator on one dataset: importance per parameter (normalised to sum 1, as Optuna
    returns them), the ranking best first, and the evaluator's own wall time (study building excluded)."""

    tool: str
    importances: dict[str, float]
    ranking: list[str]
    seconds: float
    n_trials: int


def distribution_of(p: Parameter) -> BaseDistribution:
    """The Optuna distribution a user would declare for ``p``."""
    if p.kind == "bool":
        return CategoricalDistribution([False, True])
    if p.kind == "categorical":
        return CategoricalDistribution(list(p.levels))
    lo, hi = float(min(p.levels)), float(max(p.levels))
    log = lo > 0 and hi / lo >= 4
    if all(float(v).is_integer() for v in p.levels):
        return IntDistribution(int(lo), int(hi), log=log)
    return FloatDistribution(lo, hi, log=log)


def _native(p: Parameter, v: Any) -> Any:
    if p.kind == "bool":
        return bool(v)
    if p.kind == "categorical":
        return str(v)
    f = float(v)
    return int(f) if all(float(x).is_integer() for x in p.levels) else f


def build_study(ds: xr.Dataset, metric: str = "output_throughput", load_point: str | None = None) -> optuna.Study:
    """An in-memory study with one COMPLETE trial per ok, non-baseline trial (value = log(metric))."""
    df = trial_table(ds)
    df = filter_trials(df, status="ok", load_point=load_point)
    df = df[np.isfinite(df[metric].to_numpy(dtype=float)) & (df[metric].to_numpy(dtype=float) > 0)]
    params = parameters(ds)
    dists = {p.name: distribution_of(p) for p in params}
    study = optuna.create_study(direction="maximize")
    cols = {p.name: df[p.column].tolist() for p in params}
    values = np.log(df[metric].to_numpy(dtype=float))
    trials = []
    for i, value in enumerate(values.tolist()):
        trials.append(optuna.trial.create_trial(
            params={p.name: _native(p, cols[p.name][i]) for p in params}, distributions=dists, value=value))
    study.add_trials(trials)
    return study


def evaluate(study: optuna.Study, tool: str, seed: int = 0) -> OptunaResult:
    """Run one of :data:`EVALUATORS` on ``study`` with its defaults (fANOVA seeded)."""
    evaluator: optuna.importance.BaseImportanceEvaluator
    if tool == "Optuna fANOVA":
        evaluator = optuna.importance.FanovaImportanceEvaluator(seed=seed)
    elif tool == "Optuna PED-ANOVA":
        evaluator = optuna.importance.PedAnovaImportanceEvaluator()
    else:
        raise ValueError(f"unknown evaluator {tool!r}; choose from {', '.join(EVALUATORS)}")
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        imp = optuna.importance.get_param_importances(study, evaluator=evaluator)
    seconds = time.perf_counter() - t0
    imp = {k: float(v) for k, v in imp.items()}
    for name in study.trials[0].params if study.trials else []:
        imp.setdefault(name, 0.0)
    ranking = sorted(imp, key=lambda k: (-imp[k] if math.isfinite(imp[k]) else math.inf, k))
    return OptunaResult(tool, imp, ranking, seconds, len(study.trials))


def quiet() -> None:
    """Silence Optuna's per-study INFO logging."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
