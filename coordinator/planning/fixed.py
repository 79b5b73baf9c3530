"""The designs fixed in advance: ``grid``, ``random`` and ``quasi-random``.

Each asks for all its configs at once, before any result, and ignores what it is told. ``random``
draws from the engine space under ``planner.seed`` (standard library); ``quasi-random`` takes a
scrambled Sobol sequence (``scipy.stats.qmc.Sobol``) over the grid's axes. Both keep the chosen
configs in the engine space's order.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Iterator, Sequence
from typing import Any

from coordinator.planning._base import Planner, register
from servetune.manifest import EngineConfig
from servetune.spec import MAX_GRID_CONFIGS, EngineArgs, EngineSpace, ExperimentSpec, config_key

#: Sobol points drawn at most while looking for distinct configs, before the rest is filled at random.
MAX_SOBOL_POINTS = 1 << 16


class FixedPlanner(Planner):
    """A design whose configs do not depend on results: :meth:`choose` them all on the first ask."""

    def __init__(self, spec: ExperimentSpec):
        super().__init__(spec)
        self._asked = False

    def ask(self) -> list[EngineConfig]:
        if self._asked:
            return []
        self._asked = True
        configs, self.notes = self.choose()
        return configs

    @property
    def done(self) -> bool:
        return self._asked

    def choose(self) -> tuple[list[EngineConfig], tuple[str, ...]]:
        """Every config of this design, in run order, and notes on the choice."""
        raise NotImplementedError


@register("grid")
class GridPlanner(FixedPlanner):
    """The grid design: every config the engine space describes (:func:`servetune.manifest.plan_grid`)."""

    design = "grid"

    def choose(self) -> tuple[list[EngineConfig], tuple[str, ...]]:
        return [EngineConfig(args=a, env=e) for a, e in self.spec.engine.expand()], ()


@register("random")
class RandomPlanner(FixedPlanner):
    """The random design: ``planner.n_configs`` engine configs drawn uniformly at random, without
    replacement, from those :meth:`~servetune.spec.EngineSpace.expand` yields (seeded by
    ``planner.seed``), kept in the engine space's order.

    A space larger than :data:`~servetune.spec.MAX_GRID_CONFIGS` is never listed: indices are
    drawn from its :meth:`~servetune.spec.EngineSpace.size` and each config built alone."""

    design = "random"

    def choose(self) -> tuple[list[EngineConfig], tuple[str, ...]]:
        spec = self.spec
        space = spec.engine
        picker = random.Random(f"servetune-random-design:{spec.planner.seed}")
        if space.size() > MAX_GRID_CONFIGS:
            n, notes = sample_count(spec, space.size())
            return [EngineConfig(args=a, env=e) for a, e in sample_large_space(space, n, picker)], notes
        everything = [EngineConfig(args=a, env=e) for a, e in space.expand()]
        n, notes = sample_count(spec, len(everything))
        chosen = sorted(picker.sample(range(len(everything)), n))
        return [everything[i] for i in chosen], notes


@register("quasi-random")
class QuasiRandomPlanner(FixedPlanner):
    """The quasi-random design: ``planner.n_configs`` distinct grid configs, taken in order of first
    appearance along a scrambled Sobol sequence (seeded by ``planner.seed``) over the grid's axes,
    each axis's values mapped to equal slices of [0, 1); kept in the engine space's order.

    Explicit ``engine.configs`` are not on the axes (the spec check refuses them with this design)."""

    design = "quasi-random"

    def choose(self) -> tuple[list[EngineConfig], tuple[str, ...]]:
        spec = self.spec
        space = spec.engine
        if space.size() > MAX_GRID_CONFIGS:
            return self._choose_large()
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
        return [EngineConfig(args=everything[i][0], env=everything[i][1]) for i in sorted(chosen)], notes

    def _choose_large(self) -> tuple[list[EngineConfig], tuple[str, ...]]:
        """:meth:`choose` for a space too large to list: the Sobol points' levels over
        :meth:`~servetune.spec.EngineSpace.unique_axes` name configs directly (the space is the grid's
        product: explicit configs are refused with this design), filled at random if they repeat."""
        spec = self.spec
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
        return [EngineConfig(args=a, env=e) for a, e in (space.config_at(lv, axes) for lv in sorted(chosen))], notes


def sample_count(spec: ExperimentSpec, n_available: int) -> tuple[int, tuple[str, ...]]:
    """How many configs a sampled design takes from ``n_available``: ``planner.n_configs``, or all
    of them (with a note saying so) when it asks for more than the engine space holds."""
    wanted = spec.planner.n_configs
    if wanted is None:
        raise ValueError(f"planner.kind {spec.planner.kind!r} needs planner.n_configs")
    if wanted > n_available:
        note = (f"planner.n_configs ({wanted}) exceeds the {n_available} engine config(s) the engine space "
                "describes: all of them are planned")
        return n_available, (note,)
    return wanted, ()


def sample_large_space(space: EngineSpace, n: int, picker: random.Random) -> list[tuple[EngineArgs, dict[str, str]]]:
    """``n`` distinct configs of a space too large to list, drawn uniformly by index under
    ``picker`` (indices naming a config already drawn, which only explicit configs can, are
    drawn again), in the engine space's order."""
    size = space.size()
    chosen: dict[str, tuple[int, tuple[EngineArgs, dict[str, str]]]] = {}
    drawn: set[int] = set()
    for index in picker.sample(range(size), n):
        drawn.add(index)
        config = space.config_by_index(index)
        chosen.setdefault(config_key(*config), (index, config))
    tries = 0
    while len(chosen) < n and len(drawn) < size and tries < 100 * n:
        tries += 1
        index = picker.randrange(size)
        if index not in drawn:
            drawn.add(index)
            config = space.config_by_index(index)
            chosen.setdefault(config_key(*config), (index, config))
    return [config for _, config in sorted(chosen.values(), key=lambda item: item[0])]


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
