"""The planner contract and the registry of planners, keyed by ``planner.kind``.

A planner chooses which engine configs an experiment measures; :func:`plan_configs
<servetune.manifest.plan_configs>` turns the configs it chooses into batches of trial manifests.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, ClassVar, TypeVar

from servetune.errors import SpecError, SpecIssue
from servetune.manifest import EngineConfig, Plan, PrunedConfig, StartCheck, plan_configs
from servetune.ranking import TrialSummary
from servetune.spec import ExperimentSpec


def needs_run(latest: Any | None, retry_failed: bool) -> bool:
    """The resume rule, for planned trials and rate-sweep follow-ups alike: run a trial with no
    finished attempt (``latest`` is None: a hole) or whose latest one failed in ``transport``;
    one that failed as a ``measurement`` (or any other kind) only with ``retry_failed``; never an ok one.
    ``latest`` is the store's latest finished attempt (``status``, ``failure_kind``)."""
    if latest is None:
        return True
    return bool(latest.status == "failed" and (latest.failure_kind == "transport" or retry_failed))


class Planner(ABC):
    """Chooses the engine configs of one experiment, ask/tell (one planner per sweep).

    Contract:

    - A planner never touches a socket, the store or the clock: the coordinator owns the loop. It
      :meth:`ask`\\ s, runs what it was given, and :meth:`tell`\\ s each config's results back.
    - :meth:`ask` returns the engine configs to measure next, distinct and never asked before, in
      the engine space's order for a design that takes them at once. An empty list means nothing
      now: :attr:`done` says whether more can come after further tells.
    - :meth:`tell` is called once per asked config, when every trial planned for it has finished
      (ok, or failed as a measurement): ``trials`` are its trials' latest attempts. A trial lost to
      ``transport`` (a daemon or connection lost) is not finished and is never told: it is run
      again, and the config told when it finishes. A config that never finishes (the sweep
      stopped) is never told.
    - :meth:`restore` is called once, before the first :meth:`ask` of a resumed sweep, with the
      configs an earlier sweep of the same spec planned, in plan order, so the planner rebuilds its
      history from the store (the store is the source of truth; a planner keeps no state of its own).
    - The same spec and seed give the same configs in the same order (for an adaptive planner:
      given the same results told in the same order).
    - Not thread-safe: use it from the coordinator's thread.
    - Fidelity: the coordinator drives every planner through :meth:`ask_at`, :meth:`tell_at` and
      :meth:`restore_at`, which carry each asked config's fidelity (the fraction of every load
      point it is measured at: 1 for a full trial). A single-fidelity planner implements
      :meth:`ask`, :meth:`tell` and :meth:`restore`, and the defaults map them at fidelity 1; a
      multi-fidelity one (:mod:`.halving`) overrides the ``_at`` methods, and may ask a config again
      at a higher fidelity.

    Class attributes: ``kind`` (the ``planner.kind`` it is registered under), ``design`` (the
    label recorded with the results, which the analysis reads: ``grid``, ``random``,
    ``quasi-random`` or ``adaptive``), ``adaptive`` (whether what it asks depends on what it was told).
    """

    kind: ClassVar[str]
    design: ClassVar[str]
    adaptive: ClassVar[bool] = False

    def __init__(self, spec: ExperimentSpec):
        self.spec = spec
        #: Notes on what was planned (e.g. fewer configs than asked for), recorded with the plan.
        self.notes: tuple[str, ...] = ()

    @abstractmethod
    def ask(self) -> list[EngineConfig]:
        """The engine configs to measure next (may be empty).

        Raises:
            SpecError: the spec cannot be planned by this design (with the YAML path)."""

    def tell(self, config: EngineConfig, trials: Sequence[TrialSummary]) -> None:  # noqa: B027 - optional hook
        """The results of ``config`` (every one of its trials finished). A design fixed in
        advance ignores them."""

    def restore(self, planned: Sequence[tuple[EngineConfig, Sequence[TrialSummary] | None]]) -> None:  # noqa: B027
        """Configs an earlier sweep of this spec planned, in plan order, each with its trials when
        all have finished (None: some still run). A design fixed in advance plans the same again
        and ignores them."""

    @property
    @abstractmethod
    def done(self) -> bool:
        """Whether :meth:`ask` will return nothing more, whatever it is told."""

    def ask_at(self) -> list[tuple[EngineConfig, float]]:
        """The configs to measure next, each with its fidelity (default: :meth:`ask`'s, at 1)."""
        return [(c, 1.0) for c in self.ask()]

    def tell_at(self, config: EngineConfig, fidelity: float, trials: Sequence[TrialSummary]) -> None:
        """The results of ``config`` measured at ``fidelity`` (default: :meth:`tell`)."""
        self.tell(config, trials)

    def restore_at(self, planned: Sequence[tuple[EngineConfig, float, Sequence[TrialSummary] | None]]) -> None:
        """:meth:`restore` with each planned config's fidelity (default: :meth:`restore`, which sees
        the configs planned at fidelity 1)."""
        self.restore([(c, trials) for c, f, trials in planned if f >= 1.0])

    def plan(self, configs: Sequence[EngineConfig] | None = None) -> Plan:
        """``configs`` at fidelity 1 (default: what :meth:`ask_at` returns now, at their fidelities)
        planned as batches x load point x repeat (:func:`servetune.manifest.plan_configs`), with this
        design's label and notes."""
        asked = self.ask_at() if configs is None else [(c, 1.0) for c in configs]
        # an adaptive design is told every config it asked for: a pruned one would never be
        prune = not self.adaptive
        fidelities = list(dict.fromkeys(f for _, f in asked)) or [1.0]
        plans = [plan_configs(self.spec, [c for c, g in asked if g == f], design=self.design, notes=self.notes,
                              prune=prune, fidelity=f) for f in fidelities]
        found = tuple(x for p in plans for x in p.pruned) + self.take_pruned()
        return replace(plans[0], batches=tuple(b for p in plans for b in p.batches), pruned=found)

    def take_pruned(self) -> tuple[PrunedConfig, ...]:
        """The configs this planner left out since the last call, because they cannot run (an
        adaptive planner checks each config before asking for it; a fixed design is pruned by
        :meth:`plan`): the sweep records them with the plan."""
        return ()


