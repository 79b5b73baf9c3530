"""Successive halving, ``planner.kind: halving``: a multi-fidelity design.

``n_configs`` engine configs, drawn as the ``random`` design draws them (seeded, any engine space),
are measured first on shortened load points: ``min_fidelity`` (default 1/eta^2) of each load
point's measured requests, or of its duration (:func:`servetune.manifest.at_fidelity`; at least 8
requests or 5 s). When every config of a rung is in, the best ``n // eta`` of them (at least one)
are measured again at ``eta`` times that fidelity, and so on; the last rung is the full load points.
With ``eta`` 3 and 27 configs: 27 short trials per load point and repeat, then 9 at a third, then 3
full ones.

- Ranking within a rung: the configs meeting every SLO (``ranking.require_slos``) first, by the
  objective (:func:`coordinator.planning.adaptive.score_trials`: per load point the median over
  the repeats, averaged over the load points); then those missing an SLO, by how far (the sum over
  load points and SLOs of the excess latency over each bound, relative to the bound); then the
  configs that failed by their own fault. Ties go to the earlier config in the draw's order.
- Every trial records its fidelity (the manifest's ``fidelity``, a dataset coordinate). Only the
  full-fidelity trials are results: the coordinator's ranking, ``analysis.load`` and everything
  built on it leave the shorter ones out, saying how many (they are screening, measured on fewer
  requests, and never pooled with full trials).
- Short rungs save measurement time, not server starts: each rung is a batch (one server start) per
  config and repeat, as for any design. Worth it when the measurement windows are long next to a
  server start.
- The store is the source of truth: a resumed sweep rebuilds the rungs from the configs planned at
  each fidelity and their results (:meth:`HalvingPlanner.restore_at`), and asks what an
  uninterrupted one would.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

from coordinator.planning._base import AdaptivePlanner, register
from coordinator.planning.adaptive import score_trials
from coordinator.planning.fixed import RandomPlanner
from servetune.manifest import EngineConfig
from servetune.ranking import TrialSummary
from servetune.spec import DEFAULT_ETA, ExperimentSpec

log = logging.getLogger(__name__)


def rung_fidelities(eta: int, min_fidelity: float | None) -> list[float]:
    """The fidelity of each rung, lowest first, the last 1: ``min_fidelity`` (default 1/eta^2)
    times eta^k while below 1 (rounded to 6 digits, so a trial id never depends on float noise)."""
    low = min_fidelity if min_fidelity is not None else 1.0 / eta**2
    out: list[float] = []
    f = low
    while f < 1.0 - 1e-9:
        out.append(round(f, 6))
        f *= eta
    return [*out, 1.0]


def rung_sizes(n: int, eta: int, rungs: int) -> list[int]:
    """How many configs each rung measures: ``n``, then ``n // eta`` of those (at least 1), and so on."""
    sizes = [n]
    for _ in range(rungs - 1):
        sizes.append(max(1, sizes[-1] // eta))
    return sizes


@register("halving")
class HalvingPlanner(AdaptivePlanner):
    """``planner: {kind: halving, n_configs, eta, min_fidelity, seed}`` (the module docstring says how)."""

    def __init__(self, spec: ExperimentSpec):
        super().__init__(spec)
        p = spec.planner
        self.eta = p.eta or DEFAULT_ETA
        self.fidelities = rung_fidelities(self.eta, p.min_fidelity)
        drawn, notes = RandomPlanner(spec).choose()
        first = [c for c in drawn if not self.cannot_run(c)]
        if len(first) < len(drawn):
            notes = (*notes, f"{len(drawn) - len(first)} of the {len(drawn)} configs drawn cannot run (pruned, "
                             "with the reason) and are not replaced")
        self.first = first
        self.sizes = rung_sizes(len(first), self.eta, len(self.fidelities))
        self.notes = (*notes, "successive halving: rungs at fidelity " + ", ".join(f"{f:g}" for f in self.fidelities)
                      + " of each load point, " + " -> ".join(str(k) for k in self.sizes) + " config(s)")
        self.order = {c.config_id: i for i, c in enumerate(first)}
        #: per rung, config_id -> its trials (None: asked, not yet told)
        self.rungs: list[dict[str, Sequence[TrialSummary] | None]] = [{} for _ in self.fidelities]
        self.configs = {c.config_id: c for c in first}
        #: every config of a rung failed by its own fault: nothing to promote, the search is over
        self.ended = False

    # ------------------------------------------------------------------ contract

    def ask(self) -> list[EngineConfig]:
        raise NotImplementedError("successive halving asks at a fidelity: use ask_at()")

    def ask_at(self) -> list[tuple[EngineConfig, float]]:
        k = self._next_rung()
        if k is None:
            return []
        chosen = self.first if k == 0 else self._promoted(k - 1)
        if not chosen:
            log.warning("halving planner: every config of rung %d failed by its own fault; nothing to promote", k - 1)
            self.ended = True
            return []
        for c in chosen:
            self.rungs[k][c.config_id] = None
        return [(c, self.fidelities[k]) for c in chosen]

    def tell_at(self, config: EngineConfig, fidelity: float, trials: Sequence[TrialSummary]) -> None:
        k = self._rung_of(fidelity)
        if k is None or config.config_id not in self.rungs[k]:
            log.warning("halving planner: config %s at fidelity %g was not asked; not told", config.label(), fidelity)
            return
        self.rungs[k][config.config_id] = list(trials)

    def restore_at(self, planned: Sequence[tuple[EngineConfig, float, Sequence[TrialSummary] | None]]) -> None:
        for config, fidelity, trials in planned:
            k = self._rung_of(fidelity)
            if k is None or config.config_id not in self.configs:
                continue  # planned under other settings (the spec changed): not this search's history
            self.rungs[k][config.config_id] = None if trials is None else list(trials)

    @property
    def done(self) -> bool:
        return self.ended or bool(self.rungs[-1])

    # ------------------------------------------------------------------ rungs

    def _rung_of(self, fidelity: float) -> int | None:
        for k, f in enumerate(self.fidelities):
            if math.isclose(f, fidelity, rel_tol=1e-6):
                return k
        return None

    def _next_rung(self) -> int | None:
        """The rung to ask now: the first never asked, once every config of the one before is told."""
        for k, rung in enumerate(self.rungs):
            if rung:
                continue
            if k > 0 and any(t is None for t in self.rungs[k - 1].values()):
                return None  # the rung before is still running
            return k
        return None

    def ranked(self, k: int) -> list[str]:
        """The config ids of rung ``k``, best first (the module docstring's order)."""
        return [i for i, _ in self._tiers(k)]

    def _tiers(self, k: int) -> list[tuple[str, int]]:
        """Rung ``k``'s config ids, best first, each with its tier (0 meets the SLOs, 1 misses one,
        2 failed by its own fault): each config scored once."""
        slos = self.spec.slos

        def key(config_id: str) -> tuple[int, float, int]:
            values, constraints = score_trials(self.spec, self.rungs[k][config_id] or [])
            order = self.order.get(config_id, len(self.order))
            if values is None:
                return (2, 0.0, order)
            excess = sum(max(0.0, c) / slos[i % len(slos)].max_ms for i, c in enumerate(constraints)) if slos else 0.0
            if excess > 0:
                return (1, excess, order)
            return (0, -values[0], order)

        keys = {i: key(i) for i in self.rungs[k]}
        return [(i, keys[i][0]) for i in sorted(keys, key=keys.__getitem__)]

    def _promoted(self, k: int) -> list[EngineConfig]:
        """The configs rung ``k`` promotes to rung ``k + 1``, in the draw's order: the best, never one
        that failed by its own fault (fewer than the rung's size when too few are left)."""
        usable = [i for i, tier in self._tiers(k) if tier < 2]
        keep = usable[: self.sizes[k + 1]]
        return sorted((self.configs[i] for i in keep), key=lambda c: self.order.get(c.config_id, 0))
