"""Turning a spec into a plan under the design its ``planner`` names.

``grid`` and ``random`` are planned by :mod:`servetune.manifest` (standard library only);
``quasi-random`` needs a scrambled Sobol sequence (``scipy.stats.qmc.Sobol``), so it is sampled here
and the chosen configs are planned the same way. :func:`plan_experiment` is what every command uses.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Iterator, Sequence
from typing import Any

from servetune.manifest import EngineConfig, Plan, plan_configs, plan_grid, plan_random, sample_count
from servetune.spec import MAX_GRID_CONFIGS, ExperimentSpec, config_key

#: Sobol points drawn at most while looking for distinct configs, before the rest is filled at random.
MAX_SOBOL_POINTS = 1 << 16


def needs_run(latest: Any | None, retry_failed: bool) -> bool:
    """The resume rule, for planned trials and rate-sweep follow-ups alike: run a trial with no
    finished attempt (``latest`` is None: a hole) or whose latest one failed in ``transport``;
    one that failed as a ``measurement`` (or any other kind) only with ``retry_failed``; never an ok one.
    ``latest`` is the store's latest finished attempt (``status``, ``failure_kind``)."""
    if latest is None:
        return True
    return bool(latest.status == "failed" and (latest.failure_kind == "transport" or retry_failed))


def plan_experiment(spec: ExperimentSpec) -> Plan:
    """The plan of ``spec`` under ``planner.kind``; ``Plan.design`` names the design used."""
    kind = spec.planner.kind
    if kind == "grid":
        return plan_grid(spec)
    if kind == "random":
        return plan_random(spec)
    if kind == "quasi-random":
        return plan_quasi_random(spec)
    raise ValueError(f"unknown planner.kind {kind!r}")


def plan_quasi_random(spec: ExperimentSpec) -> Plan:
    """The quasi-random design: ``planner.n_configs`` distinct grid configs, taken in order of first
    appearance along a scrambled Sobol sequence (seeded by ``planner.seed``) over the grid's axes,
    each axis's values mapped to equal slices of [0, 1); kept in the engine space's order.

    Explicit ``engine.configs`` are not on the axes (the spec check refuses them with this design).
    """
    space = spec.engine
    if space.size() > MAX_GRID_CONFIGS:
        return _plan_quasi_random_large(spec)
    everything = space.expand()
    index = {config_key(a, e): i for i, (a, e) in enumerate(everything)}
    n, notes = sample_count(spec, len(everything))
    axes = space.axes()
    chosen: list[int] = []
    if n == len(everything) or not axes:
        chosen = list(range(len(everything)))[:n]
    else:
        seen: set[int] = set()
        for levels in sobol_levels([len(values) for _, values in axes], spec.planner.seed, MAX_SOBOL_POINTS):
            i = index.get(config_key(*space.config_at(levels)))
            if i is not None and i not in seen:
                seen.add(i)
                chosen.append(i)
                if len(chosen) == n:
                    break
        if len(chosen) < n:
            rest = [i for i in range(len(everything)) if i not in seen]
            filler = random.Random(f"servetune-quasi-random-fill:{spec.planner.seed}").sample(rest, n - len(chosen))
            notes += (f"{MAX_SOBOL_POINTS} Sobol points gave only {len(chosen)} distinct configs; "
                      f"{len(filler)} more were drawn uniformly at random",)
            chosen += filler
    configs = [EngineConfig(args=everything[i][0], env=everything[i][1]) for i in sorted(chosen)]
    return plan_configs(spec, configs, design="quasi-random", notes=notes)


def _plan_quasi_random_large(spec: ExperimentSpec) -> Plan:
    """:func:`plan_quasi_random` for a space too large to list: the Sobol points' levels over
    :meth:`~servetune.spec.EngineSpace.unique_axes` name configs directly (the space is the grid's
    product: explicit configs are refused with this design), filled at random if they repeat."""
    space = spec.engine
    axes = space.unique_axes()
    counts = [len(values) for _, values in axes]
    n, notes = sample_count(spec, space.size())
    chosen: dict[tuple[int, ...], None] = {}
    for levels in sobol_levels(counts, spec.planner.seed, MAX_SOBOL_POINTS):
        chosen.setdefault(levels)
        if len(chosen) == n:
            break
    n_sobol = len(chosen)
    filler = random.Random(f"servetune-quasi-random-fill:{spec.planner.seed}")
    while len(chosen) < n:
        chosen.setdefault(tuple(filler.randrange(k) for k in counts))
    if len(chosen) > n_sobol:
        notes += (f"{MAX_SOBOL_POINTS} Sobol points gave only {n_sobol} distinct configs; "
                  f"{len(chosen) - n_sobol} more were drawn uniformly at random",)
    configs = [EngineConfig(args=a, env=e) for a, e in (space.config_at(lv, axes) for lv in sorted(chosen))]
    return plan_configs(spec, configs, design="quasi-random", notes=notes)


def sobol_levels(level_counts: Sequence[int], seed: int, max_points: int) -> Iterator[tuple[int, ...]]:
    """Level indices (one per axis) of up to ``max_points`` scrambled Sobol points, drawn lazily in
    blocks that keep every prefix drawn a power of two long (where Sobol's balance properties hold)."""
    sampler = _sobol(len(level_counts), seed)
    drawn = 0
    while drawn < max_points:
        size = min(max(drawn, 8), max_points - drawn)
        for row in sampler.random(size).tolist():
            yield tuple(min(int(u * k), k - 1) for u, k in zip(row, level_counts))
        drawn += size


def _sobol(d: int, seed: int) -> Any:
    """A scrambled Sobol sampler (scipy imported here: only this design needs it); scipy >= 1.15
    names the seed ``rng``, older versions ``seed``."""
    from scipy.stats import qmc

    if "rng" in inspect.signature(qmc.Sobol).parameters:
        return qmc.Sobol(d, scramble=True, rng=seed)
    return qmc.Sobol(d, scramble=True, seed=seed)  # pragma: no cover - scipy < 1.15
