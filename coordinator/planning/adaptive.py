"""The adaptive design ``planner.kind: optuna``: Optuna's samplers choose each next batch of engine
configs from the results so far (``sampler``: ``tpe``, ``gp`` or ``nsga2``; no optimiser of our own).

- The search space is the grid's axes (:meth:`~servetune.spec.EngineSpace.unique_axes`), each an
  Optuna parameter over its level index: ordered (an integer range) where every value is a number,
  categorical otherwise. One Optuna trial is one engine config, with all its load points and repeats.
- The objective is the spec's ``ranking.objective`` (maximised): per load point the median over a
  config's ok repeats, averaged over the load points. ``nsga2`` adds a second objective, minimised:
  the latency of the first SLO (its metric at its percentile), else the p99 end-to-end latency.
- SLOs are Optuna constraints (``ranking.require_slos``): one per load point and SLO, the median over
  the repeats of its latency minus its ``max_ms`` (feasible at or below 0), as :mod:`servetune.ranking` gates.
- A config that cannot run on any hardware target (vLLM refuses its combination of args, or it cannot
  fit in device memory: :class:`servetune.manifest.StartCheck`) is never asked: when Optuna proposes
  one it is told as FAIL in that ask's study and recorded as pruned, with the reason; no trial is spent.
- A config with a trial that failed by its own fault (a ``measurement`` failure, a parse failure,
  :func:`servetune.ranking.blames_config`) is told as FAIL; a ``transport`` failure is never told
  (the trial is run again, and the config told when it finishes).
- Batches: ``batch`` configs are asked at once (one per daemon) and the next batch only once all of
  them are told, so the configs depend only on the results and the seed, not on which daemon
  finished first. Inside a batch TPE's constant liar keeps the asks apart; a proposal already
  measured is told its known result and asked again (then filled at random, seeded, if Optuna keeps
  proposing known configs).
- The store is the source of truth: each ask builds a fresh study (sampler seeded by ``planner.seed``
  and the number of configs asked before) from the history told so far, so a resumed sweep, whose
  history comes from the store (:meth:`OptunaPlanner.restore`), asks what an uninterrupted one would.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import math
import random
import statistics
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from coordinator.planning._base import AdaptivePlanner, register
from servetune.manifest import EngineConfig
from servetune.ranking import TrialSummary, blames_config
from servetune.spec import MAX_GRID_CONFIGS, ExperimentSpec

log = logging.getLogger(__name__)

#: Asks of one batch at most, per config wanted, before the rest is filled at random.
ASKS_PER_CONFIG = 20


@dataclass(frozen=True)
class Scored:
    """One told config: its level per axis, its objective values (None: failed) and constraints."""

    levels: tuple[int, ...]
    values: tuple[float, ...] | None
    constraints: tuple[float, ...] = ()


@register("optuna")
class OptunaPlanner(AdaptivePlanner):
    """``planner: {kind: optuna, sampler, n_trials, seed, batch}`` (the module docstring says how)."""

    def __init__(self, spec: ExperimentSpec):
        super().__init__(spec)
        p = spec.planner
        assert p.n_trials is not None  # the spec requires it for this kind
        self.n_trials = p.n_trials
        self.batch = p.batch or 1
        self.sampler_name = p.sampler or "tpe"
        self.axes = spec.engine.unique_axes()
        self.size = math.prod(len(v) for _, v in self.axes)
        self.history: list[Scored] = []
        self.pending: dict[str, tuple[int, ...]] = {}  # config_id -> levels, asked and not yet told
        self.asked: dict[tuple[int, ...], None] = {}  # every config asked, in order
        self.pruned_levels: set[tuple[int, ...]] = set()  # configs proposed that cannot run: never asked
        self.exhausted = False
        if self.n_trials > self.size:
            self.notes = (f"planner.n_trials ({self.n_trials}) exceeds the {self.size} engine config(s) on the "
                          "grid's axes: at most all of them are measured",)

    # ------------------------------------------------------------------ contract

    def ask(self) -> list[EngineConfig]:
        if self.pending or self.done:
            return []
        n = min(self.batch, self.n_trials - len(self.asked), self._left())
        out = []
        for levels in self._propose(n):
            config = self.config_at(levels)
            self.asked[levels] = None
            self.pending[config.config_id] = levels
            out.append(config)
        return out

    def tell(self, config: EngineConfig, trials: Sequence[TrialSummary]) -> None:
        levels = self.pending.pop(config.config_id, None) or self.levels_of(config)
        if levels is None:
            log.warning("optuna planner: config %s is not on the grid's axes; not told", config.label())
            return
        self.asked.setdefault(levels, None)
        self.history.append(self.score(levels, trials))

    def restore(self, planned: Sequence[tuple[EngineConfig, Sequence[TrialSummary] | None]]) -> None:
        for config, trials in planned:
            levels = self.levels_of(config)
            if levels is None:
                continue  # planned under another engine space (the spec changed): not this search's history
            self.asked.setdefault(levels, None)
            if trials is None:
                self.pending[config.config_id] = levels
            else:
                self.history.append(self.score(levels, trials))

    @property
    def done(self) -> bool:
        return not self.pending and (len(self.asked) >= self.n_trials or self._left() <= 0 or self.exhausted)

    def _left(self) -> int:
        """Configs of the space neither asked nor found unable to run."""
        return self.size - len(self.asked) - len(self.pruned_levels)

    def _runnable(self, levels: tuple[int, ...]) -> bool:
        """Whether the config at ``levels`` can run (else it is pruned: never asked, never run)."""
        if levels in self.pruned_levels:
            return False
        if self.cannot_run(self.config_at(levels)):
            self.pruned_levels.add(levels)
            return False
        return True

    # ------------------------------------------------------------------ the space

    def config_at(self, levels: Sequence[int]) -> EngineConfig:
        args, env = self.spec.engine.config_at(levels, self.axes)
        return EngineConfig(args=args, env=env)

    def levels_of(self, config: EngineConfig) -> tuple[int, ...] | None:
        """The level per axis of ``config``, or None when it is not on the grid's axes."""
        levels = []
        for name, values in self.axes:
            value = config.env.get(name.removeprefix("env.")) if name.startswith("env.") else getattr(config.args, name)
            keyed = [(type(v).__name__, v) for v in values]
            if (type(value).__name__, value) not in keyed:
                return None
            levels.append(keyed.index((type(value).__name__, value)))
        found = tuple(levels)
        return found if self.config_at(found).config_id == config.config_id else None

    def _distributions(self) -> dict[str, Any]:
        from optuna.distributions import CategoricalDistribution, IntDistribution

        out: dict[str, Any] = {}
        for name, values in self.axes:
            numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
            ordered = numeric and list(values) == sorted(values)
            out[name] = IntDistribution(0, len(values) - 1) if ordered else CategoricalDistribution(list(range(len(values))))
        return out

    # ------------------------------------------------------------------ scoring

    def score(self, levels: tuple[int, ...], trials: Sequence[TrialSummary]) -> Scored:
        """A config's objective values and constraints from its trials (the module docstring's rules)."""
        values, constraints = score_trials(self.spec, trials, with_latency=self.sampler_name == "nsga2")
        return Scored(levels, values, constraints if values is not None else ())

    # ------------------------------------------------------------------ asking Optuna

    def _propose(self, n: int) -> list[tuple[int, ...]]:
        """``n`` configs never asked before, from a fresh study holding :attr:`history`."""
        if n <= 0:
            return []
        import optuna

        seed = _round_seed(self.spec.planner.seed, len(self.asked))
        dists = self._distributions()
        names = list(dists)
        known = {s.levels: s for s in self.history}
        chosen: list[tuple[int, ...]] = []
        verbosity = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # a line per told trial otherwise
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study = optuna.create_study(directions=self._directions(), sampler=self._sampler(seed))
                for s in self._history_in_ask_order():
                    study.add_trial(optuna.trial.create_trial(
                        state=optuna.trial.TrialState.COMPLETE if s.values else optuna.trial.TrialState.FAIL,
                        values=list(s.values) if s.values else None,
                        params=dict(zip(names, s.levels)), distributions=dists,
                        constraints={str(i): c for i, c in enumerate(s.constraints)} if s.values and s.constraints else None,
                    ))
                for _ in range(ASKS_PER_CONFIG * n):
                    if len(chosen) == n:
                        break
                    trial = study.ask(dists)
                    levels = tuple(int(trial.params[name]) for name in names)
                    if levels not in self.asked and levels not in chosen and not self._runnable(levels):
                        study.tell(trial, None, state=optuna.trial.TrialState.FAIL)  # cannot run: no trial spent
                        continue
                    if levels in self.asked or levels in chosen:
                        seen = known.get(levels)
                        if seen is not None:  # measured: tell Optuna what it already knows
                            for i, c in enumerate(seen.constraints if seen.values else ()):
                                trial.set_constraint(str(i), c)
                            study.tell(trial, list(seen.values) if seen.values else None,
                                       state=None if seen.values else optuna.trial.TrialState.FAIL)
                        continue  # asked in this batch or still running: left running (constant liar)
                    chosen.append(levels)
        finally:
            optuna.logging.set_verbosity(verbosity)
        if len(chosen) < n:
            chosen += self._fill(n - len(chosen), set(self.asked) | set(chosen), seed)
        return chosen

    def _history_in_ask_order(self) -> list[Scored]:
        """:attr:`history` in the order its configs were asked, not told: daemons finish a batch in any
        order, and TPE's asks depend on the order of the study's trials."""
        order = {levels: i for i, levels in enumerate(self.asked)}
        return sorted(self.history, key=lambda s: order.get(s.levels, len(order)))

    def _fill(self, n: int, taken: set[tuple[int, ...]], seed: int) -> list[tuple[int, ...]]:
        """``n`` configs not in ``taken``, uniformly at random under ``seed`` (Optuna kept proposing known ones)."""
        rng = random.Random(seed)
        counts = [len(v) for _, v in self.axes]
        out: list[tuple[int, ...]] = []
        for _ in range(1000 * n):
            if len(out) == n or len(taken) + len(out) + len(self.pruned_levels) >= self.size:
                break
            levels = tuple(rng.randrange(k) for k in counts)
            if levels not in taken and levels not in out and self._runnable(levels):
                out.append(levels)
        if len(out) < n and self.size <= MAX_GRID_CONFIGS:  # the draws missed the last ones: list them
            for levels in itertools.product(*[range(k) for k in counts]):
                if len(out) == n:
                    break
                if levels not in taken and levels not in out and self._runnable(levels):
                    out.append(levels)
        if len(out) < n:
            self.exhausted = True  # nothing left that can run was found: the search is over
        return out

    def _directions(self) -> list[str]:
        return ["maximize", "minimize"] if self.sampler_name == "nsga2" else ["maximize"]

    def _sampler(self, seed: int) -> Any:
        import optuna

        if self.sampler_name == "gp":
            return optuna.samplers.GPSampler(seed=seed)
        if self.sampler_name == "nsga2":
            return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(2, self.batch))
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True)