class AdaptivePlanner(Planner):
    """A design whose asks depend on what it was told: recorded as design ``adaptive`` (the analysis
    words effects as associations). Its configs are never pruned at plan time (it is told every
    config it asks); instead it never asks one that cannot run on any hardware target
    (:meth:`cannot_run`, :class:`servetune.manifest.StartCheck`), which :meth:`take_pruned` reports."""

    design = "adaptive"
    adaptive = True

    def __init__(self, spec: ExperimentSpec):
        super().__init__(spec)
        self.start_check = StartCheck(spec)
        #: config_id -> its pruned entries (one per target), every config found unable to run
        self.pruned: dict[str, list[PrunedConfig]] = {}
        self._reported: set[str] = set()

    def cannot_run(self, config: EngineConfig) -> bool:
        """Whether ``config`` cannot run on any target (then it is recorded in :attr:`pruned`)."""
        if config.config_id in self.pruned:
            return True
        entries = self.start_check.pruned_everywhere(config)
        if entries:
            self.pruned[config.config_id] = entries
        return bool(entries)

    def take_pruned(self) -> tuple[PrunedConfig, ...]:
        new = [k for k in self.pruned if k not in self._reported]
        self._reported.update(new)
        return tuple(x for k in new for x in self.pruned[k])


P = TypeVar("P", bound=type[Planner])
_REGISTRY: dict[str, type[Planner]] = {}


def register(kind: str) -> Callable[[P], P]:
    """Class decorator: register a planner under ``planner.kind`` ``kind`` (once per kind)."""

    def deco(cls: P) -> P:
        if kind in _REGISTRY:
            raise ValueError(f"planner kind {kind!r} is registered twice ({_REGISTRY[kind].__name__}, {cls.__name__})")
        cls.kind = kind
        _REGISTRY[kind] = cls
        return cls

    return deco


def known_kinds() -> list[str]:
    """The registered planner kinds, sorted."""
    return sorted(_REGISTRY)


def planner_class(kind: str) -> type[Planner]:
    """The planner registered under ``kind``.

    Raises:
        SpecError: no planner is registered under ``kind`` (the error lists those that are)."""
    cls = _REGISTRY.get(kind)
    if cls is None:
        raise SpecError("planner", [SpecIssue("planner.kind", f"unknown planner kind {kind!r}; known kinds: "
                                                              f"{', '.join(known_kinds())}")])
    return cls


def create_planner(spec: ExperimentSpec) -> Planner:
    """A fresh planner for ``spec`` (under ``spec.planner.kind``)."""
    return planner_class(spec.planner.kind)(spec)


def plan_experiment(spec: ExperimentSpec) -> Plan:
    """What a fresh planner of ``spec`` plans before any result: every config for the designs
    fixed in advance, the first batch for an adaptive one. ``Plan.design`` names the design."""
    return create_planner(spec).plan()