def score_trials(spec: ExperimentSpec, trials: Sequence[TrialSummary], *,
                 with_latency: bool = False) -> tuple[tuple[float, ...] | None, tuple[float, ...]]:
    """A config's objective values (None: it failed by its own fault, or nothing was measured) and
    its SLO constraints from its trials, by the module docstring's rules. ``with_latency`` adds the
    second objective (``nsga2``)."""
    trials = [t for t in trials if not t.is_baseline]
    if any(t.status == "failed" and blames_config(t.failure_kind) for t in trials):
        return None, ()
    by_lp: dict[str, list[TrialSummary]] = {}
    for t in trials:
        if t.status == "ok":
            by_lp.setdefault(t.load_point, []).append(t)
    if not by_lp:
        return None, ()
    policy, slos = spec.ranking, spec.slos
    objective: list[float] = []
    latency: list[float] = []
    constraints: list[float] = []
    for ts in by_lp.values():
        got = [float(t.metrics[policy.objective]) for t in ts if t.metrics.get(policy.objective) is not None]
        if not got:
            return None, ()
        objective.append(statistics.median(got))
        by_slo = [_slo_values(t.metrics) for t in ts]
        if policy.require_slos:
            for i, slo in enumerate(slos):
                vals = [float(x) for v in by_slo if i < len(v) and (x := v[i]) is not None]
                constraints.append((statistics.median(vals) if vals else 2 * slo.max_ms) - slo.max_ms)
        if with_latency:
            lat: list[float | None] = [v[0] for v in by_slo if v] if slos else \
                [_quantile(t.metrics, "e2el_ms", 0.99) for t in ts]
            good = [float(v) for v in lat if v is not None]
            if not good:
                return None, ()
            latency.append(statistics.median(good))
    values = (statistics.fmean(objective),) + ((statistics.fmean(latency),) if latency else ())
    return values, tuple(constraints)


def _round_seed(seed: int, n_asked: int) -> int:
    """The sampler's seed for the batch asked after ``n_asked`` configs (stable across processes)."""
    return int.from_bytes(hashlib.sha256(f"servetune-optuna:{seed}:{n_asked}".encode()).digest()[:4], "big")


def _slo_values(metrics: dict[str, Any]) -> list[float | None]:
    """The latency each SLO measured (``value_ms``), in the spec's SLO order."""
    return [s.get("value_ms") for s in metrics.get("slos") or []]


def _quantile(metrics: dict[str, Any], name: str, q: float) -> float | None:
    for qq, v in zip(metrics.get("quantiles") or [], metrics.get(name) or []):
        if abs(qq - q) < 1e-9:
            return None if v is None else float(v)
    return None
